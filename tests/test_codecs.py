"""speech.audio.codecs against independent decoders (tests/support/decoders.py).

Every file format at every contract rate must decode, with a decoder that is not the product's
FFmpeg wherever one exists, to mono audio at the rate the client is told (`output_rate`: opus is
always 48 kHz, the pipeline resamples to it before encoding), the same length within the codec's
own padding, and the same content.

Length tolerances (decoded minus input samples) and why:
* wav, flac: 0, and the samples are bit-exact to `speech.audio.signal.pcm16` (both are lossless 16-bit).
* mp3: |delta| <= 1152 (one Layer III frame). An MP3 decoder adds the encoder delay (528 + 1) and
  the end padding unless it reads LAME's gapless header; the pinned libsndfile does and gives 0,
  but the contract promises only "MPEG layer III", not gapless playback.
* opus: 0. Ogg Opus carries the pre-skip and the exact end (granule position, RFC 7845, section 4), so a
  conforming decoder returns exactly the input (see the short-segment bug test below).
* aac: 1024 <= delta <= 2048. ADTS has no field for the encoder's priming (1024 samples for
  FFmpeg's AAC) nor for the end padding (up to one 1024-sample frame), so a decoder returns both;
  the content is found 1024 samples late.
"""

from __future__ import annotations

import io
import os
import threading

import av
import numpy as np
import pytest
import soxr

from speech.audio import codecs, output
from speech.audio.codecs import FILE_FORMATS, RAW_FORMATS, EncodingError, RawEncoder, encode_file, output_rate
from speech.audio.signal import pcm16
from speech.engines.fake import FakeEngine
from speech.stream.config import SAMPLE_RATES, SPEED_MAX, SPEED_MIN
from speech.stream.frames import FIRST_FRAME_S, FRAME_S
from speech.threads import LOWEST_NICE, SYNTHESIS_NICE

from .support.decoders import (
    best_lag,
    chunked,
    decode_file,
    decode_raw,
    flac_ints,
    g711_ints,
    opus_head,
    pcm16_ints,
    rms,
    sine,
    snr_db,
    tone_frequency,
    wav_ints,
)
from .support.recorder import check_segment_order

LENGTH_TOLERANCE = {"wav": (0, 0), "flac": (0, 0), "mp3": (-1152, 1152), "opus": (0, 0), "aac": (1024, 2048)}
AAC_PRIMING = 1024
LEVEL_DB = 1.0  # lossy codecs keep a steady tone's level within 1 dB
TONE_HZ = 440.0


def test_format_lists_match_the_contract():
    assert codecs.FORMATS == ("aac", "alaw", "flac", "mp3", "mulaw", "opus", "pcm", "wav")
    assert set(RAW_FORMATS) | set(FILE_FORMATS) == set(codecs.FORMATS)
    assert SAMPLE_RATES == (8000, 16000, 22050, 24000, 44100, 48000)
    assert [output_rate("opus", rate) for rate in SAMPLE_RATES] == [48000] * 6
    for fmt in codecs.FORMATS:
        if fmt != "opus":
            assert [output_rate(fmt, rate) for rate in SAMPLE_RATES] == list(SAMPLE_RATES)


def probe_signal(rate, seconds=1.0):
    """A 440 Hz tone under a smooth envelope (so the alignment of input and output is unambiguous,
    which a steady sine's is not) with a short 1.5 kHz chirp-like burst in the middle."""
    n = int(round(rate * seconds))
    t = np.arange(n) / rate
    envelope = 0.2 + 0.6 * np.sin(np.pi * t / seconds) ** 2
    x = envelope * 0.5 * np.sin(2 * np.pi * TONE_HZ * t)
    burst = np.exp(-(((t - seconds / 2) / 0.02) ** 2))
    x += 0.2 * burst * np.sin(2 * np.pi * (1000 + 2000 * t) * t)
    return x.astype(np.float32)


@pytest.mark.parametrize("rate", SAMPLE_RATES)
@pytest.mark.parametrize("fmt", sorted(FILE_FORMATS))
def test_file_format_decodes_independently(fmt, rate):
    out_rate = output_rate(fmt, rate)  # what the pipeline resamples to and audio.start announces
    x = probe_signal(out_rate)
    data = encode_file(fmt, x, out_rate)
    decoded = decode_file(fmt, data)

    assert decoded.channels == 1, decoded
    assert decoded.rate == out_rate, f"{fmt} at {rate}: decoded at {decoded.rate}"
    low, high = LENGTH_TOLERANCE[fmt]
    delta = decoded.samples.size - x.size
    assert low <= delta <= high, f"{fmt} at {rate}: {decoded.samples.size} samples for {x.size} (delta {delta})"

    y = decoded.samples
    if fmt in ("wav", "flac"):
        expected = np.frombuffer(pcm16(x), "<i2")
        ints = wav_ints(data)[0] if fmt == "wav" else flac_ints(data)[0]
        assert np.array_equal(ints, expected), f"{fmt} is not bit-exact to pcm16"
        assert snr_db(x, y) > 70  # 16-bit quantisation (and the 32767 scale) only
        return
    # Lossy: find where the input sits in the output, then compare.
    lag, score = best_lag(x, y, max_lag=max(abs(low), abs(high)))
    if fmt == "aac":
        assert abs(lag - AAC_PRIMING) <= 2, f"aac content at {lag}, expected after {AAC_PRIMING} priming samples"
    else:
        assert lag <= abs(high), lag
    assert score > 0.99, f"{fmt} at {rate}: correlation {score:.4f} with the input"
    aligned = y[lag : lag + x.size]
    level_db = 20 * np.log10(rms(aligned) / rms(x))
    assert abs(level_db) < LEVEL_DB, f"{fmt} at {rate}: level changed by {level_db:.2f} dB"
    # A steady part of the tone (before the burst) keeps its pitch.
    steady = aligned[int(0.05 * out_rate) : int(0.4 * out_rate)]
    assert abs(tone_frequency(steady, out_rate) - TONE_HZ) < 2.0


def test_opus_header_is_mono_48k():
    data = encode_file("opus", probe_signal(48000), 48000)
    head = opus_head(data)
    assert head["channels"] == 1
    assert head["input_rate"] == 48000
    assert head["pre_skip"] > 0  # the encoder's look-ahead, to be skipped by the decoder


@pytest.mark.parametrize("seconds", [0.1, 0.25, 0.5, 0.8333])
def test_short_opus_segment_decodes_to_its_length(seconds):
    n = int(round(48000 * seconds))
    x = sine(48000, seconds) * np.hanning(n).astype(np.float32)
    decoded = decode_file("opus", encode_file("opus", x, 48000))  # granule positions must be exact (RFC 7845)
    assert decoded.samples.size == n, f"{decoded.samples.size} samples for {n}"


@pytest.mark.parametrize("fmt", sorted(FILE_FORMATS))
def test_short_file_formats_still_decode(fmt):
    """A 50 ms segment (e.g. one FakeEngine chunk) is one complete file of its own."""
    rate = output_rate(fmt, 24000)
    x = sine(rate, 0.05)
    decoded = decode_file(fmt, encode_file(fmt, x, rate))
    assert decoded.rate == rate and decoded.channels == 1
    assert decoded.samples.size >= x.size


def test_each_file_is_complete_on_its_own():
    """Two segments are two independent files: neither depends on the other's encoder state."""
    for fmt in FILE_FORMATS:
        rate = output_rate(fmt, 24000)
        first = encode_file(fmt, sine(rate, 0.5, 300.0), rate)
        second = encode_file(fmt, sine(rate, 0.5, 600.0), rate)
        assert abs(tone_frequency(decode_file(fmt, second).samples, rate) - 600.0) < 2.0
        assert abs(tone_frequency(decode_file(fmt, first).samples, rate) - 300.0) < 2.0


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="a thread's own niceness is Linux's")
async def test_a_file_is_encoded_on_spare_cores_unless_the_listener_would_run_dry():
    """One file a segment is encoded as streamed audio is: off the loop, at the lowest niceness while the
    listener has audio enough to play, else beside synthesis, at its niceness."""
    where = []

    def encode(fmt, samples, rate):
        where.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return encode_file(fmt, samples, rate)

    process = os.getpriority(os.PRIO_PROCESS, 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(output, "encode_file", encode)
        for ahead_s in (codecs.AHEAD_S, 0.0):
            data = await output.encode_segment("mp3", [np.zeros(2400, np.float32)] * 2, 24000, ahead_s)
            assert decode_file("mp3", data).samples.size >= 4800
    assert where == [LOWEST_NICE, min(LOWEST_NICE, process + SYNTHESIS_NICE)]


def test_clipping_is_saturation_not_wraparound():
    x = np.array([1.5, -1.5, 1.0, -1.0, 0.0], np.float32)
    ints, rate, channels, _ = wav_ints(encode_file("wav", x, 8000))
    assert (rate, channels) == (8000, 1)
    assert ints.tolist() == [32767, -32768, 32767, -32768, 0]


# -- raw formats -------------------------------------------------------------------------------------


def g711_bound(reference):
    """One G.711 quantisation step at each sample, in 16-bit units: steps grow with the level,
    about 1/16 of it (both laws have 16 steps per segment, segments double), and are 16 in the
    lowest segments (A-law's linear segment; mu-law's are finer). Decoders return the middle of a
    step, so a correct codec stays within half of this; a wrong law or byte order does not."""
    return np.abs(reference.astype(np.float64)) / 16 + 16


@pytest.mark.parametrize("fmt", ["mulaw", "alaw"])
@pytest.mark.parametrize("rate", [8000, 24000, 48000])
def test_g711_decodes_with_audioop(fmt, rate):
    # A tone sweeping in level from silence to near full scale covers every segment of the law.
    n = rate
    x = (sine(rate, 1.0, 440.0, 0.95) * np.linspace(0, 1, n, dtype=np.float32)).astype(np.float32)
    data = RawEncoder(fmt, rate).encode(x)
    assert len(data) == n  # one byte a sample
    reference = np.frombuffer(pcm16(x), "<i2")
    decoded = g711_ints(fmt, data)
    error = np.abs(decoded.astype(np.float64) - reference)
    assert np.all(error <= g711_bound(reference)), f"max excess {np.max(error - g711_bound(reference)):.1f}"
    # G.711's SNR is ~38 dB on a loud tone; a wrong law gives well under 20 dB.
    loud = slice(n // 2, n)
    assert snr_db(reference[loud], decoded[loud]) > 33


@pytest.mark.parametrize("fmt", RAW_FORMATS)
def test_raw_chunk_by_chunk_equals_whole_signal(fmt):
    rate = 8000
    rng = np.random.default_rng(5)
    x = (0.4 * rng.standard_normal(rate)).clip(-1, 1).astype(np.float32)
    whole = RawEncoder(fmt, rate).encode(x)
    encoder = RawEncoder(fmt, rate)
    pieces = [encoder.encode(chunk) for chunk in chunked(x, rng, 1, 700)]
    assert b"".join(pieces) == whole
    assert len(whole) == x.size * (2 if fmt == "pcm" else 1)
    assert encoder.encode(np.zeros(0, np.float32)) == b""


def test_pcm_is_s16le():
    x = np.array([0.0, 0.5, -0.5, 1.0, -1.0], np.float32)
    assert RawEncoder("pcm", 24000).encode(x) == pcm16(x)
    assert np.frombuffer(pcm16(x), "<i2").tolist() == [0, 16384, -16384, 32767, -32768]


def test_raw_encoder_rejects_file_formats():
    with pytest.raises(ValueError):
        RawEncoder("wav", 24000)


# -- failures ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [22050, 44100])
def test_encoder_refusal_is_an_encoding_error(rate):
    """libopus takes 8/12/16/24/48 kHz only: handed 22.05 or 44.1 kHz (which the pipeline never
    does: opus is resampled to 48 kHz first), FFmpeg refuses, and that must come out as the
    product's EncodingError, not as a raw av.FFmpegError."""
    with pytest.raises(EncodingError, match="opus encoder failed") as caught:
        encode_file("opus", sine(rate, 0.1), rate)
    assert not isinstance(caught.value, av.FFmpegError)
    assert isinstance(caught.value.__cause__, av.FFmpegError)


def test_raw_encoder_failure_is_an_encoding_error(monkeypatch):
    encoder = RawEncoder("mulaw", 8000)

    class Broken:
        def encode(self, frame):
            raise av.error.InvalidDataError(1094995529, "Invalid data found when processing input")

    monkeypatch.setattr(encoder, "_codec", Broken())
    with pytest.raises(EncodingError, match="mulaw encoder failed"):
        encoder.encode(sine(8000, 0.01))


def test_adts_header_agrees_with_the_stream():
    """The AAC check decodes with PyAV (no other AAC decoder here); the ADTS header itself is
    read by hand: sync word, rate index and mono channel configuration."""
    data = encode_file("aac", probe_signal(16000), 16000)
    assert data[0] == 0xFF and data[1] & 0xF0 == 0xF0
    rate_index = (data[2] >> 2) & 0x0F
    rates = [96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350]
    assert rates[rate_index] == 16000
    assert (((data[2] & 0x01) << 2) | (data[3] >> 6)) == 1
    with av.open(io.BytesIO(data), format="aac") as container:
        assert container.streams.audio[0].codec_context.name == "aac"


# -- through the session (FakeEngine, the `speech` fixture) ------------------------------------------
#
# FakeEngine here: 3 chunks of 0.4 s (tones of 220, 240, 260 Hz at 24 kHz), so a segment is 1.2 s.
# Longer than one Ogg page, so the short-Opus bug above does not hide every other check of opus.


SEGMENT_CHUNKS, CHUNK_S = 3, 0.4
SEGMENT_S = SEGMENT_CHUNKS * CHUNK_S


def fake(**kwargs):
    return FakeEngine(**{"chunk_s": CHUNK_S, "chunks": SEGMENT_CHUNKS, **kwargs})


def engine_audio(engine):
    return np.concatenate([engine.tone(i) for i in range(engine.chunks)])


async def run_to_close(s, texts):
    for text in texts:
        await s.text(text)
    await s.send({"type": "input.done"})
    items = await s.t.until_closed()
    assert items[-1] == ("close", 1000)
    return items


def expected_rate(fmt, requested):
    if requested is None:
        requested = 8000 if fmt in ("mulaw", "alaw") else 24000  # the FakeEngine's native rate
    return output_rate(fmt, requested)


@pytest.mark.parametrize("rate", [None, *SAMPLE_RATES])
@pytest.mark.parametrize("fmt", codecs.FORMATS)
async def test_session_file_per_segment_at_the_announced_rate(speech, fmt, rate):
    engine = fake()
    config = {"response_format": fmt} | ({} if rate is None else {"sample_rate": rate})
    s = await speech(engine, **config)
    out_rate = expected_rate(fmt, rate)
    assert s.configured["sample_rate"] == out_rate
    assert s.configured["response_format"] == fmt and s.configured["stream_audio"] is False
    segments = check_segment_order(await run_to_close(s, ["Hello there. "]))
    (start, frames, done) = segments[0]
    assert (start["format"], start["sample_rate"]) == (fmt, out_rate)
    assert len(frames) == 1, "not streaming: one binary frame holding the whole segment"
    assert done["error"] is False and done["total_bytes"] == len(frames[0])

    data = frames[0]
    decoded = decode_raw(fmt, data, out_rate) if fmt in RAW_FORMATS else decode_file(fmt, data)
    assert decoded.rate == out_rate and decoded.channels == 1
    expected_samples = SEGMENT_S * out_rate
    low, high = LENGTH_TOLERANCE.get(fmt, (0, 0))
    assert low - 2 <= decoded.samples.size - expected_samples <= high + 2, (decoded.samples.size, expected_samples)
    # Independent reference: the engine's audio resampled as a whole by soxr (the pipeline
    # streams it chunk by chunk), then 16-bit as every format carries.
    source = engine_audio(engine)
    reference = source if out_rate == 24000 else soxr.resample(source, 24000, out_rate, quality="HQ")
    if fmt in ("pcm", "wav", "flac"):
        ints = np.round(decoded.samples * 32768).astype(np.int64)
        expected = np.frombuffer(pcm16(reference), "<i2").astype(np.int64)
        assert ints.size == expected.size
        assert np.max(np.abs(ints - expected)) <= 1, "lossless formats carry the resampled samples"
    else:
        lag = AAC_PRIMING if fmt == "aac" else 0
        y = decoded.samples[lag : lag + reference.size]
        # each 0.4 s chunk keeps its tone (its middle 0.2 s, away from the joins)
        for i, tone in enumerate((220.0, 240.0, 260.0)):
            part = y[int((i * CHUNK_S + 0.1) * out_rate) : int((i * CHUNK_S + 0.3) * out_rate)]
            assert abs(tone_frequency(part, out_rate) - tone) < 2.0, (i, tone_frequency(part, out_rate))
    await s.finish()


@pytest.mark.parametrize(
    "fmt,rate",
    [("mulaw", None), ("alaw", None), ("mulaw", 24000), ("alaw", 16000), ("pcm", 48000), ("pcm", 8000), ("pcm", 22050)],
)
async def test_session_streamed_raw_frames(speech, fmt, rate):
    engine = fake()
    config = {"response_format": fmt, "stream_audio": True} | ({} if rate is None else {"sample_rate": rate})
    s = await speech(engine, **config)
    out_rate = expected_rate(fmt, rate)
    assert s.configured["sample_rate"] == out_rate and s.configured["stream_audio"] is True
    segments = check_segment_order(await run_to_close(s, ["Hello there. "]))
    (start, frames, done) = segments[0]
    assert start["sample_rate"] == out_rate and start["format"] == fmt
    width = 2 if fmt == "pcm" else 1  # G.711: one byte a sample
    frame_bytes = int(out_rate * FRAME_S) * width
    assert len(frames) > 1
    assert len(frames[0]) <= int(out_rate * FIRST_FRAME_S) * width  # playback starts on a short frame
    assert all(len(frame) <= frame_bytes and len(frame) % width == 0 for frame in frames)
    data = b"".join(frames)
    assert done["total_bytes"] == len(data)
    samples = len(data) // width
    assert abs(samples - SEGMENT_S * out_rate) <= 2, (samples, SEGMENT_S * out_rate)
    source = engine_audio(engine)
    reference = source if out_rate == 24000 else soxr.resample(source, 24000, out_rate, quality="HQ")
    reference = np.frombuffer(pcm16(reference), "<i2")
    decoded = pcm16_ints(data) if fmt == "pcm" else g711_ints(fmt, data)
    n = min(decoded.size, reference.size)
    error = np.abs(decoded[:n].astype(np.float64) - reference[:n])
    bound = np.ones(n) if fmt == "pcm" else g711_bound(reference[:n])
    assert np.all(error <= bound), f"chunk-by-chunk stream differs from the whole-signal reference by {error.max()}"
    await s.finish()


@pytest.mark.parametrize("fmt", sorted(FILE_FORMATS))
async def test_session_each_segment_is_its_own_file(speech, fmt):
    engine = fake()
    s = await speech(engine, response_format=fmt, sample_rate=16000)
    segments = check_segment_order(await run_to_close(s, ["One. Two. Three. "]))
    assert sorted(segments) == [0, 1, 2]
    out_rate = output_rate(fmt, 16000)
    for index, (start, frames, done) in segments.items():
        assert start["sentence_text"] == ["One.", "Two.", "Three."][index]
        assert len(frames) == 1 and done["error"] is False
        decoded = decode_file(fmt, frames[0])  # alone: no state from the segment before
        assert decoded.rate == out_rate and decoded.channels == 1
        assert decoded.samples.size >= SEGMENT_S * out_rate - 2
    await s.finish()


async def test_session_encoder_failure_fails_only_that_segment(speech, monkeypatch):
    import speech.audio.output as output

    real = output.encode_file
    calls = []

    def flaky(fmt, samples, rate):
        calls.append(samples.size)
        if len(calls) == 1:
            raise EncodingError("wav encoder failed: boom")
        return real(fmt, samples, rate)

    monkeypatch.setattr(output, "encode_file", flaky)
    engine = fake()
    s = await speech(engine, response_format="wav")
    session_id = s.session.session_id
    items = await run_to_close(s, ["First one. Second one. "])
    assert items[0] == (
        "json",
        {
            "type": "error",
            "message": "wav encoder failed: boom",
            "error_type": "server_error",
            "id": f"{session_id}-0",
            "sentence_index": 0,
        },
    )
    assert items[1] == (
        "json",
        {"type": "audio.done", "id": f"{session_id}-0", "sentence_index": 0, "total_bytes": 0, "error": True, "cancelled": False},
    )
    segments = check_segment_order(items)
    start, frames, done = segments[1]
    assert start["sentence_text"] == "Second one." and done["error"] is False
    decoded = decode_file("wav", frames[0])
    assert decoded.samples.size == round(SEGMENT_S * 24000)
    assert len(calls) == 2
    assert items[-2][1] == {"type": "session.done", "session_id": session_id, "total_sentences": 2}
    await s.finish()


async def test_session_speed_is_stretched_when_the_engine_cannot(speech):
    """An engine without rate control (native range (1, 1)): the pipeline's chain does speed 2.0."""
    engine = fake(speed_range=(1.0, 1.0))
    s = await speech(engine, response_format="pcm", speed=2.0, sample_rate=16000)
    segments = check_segment_order(await run_to_close(s, ["Hello there. "]))
    (start, frames, done) = segments[0]
    samples = pcm16_ints(frames[0]).astype(np.float32) / 32768.0
    assert abs(samples.size / 16000 - SEGMENT_S / 2) <= 0.05 * SEGMENT_S / 2
    assert [r.speed for r in engine.requests] == [1.0]
    # the first tone (220 Hz, now 0.2 s long) keeps its pitch
    assert abs(tone_frequency(samples[int(0.03 * 16000) : int(0.17 * 16000)], 16000) - 220.0) < 3.0
    await s.finish()


async def test_session_speed_goes_to_an_engine_that_can(speech):
    engine = fake()  # native 0.25-4.0: nothing left to stretch
    s = await speech(engine, response_format="pcm", speed=SPEED_MAX)
    segments = check_segment_order(await run_to_close(s, ["Hello there. "]))
    assert [r.speed for r in engine.requests] == [SPEED_MAX]
    assert segments[0][1][0] == pcm16(engine_audio(engine))
    await s.finish()


async def test_session_default_rate_is_the_engines(speech):
    s = await speech(fake(sample_rate=22050))
    assert s.configured["sample_rate"] == 22050
    s2 = await speech(fake(sample_rate=22050), response_format="alaw")
    assert s2.configured["sample_rate"] == 8000
    s3 = await speech(fake(sample_rate=22050), response_format="opus", sample_rate=8000)
    assert s3.configured["sample_rate"] == 48000
    for h in (s, s2, s3):
        await h.finish()


BAD_CONFIGS = [
    (
        "unknown-format",
        {"response_format": "ogg"},
        "response_format must be one of: aac, alaw, flac, mp3, mulaw, opus, pcm, wav",
        "response_format",
    ),
    ("format-not-a-string", {"response_format": 3}, "response_format must be a string", "response_format"),
    (
        "unknown-rate",
        {"sample_rate": 11025},
        "sample_rate must be one of: 8000, 16000, 22050, 24000, 44100, 48000",
        "sample_rate",
    ),
    (
        "rate-for-mulaw",
        {"response_format": "mulaw", "sample_rate": 32000},
        "sample_rate must be one of: 8000, 16000, 22050, 24000, 44100, 48000",
        "sample_rate",
    ),
    ("rate-float", {"sample_rate": 8000.0}, "sample_rate must be an integer", "sample_rate"),
    ("rate-bool", {"sample_rate": True}, "sample_rate must be an integer", "sample_rate"),
    ("speed-low", {"speed": 0.2499}, "speed must be between 0.25 and 4.0", "speed"),
    ("speed-high", {"speed": 4.0001}, "speed must be between 0.25 and 4.0", "speed"),
    ("speed-zero", {"speed": 0}, "speed must be between 0.25 and 4.0", "speed"),
    ("speed-negative", {"speed": -1}, "speed must be between 0.25 and 4.0", "speed"),
    ("speed-string", {"speed": "2"}, "speed must be a number", "speed"),
    (
        "stream-wav",
        {"response_format": "wav", "stream_audio": True},
        "stream_audio=true requires a streamable response_format (pcm, mulaw, alaw, mp3, opus, aac)",
        "response_format",
    ),
    (
        "stream-flac",
        {"response_format": "flac", "stream_audio": True},
        "stream_audio=true requires a streamable response_format (pcm, mulaw, alaw, mp3, opus, aac)",
        "response_format",
    ),
]


@pytest.mark.parametrize("config,message,param", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
async def test_session_bad_audio_config_is_fatal(speech, config, message, param):
    engine = fake()
    s = await speech(engine, configure=False)
    await s.send({"type": "session.config", "session": config})
    assert await s.t.event("error") == {
        "type": "error",
        "message": message,
        "error_type": "BadRequestError",
        "param": param,
        "code": 400,
    }
    await s.t.closed(4008)
    assert engine.requests == []
    await s.finish()


@pytest.mark.parametrize(
    "config,expected",
    [
        ({"speed": SPEED_MIN}, {"sample_rate": 24000}),
        ({"speed": SPEED_MAX, "response_format": " MP3 "}, {"response_format": "mp3"}),
        ({"speed": 1, "response_format": "Opus", "sample_rate": 22050}, {"response_format": "opus", "sample_rate": 48000}),
        ({"response_format": "MULAW", "stream_audio": True}, {"response_format": "mulaw", "sample_rate": 8000}),
        ({"response_format": "alaw", "sample_rate": 44100}, {"sample_rate": 44100}),
        ({"sample_rate": None, "speed": None}, {"sample_rate": 24000}),  # null skips: defaults
    ],
)
async def test_session_good_audio_config(speech, config, expected):
    s = await speech(fake(), **config)
    for key, value in expected.items():
        assert s.configured[key] == value, (key, s.configured)
    await s.finish()


async def test_session_short_opus_segment_is_a_decodable_file(speech):
    """What a client sees of the granule bug: a 0.1 s segment (FakeEngine's default two 50 ms
    chunks) in opus arrives as a file that libsndfile refuses or decodes 312 samples too long."""
    engine = FakeEngine()
    s = await speech(engine, response_format="opus")
    segments = check_segment_order(await run_to_close(s, ["Hi. "]))
    decoded = decode_file("opus", segments[0][1][0])
    assert decoded.rate == 48000
    assert decoded.samples.size == round(0.1 * 48000)
    await s.finish()
