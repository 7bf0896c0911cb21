"""The WebSocket endpoint: a thin Channels consumer around SpeechSession.

`receive()` hands the frame to the session, which only parses and enqueues; synthesis runs in
the session's own tasks. `disconnect()` aborts all of the session's work.
"""

import asyncio
import json
import logging

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from . import auth, budget
from ..control import signals as control, registry
from .. import metrics, voices
from ..conf import conf, stream_limits
from ..engines import get_engine
from ..stream.errors import CLOSE_CAPACITY, CLOSE_POLICY, RATE_LIMIT, SpeechError, at_capacity
from .flowcontrol import SCOPE_KEY
from ..stream.session import SpeechSession
from ..control.slots import Lease, get_slots


logger = logging.getLogger(__name__)

SHUTDOWN_MESSAGE = "speech session terminated: the server is shutting down"


class SpeechStreamConsumer(AsyncWebsocketConsumer):
    def __init__(self, engine=None, **kwargs):
        super().__init__(**kwargs)
        self.engine = engine
        self.session = None
        self.api_key = None
        self.lease = None
        self.registering = None  # the registry row's write (a task), once configured
        self.group = None  # the channel-layer group this session has joined
        self._open = False
        self._signal_tasks = set()

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # The server is stopping (daphne cancels every application on SIGTERM).
            if self.session is not None:
                await self.session.terminate(SHUTDOWN_MESSAGE)
                await self._ended()
            raise

    async def dispatch(self, message):
        # Channels' dispatch runs close_old_connections in the shared database thread before
        # every handler; this consumer keeps the ORM off the per-frame path, so it skips that hop.
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self):
        # Keys and slots are settled here, once: nothing touches the database per frame.
        await self.accept()
        self._open = True
        self.session = SpeechSession(self, self.engine or get_engine(), stream_limits(),
                                     find_voice=database_sync_to_async(voices.find_voice),
                                     on_configured=self._register, parse_large=budget.parse_large_config)
        metrics.session_started(self.session)
        if self.session.engine.estimated_wait() > conf.MAX_QUEUE_WAIT_S:
            await self.session.refuse(at_capacity())  # before a slot is taken: nothing to give back
            return
        if conf.REQUIRE_API_KEY:
            key = self.api_key = await database_sync_to_async(auth.websocket_key)(self.scope)
            if key is None:
                await self.session.refuse(SpeechError(auth.AUTH_FAILED, error_type="authentication_error", code=401,
                                                      close_code=CLOSE_POLICY))
                return
            if not await self._take_slot(key):
                await self.session.refuse(SpeechError(
                    f"Too many concurrent sessions for this API key (limit {self._limit(key)})",
                    error_type=RATE_LIMIT, code=429, close_code=CLOSE_CAPACITY))
                return
        self.session.start()

    @staticmethod
    def _limit(key):
        return conf.MAX_SESSIONS_PER_KEY if key.max_sessions is None else key.max_sessions

    async def _take_slot(self, key):
        slots = get_slots()
        try:
            taken = await slots.acquire(key.prefix, self.session.session_id, self._limit(key))
        except Exception:  # Redis away: serve rather than refuse; the limit is not enforced meanwhile
            logger.warning("session slots unavailable; per-key limit not enforced for this session")
            return True
        if taken:
            self.lease = Lease(slots, key.prefix, self.session.session_id)
            self.lease.start()
        return taken

    async def receive(self, text_data=None, bytes_data=None):
        if text_data is not None:
            await self.session.receive_text(text_data)
        else:
            await self.session.receive_bytes(bytes_data)

    async def disconnect(self, code):
        self._open = False
        if self.session is not None:
            await self._ended()

    # -- registry and control signals ----------------------------------------------------------
    async def _register(self, session):
        """session.configured is about to go out: join the session's group, so a cancel or terminate
        sent from now on reaches it, and record it in the registry. Without keys the row is written in
        the background (no database wait or thread hop in the handshake; the REST endpoints find the
        session by its group until then); with keys the row says whose session it is, so it comes first."""
        self.group = control.group(session.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.registering = asyncio.ensure_future(database_sync_to_async(registry.opened)(
            session.session_id, voice=session.config.voice, engine=session.engine.capabilities.name,
            api_key=self.api_key))
        if self.api_key is not None:
            await self.registering

    async def speech_cancel(self, message):
        self._on_signal(message)

    async def speech_terminate(self, message):
        self._on_signal(message)

    def _on_signal(self, message):
        # Never held up here: the consumer's dispatch also carries the client's frames.
        if self.session is None:
            return
        task = asyncio.create_task(self.session.handle_signal(message))
        self._signal_tasks.add(task)
        task.add_done_callback(self._signal_tasks.discard)

    async def _ended(self):
        session = self.session
        if self.group is not None:
            group, self.group = self.group, None
            await self.channel_layer.group_discard(group, self.channel_name)
        pending = [task for task in self._signal_tasks if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await session.aclose()
        metrics.session_ended(session)
        if self.lease is not None:
            await self.lease.release()
            self.lease = None
        if self.registering is not None:
            registering, self.registering = self.registering, None
            try:
                await registering
            except Exception:  # the row was never written: nothing to close
                logger.exception("could not record session %s in the registry", session.session_id)
                return
            pipeline = session.pipeline
            await database_sync_to_async(registry.closed)(
                session.session_id, status=session.outcome, segments=pipeline.sentences,
                bytes_sent=pipeline.bytes_sent, first_audio_s=pipeline.first_audio_s)

    # -- the session's transport ---------------------------------------------------------------
    async def send_json(self, event):
        if self._open:
            await self._send(text_data=self.encode_json(event))

    async def send_bytes(self, data):
        """Audio waits while the client is not reading (speech/web/flowcontrol.py; absent in tests that
        run the consumer without daphne)."""
        flow = self.scope.get(SCOPE_KEY)
        if flow is not None:
            await flow.writable()
        if self._open:
            await self._send(bytes_data=data)

    async def _send(self, **frame):
        try:
            await self.send(**frame)
        except Disconnected:
            # The client closed while frames were going out; disconnect() is on its way and ends the session.
            self._open = False

    async def close(self, code=None, reason=None):
        if self._open:
            self._open = False
            await super().close(code, reason)

    @classmethod
    def encode_json(cls, content):
        text = json.dumps(content, ensure_ascii=False, separators=(",", ":"))
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone UTF-16 half echoed from the client: escape it
                text = json.dumps(content, separators=(",", ":"))
        return text
