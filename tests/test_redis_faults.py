"""Redis faults with real processes: a private `redis-server` (free port, no persistence) that the test
kills and restarts, and two daphne instances (A holds the sessions, B takes the REST calls) sharing
it and a temp SQLite database, with the real Hibari engine.

With Redis gone, sessions keep working on their own instance (end to end, local input.cancel, the
registry) and the cross-instance endpoints answer 503 with the error envelope; nothing logs a
traceback. When Redis is back on the same port, signals flow again without restarting anything.

The machine's own Redis (127.0.0.1:6379) is never touched. Polling loops are bounded and only wait
for the servers to reconnect; every other wait is a hang guard.

`RedisServer` is in tests/support/redis_server.py.
"""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from tests.support.live import (
    Instances,
    assert_healthy,
    collect,
    is_event,
    run_session,
    segments_of,
    send_json,
    wait_for,
)
from tests.support.redis_server import RedisServer
from tests.support.sessions import (
    CONFIG,
    acted_on_cancel,
    cancel_path,
    request,
    rest,
    server_cancels,
    session_path,
    speak_and_stop_reading,
    speaking_session,
)

pytestmark = pytest.mark.live

# -- the module's servers -------------------------------------------------------------------------------

RATE = 24000
SENTENCES = [f"Sentence {i} of a long answer that the caller will interrupt at some point." for i in range(40)]
LONG_TEXT = " ".join(SENTENCES) + " "


class Setup(Instances):
    """Instances A and B (and those a test adds), on the shared database and `redis_server`'s database 3."""

    def __init__(self, redis_server):
        super().__init__("redis-faults-", {"REDIS_URL": redis_server.url(3)})
        self.redis = redis_server

    def status(self, session_id):
        import sqlite3

        with sqlite3.connect(self.db, timeout=10) as db:
            row = db.execute("SELECT status FROM speech_sessionrecord WHERE session_id = ?", (session_id,)).fetchone()
        return row[0] if row else None


@pytest.fixture(scope="module")
def setup():
    redis_server = RedisServer().start()
    s = Setup(redis_server)
    try:
        s.a = s.server("A")
        s.b = s.server("B")
        yield s
    finally:
        s.stop()
        redis_server.cleanup()
    s.remove()


@pytest.fixture(scope="module", autouse=True)
def standby():
    """An empty Redis for test 8's failover, started with the module so that by test 8 it has been up
    long enough not to count as just restarted (2 * STALE_S; run alone, test 8 waits for that)."""
    server = RedisServer().start()
    yield server
    server.cleanup()


@pytest.fixture(autouse=True)
def no_traceback(setup):
    yield
    assert_healthy(*setup.servers, stopped_ok=True)


# -- helpers ----------------------------------------------------------------------------------------------


def heartbeat(setup, instance, redis_server=None):
    """Whether `instance` has renewed its heartbeat in Redis (speech/control/layer.py): the REST endpoints treat
    the sessions of an instance without one as lost."""
    return (redis_server or setup.redis).has_key(f"speech:instance:{instance}", db=3)


def check_cancelled(items, sid, origin):
    """items end with: [audio.done cancelled:true of the cut segment,] input.cancelled(origin)."""
    segments, problems = segments_of(items)
    assert problems == []
    event = items[-1].data
    assert event["type"] == "input.cancelled" and event["session_id"] == sid and event["origin"] == origin, event
    cut = segments[-1]
    assert cut.done is not None and cut.done["cancelled"] is True and cut.done["total_bytes"] == len(cut.audio)
    assert items[-2].data is cut.done
    assert event["total_sentences"] == cut.index + 1
    return cut


def check_unavailable(status_body):
    status, body = status_body
    assert status == 503, (status, body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    error = body["error"]
    assert error["type"] == "server_error" and error["code"] == 503 and error["param"] is None
    assert error["message"].startswith("signals are unavailable: Redis cannot be reached"), error


async def finish_ok(ws, sid, next_index):
    """The session still works: a new sentence is spoken with the next free index, then session.done."""
    await send_json(ws, {"type": "input.text", "text": "Still speaking fine. "})
    await send_json(ws, {"type": "input.done"})
    rest_ = await collect(ws)
    segments, problems = segments_of(rest_.items)
    assert problems == []
    assert [(s.index, s.start["sentence_text"]) for s in segments] == [(next_index, "Still speaking fine.")]
    assert segments[0].done["total_bytes"] == len(segments[0].audio) > 0
    assert rest_.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": next_index + 1}
    assert rest_.close_code == 1000


# -- the sequence -----------------------------------------------------------------------------------------
# The tests run in file order and share the servers: up, down, back up, down at an instance's start.


async def test_1_with_redis_up_a_cancel_on_b_reaches_a(setup):
    ws, sid, items = await speaking_session(setup.a, LONG_TEXT)
    try:
        since = server_cancels(setup.a)
        assert await rest(setup.b, "POST", cancel_path(sid)) == (
            202,
            {"session_id": sid, "signal": "cancel", "status": "accepted"},
        )
        await acted_on_cancel(setup.a, since)
        after = await collect(ws, until=is_event("input.cancelled"))
        cut = check_cancelled(items + after.items, sid, "server")
        assert setup.redis.group_members(sid, db=3) == 1
        await finish_ok(ws, sid, cut.index + 1)
    finally:
        await ws.close()
    wait_for(lambda: setup.redis.group_members(sid, db=3) == 0, "the session left its group")


async def test_2_with_redis_down_sessions_work_and_control_answers_503(setup):
    setup.redis.kill()

    # A new session on A works end to end, and the registry still records it.
    result = await run_session(setup.a.ws_url, CONFIG, ["Redis is gone. ", "Speech goes on."])
    segments, problems = segments_of(result.items)
    assert problems == []
    assert [s.start["sentence_text"] for s in segments] == ["Redis is gone.", "Speech goes on."]
    assert all(s.done["total_bytes"] == len(s.audio) > 0 for s in segments)
    assert result.events[-1]["type"] == "session.done" and result.close_code == 1000
    wait_for(lambda: setup.status(result.configured["session_id"]) == "completed", "registry outcome")

    ws, sid, items = await speaking_session(setup.a, LONG_TEXT)
    try:
        # The cross-instance endpoints answer 503 with the envelope, on B and on A itself.
        for server in (setup.b, setup.a):
            check_unavailable(await rest(server, "POST", cancel_path(sid)))
            check_unavailable(await rest(server, "DELETE", session_path(sid)))
        # A session id without a registry row may be a session in its first milliseconds (its row is
        # written just after the handshake) whose group cannot be checked now: 503, never a wrong 404.
        # An id that can never be a session is still 404.
        check_unavailable(await rest(setup.b, "POST", cancel_path(f"speech_ws_{uuid.uuid4().hex}")))
        status, body = await rest(setup.b, "POST", cancel_path("nonsense"))
        assert status == 404 and body["error"]["type"] == "not_found_error"

        # Local barge-in works.
        await send_json(ws, {"type": "input.cancel"})
        after = await collect(ws, until=is_event("input.cancelled"))
        assert after.close_code is None, after.types()
        cut = check_cancelled(items + after.items, sid, "client")
        await finish_ok(ws, sid, cut.index + 1)
    finally:
        await ws.close()
    wait_for(lambda: setup.status(sid) == "completed", "registry outcome")
    for server in (setup.a, setup.b):
        server.assert_no_traceback()
        assert "ERROR django.request" not in server.stderr_text()  # a handled 503 is no error (speech.metrics.refused)
    assert setup.a.stderr_text().count("channel layer: Redis unavailable") == 1
    assert setup.b.stderr_text().count("refused (signals_unavailable)") == 1  # 3 refusals, one line


async def test_3_when_redis_is_back_signals_flow_again_without_a_restart(setup):
    ws, sid, items = await speaking_session(setup.a, LONG_TEXT)  # opened while Redis is still down
    try:
        check_unavailable(await rest(setup.b, "POST", cancel_path(sid)))
        setup.redis.start()  # same port, empty
        # A joins its session's group again on its own (backoff) and renews its heartbeat; until then a
        # signal would find no one, so wait for both, then for B to answer 202.
        wait_for(lambda: setup.redis.group_members(sid, db=3) == 1, "A rejoined the session's group")
        wait_for(lambda: heartbeat(setup, "A"), "A's heartbeat renewed")  # else its sessions look lost

        since = server_cancels(setup.a)

        def cancel_accepted():
            status, body = request(setup.b, "POST", cancel_path(sid))
            if status == 503:
                return None
            assert (status, body) == (202, {"session_id": sid, "signal": "cancel", "status": "accepted"})
            return True

        await asyncio.to_thread(wait_for, cancel_accepted, "B's REST cancel accepted again")
        await acted_on_cancel(setup.a, since)
        after = await collect(ws, until=is_event("input.cancelled"))
        assert after.close_code is None, after.types()
        items += after.items
        check_cancelled(items, sid, "server")

        # Terminate flows too.
        await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
        more = await speak_and_stop_reading(ws, setup.a)
        assert await rest(setup.b, "DELETE", session_path(sid)) == (
            202,
            {"session_id": sid, "signal": "terminate", "status": "accepted"},
        )
        end = await collect(ws)
        assert end.close_code == 4001
        assert (more.items + end.items)[-1].data == {
            "type": "error",
            "message": "speech session terminated by the server",
            "error_type": "server_error",
        }
    finally:
        await ws.close()
    wait_for(lambda: setup.status(sid) == "terminated", "registry outcome")
    assert setup.a.stderr_text().count("channel layer: Redis is reachable again") == 1


async def test_4_an_instance_started_while_redis_is_down_serves_and_joins_later(setup):
    setup.redis.kill()
    c = setup.server("C")  # its first session subscribes with Redis away
    ws, sid, items = await speaking_session(c, LONG_TEXT)
    try:
        check_unavailable(await rest(setup.b, "POST", cancel_path(sid)))
        await send_json(ws, {"type": "input.cancel"})
        after = await collect(ws, until=is_event("input.cancelled"))
        items += after.items
        check_cancelled(items, sid, "client")

        setup.redis.start()
        wait_for(lambda: setup.redis.group_members(sid, db=3) == 1, "C joined the session's group")
        wait_for(lambda: heartbeat(setup, "C"), "C's heartbeat written")
        await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
        await speak_and_stop_reading(ws, c)

        def terminate_accepted():
            status, body = request(setup.b, "DELETE", session_path(sid))
            return None if status == 503 else (status, body)

        status, body = await asyncio.to_thread(wait_for, terminate_accepted, "B's REST terminate accepted")
        assert status == 202, body
        end = await collect(ws)
        assert end.close_code == 4001 and end.events[-1]["message"] == "speech session terminated by the server"
    finally:
        await ws.close()
    wait_for(lambda: setup.status(sid) == "terminated", "registry outcome")


async def test_5_sigterm_with_redis_down_still_ends_sessions_cleanly(setup):
    setup.redis.kill()
    c = setup.servers[-1]
    assert c.alive()
    ws, sid, items = await speaking_session(c, LONG_TEXT)
    try:
        c.proc.send_signal(signal.SIGTERM)
        end = await collect(ws)
        await asyncio.to_thread(c.proc.wait, 30)
    finally:
        await ws.close()
    assert end.close_code == 4001
    assert end.events[-1] == {
        "type": "error",
        "message": "speech session terminated: the server is shutting down",
        "error_type": "server_error",
    }
    assert c.proc.returncode == 0, c.stderr_text()[-3000:]
    assert setup.status(sid) == "terminated"  # written before the process exited
    c.assert_no_traceback()


# -- a failover the listener cannot see ---------------------------------------------------------------------


class SilentFailoverProxy:
    """A TCP proxy in front of Redis that can fail over the way a moved virtual IP or a replaced host
    does: `failover(port)` sends new connections to another redis-server, while every connection
    opened before it goes silent -- kept open, nothing forwarded, no FIN, no RST -- because the peer
    that knew it is gone. Threads, so it runs whatever the test's event loop is doing."""

    def __init__(self, backend_port):
        import socket as socket_module
        import threading

        self._socket = socket_module
        self._threading = threading
        self.backend_port = backend_port
        self.generation = 0
        self.closed = False
        self.sockets = []
        self.listener = socket_module.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db=0):
        return f"redis://127.0.0.1:{self.port}/{db}"

    def failover(self, new_backend_port):
        self.generation += 1
        self.backend_port = new_backend_port

    def close(self):
        self.closed = True
        for sock in [self.listener, *self.sockets]:
            try:
                sock.close()
            except OSError:
                pass

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            generation = self.generation
            try:
                upstream = self._socket.create_connection(("127.0.0.1", self.backend_port), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                self._threading.Thread(target=self._pump, args=(src, dst, generation), daemon=True).start()

    def _pump(self, src, dst, generation):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            stale = generation != self.generation
            if not data:
                if not stale:  # a normal end: pass it on
                    for sock in (src, dst):
                        try:
                            sock.shutdown(self._socket.SHUT_RDWR)
                        except OSError:
                            pass
                return  # stale: the other side never hears of it
            if stale:
                continue  # swallowed
            try:
                dst.sendall(data)
            except OSError:
                return


async def test_6_a_live_session_is_not_declared_lost_after_a_failover(setup):
    """Redis comes back empty behind the same address while E's old connections go silent: until E's
    listener notices and renews its heartbeat, F cannot vouch for E. (Failed while F then wrote E's live
    session as 'failed' and answered 404 for good.)"""
    first = RedisServer().start()
    second = RedisServer()
    proxy = SilentFailoverProxy(first.port)
    try:
        proxied = {"REDIS_URL": proxy.url(3)}
        e = setup.server("E", proxied)
        f = setup.server("F", proxied)
        ws, sid, items = await speaking_session(e, LONG_TEXT)
        try:
            # Before: signals flow through the proxy.
            assert first.group_members(sid, db=3) == 1
            since = server_cancels(e)
            assert (await rest(f, "POST", cancel_path(sid)))[0] == 202
            await acted_on_cancel(e, since)
            after = await collect(ws, until=is_event("input.cancelled"))
            check_cancelled(items + after.items, sid, "server")
            await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
            more = await speak_and_stop_reading(ws, e)

            proxy.failover(second.port)  # E's connections go silent; new ones reach an empty Redis
            first.kill()
            second.start()

            since = server_cancels(e)

            # While the control plane cannot vouch for E, 503 is a fair answer; the first other answer
            # must be 202 (E is alive and its listener comes back on its own), never 404.
            def first_answer():
                status, body = request(f, "POST", cancel_path(sid))
                return None if status == 503 else (status, body)

            status, body = await asyncio.to_thread(wait_for, first_answer, "F's REST cancel answered")
            assert setup.status(sid) == "active"
            assert status == 202, body
            await acted_on_cancel(e, since)
            after = await collect(ws, until=is_event("input.cancelled"))
            check_cancelled(more.items + after.items, sid, "server")
        finally:
            await ws.close()
    finally:
        proxy.close()
        first.cleanup()
        second.cleanup()


async def test_7_signals_flow_again_after_a_silent_failover(setup):
    """The listener notices a connection that went silent (no FIN/RST) and resubscribes on the new Redis."""
    first = RedisServer().start()
    second = RedisServer()
    proxy = SilentFailoverProxy(first.port)
    try:
        proxied = {"REDIS_URL": proxy.url(3)}
        g = setup.server("G", proxied)
        h = setup.server("H", proxied)
        ws, sid, items = await speaking_session(g, LONG_TEXT)
        try:
            assert first.group_members(sid, db=3) == 1
            proxy.failover(second.port)
            first.kill()
            second.start()
            # Bounded: a dead subscription must be noticed within seconds, not TCP's minutes.
            await asyncio.to_thread(
                wait_for, lambda: second.group_members(sid, db=3) == 1, "G rejoined the session's group on the new Redis", 20.0
            )
            await asyncio.to_thread(wait_for, lambda: heartbeat(setup, "G", second), "G's heartbeat renewed")
            since = server_cancels(g)

            def accepted():
                status, body = request(h, "POST", cancel_path(sid))
                return None if status == 503 else (status, body)

            status, body = await asyncio.to_thread(wait_for, accepted, "H's REST cancel answered")
            assert status == 202, body
            await acted_on_cancel(g, since)
            after = await collect(ws, until=is_event("input.cancelled"))
            check_cancelled(items + after.items, sid, "server")
        finally:
            await ws.close()
    finally:
        proxy.close()
        first.cleanup()
        second.cleanup()


async def test_8_a_live_session_is_not_declared_lost_when_its_heartbeat_key_is_lost(setup, standby):
    first = RedisServer().start()
    proxy = SilentFailoverProxy(first.port)
    try:
        proxied = {"REDIS_URL": proxy.url(3)}
        e = setup.server("E8", proxied)
        f = setup.server("F8", proxied)
        ws, sid, items = await speaking_session(e, LONG_TEXT)
        try:
            from speech.control.signals import STALE_S

            def uptime():
                with standby.client() as client:
                    return int(client.info("server")["uptime_in_seconds"])

            # The standby has been up long enough not to count as "just restarted".
            await asyncio.to_thread(wait_for, lambda: uptime() > 2 * STALE_S + 1, "standby uptime", 60.0)
            since = server_cancels(e)
            proxy.failover(standby.port)
            first.kill()

            def first_answer():
                status, body = request(f, "POST", cancel_path(sid))
                return None if status == 503 else (status, body)

            status, body = await asyncio.to_thread(wait_for, first_answer, "F's REST cancel answered")
            assert setup.status(sid) == "active", "a live session was written as ended"
            assert status == 202, body
            await acted_on_cancel(e, since)
            after = await collect(ws, until=is_event("input.cancelled"))
            check_cancelled(items + after.items, sid, "server")
        finally:
            await ws.close()
    finally:
        proxy.close()
        first.cleanup()
