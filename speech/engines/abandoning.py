"""The part of the synthesis pool (speech/engines/pool.py) that lets go of jobs whose listener is gone.

A job whose listener is gone frees the engine at once: `Ticket.abandon` (the pipeline's, on a cancel, or
when the connection is lost, before the application hears of it) or the awaiting task cancelled. Its
waiting jobs are dropped unrun; a running one gives its place away at once and stops at its next step:
its model run is told to stop (`stoppable`: ONNX Runtime's terminate flag, checked between the graph's
nodes) and it stops at its next release point (`JobAbandoned`). Meanwhile its thread runs at the lowest
CPU priority and leaves the pool when the job ends, and its place goes at once to a new thread on the
same core, started by the pool's starter thread, not on the event loop (`Thread.start` waits until the
new thread runs: a newcomer's first job after hang-ups waited for it). The new thread takes the next
waiting job or waits idle; a waiting job starts once the event loop's turn is over (the hang-ups of that
turn are all known by then). Before, a newcomer's first sentence waited for the rest of the step of a
client that had left (bench/hangup.py in bench/RESULTS.md; docs/decisions.md).

A job submitted for a ticket already abandoned is dropped as it is submitted. In the turn of the event
loop that reads hang-ups no thread takes a waiting job (`_settling`): one that finishes its job then
waits for the dispatch after the turn, by which time every hang-up of that turn has dropped its jobs.
"""

from __future__ import annotations

import asyncio

from .jobs import ABANDONED, DONE, RUNNING, WAITING, JobAbandoned, post
from ..threads import LOWEST_NICE, demote


class Abandoning:
    """SynthesisPool's letting go; its state (`_lock`, `_waiting`, `_active`, ...) is the pool's."""

    def discard(self, job):
        """Nobody wants the job's result: a waiting job is dropped; a running one gives its place to the next
        waiting job at once, its thread demoted to the lowest priority until it stops (at its next release
        point, or its end) and leaves. Its future is cancelled, so its result or error is handed to no one."""
        with self._lock:
            freed = self._let_go(job)
        job.future.cancel()
        if freed:
            self._dispatch_soon()

    def abandon(self, ticket):
        """`Ticket.abandon`'s work here: every job of `ticket` is let go (as `discard` does), its awaiting
        task left asleep until its owner cancels it (a hang-up's tasks woken now would take the event
        loop ahead of other sessions' frames); and no thread takes a waiting job until this turn of the
        loop is over. True when the ticket had jobs here."""
        with self._lock:
            jobs = [job for job in (*self._waiting, *self._active) if job.ticket is ticket]
            for job in jobs:
                self._let_go(job)
        self._dispatch_soon()
        return bool(jobs)

    def _dispatch_soon(self):
        """Start waiting jobs on freed places once this turn of the event loop is over: when several
        clients hang up together, their disconnects come in one turn, and a place freed by the first
        would otherwise go to a waiting job of the next one to leave, on a thread of its own. Until
        then no thread takes a waiting job either (`_settling`): one that finishes its job meanwhile
        waits idle for this dispatch instead of starting a job whose client's hang-up is still to be
        read in this turn."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop: now
            self._dispatch()
            return
        with self._lock:
            if self._settling:
                return
            self._settling = True
        loop.call_soon(self._settled)

    def _settled(self):
        with self._lock:
            self._settling = False
        self._dispatch()

    def _let_go(self, job):
        """Under the lock: drop `job` if it waits; if it runs, free its place and retire its thread. True
        when a place was freed."""
        if job.state == WAITING and job in self._waiting:
            self._waiting.remove(job)
            job.state = DONE
            self.meter.engine_job_end("dropped")
        elif job.state == RUNNING:
            job.state = ABANDONED
            if job.stop is not None:
                job.stop()
            self._active.discard(job)
            self._running -= 1
            if not self._closed:  # its place goes to a new thread
                self._replacements += 1
                self._replace.set()
            if job.worker is not None:
                self._retire(job.worker)
            return True
        return False

    def _start_replacements(self):
        """The starter thread's life: start a new thread for each retired one, until the pool shuts down.
        Off the event loop, since `Thread.start` waits until the new thread runs."""
        while True:
            self._replace.wait()
            self._replace.clear()
            with self._lock:
                if self._closed:
                    return
                count, self._replacements = self._replacements, 0
            for _ in range(count):
                self._start_thread([])

    def _retire(self, worker):
        """Under the lock: `worker` leaves the pool after its job; its core is free for a new thread."""
        worker.retired = True
        if worker.core is not None:
            self._core_load[worker.core] -= 1
        if worker.native_id is not None:
            demote(worker.native_id, LOWEST_NICE)

    def _drop_unqueued(self, job):
        """A job of a ticket already abandoned, never queued: dropped, its caller told at once."""
        job.state = DONE
        job.future.set_exception(JobAbandoned("its listener has gone"))
        self.meter.engine_job_end("dropped")
        return job

    def _drop_abandoned(self):
        """Under the lock: the waiting jobs whose listener has gone are dropped, their callers told."""
        for job in [job for job in self._waiting if job.ticket.abandoned]:
            self._waiting.remove(job)
            job.state = DONE
            self.meter.engine_job_end("dropped")
            post(job.loop, job.future, None, JobAbandoned())
