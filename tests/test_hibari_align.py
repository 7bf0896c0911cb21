"""Hibari's word timings (speech/engines/hibari_align.py, hibari_words.py, traced.py), with the real engine.

What the engine promises (Engine.stream): with `timestamps` its `Alignment`s cover every word of the
text once, in order, each before any audio of its words; times from the first sample yielded, never
decreasing, never past the audio's end; the audio itself the same as without timestamps. And the
times are the model's own: where a word is said there is sound, where the model pauses (a comma,
before the first word) there is none. Whisper's view of the same times is tests/test_hibari_cuts.py
and bench/timestamps.py.
"""

from __future__ import annotations

import random
import re
import unicodedata

import numpy as np
import pytest

from speech.engines.hibari_align import STEP_FRAMES, model_with_durations, synthesise
from speech.engines.hibari_words import normalised, plan
from speech.engines.text import for_number_reader
from speech.engines.traced import Traced
from speech.stream.engine import Alignment
from speech.stream.words import word_spans
from tests.support.engine_items import speak

RATE = 24000
TEXTS = [
    "Dr. Smith paid $3.50 on 3/4 at 7:30 p.m.",
    "Hello there. How are you today? I'm fine, thanks!",
    "Mr. O'Brien met Prof. Nakamura on Jan 5, 2024 at 10:15 a.m. in room #214.",
    "Rock & roll at 50 % off, 5km away; call 555-123-4567 now.",
    "It's 10-20 °C outside, x² is ½ of 3/8, and a=b.",
    "  Leading spaces,\nnew lines\n\nand a new paragraph.  ",
    "Chapter IV: Henry VIII paid £1.5m, about ¥300 or 12¢ each, at No. 7 Baker St.",
    "Unicode ⑵ and ٣ digits, a ﬁne ligature, and an emoji 😀 here.",
    "[Kokoro](/kˈOkəɹO/) reads the link, then well-known U.S. names.",
    " ".join(["This clause goes on and on, with commas, so that the sentence is long"] * 8) + ".",
]


@pytest.fixture(scope="module")
def engine(hibari):
    return hibari


def audio_of(items):
    return np.concatenate([item for item, _ in items if not isinstance(item, Alignment)])


def words_of(items):
    return [word for item, _ in items if isinstance(item, Alignment) for word in item.words]


def test_hibari_says_it_aligns(engine):
    assert engine.capabilities.aligns


@pytest.mark.parametrize("text", TEXTS)
def test_alignments_cover_every_word_once_in_order_before_its_audio(engine, text):
    items = speak(engine, text, timestamps=True, options={"seed": 1})
    words = words_of(items)
    assert [(w.char_start, w.char_end) for w in words] == word_spans(text)
    times = [t for w in words for t in (w.start_s, w.end_s)]
    assert times == sorted(times) and times[0] >= 0
    assert times[-1] <= audio_of(items).size / RATE
    for item, before in items:
        if isinstance(item, Alignment):
            assert not item.estimated
            assert all(w.start_s >= before / RATE for w in item.words)  # no word's audio came before its timing
    # Every word here is spoken (the emoji aside): each takes time.
    silent = [text[w.char_start : w.char_end] for w in words if w.end_s <= w.start_s]
    assert [word for word in silent if re.search(r"\w", word)] == []


def test_numbers_abbreviations_and_money_keep_their_own_words(engine):
    text = "Dr. Smith paid $3.50 on 3/4 at 7:30 p.m."
    words = words_of(speak(engine, text, timestamps=True, options={"seed": 1}))
    by_word = {text[w.char_start : w.char_end]: w.end_s - w.start_s for w in words}
    assert list(by_word) == ["Dr", "Smith", "paid", "$3.50", "on", "3/4", "at", "7:30", "p.m"]
    # "three dollars and fifty cents" takes longer than "paid"; "seven thirty" longer than "at".
    assert by_word["$3.50"] > 2 * by_word["paid"] and by_word["7:30"] > 2 * by_word["at"]


def test_several_sentences_one_alignment_before_each_and_times_run_on(engine):
    text = "One sentence here. Then a second one! And a third?"
    items = speak(engine, text, timestamps=True, options={"seed": 2})
    kinds = ["timing" if isinstance(item, Alignment) else "audio" for item, _ in items]
    assert kinds == ["timing", "audio"] * 3
    chunks = [item for item, _ in items if not isinstance(item, Alignment)]
    firsts = [item.words[0] for item, _ in items if isinstance(item, Alignment)]
    assert [text[w.char_start : w.char_end] for w in firsts] == ["One", "Then", "And"]
    assert firsts[1].start_s >= chunks[0].size / RATE
    assert firsts[2].start_s >= (chunks[0].size + chunks[1].size) / RATE


@pytest.mark.parametrize("pcm16", [False, True])
def test_audio_is_the_same_with_and_without_timestamps(engine, pcm16):
    text = "Dr. Smith paid $3.50 on 3/4. Then he left, quickly!"
    plain = speak(engine, text, pcm16=pcm16, options={"seed": 5})
    timed = speak(engine, text, pcm16=pcm16, timestamps=True, options={"seed": 5})
    assert not any(isinstance(item, Alignment) for item, _ in plain)
    assert [item.tobytes() for item, _ in plain] == [item.tobytes() for item, _ in timed if not isinstance(item, Alignment)]
    assert audio_of(timed).dtype == (np.int16 if pcm16 else np.float32)
    if pcm16:  # the 16-bit path times the words as the float path does
        assert words_of(timed) == words_of(speak(engine, text, timestamps=True, options={"seed": 5}))


def test_times_sit_on_the_sound(engine):
    """Before each sentence's first word and after its last one the audio is quiet (the trim's pre-roll,
    the pause after a sentence), and most words are loud: offsets in the time base (the trim, the
    vocoder's hop, the sentences before) would move words into those pauses. (The model does not follow
    its own durations to the frame: a short word after a comma can sound in the comma's place.)"""
    text = "Well, we waited for the bus. Then, at long last, it came around the corner. Everyone cheered!"
    items = speak(engine, text, timestamps=True, options={"seed": 3})
    samples = audio_of(items).astype(np.float64)

    def loudness(start_s, end_s):
        part = samples[int(start_s * RATE) : int(end_s * RATE)]
        return float(np.sqrt(np.mean(part**2))) if part.size else 0.0

    speech = loudness(0, samples.size / RATE)
    sentences = [item.words for item, _ in items if isinstance(item, Alignment)]
    ends = np.cumsum([item.size for item, _ in items if not isinstance(item, Alignment)]) / RATE
    assert len(sentences) == len(ends) == 3
    start = 0.0
    for words, end in zip(sentences, ends, strict=True):
        assert words[0].start_s - start > 0.015
        assert loudness(start, words[0].start_s - 0.005) < 0.05 * speech
        assert end - words[-1].end_s > 0.1
        assert loudness(words[-1].end_s + 0.05, end) < 0.05 * speech
        start = end
    words = [w for sentence in sentences for w in sentence]
    loud = [w for w in words if loudness(w.start_s, w.end_s) > 0.25 * speech]
    assert len(loud) >= 0.8 * len(words)


def test_a_word_said_at_once_after_another_starts_where_that_one_ends(engine):
    """With no pause between two words the second starts where the first ends: the word space's frames
    and the decoder's lead are already its onset (an independent aligner puts its start there, not after
    the space: bench/RESULTS.md). After a comma the pause stays between them."""
    text = "Well, we waited for the bus at the corner."
    words = words_of(speak(engine, text, timestamps=True, options={"seed": 3}))
    assert [text[w.char_start : w.char_end] for w in words][:2] == ["Well", "we"]
    assert words[1].start_s - words[0].end_s > 0.1
    for before, after in zip(words[1:], words[2:]):
        assert after.start_s == before.end_s, (text[after.char_start : after.char_end], after, before)


def test_text_with_nothing_to_say_still_reports_its_words(engine):
    items = speak(engine, "😀", timestamps=True)
    assert [item for item, _ in items] == [Alignment((words_of(items)[0],))]
    assert (words_of(items)[0].start_s, words_of(items)[0].end_s) == (0.0, 0.0)
    assert not any(isinstance(item, Alignment) for item, _ in speak(engine, "...", timestamps=True))  # no word


# -- the pieces ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tts(engine):
    """The engine's own Hibari (its model already carries the durations output)."""
    return engine._models[engine.capabilities.default_voice]


def varied_texts():
    """TEXTS, and characters of every Unicode category in sentences (as tests/test_stress.py fuzzes)."""
    rng = random.Random(11)
    by_category = {}
    for code in range(0x110000):
        by_category.setdefault(unicodedata.category(chr(code)), []).append(chr(code))
    out = list(TEXTS)
    for _, chars in sorted(by_category.items()):
        for char in rng.sample(chars, min(len(chars), 8)):
            out += [f"It costs {char}5 at 7:30 pm.", f"Dr. {char} paid ${char}3.50, No. 4{char}."]
    return out


def test_the_phonemes_are_hibaris_own(tts):
    """The engine runs its own copy of Hibari's text path (to know each phoneme's word): the phonemes, and
    so the audio, are exactly what `Hibari.phonemize` makes of the same text."""
    for text in varied_texts():
        assert [part.phonemes for part in plan(tts, text).parts] == tts.phonemize(for_number_reader(text)), text


def test_the_traced_normaliser_is_hibaris():
    from hibari.g2p.normalize import normalize

    for text in varied_texts():
        traced = normalised(Traced.of(text))
        assert traced.text == normalize(text), text
        assert len(traced.origin) == len(traced.text)


def test_the_durations_output_leaves_the_audio_alone_and_counts_its_frames(tts):
    import onnxruntime as ort

    plain = ort.InferenceSession(tts.model_path, providers=["CPUExecutionProvider"])
    timed = ort.InferenceSession(model_with_durations(tts.model_path), providers=["CPUExecutionProvider"])
    from hibari import dsp

    for text, speed in [("Hello there, how are you?", 1.0), ("Dr. Smith paid $3.50.", 0.7), ("Quick!", 1.6)]:
        ids = plan(tts, text).parts[0].ids
        feeds = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)}
        before, after = plain.run(None, feeds), timed.run(None, feeds)
        assert len(after) == len(before) + 1
        assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=False))
        samples, steps = synthesise(timed, ids, speed, np.random.default_rng(0))
        assert steps.shape == (len(ids),) and (steps >= 0).all()
        assert samples.size == int(steps.sum()) * STEP_FRAMES * dsp.HOP


def test_traced_rewrites_remember_where_each_character_came_from():
    text = "Dr. Smith at 7:30 p.m. paid"
    t = normalised(Traced.of(text))
    assert t.text == "Dr Smith at seven thirty P.M. paid"

    def origin_of(piece):
        at = t.text.index(piece)
        start, end = t.span(at, at + len(piece))
        return text[start:end]

    assert origin_of("seven thirty") == "7:30"
    assert origin_of("P.M.") == "p.m."
    assert origin_of("paid") == "paid"
    assert origin_of("Dr") == "Dr"
    nfkc = Traced.of("a ﬁne ②").rewritten(unicodedata.normalize("NFKC", "a ﬁne ②"))
    assert nfkc.text == "a fine 2" and nfkc.span(2, 6) == (2, 5) and nfkc.span(7, 8) == (6, 7)
