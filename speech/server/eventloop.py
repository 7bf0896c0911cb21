"""The event loop `manage.py serve` runs daphne on: uvloop's (libuv's), in place of asyncio's own.

daphne makes its event loop when `daphne.server` is imported, and installs Twisted's asyncio reactor
on it; Django imports that module while it loads the `daphne` app, so `manage.py` chooses the loop
before Django starts (`install`). Everything runs on it unchanged; the loop's own machinery is
compiled, which leaves more CPU to synthesis (docs/decisions.md). uvloop has no wheels for Windows:
there the server runs on asyncio's loop, saying so at start-up (`MISSING`).
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


def daphne_loop() -> str:
    """Whose event loop daphne runs on ("uvloop" or "asyncio"): the one it made when Django loaded its app."""
    from daphne.server import twisted_loop  # not at import: `install` runs before daphne.server is imported

    return type(twisted_loop).__module__.partition(".")[0]
