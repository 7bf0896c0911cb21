"""One-shot synthesis for `POST /v1/audio/speech`: a whole text, the session's engine and chain.

The text is cut by the same segmenter as a session, each segment synthesised in turn through the
engine and the segment's `transforms.Chain` (speed, rate), and the audio yielded as float32 chunks
at the output rate. Closing the generator (a client that went away) aborts the engine's work.
"""

from __future__ import annotations

import asyncio
import contextlib

from .engines import SynthesisRequest
from .segmenter import Segmenter
from .transforms import Chain, plan_speed


async def synthesize(engine, config, text):
    caps = engine.capabilities
    engine_speed, stretch = plan_speed(config.speed, caps.speed_range)
    segmenter = Segmenter(config.split_granularity)
    for segment in [*segmenter.feed(text), *segmenter.flush()]:
        chain = Chain(caps.sample_rate, config.sample_rate, stretch)
        request = SynthesisRequest(segment, config.voice, engine_speed, config.options, config.reference)
        async with contextlib.aclosing(engine.stream(request)) as chunks:
            async for chunk in chunks:
                out = chunk if chain.identity else await asyncio.to_thread(chain.process, chunk)
                if out.size:
                    yield out
        if not chain.identity:
            tail = await asyncio.to_thread(chain.flush)
            if tail.size:
                yield tail
