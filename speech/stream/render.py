"""One segment's audio (and word times) as the client wants it: the engine's stream through the
segment's `transforms.Chain` (speed, sample rate). The session's pipeline and the REST one-shot
both render segments here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

import numpy as np

from ..audio.transforms import Chain, plan_speed
from .engine import CURRENT, Alignment, SynthesisRequest, Ticket, WordTiming
from .meter import NO_METER

if TYPE_CHECKING:
    from .config import SessionConfig
    from .engine import Engine
    from .meter import Meter

Audio = np.ndarray | Alignment


def start_segment(
    engine: Engine,
    config: SessionConfig,
    text: str,
    ticket: Ticket = CURRENT,
    *,
    timestamps: bool = False,
    first_words: bool = False,
) -> AsyncIterator[Audio]:
    """The engine's stream of one segment, asked for now (Hibari queues its first job at once); its
    owner closes it, or hands it to `render_segment`, which does. When no transform follows, the
    engine quantises to 16 bits where it makes the audio (`SynthesisRequest.pcm16`). `first_words`:
    the listener has no audio in hand (`SynthesisRequest.first_words`)."""
    engine_speed, stretch = plan_speed(config.speed, engine.capabilities.speed_range)
    pcm16 = not Chain.needed(engine.capabilities.sample_rate, config.sample_rate, stretch)
    request = SynthesisRequest(
        text,
        config.voice,
        engine_speed,
        config.options,
        config.reference,
        ticket,
        pcm16,
        timestamps=timestamps,
        first_words=first_words,
    )
    return engine.stream(request)


def _scaled(alignment: Alignment, stretch: float) -> Alignment:
    """Word times in the engine's audio -> in the audio as delivered (the Chain's output is exactly
    the engine's length divided by the stretch)."""
    if stretch == 1.0:
        return alignment
    words = tuple(WordTiming(w.char_start, w.char_end, w.start_s / stretch, w.end_s / stretch) for w in alignment.words)
    return Alignment(words, alignment.estimated)


async def render_segment(
    engine: Engine,
    config: SessionConfig,
    text: str,
    ticket: Ticket = CURRENT,
    stream: AsyncIterator[Audio] | None = None,
    meter: Meter = NO_METER,
) -> AsyncGenerator[Audio, None]:
    """The segment's chunks (`stream`, or a stream started here without word times) through its
        `transforms.Chain` (off the event loop): 16-bit samples when there is nothing to transform
        (`start_segment`), else float32; an engine's `Alignment`s pass through, their times scaled to
        the speed; the engine's time goes to `meter`. Closing the generator, or cancelling the task that
    reads it, aborts the engine's work."""
    _, stretch = plan_speed(config.speed, engine.capabilities.speed_range)
    chain = Chain(engine.capabilities.sample_rate, config.sample_rate, stretch)
    if stream is None:
        stream = start_segment(engine, config, text, ticket)
    async with contextlib.aclosing(_timed(stream, engine.capabilities.sample_rate, meter)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, Alignment):
                yield _scaled(chunk, stretch)
            else:
                yield chunk if chain.identity else await asyncio.to_thread(chain.process, chunk)
    if not chain.identity:
        yield await asyncio.to_thread(chain.flush)


async def _timed(chunks: AsyncIterator[Audio], sample_rate: int, meter: Meter) -> AsyncGenerator[Audio, None]:
    """The engine's chunks, passed through; a stream that ends normally reports its engine time and
    audio to `meter`. Closing this closes the engine's stream (its work is aborted)."""
    busy, samples = 0.0, 0
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]  # engines' streams close
        iterator = aiter(chunks)
        while True:
            started = time.perf_counter()
            try:
                chunk = await anext(iterator)
            except StopAsyncIteration:
                break
            busy += time.perf_counter() - started
            samples += getattr(chunk, "size", 0)  # an engine's word timings (Alignment) carry no audio
            yield chunk
    if samples:
        meter.segment_synthesised(busy, samples / sample_rate)
