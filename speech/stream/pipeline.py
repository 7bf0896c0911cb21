"""Synthesis and ordered delivery of a session's segments, in plain asyncio (no Channels).

Segments wait in one queue, in speaking order: by context (contexts.py: one after another, in the
order they were made), then in the order their text came. Synthesis runs for the segment being
delivered and for the next `LOOKAHEAD` ones at most (bounded look-ahead; the next context's first
segment among them), each in its own producer task that feeds the segment's chunk queue. One
delivery task sends segment k completely (audio.start, audio.timestamps, binary frames,
audio.done) before anything of segment k+1. Sentence indexes are given when a segment is
announced, so dropped segments never use one up.

Delivery goes as fast as the client reads: the transport's `send_bytes` waits while the
connection's outgoing buffer is full, so a client that stops reading holds its session (delivery
waits, synthesis stops after the look-ahead) without the server buffering more than one frame
beyond the socket's buffers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..audio.codecs import SAMPLE_BYTES, STREAMED_FORMATS, EncodingError
from ..audio.output import encode_segment
from ..audio.streaming import StreamedAudio
from .engine import Alignment
from .announce import Announcer
from .contexts import Context, Contexts
from .errors import SpeechError, server_error
from .events import ContextDone
from .frames import FIRST_FRAME_S, FRAME_S, frame_sizes
from .job import END, SegmentJob
from .meter import NO_METER
from .producer import Producer
from .render import start_segment
from .utterance import Utterance

if TYPE_CHECKING:
    from .config import SessionConfig
    from .engine import Engine
    from .meter import Meter
    from .transport import Transport

logger = logging.getLogger(__name__)

LOOKAHEAD = 1


class Pipeline:
    def __init__(
        self,
        *,
        engine: Engine,
        config: SessionConfig,
        transport: Transport,
        session_id: str,
        max_segment_chars: int,
        on_idle: Callable[[], None],
        on_crash: Callable[[], None],
        contexts: Contexts | None = None,
        meter: Meter = NO_METER,
    ) -> None:
        self.engine = engine
        self.meter = meter
        self.config = config
        self.transport = transport  # its send_bytes waits while the client is not reading (backpressure)
        self.session_id = session_id
        self.max_segment_chars = max_segment_chars
        self.on_idle = on_idle  # called when delivery ran out of segments it may send (not after a cancel)
        self.on_crash = on_crash  # called when delivery itself failed (a bug, not an engine error)
        self.contexts = contexts or Contexts(config.split_granularity, max_open=32)
        self.rate = config.sample_rate
        # Word times are asked for when the client wants them, and always from an engine whose times
        # are its model's own (what was heard, on a cancel).
        self.timestamps = config.timestamps or engine.capabilities.aligns
        self.jobs: deque[SegmentJob] = deque()
        self.announce = Announcer(transport, config, session_id, meter)  # segment events, sentence indexes
        self.queued_chars = 0  # text of segments whose synthesis has not started
        self.bytes_sent = 0  # audio bytes of the whole session
        self.first_audio_s: float | None = None  # the session's first segment: queued -> first audio frame sent
        self._played_out_at = 0.0  # monotonic time by which a client playing each frame as it comes has played all
        self._flowing = False  # a first frame of this utterance is out (until delivery runs dry or is cancelled)
        self._delivery: asyncio.Task[None] | None = None
        self._current: SegmentJob | None = None  # the job delivery is sending
        self._abandoned = False  # the client has gone (`abandon`): nothing more is started
        # Streamed mp3/opus/aac: one stream for the whole session, fed in delivery order (_stream_coded).
        coded = config.stream_audio and config.response_format in STREAMED_FORMATS
        self._coder = StreamedAudio(config.response_format, self.rate, FIRST_FRAME_S, FRAME_S) if coded else None

    @property
    def busy(self) -> bool:
        """Segments are being sent, or waiting with nothing before them but synthesis."""
        return self._delivery is not None or self._deliverable() is not None

    def audio_ahead_s(self) -> float:
        """Seconds of audio sent that a client playing each frame at real time from its arrival (and
        waiting through pauses) has not played yet: what it may still have to read."""
        return max(0.0, self._played_out_at - time.monotonic())

    @property
    def total_sentences(self) -> int:
        """Segments accepted and not dropped: announced ones plus those still waiting."""
        return self.sentences + sum(1 for job in self.jobs if not job.announced)

    @property
    def sentences(self) -> int:
        """Sentence indexes given so far."""
        return self.announce.sentences

    def enqueue(self, text: str, context: Context | None = None) -> None:
        """Queue a segment of `context` (the default one if None): after that context's segments,
        before those of contexts made after it."""
        context = context or self.contexts.default
        job = SegmentJob(text, context)
        at = len(self.jobs)
        while at and self.jobs[at - 1].context.order > context.order:
            at -= 1
        self.jobs.insert(at, job)
        context.jobs += 1
        context.sentences += 1
        self.queued_chars += len(text)
        self._start_producers()
        self.resume()

    async def finish(self, context: Context) -> None:
        """input.done for `context`: context.done after its last segment (now, if it has none left,
        and the next context may speak)."""
        context.finishing = True
        await self._context_step(context)
        self.resume()

    def _deliverable(self) -> SegmentJob | None:
        """The next segment to send: the queue's first, if its context has the floor."""
        if self.jobs and self.jobs[0].context is self.contexts.head():
            return self.jobs[0]
        return None

    def resume(self) -> None:
        """Deliver what may be delivered now (after a context closed, say)."""
        if self._delivery is None and self._deliverable() is not None:
            self._delivery = asyncio.create_task(self._deliver_all(), name=f"{self.session_id}-delivery")

    def _start_producers(self) -> None:
        """The segment being delivered is synthesised at the front of the engine's queue, by the deadline
        of its ticket: when the client will have played the audio it was sent (speech/engines/pool.py);
        the next one (look-ahead) waits behind every session's current segments. While the client has no
        audio of this utterance yet, the look-ahead starts only once the current segment's first
        frame is sent (its first chunk, when audio is sent as a file), so it never delays the first
        audio; once audio flows, it starts with the current segment. The engine's stream is started
        here, in this step, not by the producer task: Hibari then queues the segment's first job
        before the loop handles the other sessions' messages of this turn (bench/RESULTS.md)."""
        if self._abandoned:
            return
        for position, job in enumerate(self.jobs):
            if position > LOOKAHEAD:
                break
            if position == 0 and job is self._deliverable():
                # Due when the client has played what it was sent, or when its text came if that is later.
                job.ticket.deadline = max(self._played_out_at, job.queued_at)
                job.ticket.current = True
            elif position and not (self._flowing or self.jobs[position - 1].started):
                break
            if job.producer is None:
                self.queued_chars -= len(job.text)
                if len(job.text) <= self.max_segment_chars:
                    # A streaming listener with no audio in hand: the engine sends the first words first.
                    waiting = self.config.stream_audio and (not self._flowing or self.audio_ahead_s() == 0)
                    job.stream = start_segment(
                        self.engine, self.config, job.text, job.ticket, timestamps=self.timestamps, first_words=waiting
                    )
                producer = Producer(job, self.engine, self.config, self.max_segment_chars, self._started, self.meter)
                job.producer = asyncio.create_task(producer.run(self.session_id), name=f"{self.session_id}-synth")

    def _started(self, job: SegmentJob) -> None:
        if not job.started:
            job.started = True
            self._start_producers()

    async def _deliver_all(self) -> None:
        try:
            while (job := self._deliverable()) is not None:
                self._current = job
                await self._deliver(job)
                self._current = None
                self._forget(job)
                await self._context_step(job.context)
                self._start_producers()
        except Exception:
            logger.exception("delivery failed in %s", self.session_id)
            self._delivery = None
            self.on_crash()
            return
        # Reset here, not in a done-callback: a segment enqueued before such a callback ran would
        # find a finished task in _delivery and never be delivered.
        self._delivery = None
        self._flowing = False  # the next text is a new utterance: its first audio goes first again
        self.on_idle()

    def _forget(self, job: SegmentJob) -> None:
        self.jobs.remove(job)
        job.context.jobs -= 1

    async def _context_step(self, context: Context) -> None:
        """A segment of `context` is done: a finishing context with none left says context.done."""
        if context.finishing and context.jobs == 0 and not context.closed:
            await self.context_done(context)

    async def context_done(self, context: Context) -> None:
        if context.id is not None:
            await self.transport.send_json(ContextDone(context_id=context.id, total_sentences=context.sentences).dump())
        self.contexts.close(context)

    async def _send_audio(self, job: SegmentJob, data: bytes, seconds: float) -> None:
        first = job.bytes_sent == 0
        await self.transport.send_bytes(data)
        job.bytes_sent += len(data)
        job.sent_s += seconds
        self.bytes_sent += len(data)
        self.meter.audio_sent(len(data), seconds)
        now = time.monotonic()
        self._played_out_at = max(self._played_out_at, now) + seconds
        job.context.utterance.sent(seconds * 1000, self._played_out_at)
        job.ticket.deadline = self._played_out_at  # the segment's further jobs are due once this is played
        if self.first_audio_s is None:
            self.first_audio_s = now - job.queued_at
            self.meter.first_audio(self.first_audio_s)
        # Let the loop run: a cancel that arrived meanwhile is read and handled before the next frame.
        await asyncio.sleep(0)
        if first:
            # The next segment's synthesis starts once this segment's first frame is in the socket,
            # not when its audio was made: its G2P is Python and would hold the GIL while the loop
            # still had that frame to write.
            self._flowing = True
            self._started(job)

    async def _deliver(self, job: SegmentJob) -> None:
        fmt, streaming = self.config.response_format, self.config.stream_audio
        collected: list[np.ndarray] = []
        alignments: list[Alignment] = []
        failure = None
        while (item := await job.chunks.get()) is not END:
            if isinstance(item, SpeechError):
                failure = item
            elif failure is not None:
                continue
            elif isinstance(item, Alignment):
                if streaming:
                    await self.announce.timestamps(job, item)
                else:
                    alignments.append(item)
            elif self._coder is not None:
                try:
                    await self._stream_coded(job, item)
                except EncodingError as exc:
                    failure = server_error(str(exc))
            elif streaming:  # raw audio, encoded by the producer
                await self._stream(job, SAMPLE_BYTES[fmt], item)
            else:
                collected.append(item)
        if self._coder is not None and job.announced:  # all of the segment's audio before its audio.done
            try:
                if tail := await self._coder.end_segment():
                    await self._send_coded(job, *tail)
            except EncodingError as exc:
                failure = failure or server_error(str(exc))
        if failure is None and collected:
            try:
                data = await encode_segment(fmt, collected, self.rate, self.audio_ahead_s())
            except EncodingError as exc:
                failure = server_error(str(exc))
            else:
                await self.announce.start(job)
                for alignment in alignments:
                    await self.announce.timestamps(job, alignment)
                await self._send_audio(job, data, sum(chunk.size for chunk in collected) / self.rate)
        if failure is not None or not job.announced:
            failure = failure or server_error("the engine produced no audio for this segment")
            await self.announce.failed(job, failure)
        await self.announce.done(job, error=failure is not None, cancelled=False)

    async def _stream(self, job: SegmentJob, width: int, data: bytes) -> None:
        """Send one encoded chunk as binary frames (frames.py)."""
        if not job.announced:
            await self.announce.start(job)
        at = 0
        for size in frame_sizes(len(data), width, self.rate, first=job.bytes_sent == 0, room=self.transport.send_room):
            await self._send_audio(job, data[at : at + size], size / width / self.rate)
            at += size

    async def _stream_coded(self, job: SegmentJob, samples: np.ndarray) -> None:
        """Send a chunk of a streamed mp3/opus/aac segment as whole codec frames as the session's encoder
        makes them (speech/audio/streaming.py): a cancel stops it within one frame."""
        if not job.announced:
            await self.announce.start(job)
        async for data, seconds in self._coder.frames(samples):  # type: ignore[union-attr]
            await self._send_coded(job, data, seconds)

    async def _send_coded(self, job: SegmentJob, data: bytes, seconds: float) -> None:
        await self._send_audio(job, data, seconds)
        self._coder.sent()  # type: ignore[union-attr]

    async def _stop(self, context: Context | None = None) -> list[SegmentJob]:
        """Stop the segments of `context` (all if None), engine work included, and forget them. The
        segments are forgotten first: a producer that ends here marks its segment started, which
        must not start the next one's synthesis behind our back. Delivery stops only when it was
        sending one of them. The engine drops their jobs at once (`SegmentJob.ticket.abandon`), before the tasks
        awaiting them are cancelled."""
        jobs = [job for job in self.jobs if context is None or job.context is context]
        for job in jobs:
            job.ticket.abandon()
            self._forget(job)
            if job.producer is None:
                self.queued_chars -= len(job.text)
        tasks = [job.producer for job in jobs if job.producer is not None]
        delivery = self._delivery if self._delivery is not None and (context is None or self._current in jobs) else None
        if delivery is not None:
            tasks.append(delivery)
            self._delivery = None
            self._current = None
            self._flowing = False
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if delivery is not None and self._coder is not None:  # the stream goes on valid from the last frame sent
            await self._coder.cut()
        for job in jobs:  # a producer cancelled before its first step never took its engine stream
            if job.stream is not None:
                await job.stream.aclose()  # type: ignore[attr-defined]  # engines' streams close
        return jobs

    def abandon(self) -> None:
        """Nobody will hear the segments accepted so far (the client has gone): the engine drops their
        waiting jobs and stops a running one at its next step, from now on (speech/engines/pool.py), and
        delivery is cancelled: it would only send audio.done and errors to nobody, on the event loop,
        ahead of other sessions' frames. A producer whose work the pool held sleeps on until `aclose`
        (the teardown) cancels it: woken now, with the other sessions that left in the same turn, it
        would take the loop's turn too (docs/decisions.md, "Hang-ups: where the probe's time went"); any
        other producer is cancelled now (an engine without that pool stops only so). No further segment
        is started: a producer that ends now would otherwise start the next one's synthesis. The rest
        (the streams' closing) is `aclose`'s."""
        if self._abandoned:
            return
        self._abandoned = True
        if self._delivery is not None:
            self._delivery.cancel()
        for job in self.jobs:
            if job.producer is None:  # nothing was asked of the engine for it, and nothing will be
                continue
            if not job.ticket.abandon():
                job.producer.cancel()

    async def cancel(self, context: Context | None = None) -> int:
        """Barge-in: stop the segment being sent within one frame and drop the rest, of `context`
        (of every context if None); the other contexts go on. Returns how many segments were
        stopped or dropped."""
        jobs = [job for job in await self._stop(context) if not job.done_sent]
        for job in jobs:
            if job.announced:
                await self.announce.done(job, error=False, cancelled=True)
            else:
                job.context.sentences -= 1
        self._start_producers()
        self.resume()
        return len(jobs)

    def drop_unplayed(self, utterance: Utterance) -> None:
        """A cancelled utterance's audio not played yet is dropped by the client: later audio plays
        that much sooner (what was heard, and the deadlines of the next segments)."""
        now = time.monotonic()
        unplayed = min(utterance.sent_ms / 1000, max(0.0, utterance.played_out_at - now))
        self._played_out_at = max(now, self._played_out_at - unplayed)

    async def aclose(self) -> None:
        """The client is gone: abort all work, send nothing."""
        await self._stop()
