"""Word timings for audio an engine made without them: the words spread over the sound, pauses kept.

For engines that cannot align (an upstream server: sglang-omni, vLLM-omni's streamed speech and
OpenAI's `/v1/audio/speech` send no word times; docs/engines.md). The segment's audio is at hand
whole (`Engine.stream` yields timings before the audio they describe), so the estimate uses it:

* the words go where the sound is, from its first to its last loud frame (the energy gate of
  `speech.audio.signal`), not over the silence around it;
* the audio's pauses (PAUSE_S or more without a loud frame) are matched, in order, to the places
  the text pauses (punctuation after a word, `speech.stream.words.PAUSE_WEIGHT`), each pause to the
  one the plain spread puts nearest it; between matched pauses the words are spread by
  `speech.stream.words.estimate` (syllables). A pause with no punctuation left for it stays inside
  a span.

Marked `estimated`. Figures: bench/RESULTS.md (bench/timestamps.py).
"""

from __future__ import annotations

import numpy as np

from ..audio.signal import GATE_FRAME_S, loud_frames
from ..stream.words import PAUSE_WEIGHT, estimate, word_spans
from ..stream.engine import Alignment, WordTiming

PAUSE_S = 0.12  # shorter gaps are inside speech (stop closures), not pauses


def spread(text: str, samples: np.ndarray, rate: int) -> Alignment:
    """Every word of `text` timed over `samples` (float32, or int16 as quantised) at `rate`."""
    spans = word_spans(text)
    if not spans:
        return Alignment((), estimated=True)
    if samples.dtype == np.int16:
        samples = samples.astype(np.float32) / np.float32(32768)
    loud = loud_frames(samples, rate)
    if not loud.size:
        return Alignment(tuple(WordTiming(start, end, 0.0, 0.0) for start, end in spans), estimated=True)
    frame = max(1, int(rate * GATE_FRAME_S))
    start_s, end_s = loud[0] * frame / rate, min(samples.size, (loud[-1] + 1) * frame) / rate
    gaps = np.flatnonzero(np.diff(loud) - 1 >= PAUSE_S / GATE_FRAME_S)
    pauses = [((loud[i] + 1) * frame / rate, loud[i + 1] * frame / rate) for i in gaps]
    plain = estimate(text, end_s - start_s, spans).words
    breaks = [i for i in range(len(spans) - 1) if any(ch in PAUSE_WEIGHT for ch in text[spans[i][1] : spans[i + 1][0]])]
    cuts = _match(pauses, breaks, [start_s + w.end_s for w in plain])
    words: list[WordTiming] = []
    first, at = 0, start_s
    for last, (pause_start, pause_end) in [*cuts, (len(spans) - 1, (end_s, end_s))]:
        piece = estimate(text, pause_start - at, spans[first : last + 1]).words
        words += [WordTiming(w.char_start, w.char_end, at + w.start_s, at + w.end_s) for w in piece]
        first, at = last + 1, pause_end
    return Alignment(tuple(words), estimated=True)


def _match(pauses, breaks, break_times):
    """(index of the word the pause follows, pause) for the pauses given a break: in order, each to the
    break after the previous match whose plain time is nearest the pause's start."""
    cuts, after = [], 0
    for pause in pauses:
        options = [b for b in breaks if b >= after]
        if not options:
            break
        best = min(options, key=lambda b: abs(break_times[b] - pause[0]))
        cuts.append((best, pause))
        after = best + 1
    return cuts
