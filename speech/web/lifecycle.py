"""What the serving process does besides serving (`manage.py serve` gives it to speech/server/launcher.py).

From its start it sweeps the registry of the rows of instances that are gone (speech/control/sweep.py).
When it stops, after every session has ended: it waits until each has recorded its end and left its
group, marks any row of its own still active as terminated (a session whose end could not be
recorded), then stops the channel layer's heartbeat, so that no task is left pending at exit.
"""

from __future__ import annotations

import asyncio
import logging

from django.utils import timezone

from ..control import registry
from ..control import signals as control
from ..control.sweep import Sweeper
from .admission import Admission
from .database import on_database_thread

logger = logging.getLogger(__name__)

_instance_stopped = on_database_thread(registry.instance_stopped)


class ServingLifecycle:
    def __init__(self) -> None:
        self.started = timezone.now()  # this process's registry rows are the ones started since
        self._sweeping: asyncio.Future | None = None

    def start(self) -> None:
        self._sweeping = asyncio.ensure_future(Sweeper(self.started).run())

    async def stop(self) -> None:
        await Admission.settle()
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        await self._record_stopped()
        await control.stop()

    async def _record_stopped(self) -> None:
        try:
            ended = await _instance_stopped(self.started)
        except Exception:
            logger.exception("could not record the end of this instance's sessions in the registry")
            return
        if ended:
            logger.warning("%i session(s) without a recorded end marked terminated", ended)
