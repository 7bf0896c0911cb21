"""Give freed memory back to the operating system (glibc), so a burst leaves no lasting bulge.

Besides onnxruntime's CPU arena (turned off for Hibari, speech/engines/hibari.py), what kept
memory after a burst was glibc's malloc, in two ways:

* the dynamic mmap threshold: a block over 128 KiB is mmapped and unmapped on free, but each such
  free raises the threshold to that block's size (up to 32 MiB), so after one 16 MiB config every
  later block below 16 MiB (audio, frames, JSON strings) comes from the heap, where a freed block
  is only reusable, not returned;
* freed heap pages between live blocks stay mapped until `malloc_trim(0)` gives them back.

Fixing the threshold low (`mallopt(M_MMAP_THRESHOLD)`) would keep large blocks out of the heap, but
it was measured to make Hibari's synthesis about 1.5x slower (its inference buffers are then
mapped, zero-filled and unmapped on every call; measured in process: a 6-sentence paragraph
0.23 s -> 0.36 s). So the server only trims: after large frames are freed
(speech/web/budget.py) and when the last WebSocket connection ends (speech/web/server.py), at most once a second,
in a thread (a trim walks the heaps under their locks; it never runs on the event loop).
On a C library without these calls (musl, macOS) all of this is a no-op.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import threading
import time

logger = logging.getLogger(__name__)

TRIM_INTERVAL_S = 1.0

_libc = None
_lock = threading.Lock()
_scheduled = False
_last_trim = 0.0


def _glibc():
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
            _libc = libc if libc is not None and hasattr(libc, "malloc_trim") else False
        except OSError:
            _libc = False
    return _libc or None


def trim():
    """Return free heap pages to the OS now (blocking; call from a thread)."""
    global _last_trim
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    _last_trim = time.monotonic()


def release_free_memory():
    """Ask for a trim soon, from the event loop: at most one per TRIM_INTERVAL_S, in a thread."""
    global _scheduled
    libc = _glibc()
    if libc is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # not on the event loop (a finaliser in a worker thread): the next request trims
    with _lock:
        if _scheduled:
            return
        _scheduled = True
    delay = max(0.0, _last_trim + TRIM_INTERVAL_S - time.monotonic())
    loop.call_later(delay, _start_trim, loop)


def _start_trim(loop):
    global _scheduled
    with _lock:
        _scheduled = False
    loop.run_in_executor(None, trim)
