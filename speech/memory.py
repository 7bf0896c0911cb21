"""Give freed memory back to the operating system (glibc), so a burst leaves no lasting bulge.

Besides onnxruntime's CPU arena (turned off for Hibari, speech/engines/hibari.py), what kept
memory after a burst was glibc's malloc, in two ways:

* the dynamic mmap threshold: a block over 128 KiB is mmapped and unmapped on free, but each such
  free raises the threshold to that block's size (up to 32 MiB), so after one 16 MiB config every
  later block below 16 MiB (audio, frames, JSON strings) comes from the heap, where a freed block
  is only reusable, not returned;
* freed heap pages between live blocks stay mapped until `malloc_trim(0)` gives them back.

Fixing the threshold low (`mallopt(M_MMAP_THRESHOLD)`) would keep large blocks out of the heap, but
it made Hibari's synthesis slower (its inference buffers are then mapped, zero-filled and unmapped on
every call: docs/decisions.md#memory-the-handshake-budget-and-memory-after-load). So the server only
trims: after large frames are freed (speech/server/budget.py) and when the server, or its engine, has
gone quiet (speech/server/launcher.py), at most once a second,
in a thread (a trim walks the heaps under their locks; it never runs on the event loop).
On a C library without these calls (musl, macOS) all of this is a no-op.

A trim also hands back the synthesis threads' free working memory (`malloc_trim` releases free
pages in every arena), and the next sentence faults it in again, later to its first audio (measured:
docs/decisions.md#memory-the-handshake-budget-and-memory-after-load). So the trim for a quiet server waits until no
WebSocket has been open for QUIET_TRIM_AFTER_S, and runs only if the process grew by more than
QUIET_TRIM_GROWTH_BYTES since the last trim: a burst (stalled readers' frames, many sessions at
once) still goes back a few seconds after it ends, while sessions that follow each other keep
their working set mapped. Sessions that stay open (voice agents keep their sockets) would keep a
burst's memory for ever, so the same trim also runs once the engine has had no job for
QUIET_TRIM_AFTER_S.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import threading
import time

logger = logging.getLogger(__name__)
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

TRIM_INTERVAL_S = 1.0
QUIET_TRIM_AFTER_S = 5.0
QUIET_TRIM_GROWTH_BYTES = 32 * 1024 * 1024  # several times what a paragraph on two synthesis threads faults in

_libc = None
_lock = threading.Lock()
_scheduled = False
_last_trim = 0.0
_rss_after_trim = None  # bytes resident right after the last trim; None before the first


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
    global _last_trim, _rss_after_trim
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
    _last_trim = time.monotonic()
    _rss_after_trim = resident_bytes()


def resident_bytes():
    """The process's resident set in bytes (Linux), or None where /proc is not there."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


def release_after_growth():
    """The server is quiet: trim only if the process grew by more than QUIET_TRIM_GROWTH_BYTES
    since the last trim (or never trimmed)."""
    now = resident_bytes()
    if _rss_after_trim is None or now is None or now - _rss_after_trim > QUIET_TRIM_GROWTH_BYTES:
        release_free_memory()


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
