"""One memory budget per process for large client frames in flight (SPEECH_CONFIG_BUDGET_BYTES).

A `session.config` may be 16 MiB, and daphne takes a frame whole before the application sees it:
autobahn keeps the frame's chunks, joins them into one bytes object, daphne decodes that into a
str and queues it for the application, which parses it in a thread. Twenty such frames at once
took a process from 300 to 735 MB. So memory is reserved where it is first spent:

* the WebSocket protocol (speech/server/websocket.py, plugged in by speech/server/launcher.py) reserves
  `FRAME_COST_FACTOR` x the length a frame header announces, before any of its payload is read; when
  the budget cannot take it the connection gets the capacity error and close 4013 and the payload is
  discarded as it arrives. The reservation travels with the frame to the application (`Reservation`,
  in the ASGI message) and ends when the last reference to that message goes: the str it carries is
  freed at the same moment.
* the handshake parse (`parse_large_config` below, which the consumer gives its session) reserves what
  parsing adds beyond the text's own size: JSON that is mostly structure ({}, [], many keys) grows several times over when
  parsed, so each container or separator is charged `ELEMENT_COST` bytes.

Frames below `LARGE_FRAME_BYTES` are not counted: later frames are at most 128 KiB and ordinary
configs a few hundred bytes, so the budget only meters what can actually add up.
"""

from __future__ import annotations

import threading
import weakref

import asyncio

from .. import memory, metrics
from ..conf import conf
from ..stream.errors import CLOSE_CAPACITY, RATE_LIMIT, SpeechError
from ..stream.protocol import parse_message

LARGE_FRAME_BYTES = 1 << 20
# Measured per 16 MiB ASCII config: the chunk list and its joined copy (both alive while daphne
# decodes), then the str; their peak is three times the frame.
FRAME_COST_FACTOR = 3
ELEMENT_COST = 96  # a parsed dict/list/str/number with its slot in its container, rounded up
OVER_BUDGET_MESSAGE = "too many large speech WebSocket messages in flight; retry later"


def over_budget_error():
    return SpeechError(OVER_BUDGET_MESSAGE, error_type=RATE_LIMIT, code=429, close_code=CLOSE_CAPACITY)


class Budget:
    def __init__(self, limit):
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()  # releases may come from a finaliser on any thread

    def try_reserve(self, size, held=None):
        """A Reservation of `size` bytes (added to `held`, one reservation, when given), or None
        when the budget cannot take it."""
        with self._lock:
            if self.used + size > self.limit:
                return None
            self.used += size
            self.peak = max(self.peak, self.used)
        if held is None:
            return Reservation(self, size)
        held._cell[0] += size
        return held

    def _resize(self, cell, size):
        with self._lock:
            self.used += size - cell[0]
            cell[0] = size
            idle = self.used == 0
        if idle:
            # The large blocks just freed go back to the OS now rather than at some later trim (speech.memory).
            memory.release_free_memory()


class Reservation:
    """Held while the memory it stands for is alive; released once, explicitly or when dropped."""

    __slots__ = ("_budget", "_cell", "_finalizer", "__weakref__")

    def __init__(self, budget, size):
        self._budget = budget
        self._cell = [size]  # shared with the finaliser, which must not hold the reservation itself
        self._finalizer = weakref.finalize(self, budget._resize, self._cell, 0)

    @property
    def size(self):
        return self._cell[0]

    def shrink(self, size):
        """The memory it stands for is down to `size` bytes."""
        if self._finalizer.alive and size < self._cell[0]:
            self._budget._resize(self._cell, size)

    def release(self):
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.release()


_budget = None


def get_budget():
    global _budget
    if _budget is None:
        _budget = Budget(conf.CONFIG_BUDGET_BYTES)
    return _budget


def frame_cost(length):
    return length * FRAME_COST_FACTOR if length >= LARGE_FRAME_BYTES else 0


def parse_cost(text):
    """What parsing `text` adds beyond the text itself: a bound from its structural characters
    (separators inside strings count too, which only overestimates)."""
    return ELEMENT_COST * (text.count(",") + text.count("[") + text.count("{"))


async def parse_large_config(raw):
    """parse_message for a large handshake (over 1 MiB), in a thread (the loop stays free), with what
    parsing adds reserved in the process's budget first: JSON that is mostly structure grows several
    times over when parsed. Over budget: the capacity error, 4013."""
    cost = await asyncio.to_thread(parse_cost, raw)
    reservation = get_budget().try_reserve(cost)
    if reservation is None:
        metrics.refused(metrics.MEMORY_BUDGET, f"a {len(raw)}-character session.config: memory budget in use")
        raise over_budget_error()
    with reservation:
        return await asyncio.to_thread(parse_message, raw, handshake=True)
