"""Synthesis and ordered delivery of a session's segments, in plain asyncio (no Channels).

Segments wait in a queue. Synthesis runs for the segment being delivered and for the next
`LOOKAHEAD` ones at most (bounded look-ahead), each in its own producer task that feeds the
segment's chunk queue, after the segment's time-stretch and resampling (`transforms.Chain`,
off the event loop). One delivery task sends segment k completely (audio.start, binary frames,
audio.done) before anything of segment k+1. Sentence indexes are given when a segment is
announced, so dropped segments never use one up.

Delivery goes as fast as the client reads: the transport's `send_bytes` waits while the
connection's outgoing buffer is full (speech/web/flowcontrol.py), so a client that stops reading holds
its session (delivery waits, synthesis stops after the look-ahead) without the server buffering
more than one frame beyond the socket's buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import metrics
from ..audio.codecs import RAW_FORMATS, STREAMED_FORMATS, EncodingError, RawEncoder, encode_file
from ..audio.streaming import StreamedAudio
from ..engines import SynthesisRequest
from ..engines.pool import CURRENT, Ticket
from .errors import SpeechError, bad_request, server_error
from .events import AudioDone, AudioStart
from ..audio.transforms import Chain, plan_speed

if TYPE_CHECKING:
    from ..engines.base import Engine
    from .messages import SessionConfig
    from .session import Transport

logger = logging.getLogger(__name__)

LOOKAHEAD = 1
FIRST_FRAME_S = 0.04  # a segment's first streamed frame: 40 ms, so that playback starts at once
FRAME_S = 0.2  # later frames: fewer, larger writes (measured in bench/throughput.py)
MAX_FRAME_S = 1.0  # later frames up to this while the connection sends that much at once (Pipeline._stream)
_END = object()


class Job:
    __slots__ = (
        "text",
        "ticket",
        "chunks",
        "stream",
        "producer",
        "index",
        "bytes_sent",
        "done_sent",
        "queued_at",
        "started",
    )

    def __init__(self, text: str) -> None:
        self.text = text
        self.ticket = Ticket(current=False)  # its place in the engine's synthesis queue
        self.queued_at = time.monotonic()
        self.chunks: asyncio.Queue[Any] = asyncio.Queue()  # np.ndarray chunks, then _END or an exception
        self.stream: AsyncIterator[np.ndarray] | None = None  # the engine's, started with the producer, until it takes it
        self.producer: asyncio.Task[None] | None = None
        self.index: int | None = None  # its sentence index, given when audio.start (or its error) is sent
        self.bytes_sent = 0
        self.done_sent = False
        self.started = False  # its first frame is sent (streamed), its first chunk is there (files), or it
        # ended: the next segment may start

    @property
    def announced(self) -> bool:
        return self.index is not None


def start_segment(engine: Engine, config: SessionConfig, text: str, ticket: Ticket = CURRENT) -> AsyncIterator[np.ndarray]:
    """The engine's stream of one segment, asked for now (Hibari queues its first job at once); its
    owner closes it, or hands it to `render_segment`, which does. When no transform follows, the
    engine quantises to 16 bits where it makes the audio (`SynthesisRequest.pcm16`)."""
    engine_speed, stretch = plan_speed(config.speed, engine.capabilities.speed_range)
    pcm16 = not Chain.needed(engine.capabilities.sample_rate, config.sample_rate, stretch)
    return engine.stream(SynthesisRequest(text, config.voice, engine_speed, config.options, config.reference, ticket, pcm16))


async def render_segment(
    engine: Engine,
    config: SessionConfig,
    text: str,
    ticket: Ticket = CURRENT,
    stream: AsyncIterator[np.ndarray] | None = None,
) -> AsyncGenerator[np.ndarray, None]:
    """One segment's audio as the client wants it: the engine's chunks (`stream`, or a stream started
    here) through the segment's `transforms.Chain` (speed, rate; off the event loop); 16-bit samples
    when there is nothing to transform (`start_segment`), else float32. Closing the generator, or
    cancelling the task that reads it, aborts the engine's work."""
    _, stretch = plan_speed(config.speed, engine.capabilities.speed_range)
    chain = Chain(engine.capabilities.sample_rate, config.sample_rate, stretch)
    if stream is None:
        stream = start_segment(engine, config, text, ticket)
    async with contextlib.aclosing(metrics.timed(stream, engine.capabilities.sample_rate)) as chunks:
        async for chunk in chunks:
            yield chunk if chain.identity else await asyncio.to_thread(chain.process, chunk)
    if not chain.identity:
        yield await asyncio.to_thread(chain.flush)


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
    ) -> None:
        self.engine = engine
        self.config = config
        self.transport = transport  # its send_bytes waits while the client is not reading (backpressure)
        self.session_id = session_id
        self.max_segment_chars = max_segment_chars
        self.on_idle = on_idle  # called when delivery ran out of segments (not after a cancel)
        self.on_crash = on_crash  # called when delivery itself failed (a bug, not an engine error)
        self.rate = config.sample_rate
        self.jobs: deque[Job] = deque()
        self.sentences = 0  # sentence indexes given so far
        self.queued_chars = 0  # text of segments whose synthesis has not started
        self.bytes_sent = 0  # audio bytes of the whole session
        self.first_audio_s: float | None = None  # the session's first segment: queued -> first audio frame sent
        self._played_out_at = 0.0  # monotonic time by which a client playing each frame as it comes has played all
        self._flowing = False  # a first frame of this utterance is out (until delivery runs dry or is cancelled)
        self._delivery: asyncio.Task[None] | None = None
        # Streamed mp3/opus/aac: one stream for the whole session, fed in delivery order (_stream_coded).
        coded = config.stream_audio and config.response_format in STREAMED_FORMATS
        self._coder = StreamedAudio(config.response_format, self.rate) if coded else None
        self._coded_s = 0.0  # seconds of audio given to the coder and not yet in a frame sent

    @property
    def busy(self) -> bool:
        """Segments are waiting, being synthesised or being sent."""
        return bool(self.jobs)

    def audio_ahead_s(self) -> float:
        """Seconds of audio sent that a client playing each frame at real time from its arrival (and
        waiting through pauses) has not played yet: what it may still have to read."""
        return max(0.0, self._played_out_at - time.monotonic())

    @property
    def total_sentences(self) -> int:
        """Segments accepted and not dropped: announced ones plus those still waiting."""
        return self.sentences + sum(1 for job in self.jobs if not job.announced)

    def enqueue(self, text: str) -> None:
        job = Job(text)
        self.jobs.append(job)
        self.queued_chars += len(text)
        self._start_producers()
        if self._delivery is None:
            self._delivery = asyncio.create_task(self._deliver_all(), name=f"{self.session_id}-delivery")

    def _start_producers(self) -> None:
        """The segment being delivered is synthesised at the front of the engine's queue, by the deadline
        of its ticket: when the client will have played the audio it was sent (speech/engines/pool.py);
        the next one (look-ahead) waits behind every session's current segments. While the client has no
        audio of this utterance yet, the look-ahead starts only once the current segment's first
        frame is sent (its first chunk, when audio is sent as a file), so it never delays the first
        audio; once audio flows, it starts with the current segment, and a fast reader gets two
        segments synthesised at a time instead of one after the other."""
        for position, job in enumerate(self.jobs):
            if position > LOOKAHEAD:
                break
            if position == 0:
                # Due when the client has played what it was sent, or when its text came if that is later.
                job.ticket.deadline = max(self._played_out_at, job.queued_at)
                job.ticket.current = True
            elif not (self._flowing or self.jobs[position - 1].started):
                break
            if job.producer is None:
                self.queued_chars -= len(job.text)
                # The engine's stream is started here, in this step, not by the producer task: Hibari then
                # queues the segment's first job before the loop handles the other sessions' messages of
                # this turn. With 4 and 8 sessions' text arriving together (bench/throughput.py's rounds,
                # job timestamps), the first job started 1.5-4.3 ms after the text, now 1.3-1.9 ms; the
                # raw engine's 0.3 ms.
                if len(job.text) <= self.max_segment_chars:
                    job.stream = start_segment(self.engine, self.config, job.text, job.ticket)
                job.producer = asyncio.create_task(self._produce(job), name=f"{self.session_id}-synth")

    def _started(self, job: Job) -> None:
        if not job.started:
            job.started = True
            self._start_producers()

    async def _produce(self, job: Job) -> None:
        # A streamed segment with audio counts as started once its first frame is sent (_send_audio);
        # anything else once it has audio, or when it ends.
        streamed_audio = False
        stream, job.stream = job.stream, None  # the producer owns it now: closed with render_segment's
        try:
            if len(job.text) > self.max_segment_chars:
                raise bad_request(f"input must be at most {self.max_segment_chars} characters", "input")
            # Streamed raw audio is encoded here, as it is made: a held session's queued chunks
            # then take 2 bytes a sample (1 for G.711), not float32's 4.
            encoder = self._stream_encoder()
            segment = render_segment(self.engine, self.config, job.text, job.ticket, stream)
            async with contextlib.aclosing(segment) as audio:
                async for chunk in audio:
                    if chunk.size and encoder is not None and not streamed_audio:
                        chunk = await self._first_frame_first(job, encoder, chunk)
                    if chunk.size:
                        job.chunks.put_nowait(encoder.encode(chunk) if encoder else chunk)
                        streamed_audio = encoder is not None
                    if encoder is None:
                        self._started(job)
        except SpeechError as exc:
            job.chunks.put_nowait(exc)
        except EncodingError as exc:
            job.chunks.put_nowait(server_error(str(exc)))
        except Exception:
            logger.exception("synthesis failed for a segment of %s", self.session_id)
            job.chunks.put_nowait(server_error("speech synthesis failed"))
        finally:
            job.chunks.put_nowait(_END)
            if not streamed_audio:
                self._started(job)

    async def _first_frame_first(self, job: Job, encoder: RawEncoder, chunk: np.ndarray) -> np.ndarray:
        """Queue the segment's first frame alone and let delivery send it before the rest of the chunk is
        encoded. Encoding a whole sentence first (16-bit PCM from float32, on an event loop that has just
        woken; with the engine's 16-bit samples it is still a copy of the whole sentence) stood
        between the engine's audio and the first frame: from the engine's result reaching the loop to the
        first frame sent, 1.07 -> 0.85 ms at p50 (a server with timestamps, 2 x 40 paragraph sessions
        each way, interleaved). Returns the rest of the chunk."""
        head = _first_frame_samples(self.rate)
        if chunk.size <= head:
            return chunk
        job.chunks.put_nowait(encoder.encode(chunk[:head]))
        await asyncio.sleep(0)
        return chunk[head:]

    async def _deliver_all(self) -> None:
        try:
            while self.jobs:
                await self._deliver(self.jobs[0])
                self.jobs.popleft()
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

    def _announce(self, job: Job) -> None:
        job.index = self.sentences
        self.sentences += 1

    def _id(self, job: Job) -> str:
        return f"{self.session_id}-{job.index}"

    async def _start(self, job: Job) -> None:
        self._announce(job)
        await self.transport.send_json(
            AudioStart(
                id=self._id(job),
                sentence_index=job.index,  # type: ignore[arg-type]  # _announce() set it
                sentence_text=job.text,
                format=self.config.response_format,
                sample_rate=self.rate,
            ).dump()
        )

    async def _send_audio(self, job: Job, data: bytes, seconds: float) -> None:
        first = job.bytes_sent == 0
        await self.transport.send_bytes(data)
        job.bytes_sent += len(data)
        self.bytes_sent += len(data)
        metrics.audio_sent(len(data), seconds)
        now = time.monotonic()
        self._played_out_at = max(self._played_out_at, now) + seconds
        job.ticket.deadline = self._played_out_at  # the segment's further jobs are due once this is played
        if self.first_audio_s is None:
            self.first_audio_s = now - job.queued_at
            metrics.TTFA.observe(self.first_audio_s)
        # Let the loop run: a cancel that arrived meanwhile is read and handled before the next frame.
        await asyncio.sleep(0)
        if first:
            # The next segment's synthesis starts once this segment's first frame is in the socket
            # (speech/web/wsprotocol.py writes it through at once), not when its audio was made: its
            # G2P is Python and would hold the GIL while the loop still had that frame to write.
            self._flowing = True
            self._started(job)

    def _stream_encoder(self) -> RawEncoder | None:
        """Streamed raw audio is encoded by the producer; compressed audio by delivery (_stream_coded)."""
        if self.config.stream_audio and self.config.response_format in RAW_FORMATS:
            return RawEncoder(self.config.response_format, self.rate)
        return None

    async def _deliver(self, job: Job) -> None:
        fmt, streaming = self.config.response_format, self.config.stream_audio
        raw = RawEncoder(fmt, self.rate) if fmt in RAW_FORMATS else None
        collected = []
        failure = None
        while (item := await job.chunks.get()) is not _END:
            if isinstance(item, SpeechError):
                failure = item
            elif failure is not None:
                continue
            elif self._coder is not None:
                try:
                    await self._stream_coded(job, item)
                except EncodingError as exc:
                    failure = server_error(str(exc))
            elif streaming:  # raw audio, encoded by the producer
                await self._stream(job, raw.bytes_per_sample, item)  # type: ignore[union-attr]
            else:
                collected.append(item)
        if self._coder is not None and job.announced:  # all of the segment's audio before its audio.done
            try:
                await self._send_coded(job, await self._coder.end_segment())
            except EncodingError as exc:
                failure = failure or server_error(str(exc))
        if failure is None and collected:
            samples = collected[0] if len(collected) == 1 else np.concatenate(collected)
            try:
                data = raw.encode(samples) if raw else await asyncio.to_thread(encode_file, fmt, samples, self.rate)
            except EncodingError as exc:
                failure = server_error(str(exc))
            else:
                await self._start(job)
                await self._send_audio(job, data, samples.size / self.rate)
        if failure is not None or not job.announced:
            failure = failure or server_error("the engine produced no audio for this segment")
            partial = job.announced
            if not job.announced:
                self._announce(job)
            await self.transport.send_json(
                failure.event(id=self._id(job), sentence_index=job.index, partial_audio=True if partial else None)
            )
        await self._done(job, error=failure is not None, cancelled=False)

    async def _stream(self, job: Job, width: int, data: bytes) -> None:
        """Send one encoded chunk as raw frames: a short first frame for each segment, then FRAME_S frames.
        A later frame holds more, up to MAX_FRAME_S, when the connection sends that much at once
        (`Transport.send_room`: a client that reads faster than the audio comes). Every frame is a cost
        to the event loop and to the client: frames up to 1 s where the window allows took the loop from
        0.33 to 0.26 and the client from 0.17 to 0.12 ms of CPU per audio second, and throughput from 0.91
        to 0.94 of the engine's (bench/throughput.py's paragraph at C = 8, 20 rounds interleaved with
        200 ms frames). Frames never outgrow the window, because on loopback a write larger than it may
        wait seconds (speech/web/tcpwindow.py); a client that falls behind gets FRAME_S frames."""
        if not job.announced:
            await self._start(job)
        at = 0
        if job.bytes_sent == 0:
            at = _first_frame_samples(self.rate) * width
            await self._send_audio(job, data[:at], at / width / self.rate)
        step = max(1, int(self.rate * FRAME_S)) * width
        largest = max(1, int(self.rate * MAX_FRAME_S)) * width
        while at < len(data):
            room = self.transport.send_room() if len(data) - at > step else 0  # else one FRAME_S frame holds the rest
            size = min(largest, room - room % width) if room > step else step
            frame = data[at : at + size]
            at += len(frame)
            await self._send_audio(job, frame, len(frame) / width / self.rate)

    async def _stream_coded(self, job: Job, samples: np.ndarray) -> None:
        """Send a chunk of a streamed mp3/opus/aac segment as whole codec frames, encoded FIRST_FRAME_S at
        a time in the loop until the segment's first frame is out (the encoder gathers a few codec
        frames before its first one), then FRAME_S at a time on an encoding thread
        (speech/audio/streaming.py): a cancel stops it within one frame (docs/decisions.md)."""
        if not job.announced:
            await self._start(job)
        at = 0
        while at < samples.size:
            step = int(self.rate * (FRAME_S if job.bytes_sent else FIRST_FRAME_S))
            piece = samples[at : at + step]
            at += piece.size
            self._coded_s += piece.size / self.rate
            data = await self._coder.encode(piece, inline=not job.bytes_sent)  # type: ignore[union-attr]
            await self._send_coded(job, data)

    async def _send_coded(self, job: Job, data: bytes) -> None:
        if data:
            seconds, self._coded_s = self._coded_s, 0.0
            await self._send_audio(job, data, seconds)
            self._coder.sent()  # type: ignore[union-attr]

    async def _done(self, job: Job, *, error: bool, cancelled: bool) -> None:
        job.done_sent = True
        await self.transport.send_json(
            AudioDone(
                id=self._id(job),
                sentence_index=job.index,  # type: ignore[arg-type]  # only announced jobs end
                total_bytes=job.bytes_sent,
                error=error,
                cancelled=cancelled,
            ).dump()
        )

    async def _stop(self) -> list[Job]:
        """Stop delivery and every producer (engine work included) and forget all segments. The
        segments are forgotten first: a producer that ends here marks its segment started, which
        must not start the next one's synthesis behind our back."""
        self.abandon()
        jobs = list(self.jobs)
        self.jobs.clear()
        self.queued_chars = 0
        self._flowing = False
        tasks = [job.producer for job in jobs if job.producer is not None]
        if self._delivery is not None:
            tasks.append(self._delivery)
            self._delivery = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._coder is not None:  # the stream goes on valid from the last frame the client got
            await self._coder.cut()
            self._coded_s = 0.0
        for job in jobs:  # a producer cancelled before its first step never took its engine stream
            if job.stream is not None:
                await job.stream.aclose()  # type: ignore[attr-defined]  # engines' streams close
        return jobs

    def abandon(self) -> None:
        """Nobody will hear the segments accepted so far: the engine drops their waiting jobs and stops a
        running one at its next step, from now on, before this loop gets to cancel the tasks that await
        them (speech/engines/pool.py)."""
        for job in self.jobs:
            job.ticket.abandon()

    async def cancel(self) -> int:
        """Barge-in: stop the current segment within one frame, drop the rest. Returns how many
        segments were stopped or dropped."""
        jobs = [job for job in await self._stop() if not job.done_sent]
        if jobs and jobs[0].announced:
            await self._done(jobs[0], error=False, cancelled=True)
        return len(jobs)

    async def aclose(self) -> None:
        """The client is gone: abort all work, send nothing."""
        await self._stop()


def _first_frame_samples(rate: int) -> int:
    return max(1, int(rate * FIRST_FRAME_S))
