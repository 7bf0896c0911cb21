"""A test double engine (like httpx's MockTransport): deterministic tones, under the test's control.

Never used by the running server unless chosen explicitly (SPEECH_ENGINE=fake).

    engine = FakeEngine(chunks=3, hold=True)   # every chunk after the first waits for engine.allow()
    engine.allow(2)                             # let two more chunks out
    FakeEngine(fail_on="FAIL")                 # a segment containing FAIL fails after `fail_after` chunks
"""

from __future__ import annotations

import asyncio

import numpy as np

from ..audio.signal import quantise
from ..stream.meter import NO_METER
from ..stream.engine import Alignment, Capabilities, Engine, EngineError, SynthesisRequest


class FakeEngine(Engine):
    def __init__(
        self,
        *,
        sample_rate=24000,
        chunk_s=0.05,
        chunks=2,
        delay_s=0.0,
        hold=False,
        fail_on=None,
        fail_after=0,
        error=None,
        voices=("fake", "alt"),
        speed_range=(0.25, 4.0),
        reference_audio=False,
        instructions=False,
        chars_per_s=None,
    ):
        self.capabilities = Capabilities(
            name="fake",
            voices=tuple(voices),
            default_voice=voices[0],
            sample_rate=sample_rate,
            speed_range=speed_range,
            reference_audio=reference_audio,
            instructions=instructions,
        )
        self.chunk_samples = int(sample_rate * chunk_s)
        self.chunks = chunks
        self.chars_per_s = chars_per_s  # set: at least as much audio as speaking the text would take
        self.delay_s = delay_s
        self.hold = hold
        self.fail_on = fail_on
        self.fail_after = fail_after
        self.error = error or EngineError("fake engine failure")
        self.requests: list[SynthesisRequest] = []
        self.running = 0  # streams started and not yet finished or aborted
        self.aborted = 0  # streams that ended because the consumer cancelled or closed them
        self.completed = 0
        self._permits = asyncio.Semaphore(0)

    @classmethod
    def from_settings(cls, conf, meter=NO_METER):
        """In a running server (SPEECH_ENGINE=fake: live tests, bench/throughput.py's delivery cost),
        audio about as long as the text spoken, at 15 characters a second, in 0.2 s chunks."""
        return cls(chunk_s=0.2, chunks=1, chars_per_s=15)

    def chunk_count(self, text):
        if not self.chars_per_s:
            return self.chunks
        seconds = len(text) / self.chars_per_s
        return max(self.chunks, round(seconds * self.capabilities.sample_rate / self.chunk_samples))

    def allow(self, n=1):
        for _ in range(n):
            self._permits.release()

    def tone(self, index):
        t = np.arange(self.chunk_samples, dtype=np.float32) / self.capabilities.sample_rate
        return (0.5 * np.sin(2 * np.pi * (220.0 + 20.0 * index) * t)).astype(np.float32)

    def alignment(self, text):
        """The words of `text` spread over the audio this engine makes for it (its own timings, so not
        marked estimated)."""
        from ..stream.words import estimate

        duration = self.chunk_count(text) * self.chunk_samples / self.capabilities.sample_rate
        return Alignment(estimate(text, duration).words)

    async def stream(self, request: SynthesisRequest):
        self.requests.append(request)
        self.running += 1
        finished = False
        try:
            if request.timestamps:
                yield self.alignment(request.text)
            for i in range(self.chunk_count(request.text)):
                if self.fail_on is not None and self.fail_on in request.text and i == self.fail_after:
                    raise self.error
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.hold and i > 0:
                    await self._permits.acquire()
                tone = self.tone(i)
                yield quantise(tone) if request.pcm16 else tone
            if self.fail_on is not None and self.fail_on in request.text and self.fail_after >= self.chunks:
                raise self.error
            finished = True
        except EngineError:
            finished = True
            raise
        finally:
            self.running -= 1
            if finished:
                self.completed += 1
            else:
                self.aborted += 1
