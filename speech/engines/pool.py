"""A bounded thread pool for blocking synthesis calls.

Synthesis never runs on the event loop. The pool has `workers` threads and takes at most
`workers + queue_size` jobs at once; past that a job is refused at once with EngineBusy
("The request queue is full.") instead of waiting without bound. Cancelling the awaiting task
drops a job that has not started; a running one finishes its step and its result is discarded.
"""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from .base import EngineBusy


class BoundedPool:
    def __init__(self, workers, queue_size, name):
        self.capacity = workers + queue_size
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._taken = 0

    @property
    def taken(self):
        return self._taken

    def _release(self, _future):
        with self._lock:
            self._taken -= 1

    async def run(self, fn, *args):
        with self._lock:
            if self._taken >= self.capacity:
                raise EngineBusy()
            self._taken += 1
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._release(None)
            raise
        future.add_done_callback(self._release)
        return await asyncio.wrap_future(future)

    def shutdown(self):
        self._executor.shutdown(wait=False, cancel_futures=True)
