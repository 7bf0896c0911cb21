"""Hibari's vocoder as this engine runs it (speech/engines/hibari_vocoder.py), with the real model.

One push of a whole part makes `dsp.synth`'s samples (but for the noise); the noise it reads from its
table is standard Gaussian, independent from sample to sample, the same for the same seed and
elsewhere for another, and wraps round the table's end; a push whose job is abandoned (its client hung
up) stops at its next step.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from speech.engines import hibari_vocoder
from speech.engines.hibari_vocoder import NOISE_SAMPLES, Vocoder, noise, noise_table
from speech.engines.jobs import JobAbandoned
from speech.engines.pool import SynthesisPool
from speech.stream.engine import Ticket

SENTENCE = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch."
GUARD_S = 5


@pytest.fixture(scope="module")
def params(hibari):
    """The model's vocoder parameters for SENTENCE (each [601, F] float32, f0 [F])."""
    tts = hibari._models[hibari.capabilities.default_voice]
    ids = tts.ids(tts.phonemize(SENTENCE)[0])
    return [o[0] for o in tts.sess.run(None, {"ids": np.asarray([ids]), "speed": np.asarray([1.0], np.float32)})[:6]]


def test_one_push_of_a_whole_part_makes_the_samples_of_dsp_synth(params):
    from hibari import dsp

    quiet = [*params[:2], np.full_like(params[2], -50.0), *params[3:]]  # no noise: the rest is deterministic
    whole = dsp.synth(*quiet, np.random.default_rng(0))
    pushed = Vocoder(np.random.default_rng(1)).push(quiet, final=True)
    assert pushed.size == whole.size and np.allclose(pushed, whole, atol=1e-6)
    with_noise = Vocoder(np.random.default_rng(1)).push(params, final=True)
    assert with_noise.size == whole.size and not np.allclose(with_noise, pushed, atol=1e-4)


def test_the_noise_is_standard_gaussian_and_independent_from_sample_to_sample():
    drawn = noise(np.random.default_rng(0), 1 << 20).astype(np.float64)
    assert abs(drawn.mean()) < 0.01 and abs(drawn.std() - 1) < 0.01
    assert abs(np.mean(drawn**4) - 3) < 0.05  # a Gaussian's kurtosis
    assert abs(np.corrcoef(drawn[:-1], drawn[1:])[0, 1]) < 0.01
    assert abs(np.corrcoef(drawn[:-601], drawn[601:])[0, 1]) < 0.01  # a bin's next frame in a push


def test_the_same_seed_gives_the_same_noise_and_another_seed_other_noise(params):
    first = Vocoder(np.random.default_rng(5)).push(params, final=True)
    assert np.array_equal(first, Vocoder(np.random.default_rng(5)).push(params, final=True))
    assert not np.allclose(first, Vocoder(np.random.default_rng(6)).push(params, final=True), atol=1e-4)


class _At:
    """A random generator whose every pick is `start`."""

    def __init__(self, start):
        self.start = start

    def integers(self, high):
        return self.start


@pytest.mark.parametrize("count", [30, NOISE_SAMPLES + 25])
def test_noise_past_the_tables_end_goes_on_from_its_start(count):
    table = noise_table()
    drawn = noise(_At(NOISE_SAMPLES - 10), count)
    rounds, rest = divmod(count - 10, NOISE_SAMPLES)
    assert np.array_equal(drawn, np.concatenate([table[-10:], *[table] * rounds, table[:rest]]))


def test_the_table_cannot_be_written_through_what_a_push_reads():
    with pytest.raises(ValueError):
        noise(np.random.default_rng(0), 8)[0] = 1.0
    assert not hibari_vocoder.noise_table().flags.writeable


async def test_a_job_abandoned_while_its_part_is_vocoded_stops_at_the_pushs_next_step(params, monkeypatch):
    """The client hangs up while the pulses are made: the push stops before its spectra and its
    overlap-add, on the job's thread, and the job ends as stopped."""
    pool = SynthesisPool(1, "vocoder-test", release_points=True)
    left = Ticket()
    vocoder = Vocoder(np.random.default_rng(0))
    steps, ended = [], threading.Event()
    make_pulses, spectra = vocoder._extend_pulses, hibari_vocoder.noise

    def pulses(*args):
        make_pulses(*args)
        steps.append("pulses")
        left.abandon()  # the hang-up, read by the event loop meanwhile

    monkeypatch.setattr(vocoder, "_extend_pulses", pulses)
    monkeypatch.setattr(hibari_vocoder, "noise", lambda *args: steps.append("noise") or spectra(*args))
    monkeypatch.setattr(vocoder, "_overlap_add", lambda *args: steps.append("overlap-add"))

    def run():
        try:
            vocoder.push(params, final=True)
        except JobAbandoned:
            steps.append("stopped")
            raise
        finally:
            ended.set()

    try:
        pool.submit(run, ticket=left)
        assert await asyncio.to_thread(ended.wait, GUARD_S)
        assert steps == ["pulses", "stopped"]
    finally:
        pool.shutdown()
