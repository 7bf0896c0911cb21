"""The handshake's database thread (speech/web/database.py), against the test database: one thread, the
caller's context variables, results and errors handed back. The kept connection, and its replacement when
the database drops it, need a database whose connections can close: PostgreSQL, in
tests/test_database_live.py (Django never closes the test run's in-memory SQLite connection)."""

from __future__ import annotations

import contextvars
import threading

import pytest

from speech.models import ApiKey
from speech.web.database import on_database_thread

pytestmark = pytest.mark.django_db(transaction=True)

caller = contextvars.ContextVar("caller", default=None)


def where():
    return threading.current_thread().name, caller.get()


async def test_calls_run_one_after_another_on_the_database_thread_with_the_callers_context():
    caller.set("session-1")
    first, second = await on_database_thread(where)(), await on_database_thread(where)()
    assert first == second
    name, seen = first
    assert name.startswith("speech-database") and name != threading.current_thread().name
    assert seen == "session-1"


async def test_an_error_reaches_the_caller_and_the_next_call_works():
    def fail():
        raise ApiKey.DoesNotExist("no such key")

    with pytest.raises(ApiKey.DoesNotExist, match="no such key"):
        await on_database_thread(fail)()
    assert await on_database_thread(ApiKey.objects.count)() == 0
