"""The control plane across real processes: daphne A and B (`manage.py serve`, tests/support/live.py) sharing one
SQLite database (a temp file, migrated once) and one Redis, with the real Hibari engine.

The Redis is a private `redis-server` on a free port (tests/support/redis_server.py), so
that nothing else on the machine's shared Redis can disturb (or count in) the channel layer's groups.

Sessions run on A; the REST control endpoints (docs/protocol.md, REST endpoints) are called on B; the registry is read
straight from the shared database file (table speech_sessionrecord), and once through B's admin
with a superuser. After every test, and once more after the servers stopped, their stderr must
hold no "Traceback".

The registry's outcome is written after the socket closed (consumers.py `_ended`), so tests poll
the row (bounded) until it leaves "active". Every other wait is a hang guard.
"""

from __future__ import annotations

import asyncio
import http.client
import http.cookiejar
import os
import re
import signal
import sqlite3
import subprocess
import uuid

import pytest

from tests.support.audio_samples import wav_bytes
from tests.support.heard import without_heard
from tests.support.live import (
    PROJECT_ROOT,
    PYTHON,
    Instances,
    assert_healthy,
    cancelled_segments,
    collect,
    configure,
    is_event,
    open_session,
    run_session,
    segments_of,
    send_json,
    wait_for,
)
from tests.support.redis_server import RedisServer
from tests.support.sessions import (
    CONFIG,
    Admin,
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

RATE = 24000
POLL_S = 30.0  # hang guard of the polling loops
TERMINATED = "speech session terminated by the server"
SHUTDOWN = "speech session terminated: the server is shutting down"
SENTENCES = [f"This is sentence number {i} of a rather long text that keeps on going." for i in range(40)]
LONG_TEXT = " ".join(SENTENCES) + " "


class Cluster(Instances):
    """Instances A and B (and those a test adds), on the shared database and one Redis database."""

    def __init__(self, redis_url):
        super().__init__("control-live-", {"SPEECH_IDLE_TIMEOUT_S": "30", "REDIS_URL": redis_url})
        self.tag = uuid.uuid4().hex[:8]

    def server(self, name, env=None):
        return super().server(self.instance(name), env)

    def instance(self, name):
        return f"{name}-{self.tag}"

    # -- the registry, read from the shared database ------------------------------------------------
    def record(self, session_id):
        with sqlite3.connect(self.db, timeout=10) as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM speech_sessionrecord WHERE session_id = ?", (session_id,)).fetchone()
        return dict(row) if row is not None else None

    def active_ids(self):
        with sqlite3.connect(self.db, timeout=10) as db:
            return {r[0] for r in db.execute("SELECT session_id FROM speech_sessionrecord WHERE status = 'active'")}

    def set_voice(self, session_id, voice):
        with sqlite3.connect(self.db, timeout=10) as db:
            assert db.execute("UPDATE speech_sessionrecord SET voice = ? WHERE session_id = ?", (voice, session_id)).rowcount == 1

    def ended_record(self, session_id):
        """The row once the session's outcome is written (bounded poll: the registry writes in batches)."""

        def ended():
            row = self.record(session_id)
            return row if row is not None and row["status"] != "active" else None

        return wait_for(ended, f"registry row of {session_id} no longer active", POLL_S)

    def left_group(self, session_id):
        """The session leaves its group once its end is in the registry, right after (bounded poll)."""
        wait_for(lambda: self.redis.group_members(session_id, db=5) == 0, f"{session_id} left its group", POLL_S)

    def manage(self, *args, extra_env=None):
        """A manage.py command against the shared database and Redis."""
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ttsproject.settings", **self.env, **(extra_env or {})}
        return subprocess.run(
            [PYTHON, "manage.py", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
        )


@pytest.fixture(scope="module")
def cluster():
    redis_server = RedisServer().start()
    c = Cluster(redis_server.url(5))
    c.redis = redis_server
    try:
        c.a = c.server("A")  # migrates the shared database once
        c.b = c.server("B")
        yield c
    finally:
        c.stop()
        redis_server.cleanup()
    c.remove()


@pytest.fixture(autouse=True)
def healthy(cluster):
    yield
    assert_healthy(cluster.a, cluster.b)


# -- helpers -----------------------------------------------------------------------------------------


def not_live(session_id):
    return {
        "error": {"message": f"no live session '{session_id}'", "type": "not_found_error", "param": "session_id", "code": 404}
    }


def accepted(session_id, kind):
    return {"session_id": session_id, "signal": kind, "status": "accepted"}


def audio_bytes(items):
    return sum(len(item.data) for item in items if item.kind == "audio")


def check_terminated(items, close_code, message=TERMINATED):
    """The end of a terminated session: segments intact up to the error event, no audio after it, 4001."""
    segments, problems = segments_of(items)
    assert problems == []
    assert close_code == 4001, close_code
    last = items[-1]
    assert last.kind == "event" and last.data == {"type": "error", "message": message, "error_type": "server_error"}, items[-3:]
    for segment in segments:  # every completed segment was whole; the cut one has no audio.done
        if segment.done is not None:
            assert segment.done["total_bytes"] == len(segment.audio)
    return segments


def check_row(row, instance, *, status, items):
    segments, _ = segments_of(items)
    assert row["status"] == status, row
    assert row["instance"] == instance
    assert row["voice"] == "heart" and row["engine"] == "hibari"
    assert row["ended_at"] is not None
    assert row["segments"] == len(segments) > 0
    assert row["bytes_sent"] == audio_bytes(items) > 0
    assert row["first_audio_ms"] is not None and row["first_audio_ms"] > 0


# -- cancel and terminate from B ---------------------------------------------------------------------------


async def test_cancel_then_terminate_from_b_reach_the_session_on_a(cluster):
    a, b = cluster.a, cluster.b
    ws, sid, items = await speaking_session(a, LONG_TEXT)
    try:
        row = cluster.record(sid)
        assert row["status"] == "active" and row["instance"] == cluster.instance("A") and row["ended_at"] is None

        # Cancel on B: the segment being sent is cut, the queue dropped, then input.cancelled (server).
        since = server_cancels(a)
        assert await rest(b, "POST", cancel_path(sid)) == (202, accepted(sid, "cancel"))
        await acted_on_cancel(a, since)
        after = await collect(ws, until=is_event("input.cancelled"))
        assert after.close_code is None, f"closed instead of input.cancelled: {after.types()}"
        items += after.items
        segments, cut = cancelled_segments(items, sid)
        assert items[-2].data is cut.done
        assert [s.start["sentence_text"] for s in segments] == SENTENCES[: len(segments)]
        assert without_heard(items[-1].data) == {
            "type": "input.cancelled",
            "session_id": sid,
            "cancelled_sentences": len(SENTENCES) - cut.index,
            "total_sentences": cut.index + 1,
            "origin": "server",
        }

        # The session goes on: new text is spoken with the next free index.
        await send_json(ws, {"type": "input.text", "text": "Sure, let me check. "})
        more = await collect(ws, until=is_event("audio.done"))
        items += more.items
        new, problems = segments_of(more.items)
        assert problems == []
        assert [(s.index, s.start["sentence_text"]) for s in new] == [(cut.index + 1, "Sure, let me check.")]
        assert new[0].done["cancelled"] is False and new[0].done["total_bytes"] == len(new[0].audio) > 0

        # Terminate on B while A speaks again: error event, close 4001, no audio after it.
        await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
        speaking = await speak_and_stop_reading(ws, a)
        items += speaking.items
        assert await rest(b, "DELETE", session_path(sid)) == (202, accepted(sid, "terminate"))
        end = await collect(ws)
        items += end.items
        check_terminated(items, end.close_code)
    finally:
        await ws.close()

    row = cluster.ended_record(sid)
    check_row(row, cluster.instance("A"), status="terminated", items=items)
    # Not live any more: both endpoints, on both instances, answer 404 with the envelope.
    for server in (a, b):
        assert await rest(server, "POST", cancel_path(sid)) == (404, not_live(sid))
        assert await rest(server, "DELETE", session_path(sid)) == (404, not_live(sid))


async def test_unknown_session_is_404_with_the_envelope(cluster):
    for sid in (f"speech_ws_{uuid.uuid4().hex}", "nonsense"):
        for server in (cluster.a, cluster.b):
            assert await rest(server, "POST", cancel_path(sid)) == (404, not_live(sid))
            assert await rest(server, "DELETE", session_path(sid)) == (404, not_live(sid))


async def test_cancel_from_b_when_nothing_is_speaking_is_answered_with_nothing_cancelled(cluster):
    """Contract §8: like a client's input.cancel, a server cancel with nothing to stop is answered with
    input.cancelled (cancelled_sentences 0, origin "server"), and the session goes on."""
    ws = await open_session(cluster.a.ws_url)
    try:
        sid = (await configure(ws, CONFIG))["session_id"]
        await send_json(ws, {"type": "input.text", "text": "Just one sentence. "})
        first = await collect(ws, until=is_event("audio.done"))
        assert await rest(cluster.b, "POST", cancel_path(sid)) == (202, accepted(sid, "cancel"))
        answer = await collect(ws, until=is_event("input.cancelled"))
        assert [without_heard(e) for e in answer.events] == [
            {"type": "input.cancelled", "session_id": sid, "cancelled_sentences": 0, "total_sentences": 1, "origin": "server"}
        ]
        await send_json(ws, {"type": "input.text", "text": "And another one. "})
        await send_json(ws, {"type": "input.done"})
        rest_ = await collect(ws)
        segments, problems = segments_of(first.items + rest_.items)
        assert problems == [] and [s.index for s in segments] == [0, 1]
        assert rest_.events[-1] == {"type": "session.done", "session_id": sid, "total_sentences": 2}
        assert rest_.close_code == 1000
    finally:
        await ws.close()
    assert cluster.ended_record(sid)["status"] == "completed"


# -- the first milliseconds, and the group's lifetime ----------------------------------------------------


@pytest.mark.parametrize("round_", range(5))
async def test_a_cancel_and_a_terminate_from_b_right_after_session_configured_reach_the_session(cluster, round_):
    """The registry row is written after session.configured, in the background; a signal sent from
    another instance the moment session.configured arrives must still be accepted (never 404) and
    acted on: B finds the session by its group in the channel layer."""
    ws = await open_session(cluster.a.ws_url)
    try:
        sid = (await configure(ws, CONFIG))["session_id"]
        assert await rest(cluster.b, "POST", cancel_path(sid)) == (202, accepted(sid, "cancel"))
        answer = await collect(ws, until=is_event("input.cancelled"))
        assert [without_heard(e) for e in answer.events] == [
            {"type": "input.cancelled", "session_id": sid, "cancelled_sentences": 0, "total_sentences": 0, "origin": "server"}
        ]
        assert await rest(cluster.b, "DELETE", session_path(sid)) == (202, accepted(sid, "terminate"))
        end = await collect(ws)
        assert end.close_code == 4001 and end.events == [{"type": "error", "message": TERMINATED, "error_type": "server_error"}]
    finally:
        await ws.close()
    assert cluster.ended_record(sid)["status"] == "terminated"
    cluster.left_group(sid)


CANCEL_SNIPPET = re.compile(r"<!-- cancel-snippet -->\n```python\n(.*?)```", re.S)


async def test_the_documented_snippet_cancels_a_session_from_a_separate_process(cluster):
    """docs/operations.md's three lines, run as written in a process of their own."""
    snippet = CANCEL_SNIPPET.search((PROJECT_ROOT / "docs" / "operations.md").read_text()).group(1)
    assert len(snippet.strip().splitlines()) == 3, snippet
    ws, sid, items = await speaking_session(cluster.a, LONG_TEXT)
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ttsproject.settings", **cluster.env}
        since = server_cancels(cluster.a)
        program = f"import django\ndjango.setup()\nsession_id = {sid!r}\n{snippet}"
        done = await asyncio.to_thread(
            subprocess.run, [PYTHON, "-c", program], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        await acted_on_cancel(cluster.a, since)
        after = await collect(ws, until=is_event("input.cancelled"))
        items += after.items
        segments, problems = segments_of(items)
        assert problems == [] and segments[-1].done["cancelled"] is True
        assert items[-1].data["origin"] == "server" and items[-1].data["cancelled_sentences"] >= 1
    finally:
        await ws.close()


@pytest.mark.parametrize("how", ["done", "cancel", "terminate", "disconnect"])
async def test_the_session_leaves_its_group_however_it_ends(cluster, how):
    ws, sid, items = await speaking_session(cluster.a, LONG_TEXT)
    try:
        assert cluster.redis.group_members(sid, db=5) == 1
        if how == "cancel":
            assert (await rest(cluster.b, "POST", cancel_path(sid)))[0] == 202
            await collect(ws, until=is_event("input.cancelled"))
            await send_json(ws, {"type": "input.done"})
        elif how == "done":
            await send_json(ws, {"type": "input.cancel"})
            await collect(ws, until=is_event("input.cancelled"))
            await send_json(ws, {"type": "input.text", "text": "Last words. "})
            await send_json(ws, {"type": "input.done"})
        elif how == "terminate":
            assert (await rest(cluster.b, "DELETE", session_path(sid)))[0] == 202
        if how != "disconnect":
            end = await collect(ws)
            assert end.close_code == (4001 if how == "terminate" else 1000)
    finally:
        await ws.close()
    cluster.ended_record(sid)
    cluster.left_group(sid)


# -- the registry tells the truth --------------------------------------------------------------------------


async def test_completed_session_is_recorded_completed(cluster):
    result = await run_session(cluster.a.ws_url, CONFIG, ["Hello there. ", "How are you today?"])
    assert result.close_code == 1000 and result.types()[-1] == "session.done"
    sid = result.configured["session_id"]
    row = cluster.ended_record(sid)
    check_row(row, cluster.instance("A"), status="completed", items=result.items)
    assert row["segments"] == 2
    assert await rest(cluster.b, "POST", cancel_path(sid)) == (404, not_live(sid))


@pytest.mark.parametrize("how", ["close", "drop"])
async def test_client_leaving_mid_speech_is_recorded_cancelled(cluster, how):
    ws, sid, items = await speaking_session(cluster.a, LONG_TEXT)
    if how == "close":
        await ws.close()
    else:  # no closing handshake: the TCP connection just goes away
        ws.transport.abort()
        await ws.wait_closed()
    row = cluster.ended_record(sid)
    segments, _ = segments_of(items)
    assert row["status"] == "disconnected", row
    assert row["instance"] == cluster.instance("A") and row["ended_at"] is not None
    assert row["segments"] >= len(segments) > 0
    assert row["bytes_sent"] >= audio_bytes(items) > 0  # frames in flight were sent but not read
    assert row["first_audio_ms"] > 0
    assert await rest(cluster.b, "DELETE", session_path(sid)) == (404, not_live(sid))


async def test_failed_session_is_recorded_failed(cluster):
    ws = await open_session(cluster.a.ws_url)
    try:
        sid = (await configure(ws, CONFIG))["session_id"]
        await ws.send("x" * 1)  # a recoverable error first: not a failure
        await send_json(ws, {"type": "input.text", "text": "y" * 131000})
        await send_json(ws, {"type": "input.text", "text": "y" * 131000})
        await send_json(ws, {"type": "input.text", "text": "y" * 131000})  # pending text over 262144
        result = await collect(ws)
    finally:
        await ws.close()
    assert result.close_code == 4008
    assert result.events[-1]["message"] == "buffered speech text exceeds 262144 characters"
    row = cluster.ended_record(sid)
    assert row["status"] == "failed" and row["instance"] == cluster.instance("A")


async def test_admin_lists_live_sessions_and_terminates_one_on_another_instance(cluster):
    password = uuid.uuid4().hex
    done = cluster.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        "ops",
        "--email",
        "ops@example.com",
        extra_env={"DJANGO_SUPERUSER_PASSWORD": password},
    )
    assert done.returncode == 0, done.stderr
    ws, sid, items = await speaking_session(cluster.a, LONG_TEXT)
    try:
        admin = Admin(cluster.b)  # B's admin; the session lives on A
        await asyncio.to_thread(admin.login, "ops", password)
        page = await asyncio.to_thread(admin.get, "/admin/speech/sessionrecord/?status__exact=active")
        assert sid in page and cluster.instance("A") in page
        assert "Cancel current speech" in page and "Terminate" in page
        page = await asyncio.to_thread(admin.action, "/admin/speech/sessionrecord/?status__exact=active", "terminate", [sid])
        assert "Sent terminate to 1 live session(s)." in page
        end = await collect(ws)
        items += end.items
        check_terminated(items, end.close_code)
    finally:
        await ws.close()
    row = cluster.ended_record(sid)
    check_row(row, cluster.instance("A"), status="terminated", items=items)
    page = await asyncio.to_thread(admin.get, "/admin/speech/sessionrecord/?status__exact=active")
    assert sid not in page
    page = await asyncio.to_thread(admin.get, "/admin/speech/sessionrecord/?status__exact=terminated")
    assert sid in page


# -- voices ending their sessions --------------------------------------------------------------------------


def multipart(fields, files):
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, content_type, data) in files.items():
        parts.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
            f"Content-Type: {content_type}\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


async def test_deleting_a_voice_on_b_terminates_the_sessions_using_it_on_a(cluster):
    name = f"ctl{uuid.uuid4().hex[:10]}"
    body, content_type = multipart(
        {"name": name, "consent": "recorded with consent"}, {"audio_sample": ("sample.wav", "audio/wav", wav_bytes(2.0))}
    )
    status, created = await rest(cluster.b, "POST", "/v1/audio/voices", body=body, headers={"Content-Type": content_type})
    assert status == 201 and created["name"] == name, created
    # The embedded engine cannot speak an uploaded voice; the registry says this session uses it.
    ws, sid, items = await speaking_session(cluster.a, LONG_TEXT)
    bystander, other_sid, other_items = await speaking_session(cluster.a, LONG_TEXT)
    try:
        cluster.set_voice(sid, name.upper())  # names match ignoring case
        status, deleted = await rest(cluster.b, "DELETE", f"/v1/audio/voices/{name}")
        assert status == 200 and deleted == {"id": name, "object": "voice", "deleted": True}
        end = await collect(ws)
        items += end.items
        check_terminated(items, end.close_code, f"speech session terminated: its voice '{name}' was removed")
        # The session with another voice is untouched: it still takes a cancel (from B) and goes on.
        assert await rest(cluster.b, "POST", cancel_path(other_sid)) == (202, accepted(other_sid, "cancel"))
        after = await collect(bystander, until=is_event("input.cancelled"))
        assert after.close_code is None and after.events[-1]["origin"] == "server"
    finally:
        await ws.close()
        await bystander.close()
    row = cluster.ended_record(sid)
    assert row["status"] == "terminated" and row["instance"] == cluster.instance("A")
    assert cluster.ended_record(other_sid)["status"] == "disconnected"
    status, listed = await rest(cluster.b, "GET", "/v1/audio/voices")
    assert status == 200 and name not in listed["voices"]


async def test_end_sessions_using_called_in_another_process_terminates_the_session_on_a(cluster):
    ws, sid, items = await speaking_session(cluster.a, LONG_TEXT)
    try:
        assert cluster.active_ids() == {sid}, "another session is still active: the call would end it too"
        done = cluster.manage("shell", "-c", "from speech.voices import end_sessions_using; end_sessions_using('HEART')")
        assert done.returncode == 0, done.stderr
        end = await collect(ws)
        items += end.items
        check_terminated(items, end.close_code, "speech session terminated: its voice 'HEART' was removed")
    finally:
        await ws.close()
    check_row(cluster.ended_record(sid), cluster.instance("A"), status="terminated", items=items)


# -- shutdown ----------------------------------------------------------------------------------------------


async def test_sigterm_terminates_sessions_with_4001_and_records_them(cluster):
    c = cluster.server("C")
    keepalive = http.client.HTTPConnection(c.host, c.port, timeout=30)
    sockets = []
    try:
        # An idle keep-alive HTTP connection and a socket still in its handshake must not stop the
        # shutdown; two sessions speak.
        keepalive.request("GET", "/healthz")
        assert keepalive.getresponse().read()
        unconfigured = await open_session(c.ws_url)
        sockets.append(unconfigured)
        first, sid1, items1 = await speaking_session(c, LONG_TEXT)
        sockets.append(first)
        second, sid2, items2 = await speaking_session(c, LONG_TEXT)
        sockets.append(second)
        c.proc.send_signal(signal.SIGTERM)
        ends = await asyncio.gather(collect(first), collect(second), collect(unconfigured))
        await asyncio.to_thread(c.proc.wait, 30)
    finally:
        keepalive.close()
        for ws in sockets:
            await ws.close()
    assert c.proc.returncode == 0, c.stderr_text()[-3000:]
    for items, end in ((items1, ends[0]), (items2, ends[1])):
        items += end.items
        check_terminated(items, end.close_code, SHUTDOWN)
    assert ends[2].close_code == 4001 and ends[2].events == [{"type": "error", "message": SHUTDOWN, "error_type": "server_error"}]
    # The process is gone: the rows were written before it exited.
    check_row(cluster.record(sid1), cluster.instance("C"), status="terminated", items=items1)
    check_row(cluster.record(sid2), cluster.instance("C"), status="terminated", items=items2)
    assert cluster.redis.group_members(sid1, db=5) == cluster.redis.group_members(sid2, db=5) == 0
    assert await rest(cluster.b, "POST", cancel_path(sid1)) == (404, not_live(sid1))
    c.assert_no_traceback()


async def test_sessions_of_a_killed_instance_stop_being_live(cluster):
    """SIGKILL leaves the row active; once the instance's heartbeat has run out, the control endpoints
    answer 404 and the row is closed as failed (bounded poll: the heartbeat lasts some seconds)."""
    d = cluster.server("D")
    ws, sid, items = await speaking_session(d, LONG_TEXT)
    try:
        d.killed = True
        d.kill()  # SIGKILL: no chance to write the outcome
        end = await collect(ws)
        assert end.close_code == 1006
    finally:
        await ws.close()
    assert cluster.record(sid)["status"] == "active"

    def answer():
        status, body = request(cluster.b, "POST", cancel_path(sid))
        assert status in (202, 404), (status, body)  # 202 while the dead instance's heartbeat lasts
        return (status, body) if status == 404 else None

    result = await asyncio.to_thread(wait_for, answer, "404 for a session of a killed instance", POLL_S, 0.2)
    assert result == (404, not_live(sid))
    row = cluster.record(sid)
    assert row["status"] == "failed" and row["ended_at"] is not None and row["instance"] == cluster.instance("D")
    assert await rest(cluster.b, "DELETE", session_path(sid)) == (404, not_live(sid))
