"""Hibari's word timings cut where they say, as Whisper hears it (the heavy tier's view of
tests/test_hibari_align.py; bench/timestamps.py measures the same over 120 sentences).

The audio of a few sentences (seed fixed, so the audio and Whisper's transcripts are the same on every
run) is cut at each word's `end_s`, as a player that stops there plays it (a 10 ms fade, then
silence), and at 80 ms before each word's `start_s`. Whisper tiny.en is an imperfect judge of a cut
at a word boundary: it guesses a likely next word ("before" -> "before you") from a phoneme's onset
or from nothing, or loses a short last word, so the checks are rates over every cut, not each cut
(bench/RESULTS.md has the rates over 120 sentences). Timings off by a phoneme or more fail them: the
cuts would carry the next word, or lose the last.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from speech.engines.hibari import HibariEngine
from speech.stream.engine import Alignment, SynthesisRequest
from speech.stream.words import word_spans
from tests.support.speech_check import normalise, transcribe

pytestmark = [pytest.mark.live, pytest.mark.heavy]

RATE = 24000
FADE_S, PAD_S, BEFORE_S = 0.010, 0.5, 0.080
SENTENCES = [
    "Please close the window before you go to bed.",
    "The museum opens at ten and closes at six.",
    "Maria and Jonathan met in Lisbon last summer.",
]


@pytest.fixture(scope="module")
def spoken():
    """[(text, float32 audio, word timings)] of SENTENCES, by the real engine with timestamps."""
    engine = HibariEngine(workers=1)

    async def speak(text, seed):
        chunks, words = [], []
        request = SynthesisRequest(text, engine.capabilities.default_voice, timestamps=True, options={"seed": seed})
        async for item in engine.stream(request):
            if isinstance(item, Alignment):
                words += item.words
            else:
                chunks.append(item)
        assert [(w.char_start, w.char_end) for w in words] == word_spans(text)
        return text, np.concatenate(chunks), words

    async def run():
        try:
            return [await speak(text, seed) for seed, text in enumerate(SENTENCES)]
        finally:
            await engine.aclose()

    return asyncio.run(run())


def cut(samples, at_s):
    head = np.array(samples[: max(0, round(at_s * RATE))], dtype=np.float32)
    fade = min(head.size, int(FADE_S * RATE))
    head[head.size - fade :] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
    return np.concatenate([head, np.zeros(int(PAD_S * RATE), np.float32)])


def test_whisper_hears_each_sentence_whole(spoken, whisper):
    for text, samples, _ in spoken:
        assert normalise(transcribe(whisper, samples, RATE)) == normalise(text)


def test_cut_at_a_words_end_gives_the_words_up_to_it(spoken, whisper):
    results = []
    for text, samples, words in spoken:
        for word in words:
            heard = normalise(transcribe(whisper, cut(samples, word.end_s), RATE))
            results.append((heard == normalise(text[: word.char_end]), text[: word.char_end], heard))
    assert sum(ok for ok, _, _ in results) >= 0.75 * len(results), [r for r in results if not r[0]]


def test_cut_before_a_words_start_does_not_give_it(spoken, whisper):
    results = []
    for text, samples, words in spoken:
        for word in words[1:]:
            heard = normalise(transcribe(whisper, cut(samples, word.start_s - BEFORE_S), RATE))
            upto = normalise(text[: word.char_end])
            results.append((heard[: len(upto)] != upto, text[: word.char_end], heard))
    assert sum(ok for ok, _, _ in results) >= 0.8 * len(results), [r for r in results if not r[0]]
