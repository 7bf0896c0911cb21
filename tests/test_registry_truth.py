"""The session registry tells the truth after the ways an instance stops (speech/control/sweep.py,
speech/server/launcher.py): no row says `active` for a session that is over, in the database and in the
admin's list of live sessions.

- SIGTERM while clients do not answer the close: speaking clients that stopped reading, an idle one that
  stopped reading, and clients that vanished right after their session.config (whose socket uvloop gave
  up under daphne). Every row is ended when the process has exited.
- SIGKILL of one of two instances sharing Redis: the other marks the killed one's rows lost once its
  heartbeat is stale.
- One instance without Redis, killed and started again: the new process marks the old one's rows lost.

Real daphne processes with the Hibari engine, a private redis-server, a shared SQLite database.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.support.live import PYTHON, DaphneServer, assert_healthy, configure, open_session, send_json, wait_for
from tests.support.redis_server import RedisServer
from tests.support.sessions import CONFIG, Admin, speaking_session
from tests.support.stress import vanish_after_config

pytestmark = pytest.mark.live

LONG_TEXT = " ".join(f"Sentence {i} of a long answer that nobody will listen to the end of." for i in range(40)) + " "
LIVE_LIST = "/admin/speech/sessionrecord/?status__exact=active"
VANISHING = 12


class Registry:
    """The shared database of the module's servers, and their common environment."""

    def __init__(self, redis_server=None):
        self.dir = Path(tempfile.mkdtemp(prefix="registry-truth-"))
        self.db = self.dir / "db.sqlite3"
        self.env = {
            "SPEECH_ENGINE": "hibari",
            "SPEECH_REQUIRE_API_KEY": "false",
            "DATABASE_URL": f"sqlite:///{self.db}",
            "MEDIA_ROOT": str(self.dir / "media"),
        }
        if redis_server is not None:
            self.env["REDIS_URL"] = redis_server.url(4)
        self.servers = []
        self.migrated = False

    def server(self, instance):
        server = DaphneServer({**self.env, "SPEECH_INSTANCE_ID": instance}, migrate=not self.migrated)
        self.migrated = True
        server.start()
        self.servers.append(server)
        return server

    def rows(self, instance=None):
        """{session_id: status} of every row (of one instance)."""
        with sqlite3.connect(self.db, timeout=10) as db:
            query, args = "SELECT session_id, status FROM speech_sessionrecord", ()
            if instance is not None:
                query, args = query + " WHERE instance = ?", (instance,)
            return dict(db.execute(query, args).fetchall())

    def active(self, instance=None):
        return sorted(sid for sid, status in self.rows(instance).items() if status == "active")

    def admin(self, server):
        """`server`'s admin, logged in as a new superuser."""
        name, password = f"ops{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        subprocess.run(
            [PYTHON, "manage.py", "createsuperuser", "--noinput", "--username", name, "--email", "ops@example.com"],
            cwd=server.root,
            env={**server.environment(), "DJANGO_SUPERUSER_PASSWORD": password},
            check=True,
            capture_output=True,
            timeout=120,
        )
        admin = Admin(server)
        admin.login(name, password)
        return admin

    def cleanup(self):
        for server in self.servers:
            server.stop()
        for server in self.servers:
            server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.cleanup()


async def held_sessions(server, count):
    """Sessions speaking a long text whose clients stopped reading (held by backpressure)."""
    return [await speaking_session(server, LONG_TEXT) for _ in range(count)]


async def idle_session(server):
    ws = await open_session(server.ws_url, small_buffers=True)
    return ws, (await configure(ws, CONFIG))["session_id"]


async def test_sigterm_records_every_session_it_ends_even_when_clients_never_answer_the_close(redis_server):
    registry = Registry(redis_server)
    try:
        a = registry.server("A")
        speaking = await held_sessions(a, 2)
        idle, idle_sid = await idle_session(a)  # configured, then never reads again
        for _ in range(VANISHING):
            await vanish_after_config(a)
        wait_for(lambda: len(registry.rows("A")) == 3 + VANISHING, "every configured session has its row")
        a.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(a.proc.wait, 60) == 0, a.stderr_text()[-3000:]
        rows = registry.rows("A")
        assert registry.active("A") == [], rows
        for _ws, sid, _items in speaking:
            assert rows[sid] == "terminated"
        assert rows[idle_sid] == "terminated"
        for ws in [idle] + [ws for ws, _sid, _items in speaking]:
            ws.transport.abort()  # the server has gone: no closing handshake to wait for
        a.assert_no_traceback()
    finally:
        registry.cleanup()


async def test_the_sessions_of_a_killed_instance_are_marked_lost_by_the_other_and_leave_the_live_list(redis_server):
    registry = Registry(redis_server)
    try:
        a, b = registry.server("A"), registry.server("B")
        admin = await asyncio.to_thread(registry.admin, b)
        sessions = await held_sessions(a, 2)
        on_b = await idle_session(b)
        page = await asyncio.to_thread(admin.get, LIVE_LIST)
        assert all(sid in page for _ws, sid, _items in sessions)
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(30)
        wait_for(lambda: registry.active("A") == [], "B marked A's sessions lost", timeout=60)
        rows = registry.rows("A")
        assert sorted(rows.values()) == ["failed", "failed"], rows
        page = await asyncio.to_thread(admin.get, LIVE_LIST)
        assert not any(sid in page for _ws, sid, _items in sessions)
        assert on_b[1] in page and registry.active("B") == [on_b[1]]  # B's own session is live, and listed
        await on_b[0].close()
        for ws, _sid, _items in sessions:
            ws.transport.abort()
        assert_healthy(b)
    finally:
        registry.cleanup()


async def test_without_redis_the_next_start_marks_the_killed_process_sessions_lost():
    registry = Registry()
    try:
        first = registry.server("solo")
        ws, sid = await idle_session(first)
        await send_json(ws, {"type": "input.text", "text": "Hello there. "})
        wait_for(lambda: registry.active() == [sid], "the session's row")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
        ws.transport.abort()
        assert registry.active() == [sid]  # nobody could record its end
        second = registry.server("solo")
        wait_for(lambda: registry.active() == [], "the new process marked it lost")
        assert registry.rows()[sid] == "failed"
        admin = await asyncio.to_thread(registry.admin, second)
        assert sid not in await asyncio.to_thread(admin.get, LIVE_LIST)
        assert_healthy(second)
    finally:
        registry.cleanup()
