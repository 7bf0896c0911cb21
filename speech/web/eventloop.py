"""The event loop `manage.py serve` runs daphne on: uvloop's, in place of asyncio's own.

daphne makes its loop when `daphne.server` is imported, which Django does while it loads the `daphne`
app, so `manage.py` calls `install` before Django starts. Only the loop's own machinery (polling,
timers, callbacks, the synthesis threads' wake-ups) changes, to compiled code; the loop shares the
cores with synthesis, so what it saves goes to the engine (docs/decisions.md#the-event-loop-kept-short).
Without uvloop (no wheels, e.g. on Windows) asyncio's loop stays and start-up says so (`MISSING`).
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
