"""A segment job: one segment of a context's text, from its queueing to its audio.done (pipeline.py).
Not the engine pool's synthesis job (speech/engines/jobs.py), of which a segment may take several."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .engine import Ticket
from .utterance import Record, WordTime

if TYPE_CHECKING:
    from .contexts import Context
    from .render import Audio

END = object()  # the last item of a job's chunk queue


class SegmentJob:
    __slots__ = (
        "text",
        "context",
        "ticket",
        "chunks",
        "stream",
        "producer",
        "index",
        "bytes_sent",
        "sent_s",
        "words",
        "done_sent",
        "queued_at",
        "started",
    )

    def __init__(self, text: str, context: Context) -> None:
        self.text = text
        self.context = context
        self.ticket = Ticket(current=False)  # its place in the engine's synthesis queue
        self.queued_at = time.monotonic()
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()  # chunks and Alignments, then _END or an exception
        self.stream: AsyncIterator[Audio] | None = None  # the engine's, started with the producer, until it takes it
        self.producer: asyncio.Task[None] | None = None
        self.index: int | None = None  # its sentence index, given when audio.start (or its error) is sent
        self.bytes_sent = 0
        self.sent_s = 0.0  # seconds of its audio sent
        self.words: list[WordTime] | None = None  # its words' times as delivered, once the engine gave them
        self.done_sent = False
        self.started = False  # its first frame is sent (streamed), its first chunk is there (files), or it
        # ended: the next segment may start

    @property
    def announced(self) -> bool:
        return self.index is not None

    def record(self, complete: bool) -> Record:
        return Record(self.text, self.words, self.sent_s * 1000, complete)
