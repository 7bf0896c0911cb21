"""The session registry's writes from the serving loop (speech/control/registry_writer.py), against the
test database: batched, written once for a session that ends before its row, failures kept apart, a broken
connection replaced. The deployment tier checks the same rows in PostgreSQL (tests/test_deploy.py)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from channels.db import database_sync_to_async
from django.db import IntegrityError, OperationalError

from speech.control import registry, registry_writer
from speech.models import SessionRecord

pytestmark = pytest.mark.django_db(transaction=True)

ROW = {"voice": "fake", "engine": "fake"}
OUTCOME = {"status": SessionRecord.Status.COMPLETED, "segments": 2, "bytes_sent": 4800, "first_audio_s": 0.04567}


def new_id():
    return f"speech_ws_{uuid.uuid4().hex}"


@pytest.fixture
def batches(monkeypatch):
    """The batches the registry thread writes, as lists of writes."""
    seen = []
    write_batch = registry.write_batch

    def spy(writes):
        seen.append(list(writes))
        return write_batch(writes)

    monkeypatch.setattr(registry, "write_batch", spy)
    return seen


@database_sync_to_async
def row(session_id):
    return (
        SessionRecord.objects.filter(session_id=session_id)
        .values("status", "segments", "bytes_sent", "first_audio_ms", "ended_at", "started_at", "instance")
        .first()
    )


async def test_writes_queued_together_go_to_the_database_in_one_batch(batches):
    writer = registry_writer.registry_writer()
    sids = [new_id() for _ in range(20)]
    await asyncio.gather(*(writer.opened(sid, **ROW) for sid in sids))
    assert len(batches) == 1 and len(batches[0]) == 20
    rows = [await row(sid) for sid in sids]
    assert all(r["status"] == "active" and r["ended_at"] is None and r["instance"] == registry.instance_id() for r in rows)


async def test_a_session_that_ends_before_its_row_is_written_is_written_once_as_it_ended(batches):
    writer = registry_writer.registry_writer()
    sid = new_id()
    opening = writer.opened(sid, **ROW)
    ending = writer.closed(sid, **OUTCOME)
    assert ending is opening
    await ending
    assert [len(batch) for batch in batches] == [1]
    written = await row(sid)
    assert written["status"] == "completed" and (written["segments"], written["bytes_sent"]) == (2, 4800)
    assert written["first_audio_ms"] == 45.67 and written["started_at"] <= written["ended_at"]


async def test_an_end_after_the_row_is_written_updates_it(batches):
    writer = registry_writer.registry_writer()
    sid = new_id()
    await writer.opened(sid, **ROW)
    await writer.closed(sid, **{**OUTCOME, "status": SessionRecord.Status.DISCONNECTED, "first_audio_s": None})
    assert [len(batch) for batch in batches] == [1, 1]
    written = await row(sid)
    assert (
        written["status"] == SessionRecord.Status.DISCONNECTED
        and written["first_audio_ms"] is None
        and written["ended_at"] is not None
    )


async def test_a_write_that_fails_fails_alone():
    writer = registry_writer.registry_writer()
    taken, fresh = new_id(), new_id()
    await writer.opened(taken, **ROW)
    again, other = writer.opened(taken, **ROW), writer.opened(fresh, **ROW)
    results = await asyncio.gather(again, other, return_exceptions=True)
    assert isinstance(results[0], IntegrityError) and results[1] is None
    assert (await row(fresh))["status"] == "active"


async def test_a_batch_that_fails_on_its_connection_is_written_again_on_a_new_one(monkeypatch):
    """The registry thread keeps its connection between batches; one that broke meanwhile (a database
    restart, an idle timeout) fails the next batch, which is then written again on a new connection.
    (The test database lives in memory, where Django keeps the connection: the failure is injected.)"""
    writer = registry_writer.registry_writer()
    write, failures = registry._write, []

    def first_attempt_fails(writes):
        if not failures:
            failures.append(writes)
            raise OperationalError("server closed the connection unexpectedly")
        write(writes)

    monkeypatch.setattr(registry, "_write", first_attempt_fails)
    sid = new_id()
    await writer.opened(sid, **ROW)
    assert len(failures) == 1 and (await row(sid))["status"] == "active"


def test_rows_stored_as_cancelled_read_disconnected_after_the_migration():
    """A client that left was stored as "cancelled" (barge-in's word) before speech/migrations/0005; its
    rows say "disconnected" after it, as new ones do, and go back when it is reversed."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("speech", "0004_key_scopes_and_voice_owner")], [("speech", "0005_session_outcome_disconnected")]
    executor = MigrationExecutor(connection)
    try:
        executor.migrate(before)
        old = executor.loader.project_state(before).apps.get_model("speech", "SessionRecord")
        left, done = new_id(), new_id()
        old.objects.create(session_id=left, instance="i", voice="fake", engine="fake", status="cancelled")
        old.objects.create(session_id=done, instance="i", voice="fake", engine="fake", status="completed")
        executor = MigrationExecutor(connection)
        executor.migrate(after)
        new = executor.loader.project_state(after).apps.get_model("speech", "SessionRecord")
        assert dict(new.objects.values_list("session_id", "status")) == {left: "disconnected", done: "completed"}
        assert SessionRecord.Status.DISCONNECTED == "disconnected"
        executor = MigrationExecutor(connection)
        executor.migrate(before)
        assert dict(old.objects.values_list("session_id", "status")) == {left: "cancelled", done: "completed"}
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
