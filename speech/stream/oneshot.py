"""One-shot synthesis for `POST /v1/audio/speech`: a whole text, the session's engine and chain.

The text is cut by the same segmenter as a session and each segment rendered in turn the way a
session renders it (`render.render_segment`), the audio yielded as chunks at the output rate
(16-bit samples, or float32 after a transform). With `first_words` (a streamed response: its client
waits with no audio in hand) the first segment is asked for in pieces, as a session's first is
(`SynthesisRequest.first_words`); the later ones start while the client holds the earlier audio.
Closing the generator (a client that went away) aborts the engine's work.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

import numpy as np

from .render import render_segment, start_segment
from .segmenter import Segmenter

if TYPE_CHECKING:
    from .config import SessionConfig
    from .engine import Engine
    from .meter import Meter


async def synthesize(
    engine: Engine, config: SessionConfig, text: str, meter: Meter, *, first_words: bool = False
) -> AsyncGenerator[np.ndarray, None]:
    segmenter = Segmenter(config.split_granularity)
    for index, segment in enumerate([*segmenter.feed(text), *segmenter.flush()]):
        stream = start_segment(engine, config, segment, first_words=first_words and index == 0)
        async with contextlib.aclosing(render_segment(engine, config, segment, stream=stream, meter=meter)) as audio:
            async for chunk in audio:
                if isinstance(chunk, np.ndarray) and chunk.size:  # no word times are asked for here
                    yield chunk
