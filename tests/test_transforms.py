"""speech.audio.transforms: streaming resampling, pitch-preserving time-stretch, the speed plan, the chain.

Streamed chunk by chunk with random chunk sizes (some of one sample), as the pipeline feeds engine
chunks. Tolerances:
* chunked vs whole-signal soxr: 1e-6 (float32 rounding; soxr's stream is in fact bit-identical);
* length: within 2 samples of in_samples * out_rate / in_rate;
* no clicks: the largest sample-to-sample step of a resampled sine A sin(2 pi f t) is at most
  A * 2 pi f / rate (its steepest slope times one sample) plus 2 % for the filter's ripple, away from
  the signal's first and last 10 ms (where the abrupt start and end of the test tone ring);
* time-stretch: duration within 5 % of input / factor, fundamental within 5 % of 150 Hz.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import soxr

from speech.audio.transforms import ATEMPO_MIN, Chain, Resampler, TimeStretch, plan_speed
from speech.stream.messages import SAMPLE_RATES, SPEED_MAX, SPEED_MIN

from .support.decoders import (
    autocorr_f0,
    chunked,
    harmonic,
    max_jump,
    median_f0,
    sine,
    sound_duration,
    sound_span,
    tone_frequency,
)

ENGINE_RATE = 24000


def run_stream(step, samples, rng, low=1, high=4000):
    parts = [step.process(chunk) for chunk in chunked(samples, rng, low, high)]
    parts.append(step.flush())
    for part in parts:
        assert part.dtype == np.float32 and part.ndim == 1
    return np.concatenate(parts)


# -- Resampler -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("out_rate", SAMPLE_RATES)
def test_resampler_chunked_equals_whole_signal(out_rate):
    rng = np.random.default_rng(out_rate)
    x = (0.3 * rng.standard_normal(ENGINE_RATE * 2)).clip(-1, 1).astype(np.float32)
    x += sine(ENGINE_RATE, 2.0, 440.0, 0.3)
    whole = soxr.resample(x, ENGINE_RATE, out_rate, quality="HQ")
    streamed = run_stream(Resampler(ENGINE_RATE, out_rate), x, rng)
    expected_length = x.size * out_rate / ENGINE_RATE
    assert abs(streamed.size - expected_length) <= 2, (streamed.size, expected_length)
    assert abs(whole.size - streamed.size) <= 2
    n = min(whole.size, streamed.size)
    assert np.max(np.abs(streamed[:n] - whole[:n])) <= 1e-6


@pytest.mark.parametrize("out_rate", SAMPLE_RATES)
def test_resampled_sine_has_no_clicks_and_keeps_its_pitch(out_rate):
    rng = np.random.default_rng(out_rate + 1)
    freq, amplitude = 440.0, 0.5
    x = sine(ENGINE_RATE, 1.5, freq, amplitude)
    y = run_stream(Resampler(ENGINE_RATE, out_rate), x, rng, 1, 2000)
    edge = int(0.01 * out_rate)
    interior = y[edge:-edge]
    bound = amplitude * 2 * math.pi * freq / out_rate * 1.02
    assert max_jump(interior) <= bound, f"largest step {max_jump(interior):.5f} > {bound:.5f}"
    assert abs(tone_frequency(interior, out_rate) - freq) < 1.0
    assert abs(np.max(np.abs(interior)) - amplitude) < 0.01  # no gain change, no gaps


def test_resampler_with_tiny_chunks_and_empty_ones():
    rng = np.random.default_rng(3)
    x = sine(ENGINE_RATE, 0.2, 300.0)
    resampler = Resampler(ENGINE_RATE, 8000)
    parts = []
    for chunk in chunked(x, rng, 1, 5):
        parts.append(resampler.process(chunk))
        parts.append(resampler.process(np.zeros(0, np.float32)))
    parts.append(resampler.flush())
    y = np.concatenate(parts)
    whole = soxr.resample(x, ENGINE_RATE, 8000, quality="HQ")
    assert abs(y.size - x.size / 3) <= 2
    n = min(y.size, whole.size)
    assert np.max(np.abs(y[:n] - whole[:n])) <= 1e-6


# -- TimeStretch --------------------------------------------------------------------------------------

F0 = 150.0


def check_stretch(y, seconds, factor, rate=ENGINE_RATE):
    expected = seconds / factor
    assert abs(y.size / rate - expected) <= 0.05 * expected, f"{y.size / rate:.3f} s, expected {expected:.3f} s"
    # The fundamental, measured over the steady middle (each 100 ms window, then all of them).
    middle = y[int(0.1 * y.size) : int(0.9 * y.size)]
    window = int(0.1 * rate)
    estimates = [autocorr_f0(middle[i : i + window], rate) for i in range(0, middle.size - window, window)]
    assert estimates, "nothing to measure"
    for f0 in estimates:
        assert abs(f0 - F0) <= 0.05 * F0, f"F0 {f0:.1f} Hz in a window, expected {F0}"
    # And pitch, not just period: the harmonics are still where they were.
    assert abs(tone_frequency(middle, rate) - F0) <= 0.05 * F0


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_time_stretch_scales_duration_and_keeps_pitch(factor):
    seconds = 2.0
    x = harmonic(ENGINE_RATE, seconds, F0)
    y = run_stream(TimeStretch(ENGINE_RATE, factor), x, np.random.default_rng(int(factor * 10)), 1, 3000)
    check_stretch(y, seconds, factor)


@pytest.mark.parametrize("speed", [SPEED_MIN, SPEED_MAX])
def test_extreme_speeds_through_plan_and_chain(speed):
    """0.25 and 4.0 on an engine that has no rate control of its own: all of it is the stretch
    (0.25 takes two atempo stages, atempo's minimum being 0.5)."""
    engine_speed, stretch = plan_speed(speed, (1.0, 1.0))
    assert (engine_speed, stretch) == (1.0, speed)
    seconds = 2.0
    x = harmonic(ENGINE_RATE, seconds, F0)
    chain = Chain(ENGINE_RATE, ENGINE_RATE, stretch)
    assert len(chain.steps) == 1 and isinstance(chain.steps[0], TimeStretch)
    y = run_stream(chain, x, np.random.default_rng(7), 1, 3000)
    check_stretch(y, seconds, speed)


def test_time_stretch_is_pitch_preserving_not_resampling():
    """A plain resampler would change 150 Hz into 300 Hz at factor 2.0: the check catches that."""
    seconds = 2.0
    x = harmonic(ENGINE_RATE, seconds, F0)
    fake = soxr.resample(x, ENGINE_RATE, ENGINE_RATE // 2)  # half the samples, played at 24 kHz
    with pytest.raises(AssertionError, match="F0"):
        check_stretch(fake, seconds, 2.0)


def test_time_stretch_flush_without_input():
    stretch = TimeStretch(ENGINE_RATE, 2.0)
    assert stretch.process(np.zeros(0, np.float32)).size == 0
    assert stretch.flush().size == 0


# -- plan_speed ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "speed,native,expected",
    [
        (1.0, (1.0, 1.0), (1.0, 1.0)),
        (0.25, (1.0, 1.0), (1.0, 0.25)),
        (4.0, (1.0, 1.0), (1.0, 4.0)),
        (2.0, (1.0, 1.0), (1.0, 2.0)),
        (1.0, (0.5, 2.0), (1.0, 1.0)),
        (0.5, (0.5, 2.0), (0.5, 1.0)),
        (2.0, (0.5, 2.0), (2.0, 1.0)),
        (1.3, (0.5, 2.0), (1.3, 1.0)),
        (0.25, (0.5, 2.0), (0.5, 0.5)),
        (4.0, (0.5, 2.0), (2.0, 2.0)),
        (3.0, (0.5, 2.0), (2.0, 1.5)),
        (0.3, (0.5, 2.0), (0.5, 0.6)),
        (0.25, (0.25, 4.0), (0.25, 1.0)),
        (4.0, (0.25, 4.0), (4.0, 1.0)),
    ],
)
def test_plan_speed_table(speed, native, expected):
    engine_speed, stretch = plan_speed(speed, native)
    assert engine_speed == pytest.approx(expected[0]) and stretch == pytest.approx(expected[1])
    assert native[0] <= engine_speed <= native[1]
    assert engine_speed * stretch == pytest.approx(speed)  # together they make the speed asked for


def test_atempo_stage_floor_is_ffmpegs():
    assert ATEMPO_MIN == 0.5


# -- Chain --------------------------------------------------------------------------------------------


def test_chain_identity_and_steps():
    assert Chain(24000, 24000).identity
    assert Chain(24000, 24000, 1.0).steps == []
    only_resample = Chain(24000, 8000)
    assert [type(s) for s in only_resample.steps] == [Resampler]
    both = Chain(24000, 48000, 0.5)
    assert [type(s) for s in both.steps] == [TimeStretch, Resampler]  # stretch at the engine's rate, then resample
    assert not both.identity


@pytest.mark.parametrize("out_rate,factor", [(24000, 1.0), (24000, 1.0 + 1e-12), (24000, 1.5), (16000, 1.0), (48000, 0.5)])
def test_chain_needed_says_what_the_built_chain_does(out_rate, factor):
    assert Chain.needed(24000, out_rate, factor) is not Chain(24000, out_rate, factor).identity


@pytest.mark.parametrize("out_rate,factor", [(8000, 2.0), (48000, 0.5), (44100, 4.0), (16000, 0.25)])
def test_chain_stretch_then_resample(out_rate, factor):
    seconds = 2.0
    x = harmonic(ENGINE_RATE, seconds, F0)
    y = run_stream(Chain(ENGINE_RATE, out_rate, factor), x, np.random.default_rng(out_rate), 1, 3000)
    check_stretch(y, seconds, factor, rate=out_rate)


def test_chain_flush_passes_the_stretch_tail_through_the_resampler():
    """Whatever the stretch still holds at the end must come out at the output rate, not the engine's."""
    x = harmonic(ENGINE_RATE, 0.5, F0)
    chain = Chain(ENGINE_RATE, 8000, 0.5)
    body = chain.process(x)
    tail = chain.flush()
    total = body.size + tail.size
    assert abs(total / 8000 - 1.0) <= 0.05, f"{total / 8000:.3f} s at 8 kHz for 0.5 s stretched 2x"
    assert tail.size > 0


# -- the measuring tools themselves (tests/support/decoders.py), so the checks above and the live ones can be trusted


@pytest.mark.parametrize("f0", [90.0, 150.0, 210.0, 320.0])
def test_f0_estimators_find_the_fundamental(f0):
    x = harmonic(ENGINE_RATE, 1.0, f0, harmonics=8)
    assert abs(autocorr_f0(x, ENGINE_RATE) - f0) <= 0.01 * f0
    # A pulse train with a 2 % vibrato (a crude vowel) for the per-frame tracker used on speech.
    t = np.arange(ENGINE_RATE) / ENGINE_RATE
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.02 * np.sin(2 * np.pi * 5 * t))) / ENGINE_RATE
    pulses = np.sign(np.sin(phase)) * 0.3
    assert abs(median_f0(pulses.astype(np.float32), ENGINE_RATE) - f0) <= 0.02 * f0


def test_sound_span_ignores_quiet_edges():
    rate = 8000
    quiet = np.zeros(rate // 2, np.float32) + np.float32(1e-4)
    x = np.concatenate([quiet, harmonic(rate, 1.25, 150.0), quiet])
    start, end = sound_span(x, rate)
    assert abs(start - 0.5) <= 0.011 and abs(end - 1.75) <= 0.011
    assert abs(sound_duration(x, rate) - 1.25) <= 0.02
