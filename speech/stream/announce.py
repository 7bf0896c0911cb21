"""A session's segment events: audio.start, audio.timestamps, a segment's error and audio.done, each
with the segment's id and sentence index (given when the segment is first announced, so dropped
segments never use one up). Sent by the pipeline's delivery (pipeline.py), in the contract's order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .engine import Alignment
from .events import AudioDone, AudioStart, AudioTimestamps, Word
from .job import SegmentJob
from .meter import NO_METER
from .utterance import WordTime

if TYPE_CHECKING:
    from .errors import SpeechError
    from .config import SessionConfig
    from .meter import Meter
    from .transport import Transport


class Announcer:
    def __init__(self, transport: Transport, config: SessionConfig, session_id: str, meter: Meter = NO_METER) -> None:
        self.transport = transport
        self.meter = meter
        self.config = config
        self.session_id = session_id
        self.sentences = 0  # sentence indexes given so far

    def index(self, job: SegmentJob) -> None:
        job.index = self.sentences
        self.sentences += 1

    def id(self, job: SegmentJob) -> str:
        return f"{self.session_id}-{job.index}"

    async def start(self, job: SegmentJob) -> None:
        self.index(job)
        await self.transport.send_json(
            AudioStart(
                id=self.id(job),
                sentence_index=job.index,  # type: ignore[arg-type]  # index() set it
                context_id=job.context.id,
                sentence_text=job.text,
                format=self.config.response_format,
                sample_rate=self.config.sample_rate,
            ).dump()
        )

    async def timestamps(self, job: SegmentJob, alignment: Alignment) -> None:
        """Keep the words' delivered times (what was heard, on a cancel) and send them when asked for:
        after audio.start, before the audio they describe."""
        words = [WordTime(w.char_start, w.char_end, int(w.start_s * 1000), int(w.end_s * 1000)) for w in alignment.words]
        job.words = (job.words or []) + words
        if not self.config.timestamps:
            return
        if not job.announced:
            await self.start(job)
        await self.transport.send_json(
            AudioTimestamps(
                id=self.id(job),
                sentence_index=job.index,  # type: ignore[arg-type]  # announced above
                context_id=job.context.id,
                words=[Word(word=job.text[w.char_start : w.char_end], **vars(w)) for w in words],
                estimated=True if alignment.estimated else None,
            ).dump()
        )

    async def failed(self, job: SegmentJob, failure: SpeechError) -> None:
        """The segment's error, with `partial_audio` when some of its audio was sent."""
        if not job.announced:
            self.index(job)
        self.meter.error_sent(failure.error_type, failure.code)
        await self.transport.send_json(
            failure.event(
                id=self.id(job),
                sentence_index=job.index,
                context_id=job.context.id,
                partial_audio=True if job.bytes_sent > 0 else None,
            )
        )

    async def done(self, job: SegmentJob, *, error: bool, cancelled: bool) -> None:
        job.done_sent = True
        job.context.utterance.add(job.record(complete=not (error or cancelled)))
        await self.transport.send_json(
            AudioDone(
                id=self.id(job),
                sentence_index=job.index,  # type: ignore[arg-type]  # only announced jobs end
                context_id=job.context.id,
                total_bytes=job.bytes_sent,
                error=error,
                cancelled=cancelled,
            ).dump()
        )
