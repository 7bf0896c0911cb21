"""One segment's audio (and word times) as the client wants it: the engine's stream through the
segment's `transforms.Chain` (speed, sample rate). The session's pipeline and the REST one-shot
both render segments here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

import numpy as np

from .. import metrics
from ..audio.transforms import Chain, plan_speed
from ..engines.base import Alignment, SynthesisRequest, WordTiming
from ..engines.pool import CURRENT, Ticket

if TYPE_CHECKING:
    from ..engines.base import Engine
    from .messages import SessionConfig

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
) -> AsyncGenerator[Audio, None]:
    """The segment's chunks (`stream`, or a stream started here without word times) through its
    `transforms.Chain` (off the event loop): 16-bit samples when there is nothing to transform
    (`start_segment`), else float32; an engine's `Alignment`s pass through, their times scaled to
    the speed. Closing the generator, or cancelling the task that reads it, aborts the engine's work."""
    _, stretch = plan_speed(config.speed, engine.capabilities.speed_range)
    chain = Chain(engine.capabilities.sample_rate, config.sample_rate, stretch)
    if stream is None:
        stream = start_segment(engine, config, text, ticket)
    async with contextlib.aclosing(metrics.timed(stream, engine.capabilities.sample_rate)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, Alignment):
                yield _scaled(chunk, stretch)
            else:
                yield chunk if chain.identity else await asyncio.to_thread(chain.process, chunk)
    if not chain.identity:
        yield await asyncio.to_thread(chain.flush)
