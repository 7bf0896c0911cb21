"""Admission: new work is refused at the door while the engine's queue is too long, never accepted
work (speech/engines/pool.py keeps every accepted job). The WebSocket handshake gets the capacity
error and close 4013; REST speech gets 503 with Retry-After. In process, with an engine whose
queue estimate the test sets."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient, override_settings

import speech.runtime

from .support.communicator import HANG_GUARD_S, PATH, QueuedEngine, application, event, output, send

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE_FULL = {"type": "error", "message": "The request queue is full.", "error_type": "server_error"}


async def test_a_new_session_is_refused_with_4013_while_the_wait_is_over_the_bound():
    engine = QueuedEngine(2.5)  # SPEECH_MAX_QUEUE_WAIT_S defaults to 2
    comm = WebsocketCommunicator(application(engine), PATH)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok  # accepted, so that the client gets the reason, then closed
    assert await event(comm) == QUEUE_FULL
    close = await output(comm)
    assert close["type"] == "websocket.close" and close["code"] == 4013
    assert engine.requests == []
    await comm.disconnect()


@pytest.mark.parametrize("wait_s", [0.0, 1.99])
async def test_a_new_session_under_the_bound_is_served(wait_s):
    engine = QueuedEngine(wait_s)
    comm = WebsocketCommunicator(application(engine), PATH)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    assert (await event(comm, "session.configured"))["engine"] == "fake"
    await comm.disconnect()


async def test_the_bound_is_a_setting():
    engine = QueuedEngine(2.5)
    with override_settings(SPEECH_MAX_QUEUE_WAIT_S=5.0):
        comm = WebsocketCommunicator(application(engine), PATH)
        ok, _ = await comm.connect(HANG_GUARD_S)
        assert ok
        await send(comm, {"type": "session.config", "session": {}})
        await event(comm, "session.configured")
        await comm.disconnect()


async def test_running_sessions_are_not_affected_when_the_queue_grows():
    engine = QueuedEngine(0.0)
    comm = WebsocketCommunicator(application(engine), PATH)
    ok, _ = await comm.connect(HANG_GUARD_S)
    assert ok
    await send(comm, {"type": "session.config", "session": {"stream_audio": True}})
    await event(comm, "session.configured")
    engine.wait_s = 60.0  # the server is now overloaded: only new sessions are refused
    await send(comm, {"type": "input.text", "text": "Still spoken."})
    await send(comm, {"type": "input.done"})
    assert (await event(comm, "audio.start"))["sentence_text"] == "Still spoken."
    while (message := await output(comm)).get("bytes") is not None:
        pass
    assert json.loads(message["text"])["type"] == "audio.done"
    assert (await event(comm, "session.done"))["total_sentences"] == 1
    await comm.disconnect()


async def test_rest_speech_answers_503_with_retry_after(monkeypatch):
    engine = QueuedEngine(2.2)
    monkeypatch.setattr(speech.runtime, "_engine", engine)
    response = await AsyncClient().post("/v1/audio/speech", json.dumps({"input": "Hello."}), content_type="application/json")
    assert response.status_code == 503
    assert response["Retry-After"] == "3"
    assert json.loads(response.content)["error"]["message"] == "The request queue is full."
    assert json.loads(response.content)["error"]["type"] == "server_error"
    assert engine.requests == []
    engine.wait_s = 0.5
    response = await AsyncClient().post("/v1/audio/speech", json.dumps({"input": "Hello."}), content_type="application/json")
    assert response.status_code == 200 and len(engine.requests) == 1
