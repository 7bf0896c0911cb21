"""The session registry's writes from the serving loop, in batches on a thread of their own.

A registry write costs CPU (Django, the driver, the commit), and on a busy machine it is taken from the
handshakes and the audio of the sessions being served: written at once, beside the loop, a session's
row made the next handshake slower (docs/decisions.md#the-registrys-writes-in-batches-off-the-loop).
So `RegistryWriter.opened` and `RegistryWriter.closed` return at once with a future, timestamps taken
then; the writes collected over BATCH_WINDOW_S go to the registry thread together, in one transaction
(speech/control/registry.py `write_batch`), and a session that ends before its row was written is
written once, as it ended.

The thread keeps its database connection between batches (a new one costs CPU each time); a batch with a
failed write closes it, and the failed writes are tried once more on a new connection, so a database that
restarted or dropped an idle connection loses nothing.

Nothing waits for a row on the hot path: a session without a key is found by its channel-layer group
until its row exists (speech/control/signals.py), and it leaves its group only once its end is written
(speech/web/admission.py). A session with a key has its row written before its handshake answers, since
the row says whose session it is.
"""

from __future__ import annotations

import asyncio
import weakref
from concurrent.futures import ThreadPoolExecutor

from django.db import connection
from django.utils import timezone

from ..models import SessionRecord
from . import registry

BATCH_WINDOW_S = 0.05  # how long a registry write may wait to join others in one transaction

_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="speech-registry")


class RegistryWriter:
    """The registry writes of one event loop."""

    def __init__(self) -> None:
        self._queued: list[tuple[SessionRecord | dict, asyncio.Future]] = []
        self._draining: asyncio.Task | None = None

    def opened(self, session_id, *, voice, engine) -> asyncio.Future:
        record = SessionRecord(session_id=session_id, instance=registry.instance_id(), voice=voice, engine=engine)
        return self._queue(record)

    def closed(self, session_id, **outcome) -> asyncio.Future:
        end = {"session_id": session_id, "ended_at": timezone.now(), **outcome}
        for write, written in self._queued:
            if isinstance(write, SessionRecord) and write.session_id == session_id:
                registry.apply_end(write, end)
                return written
        return self._queue(end)

    def _queue(self, write) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._queued.append((write, done))
        if self._draining is None:
            self._draining = loop.create_task(self._drain())
        return done

    async def _drain(self):
        try:
            while self._queued:
                await asyncio.sleep(BATCH_WINDOW_S)
                batch, self._queued = self._queued, []
                try:
                    outcomes = await asyncio.get_running_loop().run_in_executor(_thread, _write, [write for write, _ in batch])
                except Exception as exc:  # the thread could not run it at all: every write failed
                    outcomes = [exc] * len(batch)
                for (_, done), outcome in zip(batch, outcomes):
                    if done.done():  # its waiter was cancelled
                        continue
                    if outcome is None:
                        done.set_result(None)
                    else:
                        done.set_exception(outcome)
        finally:
            self._draining = None


def _write(writes):
    """On the registry thread: the batch, and its failed writes once more on a new connection."""
    outcomes = registry.write_batch(writes)
    failed = [index for index, outcome in enumerate(outcomes) if outcome is not None]
    if failed:
        connection.close()
        for index, outcome in zip(failed, registry.write_batch([writes[index] for index in failed])):
            outcomes[index] = outcome
    return outcomes


_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RegistryWriter] = weakref.WeakKeyDictionary()


def registry_writer() -> RegistryWriter:
    """The running loop's RegistryWriter."""
    loop = asyncio.get_running_loop()
    if loop not in _writers:
        _writers[loop] = RegistryWriter()
    return _writers[loop]
