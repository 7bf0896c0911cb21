"""Registry rows of sessions whose instance is gone are marked ended, so that the registry (and the admin's
list of live sessions) tells the truth without anyone asking about each session.

A process that is killed (SIGKILL, a crash, the machine) records no end for its sessions. Their rows are
marked lost (failed, as `registry.lost` marks one; speech/control/registry.py `instances_lost`):

- when an instance starts: the rows of an earlier process that had its instance id; and without Redis
  (one instance only) every other instance's rows, which can only be an earlier process's;
- with Redis, by every instance every SWEEP_S: the rows of each other instance whose heartbeat
  (speech/control/layer.py) is older than signals.STALE_S, or has been missing for MISSING_GRACE_S
  (Redis restarted empty or failed over: a live instance writes it again at its next beat).

A graceful shutdown records its sessions' ends itself (speech/web/lifecycle.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.db import DatabaseError

from ..web.database import on_database_thread
from . import registry
from .layer import REDIS_ERRORS
from .signals import STALE_S, redis_layer

logger = logging.getLogger(__name__)

SWEEP_S = 5.0
MISSING_GRACE_S = 30.0  # many heartbeats (layer.BEAT_S, its backoff at most 2 s): a live instance has beaten by then

_active_instances = on_database_thread(registry.active_instances)
_instances_lost = on_database_thread(registry.instances_lost)


class Sweeper:
    def __init__(self, started):
        self.started = started  # when this process started (a datetime): its own rows are newer
        self._missing: dict[str, float] = {}  # instance -> when its heartbeat was first found missing (monotonic)

    async def run(self):
        """Sweep at the start, then, with Redis, every SWEEP_S until cancelled."""
        await self.sweep_safely(at_start=True)
        if redis_layer() is None:
            return
        while True:
            await asyncio.sleep(SWEEP_S)
            await self.sweep_safely()

    async def sweep_safely(self, *, at_start=False):
        """`sweep`, and nothing more while Redis or the database cannot answer: the next pass tries again."""
        try:
            await self.sweep(at_start=at_start)
        except REDIS_ERRORS:
            pass  # the channel layer logs the outage once
        except DatabaseError as exc:
            logger.warning("registry sweep: the database did not answer (%s)", exc)

    async def sweep(self, *, at_start=False):
        """One pass: mark the rows of the instances found gone. Returns how many rows were marked."""
        others = await _active_instances()
        others.discard(registry.instance_id())
        layer = redis_layer()
        if layer is not None:
            gone = await self._gone(layer, others)
        else:
            gone = others if at_start else set()
        if not gone and not at_start:
            return 0
        marked = await _instances_lost(gone, own_before=self.started)
        if marked:
            whose = ", ".join(sorted(gone)) or "an earlier process of this instance"
            logger.warning("registry: %d session(s) marked lost: their instance is gone (%s)", marked, whose)
        return marked

    async def _gone(self, layer, instances):
        """The instances whose heartbeat says they are gone."""
        ordered = sorted(instances)
        beats = await layer.connection(0).mget([layer.heartbeat_key(instance) for instance in ordered]) if ordered else []
        self._missing = {instance: since for instance, since in self._missing.items() if instance in instances}
        now, clock = time.time(), time.monotonic()
        gone = set()
        for instance, beat in zip(ordered, beats):
            if beat is None:  # unknown, not stale: Redis lost it, or the instance has not beaten since
                if clock - self._missing.setdefault(instance, clock) >= MISSING_GRACE_S:
                    gone.add(instance)
            else:
                self._missing.pop(instance, None)
                if now - float(beat) >= STALE_S:
                    gone.add(instance)
        return gone
