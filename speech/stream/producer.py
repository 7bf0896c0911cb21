"""A segment's producer: the engine's audio of one segment, through its transforms, into its job's
chunk queue, in the order delivery sends it (pipeline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..audio.codecs import RAW_FORMATS, EncodingError, RawEncoder
from .engine import Alignment
from .errors import SpeechError, bad_request, server_error
from .frames import first_frame_samples
from .job import END, SegmentJob
from .render import render_segment

if TYPE_CHECKING:
    from .engine import Engine
    from .meter import Meter
    from .config import SessionConfig

logger = logging.getLogger(__name__)


class Producer:
    def __init__(
        self,
        job: SegmentJob,
        engine: Engine,
        config: SessionConfig,
        max_segment_chars: int,
        started: Callable[[SegmentJob], None],
        meter: Meter,
    ) -> None:
        self.job = job
        self.engine = engine
        self.config = config
        self.max_segment_chars = max_segment_chars
        self.started = started  # the segment may let the next one start (pipeline.py's look-ahead)
        self.meter = meter

    async def run(self, session_id: str) -> None:
        # A streamed segment with audio counts as started once its first frame is sent (delivery);
        # anything else once it has audio, or when it ends.
        job, config = self.job, self.config
        streamed_audio = False
        stream, job.stream = job.stream, None  # the producer owns it now: closed with render_segment's
        try:
            if len(job.text) > self.max_segment_chars:
                raise bad_request(f"input must be at most {self.max_segment_chars} characters", "input")
            # Streamed raw audio is encoded here, as it is made: a held session's queued chunks
            # then take 2 bytes a sample (1 for G.711), not float32's 4. Compressed audio is encoded by
            # delivery, in the session's one stream.
            raw = config.stream_audio and config.response_format in RAW_FORMATS
            encoder = RawEncoder(config.response_format, config.sample_rate) if raw else None
            segment = render_segment(self.engine, config, job.text, job.ticket, stream, self.meter)
            async with contextlib.aclosing(segment) as audio:
                async for chunk in audio:
                    if isinstance(chunk, Alignment):
                        job.chunks.put_nowait(chunk)
                        continue
                    if chunk.size and encoder is not None and not streamed_audio:
                        chunk = await self._first_frame_first(encoder, chunk)
                    if chunk.size:
                        job.chunks.put_nowait(encoder.encode(chunk) if encoder else chunk)
                        streamed_audio = config.stream_audio  # raw, or coded in delivery
                    if not config.stream_audio:
                        self.started(job)
        except SpeechError as exc:
            job.chunks.put_nowait(exc)
        except EncodingError as exc:
            job.chunks.put_nowait(server_error(str(exc)))
        except Exception:
            if not job.ticket.abandoned:  # else the engine stopped it: nobody listens (hang-up or cancel)
                logger.exception("synthesis failed for a segment of %s", session_id)
            job.chunks.put_nowait(server_error("speech synthesis failed"))
        finally:
            job.chunks.put_nowait(END)
            if not streamed_audio:
                self.started(job)

    async def _first_frame_first(self, encoder: RawEncoder, chunk: np.ndarray) -> np.ndarray:
        """Queue the segment's first frame alone and let delivery send it before the rest of the chunk is
        encoded: encoding a whole sentence first stood between the engine's audio and the first
        frame (bench/RESULTS.md). Returns the rest of the chunk."""
        head = first_frame_samples(self.config.sample_rate)
        if chunk.size <= head:
            return chunk
        self.job.chunks.put_nowait(encoder.encode(chunk[:head]))
        await asyncio.sleep(0)
        return chunk[head:]
