"""A synthesis job as its engine code and its caller see it (speech/engines/pool.py runs them).

A job carries its segment's `Ticket` (speech/stream/engine.py). On a synthesis thread, a job marks its
steps: `release_point()` between them (a held result goes out; an abandoned job stops there with
`JobAbandoned`) and `stoppable(stop)` around a long call another thread can cut short.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .pool import SynthesisPool

# A job's life: WAITING for a thread, RUNNING on one, ABANDONED while running (its listener left, its place
# freed), DONE.
WAITING, RUNNING, ABANDONED, DONE = "waiting", "running", "abandoned", "done"

pools: weakref.WeakSet[SynthesisPool] = weakref.WeakSet()  # every pool of the process, stopped at exit
held = threading.local()  # a synthesis thread's job (`job`) and finished job whose result waits (`notice`)
_submitted = 0  # jobs ever queued by the pools of the process, kept here so that a collected pool's stay counted
_submitted_lock = threading.Lock()  # pools on different event loops' threads count here


def pending():
    """Jobs running or waiting for a thread, over every pool of the process."""
    return sum(pool.depth + pool.running for pool in list(pools))


def count_submitted():
    """A pool queued a job."""
    global _submitted
    with _submitted_lock:
        _submitted += 1


def submitted():
    """Jobs ever submitted to the pools of the process, gone ones' included: it moves whenever one is asked
    for, and only then."""
    return _submitted


class JobAbandoned(Exception):
    """Raised at a release point of a job whose listener has gone: the job stops there."""


class SynthesisJob:
    """One blocking call on a synthesis thread for a segment (its `ticket`); not the session's
    SegmentJob (speech/stream/job.py), whose audio may take several."""

    __slots__ = ("fn", "args", "ticket", "seq", "future", "loop", "queued", "taken", "state", "worker", "stop")

    def __init__(self, fn, args, ticket, seq, loop):
        self.fn, self.args, self.ticket, self.seq, self.loop = fn, args, ticket, seq, loop
        self.future = loop.create_future()
        self.queued = time.monotonic()
        self.taken = None  # set by its thread as it starts, when `submit` hands it to an idle one
        self.state = WAITING
        self.worker = None  # the _Worker running it, once known
        self.stop = None  # stops the call it is in now, from any thread (`stoppable`)

    def due(self):
        """Its listener waits for it: a current segment's job whose deadline has come (or that has none)."""
        deadline = self.ticket.deadline
        return self.ticket.current and (deadline is None or deadline <= time.monotonic())

    def urgency(self):
        deadline = self.ticket.deadline
        return (not self.ticket.current, self.queued if deadline is None else deadline, self.seq)


def gone(job):
    return job.state == ABANDONED or job.ticket.abandoned


def release_point():
    """Called by a job on a synthesis thread just before a long call that releases the GIL (a model's
    run), between the job's steps: a result this thread held back goes to its event loop now, which
    handles it while this thread waits in C instead of taking the GIL from it; and a job whose listener
    has gone stops here (`JobAbandoned`)."""
    job = getattr(held, "job", None)
    leaving = job is not None and gone(job)
    post_held()  # last before the job goes on (the test of the hand-over relies on it)
    if leaving:
        raise JobAbandoned("its listener has gone")


@contextlib.contextmanager
def stoppable(stop):
    """Around a long call of a job that another thread can make stop early (`stop()`: ONNX Runtime's
    terminate flag, speech/engines/stopping.py): the job's abandonment calls `stop` at once, and the
    call's failure is then JobAbandoned. Outside a synthesis thread's job it changes nothing."""
    job = getattr(held, "job", None)
    if job is None:
        yield
        return
    job.stop = stop
    try:
        if gone(job):  # abandoned before `stop` was in place
            raise JobAbandoned("its listener has gone")
        yield
    except Exception:
        if gone(job):
            raise JobAbandoned("its listener has gone") from None
        raise
    finally:
        job.stop = None


def post_held():
    notice = getattr(held, "notice", None)
    if notice is not None:
        held.notice = None
        post(*notice)


def post(loop, future, result, error):
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the caller's loop is closed: nobody is waiting
        pass


def _settle(future, result, error):
    if future.done():  # the awaiting task was cancelled while the job ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
