"""The synthesis pool: blocking engine calls on a few threads, the most urgent first.

Synthesis never runs on the event loop. Every session of the process shares one queue, and a free
thread takes the most urgent job: one for a segment that is being delivered (`Ticket.current`)
before any look-ahead, then the earliest deadline first. A ticket's deadline is when its session's
client will have played all the audio it has been sent, or when the segment's text came if that is
later (the pipeline keeps it up to date); a job without one (a REST request) is due when it was
queued. So a session whose listener has seconds of audio in hand waits for a newcomer's first
sentence and for a session that has run dry, and sessions that read as fast as they can advance
together instead of drifting apart: a burst then ends with both threads busy, not with one thread
finishing a straggler alone (bench/throughput.py's paragraph at C = 4 and 8, against first come,
first served: 1.2-2.6 % more audio per wall second at C = 4 and 0.4-2.2 % at C = 8, the paired
medians of five interleaved A/B runs of 40-48 rounds; two A/A runs of one code: 0.3-0.5 %).

No job waits forever: a deadline moves only while audio of its own segment is being sent, so newer
work goes ahead of a job only if it is due sooner, before its listener would miss anything. The
pipeline keeps at most one current and one look-ahead segment of a session in synthesis, so the
queue holds at most two jobs a session and one session's 60 queued sentences cannot starve another's
first one. Priorities are read when a thread frees: a look-ahead job whose segment becomes the one
being delivered moves up at once.

The threads run at a lower CPU priority than the event loop (`SYNTHESIS_NICE`, Linux): with every core
busy synthesising, the loop that hands a finished sentence to its client, answers handshakes and
reads cancels still gets a core at once when it wakes, instead of waiting for a synthesis thread's
time slice. It uses a few percent of the CPU, so synthesis loses nothing by it. Measured with
bench/throughput.py's paragraph, four interleaved A/B runs of 40 rounds (three at +5, one at +19):
first audio rank by rank against the raw engine 1.075-1.093x -> 1.055-1.076x at C = 4 and
1.092-1.117x -> 1.073-1.090x at C = 8, throughput unchanged (paired medians 0.997-1.009). Before,
with job timestamps, a finished job's result reached the loop 1-5 ms after the job ended, while its
thread went on to the next job. Other processes on the machine at the default priority go before
synthesis too; a server sharing its cores with other work should be given cores of its own.

With one synthesis thread for each core the process may use (SPEECH_ENGINE_WORKERS's default), each
thread is pinned to a core of its own (Linux). Unpinned, the wake-ups of the event loop and of the
clients' threads on the same cores moved a synthesis thread to the other core now and then (0.03-0.05
times per audio second, /proc's scheduler statistics), where its caches were cold (threads made to
swap cores every 20 ms lost 1.6 % / 0.4 % of throughput at C = 4 / 8). Pinned, synthesis took 0.7-2.4 %
less CPU per audio second, and bench/throughput.py's paragraph gained 0.7-2.0 % audio per wall second
at C = 4 and 1.9-2.9 % at C = 8 (paired medians of five interleaved A/B runs of 12-40 rounds; first
audio rank by rank 1.070 / 1.080 / 1.080x -> 1.067 / 1.065 / 1.073x at C = 4, 1.082 / 1.108 / 1.080x
-> 1.064 / 1.070 / 1.057x at C = 8 in the three runs against the raw engine). The raw engine alone
gains nothing from it (paired 1.000 at C = 4, 0.995 at C = 8, 30 rounds): with nothing else on the
cores, its threads stay where they are. Several processes on one host, each with the
default, pin alike, so every core runs one synthesis thread of each, as the scheduler would spread
them. With another number of threads nothing is pinned: some core would get two and another none.

A job the event loop queues while a thread is free is handed over: `submit` waits until that thread
has started it (at most HANDOFF_WAIT_S). Otherwise the woken thread waits for the GIL while the loop
goes on with other sessions' messages, until the switch interval forces the GIL out: with four texts
arriving together, the first job started 0.92 ms after it was queued and the second 1.36 ms; handed
over, 0.13 and 0.28 ms, and the four sessions' first jobs started 0.3-1.7 ms sooner after their text
(job timestamps, 20 rounds of bench/throughput.py's paragraph at C = 4). The loop then waits while the
thread runs the job's first Python (G2P, about 0.4 ms a sentence), which it would have waited for
anyway at the next forced switch. Three interleaved A/B runs of 40 rounds: first audio rank by rank
against the raw engine 1.091 / 1.091 / 1.078x -> 1.067 / 1.074 / 1.062x at C = 8, 1.061 / 1.052 /
1.062x -> 1.057 / 1.041 / 1.068x at C = 4, throughput unchanged (paired medians 0.994-1.004). A job
queued behind busy threads never makes the loop wait.

A thread that finishes a job takes the next waiting one itself. If the pool's jobs have release points
(`release_points=True`: Hibari's call `release_point()` just before the model's run, which releases
the GIL) and the finished job's listener has more than HOLD_MARGIN_S of audio in hand, the thread holds
the result back until the next job reaches its release point (or ends), instead of handing it over
at once. Handed over at once, the wake-up of the event loop races the thread for the GIL: the loop
usually won and delivered, and the thread waited for the switch interval before it could start the
next job's text, 0.62 ms between two jobs (p50) against 0.17 ms in the raw engine's rounds; held back,
the loop delivers while the thread runs the model, 0.05 ms between jobs (job timestamps, 30 rounds of
bench/throughput.py's paragraph at C = 4). Four interleaved A/B runs of 40 rounds: the loop's CPU per
audio second 0.225 / 0.228 / 0.242 / 0.277 -> 0.211 / 0.212 / 0.218 / 0.252 ms at C = 4 and 0.224 /
0.228 / 0.235 / 0.276 -> 0.204 / 0.207 / 0.216 / 0.252 ms at C = 8 (6-10 % less); first audio rank by
rank against the raw engine 1.088 / 1.087 / 1.096 / 1.078x -> 1.071 / 1.074 / 1.073 / 1.084x at C = 8,
at C = 4 1.068 / 1.089 / 1.085 / 1.077x -> 1.073 / 1.092 / 1.074 / 1.061x; throughput unchanged
(paired 0.998-1.009). The threads' time between jobs was the loop's time on a core, not idle time: the
loop's delivery now runs beside the model instead. A result whose listener is waiting for it, a
segment's first audio or a REST request, is never held.

Nothing is refused here: a job a session has accepted waits its turn. Overload is handled before
work is accepted: a WebSocket handshake or a REST request is refused while `estimated_wait` is
over SPEECH_MAX_QUEUE_WAIT_S.

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
from ..threads import place_thread, synthesis_cores, synthesis_niceness

SERVICE_EWMA = 0.2  # weight of the newest job in the running mean of job durations
INITIAL_SERVICE_S = 0.05  # the mean before any job ran: a short sentence on a slow day
HANDOFF_WAIT_S = 0.002  # at most this long the event loop waits for an idle thread to start a job it submitted
HOLD_MARGIN_S = 0.1  # a result is held back for the next job's release point only if its listener has this much audio in hand
SYNTHESIS_NICE = 5  # added to the process's niceness for the synthesis threads (weight 1024 -> 335)


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
        self._closed = False
        self._settling = False  # hang-ups of this turn of the event loop are being read: no job is taken
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
        finishing thread takes its next job itself): on an idle thread, or a new one. Returns the jobs it
        started, each with its `taken` event to wait for."""
        handed = []
        while True:
            with self._lock:
                job = self._take()
                if job is None:
                    return handed
                worker = self._idle.pop() if self._idle else None
                if worker is not None:
                    job.worker = worker
            job.taken = threading.Event()
            if worker is not None:
                worker.job = job
                worker.wake.set()
            else:
                # The job goes in a list the thread empties: a Thread keeps its args until it ends, and
                # the job's result (a sentence's audio) must not live as long as an idle thread.
                name = f"{self.name}_{next(self._threads)}"
                thread = threading.Thread(target=self._work, args=([job],), name=name, daemon=True)
                thread.start()
            handed.append(job)

    def _work(self, handoff):
        """A synthesis thread's life: placed once, then jobs until it retires or the pool shuts down."""
        job = handoff.pop()
        worker = _Worker()
        worker.native_id = threading.get_native_id()
        with self._lock:
            job.worker = worker
            if self._core_load:  # one thread for each core: this one goes where none lives now
                worker.core = min(self._core_load, key=self._core_load.get)
                self._core_load[worker.core] += 1
            if job.state == ABANDONED:
                self._retire(worker)
        place_thread(worker.native_id, self._niceness, worker.core)
        self._alive.add(threading.current_thread())
        try:
            while job is not None:
                self._call(job, worker)
                job = None  # an idle thread keeps no finished job (nor its result, the audio) alive
                if worker.retired:
                    return
                worker.wake.wait()
                worker.wake.clear()
                job, worker.job = worker.job, None  # None: the pool shut down
        finally:
            self._alive.discard(threading.current_thread())

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
                if job.state == ABANDONED:  # its place was given away: this thread leaves
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
            else:
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
        job = min(self._waiting, key=SynthesisJob.urgency)
        self._waiting.remove(job)
        job.state = RUNNING
        self._active.add(job)
        self._running += 1
        return job

    def shutdown(self):
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            idle, self._idle = self._idle, []
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
