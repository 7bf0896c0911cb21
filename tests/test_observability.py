"""Metrics, readiness and session-tagged logs, against real daphne processes.

The metrics test scrapes /metrics of a real daphne with the Hibari engine before, during and after
a real WebSocket session and checks that every number moved as the session says it should.
Readiness is checked against a real private Redis, a real PostgreSQL server (a database that does
not exist) and an upstream engine whose upstream is not there.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from speech import logcontext, metrics
from speech.engines.fake import FakeEngine

from .support.deploy import http
from .support.live import (
    DaphneServer,
    collect,
    configure,
    free_port,
    held,
    is_event,
    open_session,
    run_session,
    send_json,
    serving,
    wait_for,
)
from .support.redis_server import RedisServer

pytestmark = pytest.mark.live

CONFIG = {"response_format": "pcm", "stream_audio": True}
LONG_TEXT = " ".join(f"Sentence {i} of an answer that will be interrupted." for i in range(40)) + " "


# -- helpers ------------------------------------------------------------------------------------


def scrape(server, headers=None):
    """{(sample name, sorted labels): value} of the server's /metrics."""
    status, body = http("GET", server.http_url + "/metrics", headers=headers)
    assert status == 200, body
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before, after, name, **labels):
    return value(after, name, **labels) - value(before, name, **labels)


# -- the module's server: Hibari, with a private Redis ------------------------------------------


@pytest.fixture(scope="module")
def redis_server():
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def server(redis_server):
    with serving({"SPEECH_ENGINE": "hibari", "REDIS_URL": redis_server.url(0), "SPEECH_INSTANCE_ID": "observed"}) as srv:
        yield srv


# -- metrics --------------------------------------------------------------------------------------


async def test_metrics_follow_a_real_session(server):
    before = scrape(server)
    ws = await open_session(server.ws_url, small_buffers=True)
    try:
        sid = (await configure(ws, CONFIG))["session_id"]
        await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
        received = await collect(ws, until=lambda item: item.kind == "audio")
        during = await asyncio.to_thread(scrape, server)
        assert value(during, "speech_sessions_active") == value(before, "speech_sessions_active") + 1
        assert delta(before, during, "speech_audio_sent_bytes_total") > 0
        assert delta(before, during, "speech_time_to_first_audio_seconds_count") == 1

        # a cancel from the client, then one through the REST API (origin server)
        await send_json(ws, {"type": "input.cancel"})
        received = await collect(ws, received, until=is_event("input.cancelled"))
        await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
        received = await collect(ws, received, until=lambda item: item.kind == "audio")
        await asyncio.to_thread(held, server)  # still speaking, whatever the cancel's way takes
        status, _ = await asyncio.to_thread(http, "POST", f"{server.http_url}/v1/audio/speech/sessions/{sid}/cancel", b"")
        assert status == 202
        received = await collect(
            ws,
            received,
            until=lambda item: (
                item.kind == "event" and item.data.get("type") == "input.cancelled" and item.data["origin"] == "server"
            ),
        )
        # an error event: an unknown message type is BadRequestError 400
        await send_json(ws, {"type": "no.such.type"})
        received = await collect(ws, received, until=is_event("error"))
        await send_json(ws, {"type": "input.text", "text": "Last words."})
        await send_json(ws, {"type": "input.done"})
        received = await collect(ws, received)
    finally:
        await ws.close()
    assert received.close_code == 1000, received.types()
    status, _ = await asyncio.to_thread(http, "GET", server.http_url + "/v1/audio/voices")
    assert status == 200

    def settled():  # the end of a session is counted once its work has stopped, after the close
        after = scrape(server)
        return after if delta(before, after, "speech_sessions_ended_total", outcome="completed") == 1 else None

    after = await asyncio.to_thread(wait_for, settled, "the session counted as ended")
    audio = b"".join(item.data for item in received.items if item.kind == "audio")
    assert value(after, "speech_sessions_active") == value(before, "speech_sessions_active")
    assert delta(before, after, "speech_audio_sent_bytes_total") == len(audio)
    assert delta(before, after, "speech_audio_sent_seconds_total") == pytest.approx(len(audio) / 2 / 24000)
    assert delta(before, after, "speech_time_to_first_audio_seconds_count") == 1
    assert delta(before, after, "speech_cancels_total", origin="client") == 1
    assert delta(before, after, "speech_cancels_total", origin="server") == 1
    assert delta(before, after, "speech_errors_total", type="BadRequestError", code="400") == 1
    synthesised = delta(before, after, "speech_segment_synthesis_seconds_count")
    assert synthesised >= 3  # the first segment of each run of text, and "Last words."
    assert delta(before, after, "speech_segment_real_time_factor_count") == synthesised
    assert delta(before, after, "speech_segment_synthesis_seconds_sum") > 0
    for histogram in ("speech_engine_job_seconds", "speech_engine_job_wait_seconds"):  # at least a job a segment
        assert delta(before, after, f"{histogram}_count") >= synthesised
    assert delta(before, after, "speech_engine_job_seconds_sum") > 0
    assert delta(before, after, "speech_rest_requests_total", endpoint="voice-list", method="GET", status="200") == 1
    assert delta(before, after, "speech_rest_requests_total", endpoint="session-cancel", method="POST", status="202") == 1
    assert value(after, "speech_engine_queue_depth") == 0  # nothing left in the engine's pool
    assert f"[{sid}]: session ended: completed" in server.stderr_text()


def test_a_pool_job_is_counted_in_both_job_histograms():
    names = ("speech_engine_job_wait_seconds", "speech_engine_job_seconds")
    sample = metrics.REGISTRY.get_sample_value
    before = {name: (sample(name + "_count"), sample(name + "_sum")) for name in names}
    metrics.METER.engine_job(0.25, 0.5)
    after = {name: (sample(name + "_count"), sample(name + "_sum")) for name in names}
    assert [after[name][0] - before[name][0] for name in names] == [1, 1]
    assert [after[name][1] - before[name][1] for name in names] == pytest.approx([0.25, 0.5])


def test_metrics_need_the_token_when_one_is_set():
    with serving({"SPEECH_ENGINE": "fake", "SPEECH_METRICS_TOKEN": "s3cret-metrics"}) as srv:
        assert http("GET", srv.http_url + "/metrics")[0] == 401
        assert http("GET", srv.http_url + "/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
        status, body = http("GET", srv.http_url + "/metrics", headers={"Authorization": "Bearer s3cret-metrics"})
        assert status == 200 and b"speech_sessions_active" in body
    assert "s3cret-metrics" not in srv.stderr_text() + srv.stdout_text()


async def test_metrics_without_a_token_are_for_this_machine_only(rf, settings):
    from speech.web import views

    settings.SPEECH_METRICS_TOKEN = ""
    remote = await views.metrics(rf.get("/metrics", REMOTE_ADDR="203.0.113.9"))
    assert remote.status_code == 403
    assert json.loads(remote.content)["error"]["type"] == "permission_error"
    assert (await views.metrics(rf.get("/metrics", REMOTE_ADDR="::1"))).status_code == 200
    assert (await views.metrics(rf.get("/metrics", REMOTE_ADDR="127.0.0.1"))).status_code == 200


# -- readiness --------------------------------------------------------------------------------------


def health(server):
    status, body = http("GET", server.http_url + "/health")
    return status, json.loads(body)


def test_ready_when_database_redis_and_engine_are(server):
    status, body = health(server)
    assert (status, body) == (200, {"status": "ok", "checks": {"database": "ok", "engine": "ok", "redis": "ok"}})
    assert http("GET", server.http_url + "/healthz")[0] == 200


def test_not_ready_names_each_failing_part():
    dead = free_port()
    env = {
        "SPEECH_ENGINE": "openai",
        "SPEECH_UPSTREAM_URL": f"http://127.0.0.1:{dead}/v1",
        "SPEECH_UPSTREAM_VOICES": "alloy",
        "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/speech_no_such_database",
    }
    with DaphneServer(env, migrate=False) as srv:  # nothing to migrate into: the database is missing
        status, body = health(srv)
        liveness = http("GET", srv.http_url + "/healthz")[0]
    srv.cleanup()
    assert status == 503 and body["status"] == "unavailable"
    assert body["failing"] == ["database", "engine", "redis"]
    assert "speech_no_such_database" in body["checks"]["database"]
    assert f"127.0.0.1:{dead}" in body["checks"]["engine"] and "unreachable" in body["checks"]["engine"]
    assert "ConnectionError" in body["checks"]["redis"]
    assert liveness == 200  # alive all the same: /healthz is liveness only


def test_redis_gone_leaves_the_instance_ready_but_degraded_until_it_is_back(server, redis_server):
    """Sessions are served without Redis: readiness stays 200 (an orchestrator keeps the instance) and
    says `degraded`, naming Redis; liveness is untouched."""
    redis_server.kill()
    try:
        status, body = health(server)
        assert status == 200 and body["status"] == "degraded" and body["failing"] == ["redis"]
        assert "ConnectionError" in body["checks"]["redis"]
        assert body["checks"]["database"] == body["checks"]["engine"] == "ok"
        assert http("GET", server.http_url + "/healthz")[0] == 200
        result = asyncio.run(run_session(server.ws_url, CONFIG, ["Still speaking without Redis."]))
        assert result.close_code == 1000 and result.audio_frames
    finally:
        redis_server.start()
    assert health(server) == (200, {"status": "ok", "checks": {"database": "ok", "engine": "ok", "redis": "ok"}})


# -- logs -------------------------------------------------------------------------------------------


def test_json_logs_one_object_a_line_with_the_session_id():
    with serving({"SPEECH_ENGINE": "fake", "DJANGO_LOG_FORMAT": "json"}) as srv:

        async def one_session():
            ws = await open_session(srv.ws_url)
            try:
                sid = (await configure(ws, CONFIG))["session_id"]
                await send_json(ws, {"type": "input.text", "text": "Hello there."})
                await send_json(ws, {"type": "input.done"})
                result = await collect(ws)
            finally:
                await ws.close()
            assert result.close_code == 1000
            return sid

        sid = asyncio.run(one_session())
        wait_for(lambda: "session ended" in srv.stderr_text(), "the session's end logged")
        lines = [line for line in (srv.stderr_text() + srv.stdout_text()).splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert {"time", "level", "logger", "message", "session_id"} <= set(records[0])
    mine = [r for r in records if r["session_id"] == sid]
    assert [r["message"] for r in mine][:1] == ["session started"]
    assert any(r["message"].startswith("session ended: completed, 1 segments") for r in mine)
    assert all(r["session_id"] is None for r in records if r["logger"] in ("speech.serve", "daphne.server"))


async def test_a_sessions_tasks_log_with_its_id(speech):
    """The id is bound in the session's task; the pipeline's producer task (created from it) logs
    a failed segment with the same id, through the console handler's filter."""
    records = []
    handler = logging.Handler()
    handler.addFilter(logcontext.SessionFilter())
    handler.emit = records.append
    pipeline_logger = logging.getLogger("speech.stream.producer")
    pipeline_logger.addHandler(handler)
    try:
        s = await speech(engine=FakeEngine(fail_on="BOOM", error=RuntimeError("boom")), stream_audio=True)
        metrics.session_started(s.session)
        await s.text("BOOM now. ")
        await s.t.event("error")
    finally:
        pipeline_logger.removeHandler(handler)
        metrics.session_ended(s.session.summary())
    assert [r.session_id for r in records] == [s.session.session_id]
    assert records[0].getMessage().startswith("synthesis failed")
