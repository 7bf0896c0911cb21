"""speech.engines.pool.BoundedPool: blocking work off the loop, bounded admission, slots freed.

Jobs are steered with threading.Event; nothing sleeps. Every wait has a hang guard.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from speech.engines import EngineBusy
from speech.engines.pool import BoundedPool

GUARD_S = 5


@pytest.fixture
def pools():
    made = []

    def make(workers, queue_size):
        pool = BoundedPool(workers, queue_size, "test-pool")
        made.append(pool)
        return pool

    yield make
    for pool in made:
        pool.shutdown()


class Gate:
    """A job that reports it started, then blocks until released."""

    def __init__(self):
        self.started = threading.Event()
        self.release = threading.Event()
        self.ran = False

    def __call__(self, value=None):
        self.ran = True
        self.started.set()
        assert self.release.wait(GUARD_S), "job never released"
        return value


async def wait_started(gate):
    assert await asyncio.to_thread(gate.started.wait, GUARD_S)


async def test_runs_work_off_the_event_loop_thread(pools):
    pool = pools(1, 0)
    loop_thread = threading.get_ident()
    ident, name = await asyncio.wait_for(
        pool.run(lambda: (threading.get_ident(), threading.current_thread().name)), GUARD_S)
    assert ident != loop_thread
    assert name.startswith("test-pool")
    assert pool.taken == 0


async def test_passes_arguments_and_returns_result(pools):
    pool = pools(2, 0)
    assert await asyncio.wait_for(pool.run(divmod, 17, 5), GUARD_S) == (3, 2)


async def test_exception_propagates_and_frees_the_slot(pools):
    pool = pools(1, 0)

    def boom():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(pool.run(boom), GUARD_S)
    assert pool.taken == 0
    assert await asyncio.wait_for(pool.run(int, "7"), GUARD_S) == 7


@pytest.mark.parametrize("workers,queue_size", [(1, 0), (1, 1), (2, 0), (2, 3)],
                         ids=["1+0", "1+1", "2+0", "2+3"])
async def test_refuses_once_workers_plus_queue_are_taken(pools, workers, queue_size):
    pool = pools(workers, queue_size)
    capacity = workers + queue_size
    gates = [Gate() for _ in range(capacity)]
    tasks = [asyncio.create_task(pool.run(gate, i)) for i, gate in enumerate(gates)]
    for gate in gates[:workers]:
        await wait_started(gate)
    assert pool.taken == capacity

    extra = Gate()
    with pytest.raises(EngineBusy) as info:
        await pool.run(extra)
    assert str(info.value) == info.value.message == "The request queue is full."
    assert info.value.error_type == "server_error" and info.value.code is None
    assert pool.taken == capacity  # a refusal takes no slot
    assert not extra.ran

    for gate in gates:
        gate.release.set()
    assert await asyncio.wait_for(asyncio.gather(*tasks), GUARD_S) == list(range(capacity))
    assert pool.taken == 0


async def test_slot_is_freed_after_completion(pools):
    pool = pools(1, 0)
    gate = Gate()
    task = asyncio.create_task(pool.run(gate, "a"))
    await wait_started(gate)
    with pytest.raises(EngineBusy):
        await pool.run(int, "1")
    gate.release.set()
    assert await asyncio.wait_for(task, GUARD_S) == "a"
    assert pool.taken == 0
    assert await asyncio.wait_for(pool.run(int, "1"), GUARD_S) == 1  # the slot is usable again


async def test_cancelling_a_queued_job_frees_its_slot_and_it_never_runs(pools):
    pool = pools(1, 1)
    running, queued = Gate(), Gate()
    first = asyncio.create_task(pool.run(running))
    second = asyncio.create_task(pool.run(queued))
    await wait_started(running)  # a loop round trip: both tasks have entered run() by now
    assert pool.taken == 2
    with pytest.raises(EngineBusy):
        await pool.run(int, "1")

    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert pool.taken == 1  # only the running job holds a slot now

    third = Gate()
    third_task = asyncio.create_task(pool.run(third, "third"))  # fits in the freed slot
    running.release.set()
    third.release.set()
    assert await asyncio.wait_for(third_task, GUARD_S) == "third"
    await asyncio.wait_for(first, GUARD_S)
    # The single worker took `third` after `running`; the cancelled job, queued before it, never ran.
    assert not queued.ran
    assert pool.taken == 0


async def test_cancelling_a_running_job_keeps_its_slot_until_it_finishes(pools):
    pool = pools(1, 1)
    gate = Gate()
    task = asyncio.create_task(pool.run(gate))
    await wait_started(gate)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The thread cannot be interrupted: the slot stays taken until the step is over.
    assert pool.taken == 1
    probe = asyncio.create_task(pool.run(lambda: "probe"))  # queued behind the abandoned job
    gate.release.set()
    assert await asyncio.wait_for(probe, GUARD_S) == "probe"
    # One worker, FIFO: the abandoned job finished (and released) before the probe ran and released.
    assert pool.taken == 0


async def test_shutdown_drops_queued_jobs_and_frees_their_slots(pools):
    pool = pools(1, 2)
    running, queued = Gate(), Gate()
    first = asyncio.create_task(pool.run(running))
    second = asyncio.create_task(pool.run(queued))
    await wait_started(running)
    assert pool.taken == 2
    pool.shutdown()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(second, GUARD_S)
    running.release.set()
    await asyncio.wait_for(first, GUARD_S)
    assert not queued.ran
    assert pool.taken == 0
