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
from .hibari_vocoder import Vocoder

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
        self._held = [o[..., cut : cut + BLEND_FRAMES].copy() for o in out]  # not views of the whole window
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
