"""One speech session's state machine, in plain asyncio: it knows nothing of Channels.

Its adapter (the consumer, or a test) feeds it client frames with `receive_text` /
`receive_bytes`, and its Transport (the server's connection, or a test's recorder) gives it three
coroutines to talk back: `send_json`, `send_bytes`, `close(code, audio_ahead_s)`. Handling a frame
only parses, checks and enqueues; synthesis and delivery run in the pipeline's tasks, so frames are
handled at once even while audio is being produced.

States: AWAITING_CONFIG -> ACTIVE -> DRAINING (after input.done) -> CLOSED.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .errors import (
    CLOSE_INTERNAL,
    CLOSE_NORMAL,
    CLOSE_POLICY,
    CLOSE_TERMINATED,
    SERVER_ERROR,
    SpeechError,
    fatal,
)
from .cancel import Canceller, Origin
from .contexts import Context, Contexts
from .events import InputCommitted, SessionConfigured, SessionDone
from .messages import InputCancel, InputDone, InputText, InputCommit
from .pipeline import Pipeline
from .protocol import (
    parse_in_thread,
    parse_message,
    resolve_config,
    size_error,
    utf8_length_exceeds,
)

if TYPE_CHECKING:
    from ..engines.base import Engine
    from .messages import Limits, SessionConfig
    from .protocol import FindVoice

logger = logging.getLogger(__name__)

CONFIG_PARSE_OFFLOAD_BYTES = 1 << 20  # larger handshakes are parsed in a thread, within the memory budget


class Transport(Protocol):
    async def send_json(self, event: dict) -> None: ...
    async def send_bytes(self, data: bytes) -> None: ...
    async def close(self, code: int, audio_ahead_s: float = 0.0) -> None:
        """Close with `code`; the client may still be playing `audio_ahead_s` seconds of audio it has received."""
        ...

    def send_room(self) -> int:
        """Bytes of audio the connection would send at once, whole, right now (0: unknown)."""
        ...


class State(enum.Enum):
    AWAITING_CONFIG = "awaiting_config"
    ACTIVE = "active"
    DRAINING = "draining"
    CLOSED = "closed"


# How a session ended. A client that disconnects is stored and counted as "cancelled" (the session
# registry's rows, the admin and the metric's label keep that value); "cancel" elsewhere is barge-in.
OUTCOME_COMPLETED, OUTCOME_DISCONNECTED = "completed", "cancelled"
OUTCOME_TERMINATED, OUTCOME_FAILED = "terminated", "failed"
TERMINATED_MESSAGE = "speech session terminated by the server"


def new_session_id() -> str:
    return f"speech_ws_{uuid.uuid4().hex}"


class SpeechSession:
    def __init__(
        self,
        transport: Transport,
        engine: Engine,
        limits: Limits,
        *,
        session_id: str | None = None,
        find_voice: FindVoice | None = None,
        voice_aliases: Mapping[str, str] | None = None,
        on_configured: Callable[[SpeechSession], Awaitable[None]] | None = None,
        parse_large: Callable[[str], Awaitable[dict[str, Any]]] = parse_in_thread,
    ) -> None:
        self.transport = transport
        self.engine = engine
        self.limits = limits
        self.session_id = session_id or new_session_id()
        self.find_voice = find_voice  # async name -> ReferenceVoice | None (uploaded voices)
        self.voice_aliases = voice_aliases  # lower-cased alias -> voice (SPEECH_VOICE_ALIASES)
        self.on_configured = on_configured  # async (session) -> None, before session.configured is sent
        self.parse_large = parse_large  # async raw -> payload, for a handshake over CONFIG_PARSE_OFFLOAD_BYTES
        self.outcome: str | None = None  # how it ended: completed, cancelled (client left), terminated, failed
        self.state = State.AWAITING_CONFIG
        # Set by session.config; the handlers that use them run only after it (State.ACTIVE / DRAINING).
        self.config: SessionConfig = None  # type: ignore[assignment]
        self.contexts: Contexts = None  # type: ignore[assignment]
        self.pipeline: Pipeline = None  # type: ignore[assignment]  # None until then, and _end() checks
        self.canceller: Canceller = None  # type: ignore[assignment]
        self.closed = asyncio.Event()  # set once the session has ended, by either side
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # fatal-error and finishing tasks, awaited on close
        self._commits = 0
        self._finishing = False
        self._high_surrogate = ""
        self._lock = asyncio.Lock()  # client frames and control signals take turns
        self._utterance_started = 0.0  # wall time the current run of speech began

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Call once the socket is accepted: the session.config wait begins."""
        self._arm(self.limits.config_timeout_s, fatal("session.config was not received before timeout"))

    async def refuse(self, error: SpeechError) -> None:
        """End the session before it starts (authentication, capacity): the error, then its close code."""
        await self._report(error)

    async def terminate(self, message: str) -> None:
        """The server ends the session: an error event, close 4001, all work aborted."""
        error = None
        if self.state is not State.CLOSED:
            error = SpeechError(message, error_type=SERVER_ERROR, code=None, close_code=CLOSE_TERMINATED)
        await self._end(OUTCOME_TERMINATED, error)

    async def aclose(self) -> None:
        """The client disconnected (or the server is done): abort all work, send nothing more."""
        await self._end(OUTCOME_DISCONNECTED)

    # -- client frames -------------------------------------------------------------------------
    async def receive_text(self, raw: str) -> None:
        async with self._lock:
            if self.state is State.CLOSED:
                return
            self._disarm()
            try:
                if self.state is State.AWAITING_CONFIG:
                    await self._configure(raw)
                else:
                    await self._handle(raw)
            except SpeechError as exc:
                await self._report(exc)
            self._arm_idle()

    async def receive_bytes(self, data: bytes) -> None:
        async with self._lock:
            if self.state is State.CLOSED:
                return
            self._disarm()
            handshake = self.state is State.AWAITING_CONFIG
            limit = self.limits.max_config_bytes if handshake else self.limits.max_message_bytes
            if len(data) > limit:
                error = size_error("session" if handshake else "text", limit, handshake=handshake)
            else:
                error = SpeechError(
                    "speech WebSocket client messages must be text frames", close_code=CLOSE_POLICY if handshake else None
                )
            await self._report(error)
            self._arm_idle()

    # -- control signals (speech.cancel / speech.terminate, speech/control/signals.py) -------------
    async def handle_signal(self, message: dict[str, Any]) -> None:
        """A cancel or terminate from the control plane, possibly sent from another instance.

        A cancel is answered exactly like a client's input.cancel (origin "server"), also when
        nothing is speaking (cancelled_sentences 0). It cuts only speech under way when it was issued:
        one issued before the current utterance began (delivered late) cuts nothing and is answered
        with cancelled_sentences 0. Without `issued_at` (any Django code may send one) it is current."""
        async with self._lock:
            if self.state in (State.CLOSED, State.AWAITING_CONFIG):
                return
            kind = message.get("type")
            if kind == "speech.terminate":
                reason = message.get("reason")
                await self.terminate(reason if isinstance(reason, str) and reason else TERMINATED_MESSAGE)
            elif kind == "speech.cancel":
                if self._issued_before_utterance(message.get("issued_at")):
                    await self.canceller.answer_stale()
                else:
                    await self._on_cancel({"type": "input.cancel"}, origin="server")
                self._arm_idle()

    def _issued_before_utterance(self, issued_at: Any) -> bool:
        if not isinstance(issued_at, (int, float)) or isinstance(issued_at, bool):
            return False
        return issued_at < self._utterance_started

    async def _configure(self, raw: str) -> None:
        limit = self.limits.max_config_bytes
        if utf8_length_exceeds(raw, limit):
            raise size_error("session", limit, handshake=True)
        if len(raw) > CONFIG_PARSE_OFFLOAD_BYTES:
            payload = await self.parse_large(raw)
        else:
            payload = parse_message(raw, handshake=True)
        if payload.get("type") != "session.config":
            raise fatal("first WebSocket message must be session.config", "type")
        self.config = await resolve_config(payload, self.engine.capabilities, self.find_voice, self.voice_aliases)
        self.contexts = Contexts(self.config.split_granularity, self.limits.max_contexts)
        self.pipeline = Pipeline(
            engine=self.engine,
            config=self.config,
            transport=self.transport,
            session_id=self.session_id,
            max_segment_chars=self.limits.max_segment_chars,
            on_idle=self._on_pipeline_idle,
            on_crash=self._on_pipeline_crash,
            contexts=self.contexts,
        )
        self.canceller = Canceller(self.session_id, self.transport, self.contexts, self.pipeline, self._total)
        self.state = State.ACTIVE
        if self.on_configured is not None:
            await self.on_configured(self)
        await self.transport.send_json(
            SessionConfigured.of(self.session_id, self.config, self.engine.capabilities, self.limits).dump()
        )

    async def _handle(self, raw: str) -> None:
        if utf8_length_exceeds(raw, self.limits.max_message_bytes):
            raise size_error("text", self.limits.max_message_bytes)
        payload = parse_message(raw)
        kind = payload.get("type")
        allowed = HANDLERS if self.state is State.ACTIVE else DRAINING_HANDLERS
        handler = allowed.get(kind) if isinstance(kind, str) else None
        if handler is None:
            raise SpeechError(f"unsupported speech WebSocket message type: {kind!r}", param="type")
        await handler(self, payload)

    # -- message handlers ----------------------------------------------------------------------
    async def _on_text(self, payload: dict[str, Any]) -> None:
        message = InputText.read(payload, close_code=None)
        text = self._join_surrogates(message.text)
        limit = self.limits.max_pending_chars
        if self._pending_chars() + self.pipeline.queued_chars + len(text) > limit:
            raise fatal(f"buffered speech text exceeds {limit} characters", "text")
        context = self._open_context(message.context_id)
        if text and not self.pipeline.busy and self._pending_chars() == 0:
            self._utterance_started = time.time()  # the first text after silence begins new speech
        self._enqueue(context, context.segmenter.feed(text))

    def _pending_chars(self) -> int:
        return sum(context.segmenter.pending_chars for context in self.contexts)

    def _open_context(self, context_id: str | None) -> Context:
        """The context text goes to: made by its first text; refused once it is closed or finishing."""
        context = self.contexts.for_text(context_id)
        if context.finishing:
            raise SpeechError(f"context '{context_id}' is closed", param="context_id")
        return context

    def _join_surrogates(self, text: str) -> str:
        """JSON may carry UTF-16 halves (\\ud83d) and a client may split a pair across frames:
        a trailing high surrogate waits for the next frame, pairs are joined, and a lone half
        becomes U+FFFD, so engines and events only ever see valid text."""
        text, self._high_surrogate = self._high_surrogate + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._high_surrogate = text[:-1], text[-1]
        if not text.isascii():
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return text

    async def _on_commit(self, payload: dict[str, Any]) -> None:
        message = InputCommit.read(payload, close_code=None)
        context = self._open_context(message.context_id)
        segments = context.segmenter.flush()
        self._enqueue(context, segments)
        await self.transport.send_json(
            InputCommitted(
                session_id=self.session_id,
                context_id=context.id,
                segment_index=self._commits,
                segment_sentences=len(segments),
                total_sentences=self._total(context),
            ).dump()
        )
        self._commits += 1

    def _total(self, context: Context | None) -> int:
        """total_sentences of an event: a named context's own, else the session's."""
        return context.sentences if context is not None and context.named else self.pipeline.total_sentences

    async def _on_cancel(self, payload: dict[str, Any], origin: Origin = "client") -> None:
        message = InputCancel.read(payload, close_code=None)
        await self.canceller.cancel(message.context_id, message.played_ms, origin)
        self._on_pipeline_idle()

    async def _on_keepalive(self, payload: dict[str, Any]) -> None:
        """Only resets the idle timer, which every frame does."""

    async def _on_done(self, payload: dict[str, Any]) -> None:
        message = InputDone.read(payload, close_code=None)
        if message.context_id is not None:
            context = self._open_context(message.context_id)
            self._enqueue(context, context.segmenter.flush())
            await self.pipeline.finish(context)
            return
        for context in list(self.contexts):
            self._enqueue(context, context.segmenter.flush())
            await self.pipeline.finish(context)
        self.state = State.DRAINING
        if not self.pipeline.busy:
            self._on_pipeline_idle()

    def _enqueue(self, context: Context, segments: list[str]) -> None:
        for segment in segments:
            self.pipeline.enqueue(segment, context)

    # -- endings -------------------------------------------------------------------------------
    async def _end(self, outcome: str, error: SpeechError | None = None, close_code: int | None = None) -> None:
        """Every way a session ends comes through here; the first outcome set stands (a session that
        failed and then disconnects stays failed).

        - `error` (fatal: a timeout, a bad frame, a refusal, a crash, termination): the work stops at
          once, then the error event and its close code;
        - `close_code` alone (completed after input.done): session.done after the last audio, then
          the close; void if something else ended the session first;
        - disconnected or terminated: nothing more can be sent, so every task of the session is
          cancelled and the pipeline closed (after the error and close, when terminated)."""
        if outcome == OUTCOME_COMPLETED and self.state is not State.DRAINING:
            return
        self.outcome = self.outcome or outcome
        if error is not None:
            self.state = State.CLOSED
            self._disarm()
            if self.pipeline is not None:
                await self.pipeline.aclose()
            await self.transport.send_json(error.event())
            close_code = error.close_code
        elif close_code is not None:
            await self.transport.send_json(
                SessionDone(session_id=self.session_id, total_sentences=self.pipeline.total_sentences).dump()
            )
        if close_code is not None:
            self.state = State.CLOSED
            self.closed.set()
            await self.transport.close(close_code, self.pipeline.audio_ahead_s() if self.pipeline is not None else 0.0)
        if outcome in (OUTCOME_DISCONNECTED, OUTCOME_TERMINATED):
            self.state = State.CLOSED
            self.closed.set()
            self._disarm()
            current = asyncio.current_task()
            tasks = [task for task in self._tasks if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.pipeline is not None:
                await self.pipeline.aclose()

    async def _report(self, error: SpeechError) -> None:
        """An error event; a fatal one ends the session."""
        if error.fatal:
            await self._end(OUTCOME_FAILED, error)
        else:
            await self.transport.send_json(error.event())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_pipeline_idle(self) -> None:
        """Nothing left to synthesise or send: after input.done that ends the session."""
        if self.state is State.DRAINING and not self._finishing:
            self._finishing = True
            self._spawn(self._end(OUTCOME_COMPLETED, close_code=CLOSE_NORMAL))
        else:
            self._arm_idle()

    def _on_pipeline_crash(self) -> None:
        if self.state is not State.CLOSED:
            self._spawn(
                self._report(SpeechError("internal server error", error_type=SERVER_ERROR, code=None, close_code=CLOSE_INTERNAL))
            )

    # -- timers --------------------------------------------------------------------------------
    def _arm(self, seconds: float, error: SpeechError) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle  # the callback names its own handle, to know whether it is still armed
        handle = loop.call_later(seconds, lambda: self._spawn(self._expire(error, handle)))
        self._timer = handle

    def _arm_idle(self) -> None:
        """Idle time counts only while the client owes us a frame and nothing is generating."""
        if self.state is State.ACTIVE and not self.pipeline.busy:
            self._arm(self.limits.idle_timeout_s, fatal("speech WebSocket idle timeout"))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _expire(self, error: SpeechError, handle: asyncio.TimerHandle) -> None:
        # A frame handled between the timer firing and this task running disarmed it: void.
        if handle is self._timer and self.state in (State.AWAITING_CONFIG, State.ACTIVE):
            await self._report(error)


HANDLERS = {
    "input.text": SpeechSession._on_text,
    "input.commit": SpeechSession._on_commit,
    "input.cancel": SpeechSession._on_cancel,
    "session.keepalive": SpeechSession._on_keepalive,
    "input.done": SpeechSession._on_done,
}
# After input.done the client may still barge in or keep the socket alive; nothing else.
DRAINING_HANDLERS = {kind: HANDLERS[kind] for kind in ("input.cancel", "session.keepalive")}
