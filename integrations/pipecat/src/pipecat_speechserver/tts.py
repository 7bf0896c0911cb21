"""Pipecat TTS service for the streaming speech server (its WebSocket `/v1/audio/speech/stream`).

One WebSocket session serves the whole pipeline; each turn is one of the protocol's contexts
(docs/protocol.md, "Voice-agent extensions"): the turn's text goes out as `input.text` with the
turn's `context_id`, the end of the turn is `input.done` for that context (answered by
`context.done`), and an interruption is `input.cancel` for each interrupted context with
`played_ms`, how much of its audio had been handed to the transport. The server stops that
context within one audio frame and sends nothing more of it; the socket stays open for the next
turn (no reconnect), and `session.keepalive` keeps an idle socket open.

Word timestamps (`timestamps: "word"`) become Pipecat's word frames. Each word is timed at its
end: the output transport releases a word to the assistant context aggregator only once the word
has been played, so after an interruption the context holds the words the user heard. `played_ms`
is measured from the same base as the word frames' times, so the server's `spoken_text` (the words
whose end was reached) names the same words. The base is when the output transport starts
playing the turn: the first audio handed to it plus its usual start lag, learnt from its
BotStartedSpeakingFrame.

Built on Pipecat's `WebsocketTTSService`, the base that `AudioContextWordTTSService` became
(deprecated since pipecat-ai 0.0.105): audio contexts and word timestamps are part of it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from websockets.protocol import State

DEFAULT_URL = "ws://127.0.0.1:8000/v1/audio/speech/stream"
# The server closes a session after 30 s without a client frame while nothing is generating.
KEEPALIVE_INTERVAL_S = 10.0
HANDSHAKE_TIMEOUT_S = 10.0
# The output transport starts playing a little after the service hands it a turn's first audio
# (its queue, its "bot started speaking" work): word frames are timed from when it plays, by the
# median of the last lags seen, so the context keeps only words played. A longer wait than
# MAX_START_LAG_S was no start lag (the transport was busy with earlier audio).
START_LAGS_KEPT = 20
MAX_START_LAG_S = 0.5


class SpeechServerError(Exception):
    """The server refused the session (its `error` event) or answered something unexpected."""


@dataclass
class _Context:
    """What the receive loop knows of one context (one turn)."""

    audio_bytes: int = 0  # received so far: the next segment's words start after them
    segment_offset_s: float = 0.0  # where the current segment starts in the context's audio
    pushed_s: float = 0.0  # audio handed downstream (towards the transport)
    started_ns: int | None = None  # clock time its audio started: the base of its word frames' times
    completed: bool = False  # all its audio went downstream; the transport may still be playing it
    cancel_sent: bool = False  # input.cancel went; its input.cancelled ends it


class SpeechServerTTSService(WebsocketTTSService):
    """Text to speech on the streaming speech server, with contexts and word timestamps.

    Example::

        tts = SpeechServerTTSService(url="ws://127.0.0.1:8000/v1/audio/speech/stream",
                                     settings=SpeechServerTTSService.Settings(voice="heart"))

    Event handlers (besides the base class's):
        on_context_cancelled(service, event): the server's `input.cancelled` for a context this
            service cancelled on an interruption: `played_ms`, `spoken_text`, `unspoken_text`.
    """

    Settings = TTSSettings
    _settings: TTSSettings

    def __init__(
        self,
        *,
        url: str = DEFAULT_URL,
        api_key: str | None = None,
        sample_rate: int | None = None,
        speed: float | None = None,
        keepalive_interval_s: float = KEEPALIVE_INTERVAL_S,
        settings: TTSSettings | None = None,
        text_aggregation_mode: TextAggregationMode | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the service.

        Args:
            url: the server's WebSocket endpoint.
            api_key: sent as `Authorization: Bearer` when the server requires keys.
            sample_rate: output rate (8000, 16000, 22050, 24000, 44100 or 48000); the server
                resamples to it. None: the pipeline's output rate.
            speed: speaking rate, 0.25 to 4.0 (the pitch is kept).
            keepalive_interval_s: how often an idle socket sends `session.keepalive` (at most a
                third of the idle timeout the server announces in `session.configured`).
            settings: `voice` (a voice of the server, or an alias such as `alloy`), `model`.
            text_aggregation_mode: SENTENCE (Pipecat cuts sentences; each is committed at
                once) or TOKEN (tokens go straight on and the server cuts sentences itself).
            **kwargs: passed to `WebsocketTTSService`.
        """
        default_settings = self.Settings(model=None, voice=None, language=None)
        if settings is not None:
            default_settings.apply_update(settings)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # word frames come from the word timestamps
            push_start_frame=True,
            pause_frame_processing=False,  # audio carries its context (audio.start), nothing to hold
            sample_rate=sample_rate,
            settings=default_settings,
            **kwargs,
        )
        self._url = url
        self._api_key = api_key
        self._speed = speed
        self._keepalive_interval_s = keepalive_interval_s
        self._keepalive_every = keepalive_interval_s  # shortened to a third of the server's idle timeout
        self._receive_task: asyncio.Task[None] | None = None
        self._contexts: dict[str, _Context] = {}
        self._current: str | None = None  # the context whose binary frames are arriving
        self._start_lags: deque[int] = deque(maxlen=START_LAGS_KEPT)  # ns, first audio out -> transport playing
        self._awaiting_playback: int | None = None  # when the last turn's first audio went out
        self.session_id: str | None = None
        self._register_event_handler("on_context_cancelled")

    def can_generate_metrics(self) -> bool:
        return True

    # -- connection ------------------------------------------------------------------------------

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket and not self._receive_task:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))
        self._create_keepalive_task(self._keepalive_every)

    async def _disconnect(self) -> None:
        await super()._disconnect()
        await self._cancel_keepalive_task()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    def _session_config(self) -> dict[str, Any]:
        session: dict[str, Any] = {
            "response_format": "pcm",
            "stream_audio": True,
            "sample_rate": self.sample_rate,
            "timestamps": "word",
        }
        for key, value in (("voice", self._settings.voice), ("model", self._settings.model), ("speed", self._speed)):
            if isinstance(value, (str, int, float)):  # NOT_GIVEN and None: the server's default
                session[key] = value
        return {"type": "session.config", "session": session}

    async def _connect_websocket(self) -> None:
        try:
            if self._websocket and self._websocket.state is State.OPEN:
                return
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            websocket = await self._websocket_connect(self._url, additional_headers=headers)
            await websocket.send(json.dumps(self._session_config()))
            configured = json.loads(await asyncio.wait_for(websocket.recv(), HANDSHAKE_TIMEOUT_S))
            if configured.get("type") != "session.configured":
                await websocket.close()
                raise SpeechServerError(configured.get("message") or f"unexpected first event: {configured}")
            if configured.get("sample_rate") != self.sample_rate:
                await websocket.close()
                raise SpeechServerError(f"the server sends {configured.get('sample_rate')} Hz, not {self.sample_rate}")
            self._websocket = websocket
            self.session_id = configured["session_id"]
            idle_timeout_s = configured.get("limits", {}).get("idle_timeout_s") or self._keepalive_interval_s * 3
            self._keepalive_every = min(self._keepalive_interval_s, idle_timeout_s / 3)
            self._contexts.clear()
            self._current = None
            await self._call_event_handler("on_connected")
        except Exception as e:
            self._websocket = None
            await self.push_error(error_msg=f"{self} could not open a session: {e}", exception=e)
            await self._call_event_handler("on_connection_error", f"{e}")

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()
            if self._websocket:
                await self._websocket.close()
        except Exception as e:
            await self.push_error(error_msg=f"{self} error closing the session: {e}", exception=e)
        finally:
            self._websocket = None
            await self._call_event_handler("on_disconnected")

    async def _send(self, message: dict[str, Any]) -> None:
        if self._websocket is None:
            raise SpeechServerError("no session")
        await self._websocket.send(json.dumps(message))

    async def _send_keepalive(self) -> None:
        await self._send({"type": "session.keepalive"})

    async def _update_settings(self, delta: TTSSettings) -> dict[str, Any]:
        """Voice and model are a session's: a change opens a new session for the next turn."""
        changed = await super()._update_settings(delta)
        if changed.keys() & {"voice", "model"}:
            await self._disconnect()
            await self._connect()
        return changed

    # -- text out --------------------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send the text to the turn's context; its audio arrives on the receive loop."""
        try:
            if not self._websocket or self._websocket.state is State.CLOSED:
                await self._connect()
            if context_id not in self._contexts:
                self._forget_played()
                self._contexts[context_id] = _Context()
            await self._send({"type": "input.text", "text": text, "context_id": context_id})
            if not self._is_streaming_tokens:  # a whole sentence: speak it now, do not wait for more
                await self._send({"type": "input.commit", "context_id": context_id})
            await self.start_tts_usage_metrics(text)
            yield None
        except Exception as e:
            yield ErrorFrame(error=f"{self} could not send text: {e}")
            yield TTSStoppedFrame(context_id=context_id)

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: the server speaks the rest, then answers context.done."""
        context_id = context_id or self.get_active_audio_context_id()
        if context_id and self._websocket and context_id in self._contexts:
            await self._send({"type": "input.done", "context_id": context_id})

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Cancel the interrupted turn on the server, saying how much of it was played."""
        await self.stop_all_metrics()
        await self._cancel(context_id)
        await super().on_audio_context_interrupted(context_id)

    async def _handle_interruption(self, frame: InterruptionFrame, direction: FrameDirection) -> None:
        """Also cancel the turns whose audio all went to the transport, which is still playing it
        (the server sends audio faster than real time): their context is over on the server, but
        its `input.cancelled` says what was heard, and the context is closed for good."""
        playing_out = [cid for cid, c in self._contexts.items() if c.completed and self._played_ms(c) < 1000 * c.pushed_s]
        await super()._handle_interruption(frame, direction)
        for context_id in playing_out:
            await self._cancel(context_id)
        for context_id in [cid for cid, c in self._contexts.items() if c.completed and not c.cancel_sent]:
            del self._contexts[context_id]

    async def _cancel(self, context_id: str) -> None:
        context = self._contexts.get(context_id)
        if context is None or context.cancel_sent or self._websocket is None:
            return
        context.cancel_sent = True
        try:
            await self._send({"type": "input.cancel", "context_id": context_id, "played_ms": round(self._played_ms(context), 1)})
        except Exception as e:  # the receive loop reports a lost connection
            logger.warning(f"{self} could not cancel context {context_id}: {e}")

    def _played_ms(self, context: _Context) -> float:
        """Audio of the context played so far: real time since its audio started, never more than
        went downstream. Measured from the base of its word frames' times, so a word frame the
        transport released (at the word's end) is a word `played_ms` has passed too."""
        if context.started_ns is None:
            return 0.0
        elapsed_s = (self.get_clock().get_time() - context.started_ns) / 1e9
        return 1000.0 * max(0.0, min(elapsed_s, context.pushed_s))

    async def start_word_timestamps(self) -> None:
        """The context's first audio goes downstream: its words are timed from when the transport
        will play it (now, plus its usual start lag), or after the previous context's last word."""
        now = self.get_clock().get_time()
        start = now + (int(statistics.median(self._start_lags)) if self._start_lags else 0)
        context = self._contexts.get(self.get_active_audio_context_id() or "")
        if context is not None and context.started_ns is None:
            context.started_ns = max(self._word_timestamp_tracker.last_pts, start)
            self._awaiting_playback = now
        for cached in self._word_timestamp_tracker.start(start):  # as the base class does, from `start`
            await self._add_word_timestamps(
                [(cached.word, cached.timestamp)],
                cached.context_id,
                includes_inter_frame_spaces=cached.includes_inter_frame_spaces,
            )

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, BotStartedSpeakingFrame) and self._awaiting_playback is not None:
            lag = self.get_clock().get_time() - self._awaiting_playback
            if lag <= MAX_START_LAG_S * 1e9:
                self._start_lags.append(lag)
            self._awaiting_playback = None
        elif isinstance(frame, InterruptionFrame):
            self._awaiting_playback = None
        await super().process_frame(frame, direction)

    async def push_frame(self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM) -> None:
        if isinstance(frame, TTSAudioRawFrame) and frame.context_id in self._contexts:
            context = self._contexts[frame.context_id]
            context.pushed_s += len(frame.audio) / (2 * frame.sample_rate * frame.num_channels)
        await super().push_frame(frame, direction)

    async def on_audio_context_completed(self, context_id: str) -> None:
        if context_id in self._contexts:
            self._contexts[context_id].completed = True
        await super().on_audio_context_completed(context_id)

    def _forget_played(self) -> None:
        """Turns played to their end are over: nothing more can come of them."""
        for context_id in [cid for cid, c in self._contexts.items() if c.completed and self._played_ms(c) >= 1000 * c.pushed_s]:
            del self._contexts[context_id]

    # -- events in -------------------------------------------------------------------------------

    async def _receive_messages(self) -> None:
        async for message in self._websocket:
            if isinstance(message, bytes):
                await self._audio(message)
            else:
                await self._event(json.loads(message))

    async def _audio(self, data: bytes) -> None:
        context_id = self._current
        if context_id is None or context_id not in self._contexts:
            return
        self._contexts[context_id].audio_bytes += len(data)
        if self.audio_context_available(context_id):  # else: interrupted, the frame is stale
            frame = TTSAudioRawFrame(audio=data, sample_rate=self.sample_rate, num_channels=1, context_id=context_id)
            await self.append_to_audio_context(context_id, frame)

    async def _event(self, event: dict[str, Any]) -> None:
        kind, context_id = event.get("type"), event.get("context_id")
        context = self._contexts.get(context_id) if context_id else None
        if kind == "audio.start":
            self._current = context_id
            if context is not None:
                context.segment_offset_s = context.audio_bytes / (2 * self.sample_rate)
        elif kind == "audio.done":
            self._current = None
        elif kind == "audio.timestamps" and context is not None and self.audio_context_available(context_id):
            # Timed at each word's end, from the start of the context's audio (see the module's doc).
            words = [(w["word"], context.segment_offset_s + w["end_ms"] / 1000) for w in event["words"]]
            await self.add_word_timestamps(words, context_id)
        elif kind == "context.done" and context is not None:
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
        elif kind == "input.cancelled" and context is not None:
            self._contexts.pop(context_id, None)
            await self._call_event_handler("on_context_cancelled", event)
        elif kind == "error":
            if context_id and not (context and self.audio_context_available(context_id)):
                return  # about a turn already interrupted
            await self.push_error(error_msg=f"{self} server error: {event.get('message')}")
