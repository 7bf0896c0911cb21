"""When the cyclic garbage collector walks the serving process's objects (`manage.py serve`).

CPython's full collection (generation 2) stops the event loop for as long as it takes to walk every
tracked object, and an open session keeps about 150 of them (its consumer, protocol, transport, tasks,
events, header lists). It runs once the objects promoted since the last one reach a quarter of those that
survived it: with 2,000 idle sessions open, a pause of about 200 ms every ~750 handshakes, against
about 12 ms with none open, and the handshakes under way when it struck waited for it (figures:
bench/RESULTS.md, "Handshake and channel layer", part 4; docs/decisions.md). Sessions cannot simply
be left out: an ended session is cyclic garbage (daphne's, Twisted's and autobahn's objects refer to
each other), which only a collection frees.

So the objects that survive a full collection are frozen (`gc.freeze`): the next ones walk only what
was made since, and a session that stays open is walked about once. A connection that was open at a
freeze and has ended since is garbage the collector cannot see; after UNFREEZE_AFTER_ENDED of them the
next full collection walks everything again (`gc.unfreeze`) and frees them, then freezing resumes. That
bounds the garbage held back to about that many sessions (tens of KiB each), and the long pause to once
per that many ended sessions that had been open at a freeze.
"""

from __future__ import annotations

import gc

UNFREEZE_AFTER_ENDED = 256


class Collector:
    def __init__(self) -> None:
        self.freezes = 0  # full collections whose survivors were frozen
        self.frozen_ended = 0  # connections open at a freeze that have ended since the last unfreeze
        self.unfreezes = 0

    def install(self) -> None:
        """Collect and freeze what the process holds now (the application, warmed up), then freeze the
        survivors of every full collection."""
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._after_collection)

    def opened(self) -> int:
        """A connection opened: the mark it gives `ended`."""
        return self.freezes

    def ended(self, mark: int) -> None:
        """A connection that `opened` gave `mark` has ended."""
        if mark < self.freezes:
            self.frozen_ended += 1

    def _after_collection(self, phase: str, info: dict) -> None:
        if phase != "stop" or info["generation"] != 2:
            return
        if self.frozen_ended >= UNFREEZE_AFTER_ENDED:
            gc.unfreeze()  # the next full collection walks everything and frees what was held back
            self.frozen_ended = 0
            self.unfreezes += 1
        else:
            gc.freeze()
            self.freezes += 1


collector = Collector()
