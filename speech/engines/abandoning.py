"""The part of the synthesis pool (speech/engines/pool.py) that lets go of jobs whose listener is gone.

A job whose listener is gone frees the engine at once: `Ticket.abandon` (the pipeline's, on a cancel, or
when the connection is lost, before the application hears of it) or the awaiting task cancelled. Its
waiting jobs are dropped unrun; a running one gives its place away at once and stops at its next step:
its model run is told to stop (`stoppable`: ONNX Runtime's terminate flag, checked between the graph's
nodes) and it stops at its next release point (`JobAbandoned`; Hibari's vocoder has one between its
steps). Meanwhile its thread runs at the lowest CPU priority and leaves the pool when the job ends.

Its place, and its core, go at once to a spare: an idle thread that holds no place, started earlier by
the pool's starter thread, which starts the next spare SPARE_DELAY_S later. With no spare left, the
starter starts a new thread at once. Either way the event loop starts no thread (`Thread.start` waits
until the new thread runs, and the new thread takes the GIL from the loop that reads the hang-ups and the
newcomers after them: bench/hangup.py in bench/RESULTS.md; docs/decisions.md, "Hang-ups").

A job submitted for a ticket already abandoned is dropped as it is submitted. In the turn of the event
loop that reads hang-ups no thread takes a waiting job (`_settling`): one that finishes its job then
waits for the dispatch after the turn, by which time every hang-up of that turn has dropped its jobs. For
QUIET_S after that only a job its listener waits for starts (`_quiet`): clients that leave together are
read over several turns.
"""

from __future__ import annotations

import asyncio
import time

from .jobs import ABANDONED, DONE, RUNNING, WAITING, JobAbandoned, post
from ..threads import LOWEST_NICE, demote, place_thread

SPARE_DELAY_S = 0.25  # a spare that took a retired thread's place is replaced this long after, not amid the hang-ups
QUIET_S = 0.005  # after a hang-up, jobs with audio in hand wait this long for more of the burst (`_quiet`)


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
        loop ahead of other sessions' frames); no thread takes a waiting job until this turn of the
        loop is over, and for QUIET_S after it only a job its listener waits for (`_quiet`). True when
        the ticket had jobs here."""
        with self._lock:
            jobs = [job for job in (*self._waiting, *self._active) if job.ticket is ticket]
            for job in jobs:
                self._let_go(job)
        if jobs:
            self._quiet()
        self._dispatch_soon()
        return bool(jobs)

    def _quiet(self):
        """Clients that hang up together are read over several turns of the event loop: until QUIET_S after
        the last, a thread takes only a job whose listener waits for it (`SynthesisJob.due`), not one with
        audio in hand (look-ahead, typically), which may be of the next client to leave: started, it would
        be stopped again, its thread retired and replaced while the loop reads the hang-ups and the
        newcomers after them (bench/hangup.py). The jobs left waiting start when the quiet ends."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop: no turns to wait for
            return
        with self._lock:
            self._quiet_until = time.monotonic() + QUIET_S
            if self._quiet_timer:
                return
            self._quiet_timer = True
        loop.call_later(QUIET_S, self._quiet_over, loop)

    def _quiet_over(self, loop):
        with self._lock:
            left = self._quiet_until - time.monotonic()
            self._quiet_timer = left > 0
        if left > 0:  # a later hang-up made it longer
            loop.call_later(left, self._quiet_over, loop)
        else:
            self._dispatch()

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
            if job.worker is not None:
                self._retire(job.worker)
            if not self._closed:
                self._give_place(job.worker)
            return True
        return False

    def _give_place(self, retired):
        """Under the lock: a retired thread's place (and core) goes at once to a spare, which waits idle
        in it, and a spare is started for the next SPARE_DELAY_S later; with no spare, to a new thread
        the starter starts now."""
        if self._spares:
            spare = self._spares.pop()
            core = retired.core if retired is not None else None
            if core is not None:
                spare.core = core
                self._core_load[core] += 1
                place_thread(spare.native_id, None, core)
            self._idle.append(spare)
            self._spares_wanted += 1
        else:
            self._replacements += 1
        self._replace.set()

    def _park(self, worker):
        """A spare's start: it waits among the spares, holding no place. False: the pool has shut down."""
        with self._lock:
            if self._closed:
                return False
            self._spares.append(worker)
            return True

    def _start_replacements(self):
        """The starter thread's life, until the pool shuts down: a new thread at once for each retired one
        no spare replaced, and the spares wanted SPARE_DELAY_S after they were first wanted. Off the
        event loop, since `Thread.start` waits until the new thread runs."""
        wanted_at = None  # when the spares wanted were first wanted
        while True:
            self._replace.wait(None if wanted_at is None else max(0.0, wanted_at + SPARE_DELAY_S - time.monotonic()))
            self._replace.clear()
            spares = 0
            with self._lock:
                if self._closed:
                    return
                count, self._replacements = self._replacements, 0
                if self._spares_wanted and wanted_at is None:
                    wanted_at = time.monotonic()
                if wanted_at is not None and time.monotonic() >= wanted_at + SPARE_DELAY_S:
                    spares, self._spares_wanted, wanted_at = self._spares_wanted, 0, None
            for _ in range(count):
                self._start_thread([])
            for _ in range(spares):
                self._start_thread([], spare=True)

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
