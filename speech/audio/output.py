"""A segment's samples as the bytes of its response_format: the one encoder of the WebSocket session
(speech/stream/pipeline.py) and the REST one-shot (speech/web/api.py). The samples arrive already at
the output rate and speed (speech/stream/render.py).

- Whole: `encode_segment` gives a segment's audio as one piece, raw bytes or one complete file
  (codecs.py).
- Streamed: `stream_encoder` gives an encoder of audio as it is made, raw chunk by chunk, or mp3/opus/aac
  as one stream whose segments follow each other (streaming.py); both yield (bytes, seconds) from
  `frames` and a segment's tail from `end_segment`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import numpy as np

from .codecs import RAW_FORMATS, RawEncoder, encode_file, encoding_threads
from .streaming import StreamedAudio


async def encode_segment(fmt: str, chunks: Sequence[np.ndarray], rate: int, ahead_s: float) -> bytes:
    """The bytes of `chunks` (one segment's samples at `rate`, in order) as `fmt`, for a listener with
    `ahead_s` seconds of audio still to play. A file is encoded on an encoding thread (codecs.py): its
    encoder would hold the event loop for milliseconds."""
    samples = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    if fmt in RAW_FORMATS:
        return RawEncoder(fmt, rate).encode(samples)
    return await asyncio.get_running_loop().run_in_executor(encoding_threads(ahead_s), encode_file, fmt, samples, rate)


class RawStream:
    """Streamed raw audio, with the interface of StreamedAudio: each chunk's bytes at once."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.encoder = RawEncoder(fmt, rate)
        self.rate = rate

    async def frames(self, samples: np.ndarray) -> AsyncIterator[tuple[bytes, float]]:
        yield self.encoder.encode(samples), samples.size / self.rate

    async def end_segment(self) -> None:
        """Raw audio has no tail."""
        return None


def stream_encoder(fmt: str, rate: int, first_s: float, later_s: float) -> RawStream | StreamedAudio:
    """The encoder of `fmt` streamed at `rate`; compressed audio is coded `first_s` at a time until a
    segment's first bytes, then `later_s` at a time (StreamedAudio)."""
    return RawStream(fmt, rate) if fmt in RAW_FORMATS else StreamedAudio(fmt, rate, first_s, later_s)
