"""Hibari: the embedded engine. Real neural speech on the CPU, weights inside its wheel.

Facts this relies on (docs/engines.md, Hibari): 24 kHz float32 output, one array per sentence,
a lazily loaded G2P (warmed up here), ~0.3 s of leading and ~0.5 s of
trailing near-silence per sentence (trimmed) and quiet output (normalised). onnxruntime releases
the GIL, so a small pool of threads, one intra-op thread each, uses the cores.
"""

from __future__ import annotations

import numpy as np

from ..audio import signal as audio
from .base import Capabilities, Engine, SynthesisRequest
from .pool import SynthesisPool


def available_voices():
    """Voices whose model files are on disk: the bundled one, plus any already in Hibari's cache.
    Never downloads (no model hub is reachable from a server)."""
    from hibari.voices import VOICES, voice_path

    present = []
    for name in VOICES:
        try:
            voice_path(name, download_missing=False)
        except (FileNotFoundError, ValueError):
            continue
        present.append(name)
    return tuple(present)


class HibariEngine(Engine):
    def __init__(self, *, workers=1):
        from hibari import SAMPLE_RATE, Hibari
        from hibari.voices import DEFAULT

        voices = available_voices()
        self._models = {name: Hibari(voice=name, threads=1) for name in voices}
        self._pool = SynthesisPool(workers, "hibari")
        self.capabilities = Capabilities(
            name="hibari",
            voices=voices,
            default_voice=DEFAULT if DEFAULT in voices else voices[0],
            sample_rate=SAMPLE_RATE,
            # Hibari takes speed 0.5-2.0, but measured it misses 1/speed by up to 13 % and shifts
            # the pitch by up to 7 % at 0.5 (tests/test_formats_live.py); the pipeline's time-stretch
            # is within 3.5 % and keeps the pitch within ~1 %, so every speed goes through it.
            speed_range=(1.0, 1.0),
        )

    @classmethod
    def from_settings(cls, conf):
        return cls(workers=conf.ENGINE_WORKERS)

    def _render(self, tts, phonemes, speed, rng):
        rate = self.capabilities.sample_rate
        raw = tts.from_ids(tts.ids(phonemes), speed, rng)
        return audio.normalise(audio.trim_silence(raw, rate))

    def _first(self, tts, text, speed, rng):
        """G2P plus the first sentence in one job: one thread hop before the first audio."""
        parts = tts.phonemize(text)
        if not parts:
            return None, []
        return self._render(tts, parts[0], speed, rng), parts[1:]

    async def stream(self, request: SynthesisRequest):
        tts = self._models[request.voice]
        rng = np.random.default_rng(request.options.get("seed"))
        first, rest = await self._pool.run(self._first, tts, request.text, request.speed, rng, ticket=request.ticket)
        if first is not None and first.size:
            yield first
        for phonemes in rest:
            chunk = await self._pool.run(self._render, tts, phonemes, request.speed, rng, ticket=request.ticket)
            if chunk.size:
                yield chunk

    def estimated_wait(self):
        return self._pool.estimated_wait()

    async def warm_up(self):
        for voice in self.capabilities.voices:
            async for _ in self.stream(SynthesisRequest(text="Warm up.", voice=voice)):
                pass

    async def aclose(self):
        self._pool.shutdown()
