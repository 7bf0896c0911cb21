"""The event loop `manage.py serve` runs daphne on: uvloop's (libuv's), in place of asyncio's own.

daphne makes its event loop when `daphne.server` is imported, and installs Twisted's asyncio reactor
on it; Django imports that module while it loads the `daphne` app, so `manage.py` chooses the loop
before Django starts (`install`). Twisted, daphne, Channels and the sessions run on it unchanged: only
the loop's own machinery (polling, timers, callbacks, the wake-ups that bring synthesis results from
the pool's threads) is libuv's compiled code instead of Python's.

The loop shares the machine's cores and the GIL with synthesis, so its CPU is taken from the engine.
Against the same server on asyncio's loop, three runs of bench/compare.py (40 interleaved rounds of
bench/throughput.py's paragraph each): the loop's CPU per audio second 3-6 % lower at 4 and 8 sessions,
audio per wall second 0.6-1.3 % higher (rounds paired); first audio unchanged within the noise.

uvloop has no wheels for Windows: requirements.txt installs it only where it has (an environment
marker), and elsewhere the server runs on asyncio's loop, saying so at start-up (`MISSING`).
"""

import asyncio

MISSING = "uvloop is not installed (it has no wheels for this platform); the server works on asyncio's loop, a few % slower"


def install():
    """Make every event loop created from now on a uvloop loop; call before `daphne.server` is imported.
    Without uvloop, asyncio's own stays: `manage.py serve` says so."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
