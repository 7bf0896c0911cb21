"""Hibari's vocoder (`hibari.dsp.synth`), as this engine runs it for every part: frame by frame, stoppable,
with its noise read from a table.

* Frame by frame (`Vocoder.push`): the frames pushed so far make the samples one call on them all
  makes; a first piece (speech/engines/hibari_pieces.py) goes out before the rest is made. One push of
  a whole part is the samples of `dsp.synth` (tests/test_vocoder.py).
* Stoppable: a job abandoned while its part is vocoded (its client hung up) stops at the push's next
  step (`release_point`), within about a millisecond, instead of running the push to its end on a core
  a newcomer wants (bench/hangup.py).
* The noise: `dsp.synth` draws a fresh Gaussian for every bin of every frame, which was 40 % of the
  vocoder's time; here a push reads that many samples of one Gaussian table made once per process,
  from a place its random generator picks (`noise`): the same noise in every respect a listener
  or a test can tell, the same seed giving the same audio (docs/decisions.md, "Hibari's vocoder: its
  noise read from a table").
"""

from __future__ import annotations

import threading

import numpy as np

from .jobs import release_point

NOISE_SAMPLES = 1 << 21  # the table: 8 MiB of float32, longer than a long sentence's noise (~1.4 M samples for 15 s)
NOISE_SEED = 20261207
_table: np.ndarray | None = None
_table_made = threading.Lock()


def noise_table() -> np.ndarray:
    """The process's Gaussian table (read-only), made on first use: the engine makes it as it loads."""
    global _table
    with _table_made:
        if _table is None:
            table = np.random.default_rng(NOISE_SEED).standard_normal(NOISE_SAMPLES, dtype=np.float32)
            table.flags.writeable = False
            _table = table
    return _table


def noise(rng, count: int) -> np.ndarray:
    """`count` standard Gaussian float32 samples (read-only): the table's from a place `rng` picks, wrapping
    round its end."""
    table = noise_table()
    start = int(rng.integers(NOISE_SAMPLES))
    if start + count <= NOISE_SAMPLES:
        return table[start : start + count]
    head = table[start:]
    return np.concatenate((head, np.resize(table, count - head.size)))


class Vocoder:
    """`hibari.dsp.synth` frame by frame: the frames pushed so far make the same samples as one call on
    them all would (but for the noise, `noise`, read push by push), those not yet final (the
    overlap-add's last three hops) held back until the next push. On a synthesis thread each push stops
    between its steps if its job has been abandoned (`JobAbandoned`).

    A push that is not final brings f0 for two frames more than the others: the pulse train under the
    last frame's analysis window reaches two hops past it (frame k's window spans pulse frames k-2..k+1,
    and a pulse frame's samples interpolate f0 with the next frame's)."""

    def __init__(self, rng):
        from hibari import dsp

        self._dsp = dsp
        self._rng = rng
        self._frames = 0  # frames pushed
        self._cycles = 0.0  # the pulse train's phase in cycles (float64 running sum, as dsp.pulses keeps it)
        self._made = 0  # pulse frames made
        self._f0_tail: np.ndarray | None = None  # f0 of the last pulse frame made and of the next
        self._pulses = np.zeros(0, np.float32)  # pulse samples from the next frame's window start on
        self._open = np.zeros((3, dsp.HOP), np.float32)  # overlap-add hops not yet complete

    def push(self, params, *, final: bool) -> np.ndarray:
        d = self._dsp
        lh, th, ln, lr, phi, f0 = params
        count = lh.shape[1]
        self._extend_pulses(f0, count, final)
        release_point()
        # The analysis windows of the frames pushed: frame k spans pulse samples (k - 2) * HOP ... (k + 2) * HOP.
        windows = np.lib.stride_tricks.sliding_window_view(self._pulses, d.N_FFT)[:: d.HOP][:count] * d.WIN_SRC
        self._pulses = self._pulses[count * d.HOP :].copy()  # a view would keep all the pulses made alive
        spec = np.ascontiguousarray(d.rfft(windows, 1).T)
        release_point()
        rot = np.empty(lh.shape, np.complex64)
        c = np.tanh(th)
        c *= np.pi
        np.cos(c, out=rot.real)
        np.sin(c, out=rot.imag)
        rot *= d.ex(lh)
        spec *= rot
        z = noise(self._rng, lh.shape[0] * 2 * count).reshape(lh.shape[0], 2 * count).view(np.complex64)
        spec += z * d.ex(ln)
        np.cos(phi, out=rot.real)
        np.sin(phi, out=rot.imag)
        rot *= d.ex(lr)
        spec += rot
        release_point()
        return self._overlap_add(spec, final)

    def _extend_pulses(self, f0, count, final):
        """Pulse samples up to the last pushed frame's window end (the signal's end when final, mirrored
        as dsp.stft pads it). `f0` starts at the first frame pushed now."""
        d = self._dsp
        f0 = np.asarray(f0, np.float32)
        first = self._f0_tail is None
        self._frames += count
        upto = self._frames if final else self._frames + 1  # pulse frames the windows reach
        # The f0 of frames made - 1 ... upto, edge-padded at both ends, for pulse frames made ... upto - 1.
        known = np.concatenate(([f0[0]], f0) if first else (self._f0_tail, f0[2:]))
        if final:
            known = np.concatenate((known, known[-1:]))
        fp = known[: upto - self._made + 2]
        self._made = upto
        self._f0_tail = fp[-2:]
        samples = self._pulse_samples(fp)
        if first:
            samples = np.concatenate((samples[d.N_FFT // 2 : 0 : -1], samples))
        self._pulses = np.concatenate((self._pulses, samples))
        if final:
            self._pulses = np.concatenate((self._pulses, self._pulses[-2 : -d.N_FFT // 2 - 2 : -1]))

    def _pulse_samples(self, fp):
        """dsp.pulses for the frames of `fp[1:-1]`, `fp` their f0 with one frame's each side, from the
        phase the last pulses left."""
        d = self._dsp
        frames, h2 = len(fp) - 2, d.HOP // 2
        u, v = d._interp_w()
        f = np.empty((frames, d.HOP), np.float32)
        np.multiply(fp[:-2, None], v[:h2], out=f[:, :h2])
        f[:, :h2] += fp[1:-1, None] * u[:h2]
        np.multiply(fp[1:-1, None], v[h2:], out=f[:, h2:])
        f[:, h2:] += fp[2:, None] * u[h2:]
        f = f.reshape(-1)
        voiced = f > 40.0
        np.maximum(f, 40.0, out=f)
        t = np.cumsum(np.concatenate(([self._cycles], f)), dtype=np.float64)[1:]
        self._cycles = float(t[-1])
        t *= 1.0 / d.SR
        np.modf(t, t)
        t *= 2 * np.pi
        t = t.astype(np.float32)
        harmonics = np.floor(11000.0 / f)
        harmonics += 0.5
        s = np.sin(t * 0.5)
        s *= 2
        bad = np.abs(s) <= 2e-3
        e = np.sin(harmonics * t)
        s[bad] = 1
        e /= s
        e[bad] = harmonics[bad]
        e -= 0.5
        e[~voiced] = 0
        return e

    def _overlap_add(self, spec, final):
        """dsp.ola, hop block by hop block: a block is complete once the four frames over it are in."""
        d = self._dsp
        count, k = spec.shape[1], d.N_FFT // d.HOP
        frames = d.irfft(spec.T, d.N_FFT, 1)
        frames *= d.WIN
        frames = frames.reshape(count, k, d.HOP)
        y = np.zeros((count + k - 1, d.HOP), np.float32)
        y[: k - 1] = self._open
        for i in range(k):
            y[i : i + count] += frames[:, i]
        first_block = self._frames - count  # y[0] is overlap-add block `first_block`
        done = len(y) if final else count
        # dsp.ola's factors, cached by length: a block made before the last push has all its frames
        # (those before frame 0 aside), as in the signal of the frames pushed so far.
        out = y[:done] * d._ola_norm(self._frames)[first_block : first_block + done]
        self._open = y[count:].copy() if not final else self._open  # not a view of all of y
        # Block b holds samples (b - 2) * HOP ... (b - 1) * HOP of the signal: the first two blocks are the padding.
        skip = max(0, 2 - first_block)
        return out[skip : len(out) - 1 if final else len(out)].reshape(-1)
