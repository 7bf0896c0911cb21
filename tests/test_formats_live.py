"""Every audio format, rate and speed through a real server (daphne, Hibari), decoded as a client would.

One daphne for the module (SPEECH_ENGINE=hibari); after each test and at the end its stderr must
hold no traceback. Every session sets `seed`, so Hibari's output is the same each time: a pcm
session at the same rate is the reference the other formats are compared with.

* each format, non-streamed, at 24000 and 8000 Hz (opus: 48000 whatever is asked): every segment is
  one binary frame, decoded on its own by an independent decoder (tests/support/decoders.py) at the rate
  audio.start announced, of plausible duration and loudness, and the same audio as pcm (bit-exact
  for wav/flac, within G.711's quantisation for mulaw/alaw, correlation > 0.95 and level within
  1 dB for mp3/opus/aac);
* Whisper tiny.en hears the words (WER <= 0.1) in mp3, in streamed mulaw at 8 kHz and in streamed
  pcm at 48 and 8 kHz (resampled chunk by chunk by the server);
* speed: the span of speech (first to last 10 ms frame within 30 dB of the loudest) of one
  sentence scales to within 5 % of 1/speed of speed 1.0's, and its median F0 stays within 5 %.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import resample_poly

from speech.audio.signal import quantise
from speech.audio.transforms import Chain
from speech.stream.frames import FIRST_FRAME_S, MAX_FRAME_S
from tests.support.live import healthy_after_each, module_server, run_session, segments_of
from tests.support.speech_check import WHISPER_RATE, normalise, transcribe, wer

from .support.decoders import (
    best_lag,
    decode_file,
    decode_raw,
    g711_ints,
    median_f0,
    pcm16_ints,
    rms,
    sound_duration,
)

pytestmark = [pytest.mark.live, pytest.mark.heavy]

SEED = 7
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "It is raining in Paris today."]
FORMATS = ("aac", "alaw", "flac", "mp3", "mulaw", "opus", "pcm", "wav")
LOSSY_LAG = {"mp3": 1152, "opus": 0, "aac": 2048}  # as in test_codecs: codec delay a decoder may keep
AAC_PRIMING = 1024


server = module_server()
healthy = healthy_after_each()


async def synthesize(server, config, texts, *, stream=False):
    """One session; returns (session.configured, segments) after checking the protocol's ordering."""
    config = {"seed": SEED, "stream_audio": stream, **config}
    result = await run_session(server.ws_url, config, texts)
    segments, problems = segments_of(result.items)
    assert problems == [], problems
    assert result.close_code == 1000, (result.close_code, result.close_reason)
    assert result.types()[-1] == "session.done"
    for segment in segments:
        assert segment.errors == [] and segment.done["error"] is False, segment
        assert segment.done["total_bytes"] == len(segment.audio)
    return result.configured, segments


_pcm_reference: dict[int, list[np.ndarray]] = {}


async def pcm_reference(server, rate):
    """int16 samples of each sentence in a non-streamed pcm session at `rate` (cached)."""
    if rate not in _pcm_reference:
        configured, segments = await synthesize(server, {"response_format": "pcm", "sample_rate": rate}, [" ".join(SENTENCES)])
        assert configured["sample_rate"] == rate
        _pcm_reference[rate] = [pcm16_ints(s.audio) for s in segments]
    return _pcm_reference[rate]


def check_plausible_speech(samples, rate, sentence):
    seconds = samples.size / rate
    words = len(normalise(sentence))
    # as test_roundtrip: at least ~0.12 s and at most ~1 s a word, and clearly not silence
    assert 0.12 * words < seconds < 1.0 * words + 1.0, f"{seconds:.2f} s for {words} words: {sentence!r}"
    assert rms(samples) > 0.02, f"too quiet (rms {rms(samples):.4f}) for {sentence!r}"


def check_heard(model, samples, rate, sentence):
    check_plausible_speech(samples, rate, sentence)
    audio16k = samples if rate == WHISPER_RATE else resample_poly(samples, WHISPER_RATE, rate)
    heard = transcribe(model, np.asarray(audio16k, np.float32), WHISPER_RATE)
    error = wer(sentence, heard)
    assert error <= 0.1, f"WER {error:.2f} at {rate} Hz: said {sentence!r}, heard {heard!r}"
    return heard


# -- every format, non-streamed ------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [24000, 8000])
@pytest.mark.parametrize("fmt", FORMATS)
async def test_format_non_streamed(server, fmt, rate):
    out_rate = 48000 if fmt == "opus" else rate
    configured, segments = await synthesize(server, {"response_format": fmt, "sample_rate": rate}, [" ".join(SENTENCES)])
    assert configured["response_format"] == fmt and configured["sample_rate"] == out_rate
    assert [s.start["sentence_text"] for s in segments] == SENTENCES
    reference = await pcm_reference(server, out_rate)
    for segment, sentence, ref_ints in zip(segments, SENTENCES, reference):
        assert segment.start["format"] == fmt and segment.start["sample_rate"] == out_rate
        assert len(segment.frames) == 1, "not streaming: one complete file per segment"
        data = segment.frames[0]
        decoded = decode_raw(fmt, data, out_rate) if fmt in ("pcm", "mulaw", "alaw") else decode_file(fmt, data)
        assert decoded.rate == out_rate and decoded.channels == 1, decoded
        samples = decoded.samples
        if fmt == "aac":  # ADTS keeps the encoder's priming (see test_codecs)
            samples = samples[AAC_PRIMING:]
        check_plausible_speech(samples, out_rate, sentence)

        ref = ref_ints.astype(np.float32) / 32768.0
        if fmt in ("pcm", "wav", "flac"):
            assert np.array_equal(np.round(decoded.samples * 32768).astype(np.int64), ref_ints.astype(np.int64))
        elif fmt in ("mulaw", "alaw"):
            ints = g711_ints(fmt, data).astype(np.float64)
            assert ints.size == ref_ints.size
            assert np.all(np.abs(ints - ref_ints) <= np.abs(ref_ints.astype(np.float64)) / 16 + 16)
        else:
            low_lag = AAC_PRIMING if fmt == "aac" else 0
            assert abs(decoded.samples.size - low_lag - ref.size) <= LOSSY_LAG[fmt]
            lag, score = best_lag(ref, decoded.samples, LOSSY_LAG[fmt])
            assert score > 0.95, f"{fmt}: correlation {score:.3f} with the pcm of the same speech"
            if fmt == "aac":
                assert abs(lag - AAC_PRIMING) <= 2, lag
            aligned = decoded.samples[lag : lag + ref.size]
            level_db = 20 * np.log10(rms(aligned) / rms(ref))
            assert abs(level_db) < 1.0, f"{fmt}: level {level_db:+.2f} dB against pcm"


# -- Whisper round trips ----------------------------------------------------------------------------------


async def test_mp3_round_trip(server, whisper):
    configured, segments = await synthesize(server, {"response_format": "mp3"}, [" ".join(SENTENCES)])
    assert configured["sample_rate"] == 24000  # Hibari's native rate is the default
    for segment, sentence in zip(segments, SENTENCES):
        decoded = decode_file("mp3", segment.frames[0])
        assert decoded.rate == segment.start["sample_rate"] == 24000
        check_heard(whisper, decoded.samples, decoded.rate, sentence)
    assert len(segments) == len(SENTENCES)


async def test_streamed_mulaw_8k_round_trip(server, whisper):
    configured, segments = await synthesize(server, {"response_format": "mulaw"}, [" ".join(SENTENCES)], stream=True)
    assert configured["sample_rate"] == 8000 and configured["stream_audio"] is True  # G.711's default rate
    for segment, sentence in zip(segments, SENTENCES):
        assert segment.start["sample_rate"] == 8000 and segment.start["format"] == "mulaw"
        assert len(segment.frames) > 1, "streamed"
        assert len(segment.frames[0]) <= 320, "a 40 ms first frame, one byte a sample"
        assert all(len(frame) <= 8000 for frame in segment.frames), "then frames of 200 ms to 1 s"
        samples = g711_ints("mulaw", segment.audio).astype(np.float32) / 32768.0
        check_heard(whisper, samples, 8000, sentence)


@pytest.mark.parametrize("rate", [48000, 8000])
async def test_streamed_pcm_resampled_round_trip(server, whisper, rate):
    configured, segments = await synthesize(
        server, {"response_format": "pcm", "sample_rate": rate}, [" ".join(SENTENCES)], stream=True
    )
    assert configured["sample_rate"] == rate
    for segment, sentence in zip(segments, SENTENCES):
        assert segment.start["sample_rate"] == rate
        assert len(segment.frames) > 1 and len(segment.frames[0]) <= int(rate * FIRST_FRAME_S) * 2
        assert all(len(f) <= int(rate * MAX_FRAME_S) * 2 for f in segment.frames)
        samples = pcm16_ints(segment.audio).astype(np.float32) / 32768.0
        check_heard(whisper, samples, rate, sentence)
    # Resampled chunk by chunk by the server = the whole segment resampled at once: the non-streamed
    # session's audio. But for the first segment, which a streamed session gets in pieces (first words
    # first, speech/engines/hibari_pieces.py): its reference is the 24 kHz streamed session's first
    # segment (the same pieces) resampled here at once, from its 16-bit samples (so within 2).
    _, native = await synthesize(server, {"response_format": "pcm"}, [" ".join(SENTENCES)], stream=True)
    chain = Chain(24000, rate)
    whole = chain.process(pcm16_ints(native[0].audio).astype(np.float32) / 32768.0)
    reference = [quantise(np.concatenate((whole, chain.flush()))), *(await pcm_reference(server, rate))[1:]]
    for index, (segment, ref_ints) in enumerate(zip(segments, reference, strict=True)):
        ints = pcm16_ints(segment.audio)
        assert abs(ints.size - ref_ints.size) <= 2
        n = min(ints.size, ref_ints.size)
        assert np.max(np.abs(ints[:n].astype(np.int64) - ref_ints[:n])) <= (2 if index == 0 else 1)


# -- speed ---------------------------------------------------------------------------------------------

SPEED_SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank."
_speech_at: dict[tuple[str, float], np.ndarray] = {}


async def speech_at(server, sentence, speed):
    key = (sentence, speed)
    if key not in _speech_at:
        configured, segments = await synthesize(server, {"response_format": "pcm", "speed": speed}, [sentence])
        assert len(segments) == 1 and segments[0].start["sample_rate"] == 24000
        _speech_at[key] = pcm16_ints(segments[0].audio).astype(np.float32) / 32768.0
    return _speech_at[key]


async def check_speed(server, sentence, speed):
    base = await speech_at(server, sentence, 1.0)
    fast = await speech_at(server, sentence, speed)
    base_s, fast_s = sound_duration(base, 24000), sound_duration(fast, 24000)
    expected = base_s / speed
    f0_base, f0 = median_f0(base, 24000), median_f0(fast, 24000)
    assert abs(f0 / f0_base - 1) <= 0.05, f"speed {speed}: median F0 {f0:.1f} Hz, at 1.0 {f0_base:.1f} Hz"
    assert abs(fast_s / expected - 1) <= 0.05, (
        f"speed {speed}: speech lasts {fast_s:.2f} s, expected {expected:.2f} s ({base_s:.2f} s at 1.0)"
    )


@pytest.mark.parametrize("speed", [0.5, 2.0, 0.25, 4.0])
async def test_speed_scales_duration_and_keeps_pitch(server, speed):
    await check_speed(server, SPEED_SENTENCE, speed)


async def test_speed_half_keeps_pitch_of_another_sentence(server):
    await check_speed(server, "Please remember to bring your umbrella because it might rain this afternoon.", 0.5)


async def test_speed_output_is_repeatable_with_a_seed(server):
    """What the speed checks rely on: with `seed`, the same sentence gives the same audio."""
    _, first = await synthesize(server, {"response_format": "pcm", "speed": 0.5}, [SPEED_SENTENCE])
    again = await speech_at(server, SPEED_SENTENCE, 0.5)
    assert np.array_equal(pcm16_ints(first[0].audio).astype(np.float32) / 32768.0, again)
