"""Per-segment audio transforms that keep state across a stream's chunks.

- `Resampler`: soxr's streaming resampler (high quality), so chunk joins have no clicks, gaps or
  drift: resampling a stream chunk by chunk gives the whole-signal result.
- `TimeStretch`: FFmpeg's `atempo` (pitch-preserving, WSOLA) through a PyAV filter graph, for
  speeds the engine cannot do itself; atempo takes 0.5–100 per stage, so 0.25 is two stages.
- `plan_speed`: what the engine does and what is left for the stretch.
- `Chain`: engine chunks -> stretch -> resample, one per segment; `process` then `flush`.
"""

from __future__ import annotations

from fractions import Fraction

import av
import av.filter
import numpy as np
import soxr

ATEMPO_MIN = 0.5


def plan_speed(speed, native_range):
    """(engine speed, stretch factor): the engine's own rate control as far as it goes."""
    low, high = native_range
    engine_speed = min(max(speed, low), high)
    return engine_speed, speed / engine_speed


def _empty():
    return np.zeros(0, np.float32)


class Resampler:
    def __init__(self, in_rate, out_rate):
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def process(self, samples):
        return self._stream.resample_chunk(samples)

    def flush(self):
        return self._stream.resample_chunk(_empty(), last=True)


class TimeStretch:
    def __init__(self, rate, factor):
        self.rate = rate
        self._time_base = Fraction(1, rate)
        self._pts = 0
        graph = av.filter.Graph()
        node = graph.add_abuffer(format="flt", sample_rate=rate, layout="mono", time_base=self._time_base)
        source = node
        for stage in _atempo_stages(factor):
            stretch = graph.add("atempo", f"{stage:.6f}")
            node.link_to(stretch)
            node = stretch
        node.link_to(graph.add("abuffersink"))
        graph.configure()
        self._graph = graph
        self._source = source

    def _pull(self):
        out = []
        while True:
            try:
                frame = self._graph.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                break
            out.append(frame.to_ndarray()[0].astype(np.float32, copy=False))
        return np.concatenate(out) if out else _empty()

    def process(self, samples):
        if samples.size == 0:
            return _empty()
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples, np.float32)[None, :], format="flt", layout="mono")
        frame.sample_rate = self.rate
        frame.time_base = self._time_base
        frame.pts = self._pts
        self._pts += samples.size
        self._graph.push(frame)
        return self._pull()

    def flush(self):
        self._graph.push(None)
        return self._pull()


def _atempo_stages(factor):
    stages = []
    while factor < ATEMPO_MIN:
        stages.append(ATEMPO_MIN)
        factor /= ATEMPO_MIN
    return [*stages, factor]


def _stretches(factor):
    return abs(factor - 1.0) > 1e-9


class Chain:
    """One segment's way from engine chunks to output samples. Its output is exactly as long as the
    input at the output rate and speed (the tail padded or cut at `flush`), so word times scale
    with the speed and never pass the end of the audio (docs/protocol.md, `audio.timestamps`)."""

    def __init__(self, engine_rate, out_rate, stretch=1.0):
        self.steps = []
        if _stretches(stretch):
            self.steps.append(TimeStretch(engine_rate, stretch))
        if out_rate != engine_rate:
            self.steps.append(Resampler(engine_rate, out_rate))
        self._ratio = out_rate / engine_rate / stretch
        self._in = self._out = 0

    @staticmethod
    def needed(engine_rate, out_rate, stretch=1.0):
        """Whether a chain of these settings transforms anything (not `identity`), without building its
        steps (an FFmpeg filter graph, a resampler)."""
        return _stretches(stretch) or out_rate != engine_rate

    @property
    def identity(self):
        return not self.steps

    def process(self, samples):
        self._in += samples.size
        for step in self.steps:
            samples = step.process(samples)
        self._out += samples.size
        return samples

    def flush(self):
        tail = _empty()
        for step in self.steps:
            tail = step.process(tail) if tail.size else tail
            tail = np.concatenate([tail, step.flush()])
        missing = round(self._in * self._ratio) - self._out
        if missing >= tail.size:
            return np.concatenate([tail, np.zeros(missing - tail.size, np.float32)])
        return tail[: max(0, missing)]
