"""Readiness: can this instance serve a session right now? (`GET /health`; `/healthz` is liveness.)

Each part is checked for real, within CHECK_TIMEOUT_S: the database answers a query, Redis (when
REDIS_URL is set) answers PING, and the engine is built and says it is ready (an upstream engine
asks its upstream). The answer names every part, so a failure says which one.

Sessions need the database and the engine: without either the instance is `unavailable` (503).
Without Redis it still serves sessions (cross-instance signals and shared per-key counts wait for
it, speech/control/layer.py), so it is `degraded` and stays ready (200): an orchestrator must not
take every instance out at a Redis blip (docs/deployment.md, Health).
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection

from ..runtime import get_engine

CHECK_TIMEOUT_S = 3.0


def _database():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


async def _redis():
    client = aioredis.from_url(settings.REDIS_URL, socket_connect_timeout=CHECK_TIMEOUT_S, socket_timeout=CHECK_TIMEOUT_S)
    try:
        await client.ping()
    finally:
        await client.aclose()


async def _engine():
    engine = await sync_to_async(get_engine)()  # built at start-up (warm-up); built here otherwise
    await engine.ready()


async def _check(probe):
    """ "ok", or what went wrong (the exception's class and message)."""
    try:
        await asyncio.wait_for(probe(), CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g} s"
    except Exception as exc:  # any failure means not ready; its text says why
        return f"{type(exc).__name__}: {exc}".strip()
    return "ok"


REQUIRED = ("database", "engine")  # the parts a session cannot do without
OK, DEGRADED, UNAVAILABLE = "ok", "degraded", "unavailable"


async def readiness():
    """(status, {part: "ok" or the failure}) for the database, Redis when configured, the engine:
    `unavailable` when a REQUIRED part fails, `degraded` when only Redis does, else `ok`."""
    probes = {"database": sync_to_async(_database), "engine": _engine}
    if settings.REDIS_URL:
        probes["redis"] = _redis
    results = await asyncio.gather(*(_check(probe) for probe in probes.values()))
    checks = dict(zip(probes, results))
    if any(checks[part] != "ok" for part in REQUIRED):
        return UNAVAILABLE, checks
    return (OK if all(result == "ok" for result in results) else DEGRADED), checks
