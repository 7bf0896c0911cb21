"""Hibari's own word timings: its model's phoneme durations, exposed and turned into seconds.

Hibari's graph predicts how long each phoneme id lasts before it renders them (its length regulator:
`/Round` -> `/Clip` -> `/Cast_32` -> `/CumSum`), but outputs only the vocoder's parameters. At load
time `model_with_durations` adds `/Clip_output_0` (steps per id, the `speed` input already applied)
as one more output; the six outputs Hibari has are computed as before, bit for bit
(tests/test_hibari_align.py). A step is `STEP_FRAMES` vocoder frames (the graph's `/Tile` repeats each
regulated frame twice; the audio is exactly `2 * sum(steps) * hop` samples) and a frame is
`hibari.dsp.HOP` samples, centred on its index times the hop (the vocoder's inverse STFT is centred),
so the boundary before step `c` lies at `(STEP_FRAMES * c - 1/2) * HOP` samples.

`speech.engines.hibari_words` says which ids speak which words; `alignment` turns that into times
from the first sample the engine yields for the part (after its silence trim), clamped to the part's
audio, plus the audio the segment yielded before it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..stream.engine import Alignment, WordTiming
from .hibari_words import Part, Plan
from .hibari_vocoder import Vocoder
from .jobs import release_point

DURATIONS = "/Clip_output_0"
STEP_FRAMES = 2
END_PAD_S = 0.03  # kept after the last sound's gate frame (speech.audio.signal) for a word's release
END_LEAD_S = 0.05  # a word followed at once by the next ends this much before its last frame (_lead)
JOINED_S = 0.1  # words closer than this have no pause between them: they abut (_lead)


def model_with_durations(path: str) -> bytes:
    """Hibari's model with the phoneme durations as a seventh output, serialised for onnxruntime."""
    import onnx

    model = onnx.load(path)
    if not any(DURATIONS in node.output for node in model.graph.node):
        raise RuntimeError(f"{path} has no {DURATIONS}: this Hibari's graph is not the one word timings know")
    model.graph.output.append(onnx.helper.make_tensor_value_info(DURATIONS, onnx.TensorProto.FLOAT, None))
    return model.SerializeToString()


def synthesise(session, ids, speed, rng):
    """`Hibari.from_ids` on the session `model_with_durations` built, voiced by this engine's vocoder
    (speech/engines/hibari_vocoder.py): the waveform, and the steps of every id (empty when there is
    nothing to say)."""
    if len(ids) < 3:
        return np.zeros(0, np.float32), np.zeros(0, np.int64)
    out = session.run(None, {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)})
    release_point()  # a job abandoned during the model's run stops here, before the vocoder
    return Vocoder(rng).push([o[0] for o in out[:6]], final=True), np.rint(out[6]).astype(np.int64)


def alignment(plan: Plan, part: Part, steps, kept, sound, offset: int, rate: int) -> Alignment:
    """The words `part` reports, timed: `steps` per phoneme id (`synthesise`), `kept` the samples of the
    rendered audio the engine yields (its trim), `sound` where its sound lies (`sound_bounds`), `offset`
    the samples the segment yielded before it. The model stretches a sentence's last phoneme over the
    silence after it: no word ends later than END_PAD_S after the last sound. Its first sound can lead
    its first phoneme's frames (by up to ~50 ms, as its decoder sees frames ahead): the first word
    starts no later than the first sound.
    Words a part's tokens speak together (one reading for several words) share their time by
    `speech.stream.words.estimate`; words nothing speaks take none, where the words before them end."""
    from hibari.dsp import HOP

    from ..stream.words import estimate

    start, end = kept
    last = 0 if sound is None else min(end - start, sound[1] + int(END_PAD_S * rate) - start)
    bounds = np.concatenate(([0], np.cumsum(steps))) * (STEP_FRAMES * HOP) - HOP // 2 - start
    times = ((np.clip(bounds, 0, max(0, last)) + offset) / rate).tolist() if len(steps) else []
    spoken_ids = [first for _, _, spoken in part.entries for first, _ in spoken]
    if spoken_ids and sound is not None:  # the model's first sound can come before its first phoneme's frames
        times[spoken_ids[0]] = min(times[spoken_ids[0]], (sound[0] - start + offset) / rate)
    words, now = [], offset / rate
    for lo, hi, spoken in part.entries:
        if not spoken:
            words += [WordTiming(*plan.spans[w], now, now) for w in range(lo, hi + 1)]
            continue
        pieces = [(max(now, times[a]), max(now, times[b])) for a, b in spoken]
        if lo == hi:
            words.append(WordTiming(*plan.spans[lo], pieces[0][0], pieces[-1][1]))
        elif len(pieces) == hi - lo + 1:
            words += [WordTiming(*plan.spans[w], a, b) for w, (a, b) in zip(range(lo, hi + 1), pieces, strict=True)]
        else:
            spread = estimate(plan.text, pieces[-1][1] - pieces[0][0], plan.spans[lo : hi + 1]).words
            words += [WordTiming(w.char_start, w.char_end, pieces[0][0] + w.start_s, pieces[0][0] + w.end_s) for w in spread]
        now = words[-1].end_s
    return Alignment(tuple(_lead(words)), estimated=part.estimated)


def _lead(words: list[WordTiming]) -> list[WordTiming]:
    """A word followed at once by another (no pause between) ends END_LEAD_S before its last frame,
    at most half its time earlier, and the next word starts there: the decoder starts a sound ahead of
    its frames (a sentence's first sound leads its first phoneme by up to ~50 ms), so a word's last
    frames already carry the next word's onset, and the word space between them (a phoneme with frames
    of its own, no pause) is that onset too. Cut at the frame boundary, Whisper hears the next word in a
    third of the cuts that fail; an independent aligner puts the next word's start where this one ends,
    not after the space (bench/RESULTS.md, bench/timestamps.py)."""
    spoken = [i for i, w in enumerate(words) if w.end_s > w.start_s]
    out = list(words)  # the ends are worked out from the frames, not from a start already moved
    for i, j in zip(spoken, spoken[1:]):
        if words[j].start_s - words[i].end_s < JOINED_S:
            word = words[i]
            end = max((word.start_s + word.end_s) / 2, word.end_s - END_LEAD_S)
            out[i] = replace(out[i], end_s=end)
            for k in range(i + 1, j):  # words nothing speaks, between the two: where the first ends
                out[k] = replace(out[k], start_s=end, end_s=end)
            out[j] = replace(out[j], start_s=end)
    return out
