"""The WebSocket handshake's database work, on one thread that keeps its connection.

A session with an API key asks the database twice before `session.configured`: who the key is
(speech/web/auth.py) and its registry row (speech/control/registry.py); a session that names an
uploaded voice asks for the voice. channels' `database_sync_to_async` closes the connection after
every call (CONN_MAX_AGE is 0, and must stay 0: under ASGI every REST request runs on a thread of
its own, and a connection kept there would outlive its thread), so each of those calls connected
anew, which cost a keyed handshake most of its time (bench/handshake.py part 3 in bench/RESULTS.md;
docs/decisions.md#the-event-loop-kept-short).

This thread connects once and keeps its connection for the life of the process. Before each call
on a kept connection it asks the database whether the connection still works (Django's
`is_usable`: one `SELECT 1` round trip on PostgreSQL), and connects again if
not: a database that restarted, or that dropped an idle connection, costs one reconnect, never a
failed handshake. One thread, so calls run one after another, as they did on channels' shared
database thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor

from django.db import connection

_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speech-database")


def on_database_thread(fn):
    """`fn` as a coroutine function that runs it on the database thread (with the caller's context
    variables, as `database_sync_to_async` does)."""

    @functools.wraps(fn)
    async def call(*args, **kwargs):
        context = contextvars.copy_context()
        work = functools.partial(context.run, _run, fn, args, kwargs)
        return await asyncio.get_running_loop().run_in_executor(_thread, work)

    return call


def _run(fn, args, kwargs):
    if connection.connection is not None and not connection.is_usable():
        connection.close()  # gone on the server's side; the call below connects again
    return fn(*args, **kwargs)
