"""The WebSocket endpoint: a thin Channels consumer around SpeechSession.

`receive()` hands the frame to the session, which only parses and enqueues; synthesis runs in
the session's own tasks. `disconnect()` aborts all of the session's work.
"""

import asyncio
import json

from channels.generic.websocket import AsyncWebsocketConsumer

from .engines import get_engine
from .protocol import Limits
from .session import SpeechSession


SHUTDOWN_MESSAGE = "speech session terminated: the server is shutting down"


class SpeechStreamConsumer(AsyncWebsocketConsumer):
    def __init__(self, engine=None, **kwargs):
        super().__init__(**kwargs)
        self.engine = engine
        self.session = None
        self._open = False

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            # The server is stopping (daphne cancels every application on SIGTERM).
            if self.session is not None:
                await self.session.terminate(SHUTDOWN_MESSAGE)
            raise

    async def dispatch(self, message):
        # Channels' dispatch runs close_old_connections in the shared database thread before
        # every handler; this consumer keeps the ORM off the per-frame path, so it skips that hop.
        handler = getattr(self, message["type"].replace(".", "_"), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self):
        await self.accept()
        self._open = True
        self.session = SpeechSession(self, self.engine or get_engine(), Limits.from_settings())
        self.session.start()

    async def receive(self, text_data=None, bytes_data=None):
        if text_data is not None:
            await self.session.receive_text(text_data)
        else:
            await self.session.receive_bytes(bytes_data)

    async def disconnect(self, code):
        self._open = False
        if self.session is not None:
            await self.session.aclose()

    # -- the session's transport ---------------------------------------------------------------
    async def send_json(self, event):
        if self._open:
            await self.send(text_data=self.encode_json(event))

    async def send_bytes(self, data):
        if self._open:
            await self.send(bytes_data=data)

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
