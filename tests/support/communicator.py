"""Helpers for driving the consumer through channels.testing.WebsocketCommunicator."""

import json

from channels.routing import URLRouter
from django.urls import path

from speech.engines.fake import FakeEngine
from speech.web.consumers import SpeechStreamConsumer
from speech.web.origin import origin_policy

PATH = "/v1/audio/speech/stream"
HANG_GUARD_S = 5


def application(engine):
    """The WebSocket stack of ttsproject/asgi.py, with `engine` instead of the process's."""
    return origin_policy(URLRouter([path("v1/audio/speech/stream", SpeechStreamConsumer.as_asgi(engine=engine))]))


async def output(comm):
    """The next raw ASGI message the application sent: websocket.send (text or bytes) or websocket.close."""
    return await comm.receive_output(HANG_GUARD_S)


async def event(comm, type_=None):
    message = await output(comm)
    assert message["type"] == "websocket.send" and message.get("text") is not None, message
    value = json.loads(message["text"])
    if type_ is not None:
        assert value["type"] == type_, value
    return value


async def send(comm, obj):
    await comm.send_to(text_data=json.dumps(obj, ensure_ascii=False))


class QueuedEngine(FakeEngine):
    """A FakeEngine whose synthesis queue would make a new session wait `wait_s` seconds."""

    def __init__(self, wait_s, **kwargs):
        super().__init__(**kwargs)
        self.wait_s = wait_s

    def estimated_wait(self):
        return self.wait_s
