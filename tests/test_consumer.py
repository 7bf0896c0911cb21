"""The Channels consumer and the Origin policy, through channels.testing.WebsocketCommunicator.

`receive_nothing()` is Channels' own short negative check; every test ends with `disconnect()`.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from speech.engines.fake import FakeEngine
from speech.server.connection import CLOSE_HANDSHAKE_TIMEOUT_S, SCOPE_KEY, Connection
from speech.server.flowcontrol import InputQueue
from speech.web.admission import Admission

from .support.communicator import HANG_GUARD_S, PATH, application, event, output, send
from .support.heard import without_heard

# The handshake looks uploaded voices up in the database (from the consumer's DB thread).
pytestmark = pytest.mark.django_db(transaction=True)


def communicator(engine, origin=None):
    headers = [(b"origin", origin.encode("latin1"))] if origin is not None else []
    return WebsocketCommunicator(application(engine), PATH, headers=headers)


async def connected(engine, origin=None, **config):
    comm = communicator(engine, origin)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    await send(comm, {"type": "session.config", "session": config})
    configured = await event(comm, "session.configured")
    return comm, configured


async def test_full_session_with_audio():
    engine = FakeEngine()
    comm, configured = await connected(engine, stream_audio=True, voice="alt")
    sid = configured["session_id"]
    assert re.match(r"^speech_ws_[0-9a-f]{32}$", sid)
    assert configured["engine"] == "fake" and configured["voice"] == "alt"
    assert configured["limits"] == {
        "config_timeout_s": 10.0,
        "idle_timeout_s": 30.0,
        "max_config_bytes": 16777216,
        "max_message_bytes": 131072,
        "max_pending_chars": 262144,
        "max_segment_chars": 4096,
        "max_contexts": 32,
    }
    await send(comm, {"type": "input.text", "text": "Grüß dich. How are"})
    await send(comm, {"type": "input.text", "text": " you today?"})
    await send(comm, {"type": "input.done"})
    texts = []
    for index in range(2):
        start = await event(comm, "audio.start")
        assert start["id"] == f"{sid}-{index}" and start["sentence_index"] == index
        texts.append(start["sentence_text"])
        total = 0
        while (message := await output(comm)).get("bytes") is not None:
            total += len(message["bytes"])
        done = json.loads(message["text"])
        assert done == {
            "type": "audio.done",
            "id": f"{sid}-{index}",
            "sentence_index": index,
            "total_bytes": total,
            "error": False,
            "cancelled": False,
        }
        assert total == 2 * engine.chunk_samples * 2
    assert texts == ["Grüß dich.", "How are you today?"]
    assert await event(comm) == {"type": "session.done", "session_id": sid, "total_sentences": 2}
    closed = await output(comm)
    assert closed["type"] == "websocket.close" and closed["code"] == 1000
    await comm.disconnect()
    assert engine.running == 0


async def test_text_frames_are_utf8_json_not_ascii_escaped():
    comm, _ = await connected(FakeEngine(), stream_audio=True)
    await send(comm, {"type": "input.text", "text": "Ça va? "})
    message = await output(comm)
    assert "Ça va?" in message["text"]
    await comm.disconnect()


async def test_binary_frames_are_a_recoverable_error():
    engine = FakeEngine()
    comm, _ = await connected(engine)
    await comm.send_to(bytes_data=b"\x00\x01\x02")
    assert await event(comm) == {
        "type": "error",
        "message": "speech WebSocket client messages must be text frames",
        "error_type": "BadRequestError",
        "code": 400,
    }
    await send(comm, {"type": "input.text", "text": "Still here."})
    await send(comm, {"type": "input.commit"})
    await event(comm, "input.committed")
    await event(comm, "audio.start")
    frame = await output(comm)
    assert len(frame["bytes"]) == 2 * engine.chunk_samples * 2  # not streaming: one frame
    await event(comm, "audio.done")
    assert await comm.receive_nothing()
    await comm.disconnect()


@pytest.mark.parametrize(
    "first,message,code",
    [
        ({"type": "input.text", "text": "hi"}, "first WebSocket message must be session.config", 4008),
        ({"type": "session.config", "session": {"voice": "nobody"}}, "Unknown voice 'nobody'. Supported voices: fake, alt", 4008),
    ],
    ids=["not-config", "bad-voice"],
)
async def test_fatal_error_then_close_code(first, message, code):
    comm = communicator(FakeEngine())
    assert (await comm.connect(HANG_GUARD_S))[0]
    await send(comm, first)
    assert (await event(comm, "error"))["message"] == message
    closed = await output(comm)
    assert closed["type"] == "websocket.close" and closed["code"] == code
    await send(comm, {"type": "session.config"})  # ignored after the close
    assert await comm.receive_nothing()
    await comm.disconnect()


async def test_binary_first_frame_is_fatal():
    comm = communicator(FakeEngine())
    assert (await comm.connect(HANG_GUARD_S))[0]
    await comm.send_to(bytes_data=b"{}")
    assert (await event(comm, "error"))["message"] == "speech WebSocket client messages must be text frames"
    assert (await output(comm))["code"] == 4008
    await comm.disconnect()


async def test_disconnect_mid_segment_aborts_the_engine_work():
    engine = FakeEngine(chunks=3, hold=True)
    comm, _ = await connected(engine, stream_audio=True)
    await send(comm, {"type": "input.text", "text": "First one. Second one. Third one. "})
    await event(comm, "audio.start")
    assert "bytes" in await output(comm)
    assert "bytes" in await output(comm)
    assert await comm.receive_nothing()  # held: the second chunk does not come
    assert engine.running == 2
    await comm.disconnect()
    assert engine.running == 0
    assert engine.aborted == 2 and engine.completed == 0


async def test_cancel_through_the_socket():
    engine = FakeEngine(chunks=3, hold=True)
    comm, configured = await connected(engine, stream_audio=True)
    sid = configured["session_id"]
    await send(comm, {"type": "input.text", "text": "First one. Second one. "})
    await event(comm, "audio.start")
    sent = len((await output(comm))["bytes"]) + len((await output(comm))["bytes"])
    await send(comm, {"type": "input.cancel"})
    assert await event(comm) == {
        "type": "audio.done",
        "id": f"{sid}-0",
        "sentence_index": 0,
        "total_bytes": sent,
        "error": False,
        "cancelled": True,
    }
    assert without_heard(await event(comm)) == {
        "type": "input.cancelled",
        "session_id": sid,
        "cancelled_sentences": 2,
        "total_sentences": 1,
        "origin": "client",
    }
    assert engine.running == 0
    await comm.disconnect()


class _Protocol:
    """Stands in for daphne's protocol under a Connection: records the messages sent to it, and the close."""

    STATE_OPEN, STATE_CLOSING = 3, 4
    closeHandshakeTimeout = 1
    tcp = None
    gone = False

    def __init__(self):
        self.transport = self
        self.state = self.STATE_OPEN
        self.sent = []
        self.arrived = asyncio.Queue()
        self.closed = asyncio.get_running_loop().create_future()

    def registerProducer(self, producer, streaming):
        pass

    def unregisterProducer(self):
        pass

    def send_data_message(self, payload, binary):
        item = "audio" if binary else json.loads(payload)["type"]
        self.sent.append(item)
        self.arrived.put_nowait(item)

    def serverClose(self, code=None):
        self.state = self.STATE_CLOSING
        self.closed.set_result((code, self.closeHandshakeTimeout))

    async def next(self):
        return await asyncio.wait_for(self.arrived.get(), HANG_GUARD_S)


class GatedInput(InputQueue):
    """The connection's input queue, whose messages the test can hold between daphne and the consumer."""

    def __init__(self):
        super().__init__()
        self.delivering = asyncio.Event()
        self.delivering.set()

    async def get(self):
        message = await super().get()
        await self.delivering.wait()
        return message


def served(engine):
    """A communicator whose consumer runs on a Connection, as under the launcher: the consumer reads the
    connection's input queue and sends through the connection."""
    protocol = _Protocol()
    connection = Connection.attach(protocol)
    connection.flow.input = GatedInput()
    comm = communicator(engine)
    comm.scope[SCOPE_KEY] = connection
    comm._input_queue = connection.input
    return comm, protocol


async def test_events_and_audio_go_straight_to_the_connection_not_through_channels():
    comm, protocol = served(FakeEngine())
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    await send(comm, {"type": "input.text", "text": "One sentence."})
    await send(comm, {"type": "input.done"})
    code, _ = await asyncio.wait_for(protocol.closed, HANG_GUARD_S)
    assert code == 1000
    assert await comm.receive_nothing()  # Channels carried the accept only
    sent = protocol.sent
    assert sent[:2] == ["session.configured", "audio.start"] and sent[-2:] == ["audio.done", "session.done"]
    assert sent[2:-2] and set(sent[2:-2]) == {"audio"}
    await comm.disconnect()


async def test_audio_waits_for_a_client_message_the_server_has_read_and_not_handled():
    engine = FakeEngine(chunks=3, hold=True)
    comm, protocol = served(engine)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    assert await protocol.next() == "session.configured"
    await send(comm, {"type": "input.text", "text": "First one. Second one. "})
    assert [await protocol.next() for _ in range(3)] == ["audio.start", "audio", "audio"]
    assert await comm.receive_nothing() and protocol.arrived.empty()  # the engine holds the second chunk
    comm.scope[SCOPE_KEY].input.delivering.clear()
    await send(comm, {"type": "input.text", "text": "Third one. "})  # daphne has read it; the consumer has not had it yet
    engine.allow(1)
    assert await comm.receive_nothing() and protocol.arrived.empty()  # the second chunk is there, and waits behind it
    comm.scope[SCOPE_KEY].input.delivering.set()
    assert await protocol.next() == "audio"
    await comm.disconnect()


async def test_the_close_waits_for_a_client_that_may_still_be_playing():
    engine = FakeEngine(chunk_s=1.0, chunks=2)
    comm, protocol = served(engine)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    started = asyncio.get_running_loop().time()
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    await send(comm, {"type": "input.text", "text": "Two seconds of audio."})
    await send(comm, {"type": "input.done"})
    _, timeout = await asyncio.wait_for(protocol.closed, HANG_GUARD_S)
    elapsed = asyncio.get_running_loop().time() - started
    assert 2.0 - elapsed <= timeout - CLOSE_HANDSHAKE_TIMEOUT_S <= 2.0
    await comm.disconnect()


# -- Origin policy ---------------------------------------------------------------------------------


async def test_no_origin_is_accepted():
    comm = communicator(FakeEngine())
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    await comm.disconnect()


@pytest.mark.parametrize("origin", ["http://localhost:8000", "http://127.0.0.1:8000", "https://localhost", "http://[::1]:8000"])
async def test_allowed_origin_is_accepted(origin):
    comm, _ = await connected(FakeEngine(), origin)
    await comm.disconnect()


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "https://localhost.evil.example", "null", "http://127.0.0.2:8000", "file://"]
)
async def test_origin_not_allowed_is_refused(origin):
    engine = FakeEngine()
    comm = communicator(engine, origin)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert not ok
    await comm.disconnect()
    assert engine.requests == []


async def test_speech_allowed_origins_setting_replaces_allowed_hosts():
    with override_settings(SPEECH_ALLOWED_ORIGINS=["https://app.example"]):
        app = application(FakeEngine())
    allowed = WebsocketCommunicator(app, PATH, headers=[(b"origin", b"https://app.example")])
    assert (await allowed.connect(HANG_GUARD_S))[0]
    await allowed.disconnect()
    refused = WebsocketCommunicator(app, PATH, headers=[(b"origin", b"http://localhost:8000")])
    assert not (await refused.connect(HANG_GUARD_S))[0]
    await refused.disconnect()
    anonymous = WebsocketCommunicator(app, PATH)
    assert (await anonymous.connect(HANG_GUARD_S))[0]
    await anonymous.disconnect()


async def test_no_task_left_after_disconnect():
    engine = FakeEngine(hold=True)
    comm, _ = await connected(engine, stream_audio=True)
    await send(comm, {"type": "input.text", "text": "Hello there. "})
    await event(comm, "audio.start")
    await comm.disconnect()
    await Admission.settle()  # the session's end goes to the registry, then it leaves its group
    current = asyncio.current_task()
    assert {t for t in asyncio.all_tasks() if t is not current and not t.done()} == set()
    assert engine.running == 0


async def test_a_session_makes_no_database_thread_hop(monkeypatch):
    """No ORM work on the path of a keyless session: not per message (dispatch), and not at the
    disconnect, where Channels' own consumer closes stale connections in its database thread."""
    import channels.consumer
    import channels.generic.websocket

    hops = []

    async def counted():
        hops.append(1)

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted)
    monkeypatch.setattr(channels.generic.websocket, "aclose_old_connections", counted)
    comm, _ = await connected(FakeEngine(), stream_audio=True)
    await send(comm, {"type": "input.done"})
    await event(comm, "session.done")
    await comm.disconnect()
    assert hops == []


async def test_server_shutdown_terminates_the_session():
    engine = FakeEngine(chunks=3, hold=True)
    comm, _ = await connected(engine, stream_audio=True)
    await send(comm, {"type": "input.text", "text": "First one. Second one. "})
    await event(comm, "audio.start")
    comm.future.cancel()  # what daphne does to every application on SIGTERM
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(comm.future, HANG_GUARD_S)
    rest = []
    while not comm.output_queue.empty():
        rest.append(comm.output_queue.get_nowait())
    rest = [message for message in rest if message.get("bytes") is None]  # frames of chunk 0 may precede
    assert [json.loads(rest[0]["text"])] == [
        {"type": "error", "error_type": "server_error", "message": "speech session terminated: the server is shutting down"}
    ]
    assert rest[1]["type"] == "websocket.close" and rest[1]["code"] == 4001
    assert len(rest) == 2
    assert engine.running == 0 and engine.aborted == 2


# -- text frames must be valid UTF-8 (RFC 6455); daphne encodes them with str.encode("utf8") ---------


def utf8_text(message):
    assert message["type"] == "websocket.send" and message.get("text") is not None, message
    message["text"].encode("utf-8")  # what daphne does; UnicodeEncodeError means the socket write fails
    return json.loads(message["text"])


async def test_split_surrogate_pair_is_still_valid_utf8():
    comm, _ = await connected(FakeEngine(), stream_audio=True)
    await comm.send_to(text_data='{"type":"input.text","text":"Hi \\ud83d"}')
    await comm.send_to(text_data='{"type":"input.text","text":"\\ude00 there. "}')
    start = utf8_text(await output(comm))
    assert start["type"] == "audio.start"
    await comm.disconnect()


async def test_unknown_voice_with_a_lone_surrogate_is_still_valid_utf8():
    comm = communicator(FakeEngine())
    assert (await comm.connect(HANG_GUARD_S))[0]
    await comm.send_to(text_data='{"type":"session.config","session":{"voice":"x\\ud800"}}')
    error = utf8_text(await output(comm))
    assert error["type"] == "error" and error["param"] == "voice"
    assert (await output(comm))["code"] == 4008
    await comm.disconnect()
