"""The WebSocket endpoint: a thin Channels consumer around SpeechSession.

`receive()` hands the frame to the session, which only parses and enqueues; synthesis runs in
the session's own tasks. Admission (capacity, key, slot) and the control plane (group, registry,
signals) are one object it calls, speech/web/admission.py. A lost connection stops the session's
engine work and gives its key's slot back at once (`_abandon_work`); `disconnect()` then gives the rest
back, TEARDOWN_DELAY_S after the loss when the client left without a close frame (this server's protocol
delays such a disconnect itself: speech/server/websocket.py). The session's transport is the connection
the server put in the scope (speech/server/connection.py), or the ASGI `send` under another server.
"""

import asyncio

from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer

from .. import metrics, voices
from ..conf import stream_limits, voice_aliases
from ..runtime import get_engine
from ..server import budget
from ..server.connection import SCOPE_KEY, TEARDOWN_DELAY_S, AsgiConnection
from ..stream.session import SpeechSession
from ..stream.signal import ControlSignal
from .admission import Admission
from .database import on_database_thread

SHUTDOWN_MESSAGE = "speech session terminated: the server is shutting down"
ABNORMAL_CLOSE = 1006  # a client gone without a close frame: a hang-up, a reset
_find_voice = on_database_thread(voices.find_voice)  # an uploaded voice, at session.config


class SpeechStreamConsumer(AsyncWebsocketConsumer):
    def __init__(self, engine=None, **kwargs):
        super().__init__(**kwargs)
        self.engine = engine
        self.session = None
        self.admission = None  # speech/web/admission.py: key, slot, group and registry row

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
        await handler(message)

    async def connect(self):
        connection = self.scope.get(SCOPE_KEY)
        if connection is not None:
            connection.flow.on_lost = self._abandon_work
        # Admission comes before the upgrade's answer, so that an admitted session's group join (a Redis
        # round trip) runs while the 101 and the client's session.config travel. A refused session is
        # accepted too: its client gets the reason, then the close code.
        self.admission = Admission(self.channel_layer, self.channel_name)
        self.session = SpeechSession(
            connection or AsgiConnection(self.base_send),
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
        """The client is gone: the engine stops the session's work now, before the session's teardown,
        and the key's slot is given back (a client reconnecting at once finds it free)."""
        if self.session is not None:
            self.session.abandon()
            self.admission.release_slot_soon()

    async def disconnect(self, code):
        self._abandon_work()
        if self.session is not None:
            if code == ABNORMAL_CLOSE and self.scope.get(SCOPE_KEY) is None:
                # Another server's disconnect comes at the loss: the teardown waits here instead (the
                # engine work has stopped; a newcomer's first sentence should not wait behind the rest).
                await asyncio.sleep(TEARDOWN_DELAY_S)
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
