"""Where a worker thread runs, and at what CPU priority (Linux): the synthesis threads
(speech/engines/pool.py's reasons) and the audio encoding threads (speech/audio/codecs.py).

A thread's niceness and cores are its own on Linux (the kernel's thread id is a process id there); the
pool calls none of this elsewhere.
"""

from __future__ import annotations

import os

LOWEST_NICE = 19  # a thread finishing a job nobody will hear: it runs only on a core no other thread wants
SYNTHESIS_NICE = 5  # added to the process's niceness for the synthesis threads (a third of its CPU weight)


def synthesis_niceness(added):
    """The synthesis threads' niceness: the process's plus `added`, as an absolute value, because a new
    thread inherits the niceness of the thread that started it, which may be a synthesis thread."""
    return min(LOWEST_NICE, os.getpriority(os.PRIO_PROCESS, os.getpid()) + added)


def synthesis_cores(workers):
    """The cores this process may run on, one for each synthesis thread, if there are exactly `workers`
    of them (the default, SPEECH_ENGINE_WORKERS); otherwise None: the threads are not pinned. Read on the
    thread that makes the pool: a new thread inherits the cores of the thread that starts it."""
    cores = sorted(os.sched_getaffinity(0))
    return cores if len(cores) == workers else None


def place_thread(native_id, niceness, core):
    """On each synthesis thread as it starts: its niceness, and its core (None: not pinned), so that every
    core runs one synthesis thread and no thread moves."""
    if niceness is not None:
        demote(native_id, niceness)
    if core is not None:
        try:
            os.sched_setaffinity(native_id, {core})
        except OSError:  # a core taken away since the pool was made: the thread runs where it may
            pass


def demote(native_id, niceness):
    """Set a thread's niceness (raising it needs no privilege; lowering it again would)."""
    try:
        os.setpriority(os.PRIO_PROCESS, native_id, niceness)
    except OSError:  # not allowed here (a sandbox), or the thread has ended: it runs as it was
        pass
