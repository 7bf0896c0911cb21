"""Hibari's first words first: a part rendered in two pieces, the first sent before the rest is made.

Hibari's graph is a text encoder and duration predictor on the phoneme ids, a length regulator
(`/Gather_32`, `/Gather_33`: each id's features repeated for its steps), then a prosody net and a
decoder that are convolutions over those steps, and the host's vocoder (`hibari.dsp.synth`). Most
of the time goes after the regulator (bench/RESULTS.md, "First words first"), so `split_model` cuts
the graph there: `front` runs once on the whole part, and `back` runs on windows of its steps with
`CONTEXT_STEPS` of context on each side. Its output depends a little on what lies further (its
quantisation is dynamic, per tensor: even the steps at the far end move a frame's spectrum by a few
percent), and 8 steps of context joined as well as 16 or 24 at half the cost of 16 (bench/RESULTS.md,
"First words first"). The first window's frames up to `FIRST_STEPS` are vocoded and sent; the second
window's first frames are blended into the first's over `BLEND_FRAMES`, and `Vocoder` goes on from
the same pulse phase, noise stream and overlap-add, so the pieces join into one signal: no gap, no step.
"""

from __future__ import annotations

import numpy as np

from .hibari_align import DURATIONS, STEP_FRAMES

FEATURES = ("/Gather_32_output_0", "/Gather_33_output_0")  # the regulated steps: the back net's inputs
OUTPUTS = ("lh", "theta", "ln", "lr", "phi", "f0")
FIRST_STEPS = 32  # the first piece: 0.8 s of the model's audio, ~0.3 s of it leading silence
CONTEXT_STEPS = 8  # steps a window sees past the frames taken from it, each side
BLEND_FRAMES = 8  # frames over which the second window's output takes over from the first's
MIN_REST_STEPS = 40  # a part with fewer steps after the first piece is rendered whole


def split_model(path: str) -> tuple[bytes, bytes]:
    """Hibari's model cut at its length regulator: (front: ids, speed -> FEATURES and the durations;
    back: FEATURES -> the vocoder's parameters), serialised for onnxruntime."""
    import onnx
    from onnx.utils import Extractor

    extractor = Extractor(onnx.load(path))
    front = extractor.extract_model(["ids", "speed"], [*FEATURES, DURATIONS])
    back = extractor.extract_model(list(FEATURES), list(OUTPUTS))
    return front.SerializeToString(), back.SerializeToString()


class Pieces:
    """One part's audio in two pieces: `first()` then `rest()`, raw (untrimmed, as `hibari.dsp.synth`
    makes it), together as long as the part rendered whole (`samples`); or `whole()`. `steps`: each
    id's steps, as `hibari_align.synthesise` gives them."""

    def __init__(self, front, back, ids, speed, rng):
        ids_in = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)}
        *self._features, durations = front.run(None, ids_in)
        self.steps = np.rint(durations).astype(np.int64)
        self._back = back
        self.total_steps = self._features[0].shape[2]
        self.samples = self.total_steps * STEP_FRAMES * _hop()  # the whole part's length
        self._vocoder = Vocoder(rng)
        self._held: list[np.ndarray] = []  # the first window's frames to blend with the second's

    @property
    def split(self) -> bool:
        """Long enough to be worth two pieces."""
        return self.total_steps >= FIRST_STEPS + MIN_REST_STEPS

    def _window(self, start, end):
        return [
            o[0]
            for o in self._back.run(None, {name: f[:, :, start:end] for name, f in zip(FEATURES, self._features, strict=True)})
        ]

    def whole(self) -> np.ndarray:
        return self._vocoder.push(self._window(0, self.total_steps), final=True)

    def first(self) -> np.ndarray:
        out = self._window(0, FIRST_STEPS + CONTEXT_STEPS)
        cut = FIRST_STEPS * STEP_FRAMES - BLEND_FRAMES
        self._held = [o[..., cut : cut + BLEND_FRAMES] for o in out]
        # Two frames of f0 past the cut: the pulses under the last frame's window (Vocoder.push).
        return self._vocoder.push([o[..., :cut] for o in out[:5]] + [out[5][: cut + 2]], final=False)

    def rest(self) -> np.ndarray:
        start = max(0, FIRST_STEPS - CONTEXT_STEPS)
        out = self._window(start, self.total_steps)
        skip = (FIRST_STEPS - start) * STEP_FRAMES - BLEND_FRAMES
        out = [o[..., skip:] for o in out]
        fade = (np.arange(BLEND_FRAMES, dtype=np.float32) + 0.5) / BLEND_FRAMES
        for name, new, old in zip(OUTPUTS, out, self._held, strict=True):
            head = new[..., :BLEND_FRAMES]
            if name == "phi":  # phases: blended on the circle
                head[...] = np.angle((1 - fade) * np.exp(1j * old) + fade * np.exp(1j * head))
            else:
                head[...] = (1 - fade) * old + fade * head
        self._held = []
        return self._vocoder.push(out, final=True)


def _hop():
    from hibari.dsp import HOP

    return HOP


class Vocoder:
    """`hibari.dsp.synth` frame by frame: the frames pushed so far make the same samples as one call on
    them all would (but for the noise, drawn in the same way, piece by piece), those not yet final
    (the overlap-add's last three hops) held back until the next push.

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
        # The analysis windows of the frames pushed: frame k spans pulse samples (k - 2) * HOP ... (k + 2) * HOP.
        windows = np.lib.stride_tricks.sliding_window_view(self._pulses, d.N_FFT)[:: d.HOP][:count] * d.WIN_SRC
        self._pulses = self._pulses[count * d.HOP :]
        spec = np.ascontiguousarray(d.rfft(windows, 1).T)
        rot = np.empty(lh.shape, np.complex64)
        c = np.tanh(th)
        c *= np.pi
        np.cos(c, out=rot.real)
        np.sin(c, out=rot.imag)
        rot *= d.ex(lh)
        spec *= rot
        z = self._rng.standard_normal((lh.shape[0], 2 * count), dtype=np.float32).view(np.complex64)
        z *= d.ex(ln)
        spec += z
        np.cos(phi, out=rot.real)
        np.sin(phi, out=rot.imag)
        rot *= d.ex(lr)
        spec += rot
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
        self._open = y[count:] if not final else self._open
        # Block b holds samples (b - 2) * HOP ... (b - 1) * HOP of the signal: the first two blocks are the padding.
        skip = max(0, 2 - first_block)
        return out[skip : len(out) - 1 if final else len(out)].reshape(-1)
