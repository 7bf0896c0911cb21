"""speech.audio.signal on plain numpy signals: trim_silence, normalise, pcm16."""

from __future__ import annotations

import numpy as np
import pytest

from speech.audio import signal as audio

RATE = 24000
MS = RATE // 1000  # samples per millisecond


def tone(seconds, amplitude=0.5, freq=220.0, rate=RATE):
    """A cosine: loud from its very first sample, so the sound's onset is exact."""
    t = np.arange(int(round(seconds * rate)), dtype=np.float32) / rate
    return (amplitude * np.cos(2 * np.pi * freq * t)).astype(np.float32)


def silence(seconds, rate=RATE):
    return np.zeros(int(round(seconds * rate)), dtype=np.float32)


def noise_floor(seconds, level=1e-3, seed=0):
    return (np.random.default_rng(seed).uniform(-level, level, int(round(seconds * RATE)))).astype(np.float32)


def sound_bounds(samples, threshold):
    loud = np.flatnonzero(np.abs(samples) > threshold)
    return int(loud[0]), int(loud[-1])


# -- trim_silence ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lead_s,tail_s", [(0.3, 0.5), (0.5, 1.0), (0.05, 0.3), (1.0, 0.0)], ids=["hibari-like", "long", "short", "no-tail"]
)
def test_trim_cuts_leading_and_trailing_silence(lead_s, tail_s):
    body = tone(0.4)
    samples = np.concatenate([silence(lead_s), body, silence(tail_s)])
    out = audio.trim_silence(samples, RATE)
    first, last = sound_bounds(out, 0.01)
    assert first <= 20 * MS  # at most 20 ms before the first sound (the contract allows < 100 ms)
    assert out.size - 1 - last <= 250 * MS  # at most 250 ms after the last sound
    # The sound itself is kept untouched between the fades.
    middle = out[first + 10 * MS : last - 10 * MS]
    assert np.max(np.abs(middle)) == pytest.approx(0.5, abs=1e-3)
    assert out.dtype == np.float32


@pytest.mark.parametrize(
    "lead_s,body_s", [(0.3051, 0.4003), (0.2999, 0.1234), (0.0071, 0.2)], ids=["mid-frame", "frame-end", "tiny-lead"]
)
def test_trim_with_onsets_between_gate_frames(lead_s, body_s):
    # The gate works in 10 ms frames, so a cut can keep up to one frame more than the nominal
    # 20 ms / 250 ms; still far inside the contract's "under 100 ms of silence before speech".
    samples = np.concatenate([silence(lead_s), tone(body_s), silence(0.6)])
    out = audio.trim_silence(samples, RATE)
    first, last = sound_bounds(out, 0.01)
    frame = int(RATE * audio.GATE_FRAME_S)
    assert first <= 20 * MS + frame
    assert out.size - 1 - last <= 250 * MS + frame


def test_trim_keeps_a_short_pre_roll_and_tail():
    samples = np.concatenate([silence(0.5), tone(0.2), silence(1.0)])
    out = audio.trim_silence(samples, RATE)
    first, last = sound_bounds(out, 1e-6)
    assert 10 * MS <= first <= 20 * MS  # the attack is not cut
    assert 200 * MS <= out.size - 1 - last <= 250 * MS  # a natural pause is kept


def test_trim_with_a_noise_floor():
    samples = np.concatenate([noise_floor(0.4), tone(0.3), noise_floor(0.6, seed=1)])
    out = audio.trim_silence(samples, RATE)
    first, last = sound_bounds(out, 0.05)
    assert first <= 20 * MS
    assert out.size - 1 - last <= 250 * MS
    assert out.size < samples.size


def test_trim_fades_at_the_cut_points():
    # Cut points fall where a constant non-silent level is: without a fade the output would jump.
    samples = np.concatenate(
        [np.full(RATE, 0.02, np.float32), np.full(RATE // 2, 0.8, np.float32), np.full(RATE, 0.02, np.float32)]
    )
    out = audio.trim_silence(samples, RATE)
    assert out.size < samples.size
    assert out[0] == 0.0 and out[-1] == 0.0  # ramps start and end at zero: no click
    fade = int(RATE * audio.FADE_S)
    assert np.all(np.abs(np.diff(out[:fade])) <= 0.02 / (fade - 1) + 1e-6)


def test_trim_does_not_fade_an_edge_that_was_not_cut():
    samples = np.concatenate([tone(0.2), silence(1.0)])  # sound from the very first sample
    out = audio.trim_silence(samples, RATE)
    assert np.array_equal(out[: 10 * MS], samples[: 10 * MS])


@pytest.mark.parametrize(
    "samples", [silence(1.0), np.zeros(0, np.float32), noise_floor(0.5, level=5e-5)], ids=["zeros", "empty", "below-threshold"]
)
def test_trim_all_silence_is_empty(samples):
    out = audio.trim_silence(samples, RATE)
    assert out.size == 0


def test_trim_keeps_sound_that_fills_the_whole_signal():
    samples = tone(0.3)
    assert np.array_equal(audio.trim_silence(samples, RATE), samples)


def test_trim_keeps_sound_in_a_signal_shorter_than_a_gate_frame():
    # Regression: sample indexes were taken for gate-frame indexes, and the sound was trimmed away.
    samples = np.zeros(5 * MS, np.float32)  # 5 ms
    samples[2 * MS :] = 0.5
    out = audio.trim_silence(samples, RATE)
    assert np.max(np.abs(out)) == pytest.approx(0.5)


def test_trim_keeps_sound_in_the_last_partial_gate_frame():
    # Regression: the last partial gate frame was ignored, so this signal was trimmed to nothing.
    samples = np.zeros(1000, np.float32)  # 4 full 240-sample frames + 40 samples
    samples[970:] = 0.5
    out = audio.trim_silence(samples, RATE)
    assert out.size and np.max(np.abs(out)) == pytest.approx(0.5)


# -- normalise -------------------------------------------------------------------------------------


def sounding_rms(samples):
    peak = np.max(np.abs(samples))
    sounding = samples[np.abs(samples) > peak * audio.GATE_RELATIVE]
    return float(np.sqrt(np.mean(np.square(sounding, dtype=np.float64))))


@pytest.mark.parametrize("amplitude", [0.01, 0.05, 0.3, 0.9])
def test_normalise_reaches_the_target_rms(amplitude):
    samples = np.concatenate([silence(0.2), tone(0.5, amplitude), silence(0.2)])
    out = audio.normalise(samples)
    assert sounding_rms(out) == pytest.approx(audio.TARGET_RMS, rel=1e-3)
    assert np.max(np.abs(out)) <= audio.PEAK_CEILING
    assert out.dtype == np.float32 and out.size == samples.size


def test_normalise_never_passes_the_peak_ceiling():
    # Mostly a low level with one spike: the RMS target alone would push the spike to clipping.
    samples = np.full(RATE, 0.06, np.float32)
    samples[::2] *= -1
    samples[RATE // 2] = 1.0
    out = audio.normalise(samples)
    assert np.max(np.abs(out)) == pytest.approx(audio.PEAK_CEILING, rel=1e-6)
    assert sounding_rms(out) < audio.TARGET_RMS


def test_normalise_keeps_the_shape():
    samples = tone(0.3, 0.2)
    out = audio.normalise(samples)
    ratio = out[np.abs(samples) > 0.01] / samples[np.abs(samples) > 0.01]
    assert np.allclose(ratio, ratio[0], rtol=1e-5)


@pytest.mark.parametrize(
    "samples", [np.zeros(0, np.float32), silence(0.1), noise_floor(0.1, level=5e-5)], ids=["empty", "zeros", "below-threshold"]
)
def test_normalise_leaves_silence_alone(samples):
    out = audio.normalise(samples)
    assert np.array_equal(out, samples)


# -- pcm16 and wav ---------------------------------------------------------------------------------


def test_pcm16_values_and_little_endian():
    samples = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1e-6], dtype=np.float32)
    data = audio.pcm16(samples)
    assert len(data) == 2 * samples.size
    assert np.frombuffer(data, "<i2").tolist() == [0, 16384, -16384, 32767, -32768, 0]
    assert data[6:8] == b"\xff\x7f"  # 32767, low byte first


@pytest.mark.parametrize(
    "value,expected",
    [(1.5, 32767), (-1.5, -32768), (100.0, 32767), (-100.0, -32768), (np.inf, 32767), (-np.inf, -32768)],
    ids=["1.5", "-1.5", "100", "-100", "inf", "-inf"],
)
def test_pcm16_clips(value, expected):
    assert np.frombuffer(audio.pcm16(np.array([value], np.float32)), "<i2")[0] == expected


def test_quantise_gives_int16_and_leaves_its_input_and_16_bit_samples_alone():
    samples = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, 2.6 / 32768, -0.4 / 32768], np.float32)
    before = samples.copy()
    ints = audio.quantise(samples)
    assert ints.dtype == np.dtype("<i2")
    assert ints.tolist() == [0, 16384, -16384, 32767, -32768, 32767, 3, 0]
    assert np.array_equal(samples, before)  # rounded and saturated in an array of its own
    assert audio.quantise(ints) is ints
    assert audio.pcm16(ints) == ints.tobytes()


def test_pcm16_empty():
    assert audio.pcm16(np.zeros(0, np.float32)) == b""


def test_pcm16_round_trips_every_16_bit_value():
    """Reading s16 as n / 32768 and writing it back gives the same bytes (an upstream's PCM passes
    through an instance unchanged)."""
    ints = np.arange(-32768, 32768, dtype="<i2")
    assert audio.pcm16(ints.astype(np.float32) / 32768.0) == ints.tobytes()
