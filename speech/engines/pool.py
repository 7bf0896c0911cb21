"""The synthesis pool: blocking engine calls on a few threads, the most urgent first.

Synthesis never runs on the event loop. Every session of the process shares one queue, and a free
thread takes the most urgent job: one for a segment that is being delivered (`Ticket.current`) before
any look-ahead, then the earliest deadline first. A ticket's deadline is when its session's client
will have played all the audio it has been sent, or when the segment's text came if that is later
(the pipeline keeps it up to date); a job without one (a REST request) is due when it was queued. So a
listener with seconds of audio in hand waits for a newcomer's first sentence, and sessions that read as
fast as they can advance together instead of drifting apart (docs/decisions.md#synthesis-earliest-deadline-first).

No job waits forever: a deadline moves only while audio of its own segment is being sent, so newer work
goes ahead of a job only if it is due sooner. The pipeline keeps at most one current and one look-ahead
segment of a session in synthesis, so one session's queued sentences cannot starve another's first one.
Priorities are read when a thread frees: a look-ahead job whose segment becomes current moves up at once.

How the threads run (Linux; docs/decisions.md has the measurements of each):

* below the event loop's CPU priority (`SYNTHESIS_NICE`), so the loop that delivers audio, answers
  handshakes and reads cancels gets a core at once when it wakes; other processes at the default
  priority go first too, so a server sharing its cores should be given cores of its own
  (docs/decisions.md#synthesis-threads-below-the-event-loop);
* with one thread for each core the process may use (SPEECH_ENGINE_WORKERS's default), each pinned to
  a core of its own, so the loop's and clients' wake-ups do not move it onto cold caches; several
  processes with the default pin alike; with another number of threads nothing is pinned
  (docs/decisions.md#synthesis-threads-pinned-one-to-a-core);
* a job queued while a thread is free is handed over: `submit` waits (at most HANDOFF_WAIT_S) until
  that thread has started it, rather than the woken thread waiting for the GIL while the loop reads
  other sessions' messages; a job queued behind busy threads never makes the loop wait
  (docs/decisions.md#jobs-handed-over-to-the-synthesis-threads);
* a thread that finishes a job takes the next waiting one itself. With release points
  (`release_points=True`: Hibari calls `release_point()` just before its model's run, which releases
  the GIL) and a listener with more than HOLD_MARGIN_S of audio in hand, it holds the result back until
  the next job's release point (or end), so the loop delivers while the thread runs the model instead
  of racing it for the GIL. A result a listener is waiting for (a first audio, a REST request) is never
  held (docs/decisions.md#jobs-handed-over-to-the-synthesis-threads).

Nothing is refused here: a job a session has accepted waits its turn. Overload is handled before work
is accepted: a handshake or a REST request is refused while `estimated_wait` is over
SPEECH_MAX_QUEUE_WAIT_S.

A job whose listener is gone frees the engine at once: speech/engines/abandoning.py.

Every job that runs reports to the pool's meter (speech/stream/meter.py; the server's is
speech/metrics.py) how long it waited for a thread and how long it ran on one. Every job's end is
reported by outcome (`speech_engine_jobs_total`): completed, failed, dropped (never started: its
listener had left), stopped (at its next step, its listener gone), unheard (ran to its end after its
listener left: it was in a step that cannot stop).
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import sys
import threading
import time

from ..stream.engine import CURRENT, queues
from ..stream.meter import NO_METER
from .jobs import (
    ABANDONED,
    DONE,
    RUNNING,
    SynthesisJob,
    count_submitted,
    JobAbandoned,
    gone,
    post,
    held,
    post_held,
    pools,
    release_point,
    stoppable,
)
from .abandoning import Abandoning
from ..threads import SYNTHESIS_NICE, place_thread, synthesis_cores, synthesis_niceness

SERVICE_EWMA = 0.2  # weight of the newest job in the running mean of job durations
INITIAL_SERVICE_S = 0.05  # the mean before any job ran: a short sentence on a slow day
HANDOFF_WAIT_S = 0.002  # at most this long the event loop waits for an idle thread to start a job it submitted
HOLD_MARGIN_S = 0.1  # a result is held back for the next job's release point only if its listener has this much audio in hand


class _Worker:
    """A synthesis thread: runs jobs while there are any, then waits idle for `wake` with its next `job`.
    A retired one (its job was abandoned mid-run) ends with that job."""

    __slots__ = ("wake", "job", "core", "native_id", "retired")

    def __init__(self):
        self.wake = threading.Event()
        self.job = None
        self.core = None
        self.native_id = None
        self.retired = False


class SynthesisPool(Abandoning):
    def __init__(self, workers, name, *, release_points=False, meter=NO_METER):
        self.workers = workers
        self.meter = meter  # each job's wait, run and end (speech/stream/meter.py)
        self.release_points = release_points  # the jobs call release_point() before their model runs
        self.name = name
        linux = sys.platform.startswith("linux")  # a thread's own niceness and cores; elsewhere a thread's id is not a process's
        self._niceness = synthesis_niceness(SYNTHESIS_NICE) if linux else None
        cores = synthesis_cores(workers) if linux else None
        self._core_load = dict.fromkeys(cores, 0) if cores else {}  # live (not retired) threads on each pinned core
        self._lock = threading.Lock()  # jobs finish on worker threads; callers may be on several loops
        self._waiting: list[SynthesisJob] = []  # scanned when a thread frees: at most two jobs a session
        self._active: set[SynthesisJob] = set()  # running, not abandoned
        self._idle: list[_Worker] = []
        self._running = 0  # jobs holding a place: running, and not abandoned
        self._places = 0  # threads holding a place: idle, running a job, or being started to replace a retired one
        self._replacements = 0  # retired threads' places whose new thread the starter has yet to start
        self._spares: list[_Worker] = []  # idle threads holding no place, each to take a retired one's at once
        self._spares_wanted = workers  # spares the starter has yet to start (speech/engines/abandoning.py)
        self._replace = threading.Event()  # wakes the starter (speech/engines/abandoning.py)
        self._starter = None  # the thread that starts retired threads' replacements, once the first thread runs
        self._closed = False
        self._settling = False  # hang-ups of this turn of the event loop are being read: no job is taken
        self._quiet_until = 0.0  # hang-ups are being read: until then only due jobs are taken (abandoning.py)
        self._quiet_timer = False  # the quiet's end is scheduled
        self._seq = itertools.count()
        self._threads = itertools.count()
        self._service_s = INITIAL_SERVICE_S
        self._alive: set[threading.Thread] = set()  # this pool's threads that have not ended
        pools.add(self)
        queues.add(self)  # Ticket.abandon reaches this pool

    @property
    def depth(self):
        """Jobs waiting for a thread."""
        return len(self._waiting)

    @property
    def running(self):
        """Jobs running on a thread for a listener (an abandoned one finishing its step is not counted)."""
        return self._running

    def estimated_wait(self):
        """Seconds a new session's first job would wait for a thread: the running jobs and the
        current-segment jobs queued ahead of it, at the recent mean job duration."""
        with self._lock:
            ahead = self._running + sum(1 for job in self._waiting if job.ticket.current)
            service_s = self._service_s
        if ahead < self.workers:
            return 0.0
        return (ahead - self.workers + 1) * service_s / self.workers

    async def run(self, fn, *args, ticket=CURRENT):
        return await self.wait(self.submit(fn, *args, ticket=ticket))

    def submit(self, fn, *args, ticket=CURRENT):
        """Queue a job now, without waiting: it has its place before the caller's next await. `wait`
        for its result, or `discard` it."""
        job = SynthesisJob(fn, args, ticket, next(self._seq), asyncio.get_running_loop())
        if ticket.abandoned:  # its listener has gone already: it never waits
            return self._drop_unqueued(job)
        with self._lock:
            if self._closed:  # the job can never run
                job.future.set_exception(RuntimeError("synthesis pool is shut down"))
                return job
            self._waiting.append(job)
        count_submitted()
        for handed in self._dispatch():
            handed.taken.wait(HANDOFF_WAIT_S)
        return job

    async def wait(self, job):
        """The result of a submitted job; cancelling the awaiting task discards the job."""
        try:
            return await job.future
        except asyncio.CancelledError:
            self.discard(job)
            raise

    def _dispatch(self):
        """Start waiting jobs on free places, the most urgent first (`submit`'s and `discard`'s call: a
        finishing thread takes its next job itself): on an idle thread, or a new one while the pool has
        fewer threads than places (its first jobs). A place whose thread is being started (a retired
        thread's replacement) is left to it: it takes a waiting job itself. Returns the jobs it started,
        each with its `taken` event to wait for."""
        handed = []
        while True:
            with self._lock:
                if not self._idle and self._places >= self.workers:
                    return handed
                job = self._take()
                if job is None:
                    return handed
                worker = self._idle.pop() if self._idle else None
                if worker is not None:
                    job.worker = worker
                else:
                    self._places += 1
            job.taken = threading.Event()
            if worker is not None:
                worker.job = job
                worker.wake.set()
            else:
                if self._starter is None:
                    self._starter = threading.Thread(target=self._start_replacements, name=f"{self.name}_starter", daemon=True)
                    self._starter.start()
                    self._replace.set()  # its first spares
                self._start_thread([job])
            handed.append(job)

    def _start_thread(self, handoff, *, spare=False):
        # The job goes in a list the thread empties: a Thread keeps its args until it ends, and the job's
        # result (a sentence's audio) must not live as long as an idle thread.
        name = f"{self.name}_{next(self._threads)}"
        threading.Thread(target=self._work, args=(handoff, spare), name=name, daemon=True).start()

    def _work(self, handoff, spare):
        """A synthesis thread's life: placed once, then jobs until it retires or the pool shuts down. One
        started with no job (a replacement) takes a waiting one, or waits idle; a spare waits for a place
        (`_park`)."""
        job = handoff.pop() if handoff else None
        worker = _Worker()
        worker.native_id = threading.get_native_id()
        with self._lock:
            if self._core_load and not spare:  # one thread for each core: this one goes where none lives now
                worker.core = min(self._core_load, key=self._core_load.get)
                self._core_load[worker.core] += 1
            if job is not None:
                job.worker = worker
                if job.state == ABANDONED:  # its place went to a replacement already (`_let_go`)
                    self._retire(worker)
        place_thread(worker.native_id, self._niceness, worker.core)
        self._alive.add(threading.current_thread())
        try:
            if spare:
                if not self._park(worker):
                    return
            elif job is None:
                job = self._take_or_idle(worker)
            while True:
                if job is not None:
                    self._call(job, worker)
                    job = None  # an idle thread keeps no finished job (nor its result, the audio) alive
                if worker.retired:
                    return
                worker.wake.wait()
                worker.wake.clear()
                job, worker.job = worker.job, None
                if job is None:  # the pool shut down
                    return
        finally:
            self._alive.discard(threading.current_thread())

    def _take_or_idle(self, worker):
        """A replacement's first job: the most urgent waiting one; else None, this thread now among the
        idle ones (or retired: the pool has shut down)."""
        with self._lock:
            if self._closed:
                worker.retired = True
                return None
            job = self._take()
            if job is None:
                self._idle.append(worker)
            else:
                job.worker = worker
            return job

    def _call(self, job, worker):
        """Run `job` on this thread, then, while jobs wait, the most urgent of them; then put this thread
        among the idle ones, in the same turn of the lock that found no job (or retire it). A finished
        job's result is held back while this thread goes on to the next job if the pool has release points
        and the job's listener has audio in hand (`_can_wait`)."""
        while job is not None:
            if job.taken is not None:
                job.taken.set()
            held.job = job
            started = time.monotonic()
            result = error = None
            ran = not gone(job)  # else its listener left after it was taken: it never starts
            if not ran:
                error = JobAbandoned("its listener has gone")
            else:
                try:
                    result = job.fn(*job.args)
                except BaseException as exc:  # handed to the awaiting task, like concurrent.futures does
                    error = exc
            elapsed = time.monotonic() - started
            held.job = None
            post_held()  # the previous job's result, if this one never reached a release point
            outcome = _outcome(job, ran, error)
            if ran:
                self.meter.engine_job(started - job.queued, elapsed)  # before the result is handed over: counted when seen
            self.meter.engine_job_end(outcome)
            with self._lock:
                abandoned = job.state == ABANDONED
                if abandoned:  # its place was given away: this thread leaves; its listener hears nothing
                    following = None
                else:
                    self._active.discard(job)
                    self._running -= 1
                    self._service_s += SERVICE_EWMA * (elapsed - self._service_s)
                    following = self._take()
                    if following is not None:
                        following.worker = worker
                    elif not self._closed:
                        self._idle.append(worker)
                    else:
                        worker.retired = True
                job.state = DONE
            # No other thread needs starting here: a job waits only while every place is taken (`submit`
            # starts one on a free thread), and this thread freed its place only to take `following`.
            notice = (job.loop, job.future, result, error)
            if following is not None and self.release_points and _can_wait(job.ticket):
                held.notice = notice
            elif not abandoned:
                post(*notice)
            notice = result = None  # the audio is the listener's now: this thread keeps none of it alive
            job = following

    def _take(self):
        """The most urgent waiting job, now counted as running (under the lock), or None. Jobs whose
        listener has gone are dropped on the way."""
        if self._running >= self.workers or not self._waiting or self._settling:
            return None
        if any(job.ticket.abandoned for job in self._waiting):
            self._drop_abandoned()
            if not self._waiting:
                return None
        waiting = self._waiting if time.monotonic() >= self._quiet_until else [job for job in self._waiting if job.due()]
        if not waiting:
            return None
        job = min(waiting, key=SynthesisJob.urgency)
        self._waiting.remove(job)
        job.state = RUNNING
        self._active.add(job)
        self._running += 1
        return job

    def shutdown(self):
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            idle, self._idle = self._idle + self._spares, []
            self._spares = []
        self._replace.set()  # the starter ends
        for job in waiting:
            try:
                job.loop.call_soon_threadsafe(job.future.cancel)
            except RuntimeError:
                pass
        for worker in idle:  # woken with no job: the thread ends
            worker.wake.set()

    def join(self, timeout):
        """Wait up to `timeout` seconds for this pool's threads to end (after `shutdown`)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._alive):
            thread.join(max(0.0, deadline - time.monotonic()))


EXIT_WAIT_S = 5.0


@atexit.register
def _stop_at_exit():
    """The synthesis threads are daemons, so that an idle one never holds the process open; one still in
    a model's run when the interpreter finalises would be torn out of onnxruntime's C++ (the process
    aborts: "terminate called without an active exception"). At exit every pool stops taking jobs and
    its running ones are waited for."""
    for pool in list(pools):
        pool.shutdown()
    for pool in list(pools):
        pool.join(EXIT_WAIT_S)


def _can_wait(ticket):
    """A job's listener has audio in hand for longer than HOLD_MARGIN_S: its result may wait for the
    next job's release point (a job without a deadline is due now)."""
    return ticket.deadline is not None and ticket.deadline - time.monotonic() > HOLD_MARGIN_S


def _outcome(job, ran, error):
    if not ran:
        return "dropped"
    if isinstance(error, JobAbandoned):
        return "stopped"
    if gone(job):
        return "unheard"
    return "failed" if error is not None else "completed"


__all__ = ["JobAbandoned", "SynthesisPool", "release_point", "stoppable"]
