"""LiveKit Agents TTS plugin for the streaming speech server (its WebSocket `/v1/audio/speech/stream`).

`TTS.stream()` is one of the protocol's contexts (docs/protocol.md, "Voice-agent extensions") on a
pooled session: `push_text` sends `input.text`, `flush` sends `input.commit` (speak what is
buffered now), `end_input` sends `input.done` for the context, and the stream ends on the server's
`context.done`. Word timestamps (`timestamps: "word"`) become LiveKit's TimedStrings, timed from the
start of the stream's audio, for the synchronised transcript (`aligned_transcript=True`).

An interruption closes the stream (LiveKit cancels it): the plugin sends `input.cancel` for the
context, the server stops it within one audio frame, and the session goes back to the pool for the
next stream, with nothing of the cancelled context left to arrive on it (session.py drops it).
The TTS then emits `context_cancelled` with the server's `input.cancelled` (what it estimates
was heard: `spoken_text`, `unspoken_text`). A stream whose context the server had already finished
(`context.done`) has nothing left to stop: LiveKit's own transcript synchroniser knows what was
played of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, tts, utils
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS
from livekit.agents.voice.io import TimedString

from .log import logger
from .session import Audio, Session, SessionClosed

DEFAULT_URL = "ws://127.0.0.1:8000/v1/audio/speech/stream"


@dataclass
class _Options:
    url: str
    api_key: str | None
    voice: str | None
    model: str | None
    speed: float | None
    sample_rate: int
    word_timestamps: bool

    def session_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "response_format": "pcm",
            "stream_audio": True,
            "sample_rate": self.sample_rate,
            "timestamps": "word" if self.word_timestamps else "none",
        }
        for key in ("voice", "model", "speed"):
            if getattr(self, key) is not None:
                config[key] = getattr(self, key)
        return config


class TTS(tts.TTS):
    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        voice: str | None = None,
        model: str | None = None,
        speed: float | None = None,
        sample_rate: int = 24000,
        word_timestamps: bool = True,
        http_session: aiohttp.ClientSession | None = None,
    ) -> None:
        """Text to speech on the streaming speech server.

        Args:
            url: the server's WebSocket endpoint.
            api_key: sent as `Authorization: Bearer` (default: `SPEECH_API_KEY` from the environment).
            voice: a voice of the server (or an alias such as `alloy`); None: its default voice.
            model: forwarded to the server's engine.
            speed: speaking rate, 0.25 to 4.0 (the pitch is kept).
            sample_rate: 8000, 16000, 22050, 24000, 44100 or 48000; the server resamples to it.
            word_timestamps: timed words for LiveKit's synchronised transcript.
            http_session: an aiohttp session to open the WebSockets with (default: the job's).
        """
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=word_timestamps),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._opts = _Options(
            url=url,
            api_key=api_key or os.environ.get("SPEECH_API_KEY"),
            voice=voice,
            model=model,
            speed=speed,
            sample_rate=sample_rate,
            word_timestamps=word_timestamps,
        )
        self._http = http_session
        self._pool = utils.ConnectionPool[Session](connect_cb=self._connect, close_cb=self._close)
        self._streams = weakref.WeakSet[SynthesizeStream]()

    @property
    def model(self) -> str:
        return self._opts.model or "default"

    @property
    def provider(self) -> str:
        return "speechserver"

    async def _connect(self, timeout: float) -> Session:
        if self._http is None:
            self._http = utils.http_context.http_session()
        headers = {"Authorization": f"Bearer {self._opts.api_key}"} if self._opts.api_key else {}
        config = self._opts.session_config()
        return await Session.open_session(
            self._http, self._opts.url, config, headers=headers, timeout=timeout, on_cancelled=self._cancelled
        )

    def _cancelled(self, event: dict[str, Any]) -> None:
        """An interrupted stream's context, as the server stopped it: `context_cancelled` with its
        `input.cancelled` (`spoken_text`: what was played by its estimate, `unspoken_text`)."""
        self.emit("context_cancelled", event)

    async def _close(self, session: Session) -> None:
        await session.aclose()

    def prewarm(self) -> None:
        self._pool.prewarm()

    def update_options(self, *, voice: str | None = None, speed: float | None = None) -> None:
        """Voice and speed are a session's: pooled sessions are replaced for the next streams."""
        if voice is not None:
            self._opts.voice = voice
        if speed is not None:
            self._opts.speed = speed
        self._pool.invalidate()

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> tts.ChunkedStream:
        """One-shot text: a context of its own, the whole text then `input.done`."""
        return self._synthesize_with_stream(text, conn_options=conn_options)

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        await self._pool.aclose()


class _Transcript:
    """Word timings of one context as TimedStrings: each word with the text before it (spaces,
    punctuation), times from the start of the context's audio. The server times words from the
    start of each segment (sentence); `offset_s` is where the current segment starts."""

    def __init__(self, sample_rate: int) -> None:
        self.bytes_per_s = 2 * sample_rate
        self.audio_bytes = 0
        self.offset_s = 0.0
        self.sentence = ""
        self.cursor = 0
        self.segments = 0

    def start(self, event: dict[str, Any]) -> None:
        self.offset_s = self.audio_bytes / self.bytes_per_s
        self.sentence = ("" if self.segments == 0 else " ") + event["sentence_text"]
        self.cursor = 0
        self.segments += 1

    def words(self, event: dict[str, Any]) -> list[TimedString]:
        shift = 1 if self.segments > 1 else 0  # the space start() put before a later sentence
        timed = []
        for word in event["words"]:
            end = word["char_end"] + shift
            timed.append(
                TimedString(
                    text=self.sentence[self.cursor : end],
                    start_time=self.offset_s + word["start_ms"] / 1000,
                    end_time=self.offset_s + word["end_ms"] / 1000,
                )
            )
            self.cursor = end
        return timed

    def rest(self) -> TimedString | None:
        """What follows the last word of the segment (its closing punctuation), at its end."""
        text, self.cursor = self.sentence[self.cursor :], len(self.sentence)
        if not text:
            return None
        end = self.audio_bytes / self.bytes_per_s
        return TimedString(text=text, start_time=end, end_time=end)


class SynthesizeStream(tts.SynthesizeStream):
    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self.context_id = ""  # the protocol context of the current attempt (a retry takes a new one)
        self.session_id: str | None = None  # the server session the stream ran on
        self.cancelled: dict[str, Any] | None = None  # input.cancelled, when the server cancelled it (REST, admin)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        self.context_id = utils.shortuuid("ctx_")
        output_emitter.initialize(
            request_id=self.context_id,
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        try:
            session = await self._tts._pool.get(timeout=self._conn_options.timeout)
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            raise APIConnectionError(f"cannot open a speech server session: {e}") from e
        self.session_id = session.configured["session_id"]
        queue = session.open(self.context_id)
        finished = False
        try:
            output_emitter.start_segment(segment_id=self.context_id)
            sender = asyncio.create_task(self._send_input(session))
            try:
                await self._receive(queue, output_emitter)
                finished = True
            finally:
                await utils.aio.gracefully_cancel(sender)
            output_emitter.end_input()
        finally:
            if not finished and session.alive:  # interrupted (or failed): stop the context on the server
                with contextlib.suppress(Exception):
                    await asyncio.shield(session.send({"type": "input.cancel", "context_id": self.context_id}))
            session.forget(self.context_id)
            if session.alive:
                self._tts._pool.put(session)
            else:
                self._tts._pool.remove(session)

    async def _send_input(self, session: Session) -> None:
        context = {"context_id": self.context_id}
        async for data in self._input_ch:
            if isinstance(data, self._FlushSentinel):
                await session.send({"type": "input.commit", **context})
                continue
            self._mark_started()
            await session.send({"type": "input.text", "text": data, **context})
        await session.send({"type": "input.done", **context})

    async def _receive(self, queue: asyncio.Queue[Any], output_emitter: tts.AudioEmitter) -> None:
        transcript = _Transcript(self._tts.sample_rate)
        while True:
            item = await queue.get()
            if isinstance(item, Audio):
                transcript.audio_bytes += len(item.data)
                output_emitter.push(item.data)
                continue
            if isinstance(item, SessionClosed):
                raise APIConnectionError(str(item))
            kind = item["type"]
            if kind == "audio.start":
                transcript.start(item)
            elif kind == "audio.timestamps":
                output_emitter.push_timed_transcript(transcript.words(item))
            elif kind == "audio.done":
                rest = transcript.rest()
                if rest is not None:
                    output_emitter.push_timed_transcript(rest)
            elif kind == "context.done":
                return
            elif kind == "input.cancelled":
                self.cancelled = item
                return
            elif kind == "error":
                if item.get("sentence_index") is None:  # the context as a whole was refused
                    raise APIError(f"speech server: {item.get('message')}", retryable=False)
                logger.warning("speech server failed a sentence: %s", item.get("message"))
