"""The WebSocket endpoint: a thin Channels consumer around SpeechSession.

`receive()` hands the frame to the session, which only parses and enqueues; synthesis runs in
the session's own tasks. Admission (capacity, key, slot) and the control plane (group, registry,
signals) are one object it calls, speech/web/admission.py. `disconnect()` aborts all of the
session's work and gives everything back.
"""

import asyncio
import json

from autobahn.exception import Disconnected
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from .. import metrics, voices
from ..conf import stream_limits, voice_aliases
from ..runtime import get_engine
from ..stream.session import SpeechSession
from ..stream.signal import ControlSignal
from . import budget
from .admission import Admission
from .database import on_database_thread
from .flowcontrol import SCOPE_KEY

SHUTDOWN_MESSAGE = "speech session terminated: the server is shutting down"
_find_voice = on_database_thread(voices.find_voice)  # an uploaded voice, at session.config


class SpeechStreamConsumer(AsyncWebsocketConsumer):
    def __init__(self, engine=None, **kwargs):
        super().__init__(**kwargs)
        self.engine = engine
        self.session = None
        self.admission = None  # speech/web/admission.py: key, slot, group and registry row
        self.flow = None  # the connection's FlowControl (speech/web/flowcontrol.py), from the scope at connect
        self._open = False

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # The server is stopping (daphne cancels every application on SIGTERM).
            if self.session is not None:
                try:
                    await self.session.terminate(SHUTDOWN_MESSAGE)
                finally:  # whatever the goodbye met, the session's end is recorded
                    await self.admission.release(self.session)
            raise

    async def dispatch(self, message):
        # Channels' dispatch runs close_old_connections in the shared database thread before
        # every handler; this consumer keeps the ORM off the per-frame path, so it skips that hop.
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        try:
            await handler(message)
        finally:
            if self.flow is not None and message["type"] == "websocket.receive":
                self.flow.message_handled()  # audio waited for it (speech/web/flowcontrol.py)

    async def connect(self):
        self.flow = self.scope.get(SCOPE_KEY)  # absent in tests that run the consumer without daphne
        if self.flow is not None:
            self.flow.on_lost = self._abandon_work
        # Admission comes before the upgrade's answer, so that an admitted session's group join (a Redis
        # round trip) runs while the 101 and the client's session.config travel. A refused session is
        # accepted too: its client gets the reason, then the close code.
        self.admission = Admission(self.channel_layer, self.channel_name)
        self.session = SpeechSession(
            self,
            self.engine or get_engine(),
            stream_limits(),
            find_voice=_find_voice,
            voice_aliases=voice_aliases(),
            on_configured=self.admission.register,
            parse_large=budget.parse_large_config,
            meter=metrics.METER,
        )
        refusal = await self.admission.admit(self.scope, self.session)
        if refusal is None:
            self.admission.join(self.session)
        await self.accept()
        self._open = True
        if refusal is not None:
            await self.session.refuse(refusal)
            return
        self.session.start()

    async def receive(self, text_data=None, bytes_data=None):
        if text_data is not None:
            await self.session.receive_text(text_data)
        else:
            await self.session.receive_bytes(bytes_data)

    async def websocket_disconnect(self, message):
        # Channels' version also discards `self.groups` (empty: Admission owns the session's group)
        # and runs close_old_connections in the shared database thread, a thread hop for every
        # session; this consumer's only ORM work runs on speech/web/database.py's thread, which checks
        # its connection itself.
        await self.disconnect(message["code"])
        raise StopConsumer()

    def _abandon_work(self):
        """The client is gone: the engine stops the session's work now, before the session's teardown."""
        if self.session is not None:
            self.session.abandon()

    async def disconnect(self, code):
        self._open = False
        self._abandon_work()
        if self.session is not None:
            await self.admission.release(self.session)

    # -- control signals (speech/control/signals.py), read once here (speech/stream/signal.py) ------
    async def speech_cancel(self, message):
        self._signal(message)

    async def speech_terminate(self, message):
        self._signal(message)

    def _signal(self, message):
        signal = ControlSignal.read(message)
        if self.session is not None and signal is not None:
            self.admission.signal(self.session, signal)

    # -- the session's transport ---------------------------------------------------------------
    async def send_json(self, event):
        if self._open:
            await self._send(self.encode_json(event))

    async def send_bytes(self, data):
        """Audio waits while the client is not reading (speech/web/flowcontrol.py; absent in tests that
        run the consumer without daphne)."""
        if self.flow is not None:
            await self.flow.writable()
        if self._open:
            await self._send(data)

    def send_room(self):
        """Bytes the next audio frame may hold and still leave at once (speech/web/flowcontrol.py); 0 in
        tests that run the consumer without daphne."""
        return self.flow.send_room() if self.flow is not None and self._open else 0

    async def _send(self, data):
        """A text (str) or binary (bytes) message: straight to daphne's protocol through the connection's
        FlowControl (speech/web/flowcontrol.py), or through Channels in tests that run the consumer without daphne."""
        try:
            if self.flow is not None and self.flow.attached:
                self.flow.send(data)
            elif isinstance(data, str):
                await self.send(text_data=data)
            else:
                await self.send(bytes_data=data)
        except Disconnected:
            # The client closed while frames were going out; disconnect() is on its way and ends the session.
            self._open = False

    async def close(self, code=None, reason=None):
        if self._open:
            self._open = False
            ahead = self.session.audio_ahead_s() if self.session is not None else None
            if self.flow is not None and ahead is not None:
                self.flow.closing(ahead)
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
