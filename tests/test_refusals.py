"""Handled refusals (speech/metrics.py `refused`): a 503 while control signals are unavailable, a 503 or a
close 4013 at capacity, a 429 at a limit are the server working as designed. Each counts in /metrics by
cause; none is an ERROR line (django.request wrote one for every 503); and an outage that refuses many
requests writes one WARNING line per cause per interval, saying how many it stands for."""

from __future__ import annotations

import logging

import pytest
from channels.testing import WebsocketCommunicator
from django.test import AsyncClient

import speech.runtime
from speech import metrics
from speech.control import registry

from .support.communicator import HANG_GUARD_S, PATH, QueuedEngine, application, output

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_lines(monkeypatch):
    """No line written yet for any cause, whatever an earlier test refused."""
    monkeypatch.setattr(metrics, "_refusal_lines", {})


def refusals(cause):
    return metrics.REGISTRY.get_sample_value("speech_refusals_total", {"cause": cause}) or 0.0


def lines(caplog, level=logging.WARNING):
    return [record for record in caplog.records if record.levelno >= level]


def test_signals_refused_while_unavailable_are_counted_and_logged_once_never_as_errors(client, caplog):
    """A live session out of its group (its instance has not rejoined since Redis lost the groups): 503."""
    sid = "speech_ws_" + "d" * 32
    registry.opened(sid, voice="fake", engine="fake")
    before = refusals(metrics.SIGNALS_UNAVAILABLE)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            assert client.post(f"/v1/audio/speech/sessions/{sid}/cancel").status_code == 503
        assert client.delete(f"/v1/audio/speech/sessions/{sid}").status_code == 503
    assert refusals(metrics.SIGNALS_UNAVAILABLE) == before + 4
    assert [record.levelname for record in lines(caplog)] == ["WARNING"], [r.getMessage() for r in caplog.records]
    assert lines(caplog)[0].getMessage().startswith("refused (signals_unavailable): signals are unavailable")
    assert client.get("/metrics").content.decode().count('speech_refusals_total{cause="signals_unavailable"}') == 1


def test_one_line_per_cause_per_interval_says_how_many_it_stands_for(monkeypatch, caplog):
    now = [1000.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="speech.metrics"):
        for _ in range(5):
            metrics.refused(metrics.ENGINE_BUSY, "the queue is full")
        metrics.refused(metrics.RATE_LIMITED, "the upstream is rate limiting")  # another cause: its own line
        now[0] += metrics.REFUSAL_LOG_INTERVAL_S
        metrics.refused(metrics.ENGINE_BUSY, "the queue is full")
    assert [record.getMessage() for record in caplog.records] == [
        "refused (engine_busy): the queue is full",
        "refused (rate_limited): the upstream is rate limiting",
        "refused (engine_busy): the queue is full (and 4 more since the last line)",
    ]


async def test_a_session_refused_at_capacity_is_counted_and_a_rest_request_too(monkeypatch, caplog):
    before = refusals(metrics.ENGINE_BUSY)
    engine = QueuedEngine(2.5)  # over SPEECH_MAX_QUEUE_WAIT_S: the WebSocket gets 4013, REST speech 503
    with caplog.at_level(logging.INFO):
        comm = WebsocketCommunicator(application(engine), PATH)
        assert (await comm.connect(HANG_GUARD_S))[0]
        while (message := await output(comm))["type"] != "websocket.close":
            pass
        assert message["code"] == 4013
        await comm.disconnect()
        monkeypatch.setattr(speech.runtime, "_engine", engine)
        response = await AsyncClient().post("/v1/audio/speech", {"input": "Hello."}, content_type="application/json")
    assert response.status_code == 503 and response["Retry-After"] == "3"
    assert refusals(metrics.ENGINE_BUSY) == before + 2
    assert [r.getMessage() for r in lines(caplog, logging.ERROR)] == []
