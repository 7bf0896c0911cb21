"""Concurrent sessions per API key, counted across every instance.

With REDIS_URL the count lives in Redis: one sorted set per key whose members are the live
sessions and whose scores are lease deadlines. A session renews its lease while it lives, so the
slot of a session whose instance crashed frees itself when the lease runs out; taking a slot is
one atomic Lua script (drop expired leases, count, add). Without Redis one process counts alone.
"""

from __future__ import annotations

import asyncio
import logging
import time

logger = logging.getLogger(__name__)

LEASE_S = 30.0
RENEW_S = 10.0

_ACQUIRE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
"""


class LocalSlots:
    def __init__(self):
        self._held: dict[str, set[str]] = {}

    async def acquire(self, key, session_id, limit):
        held = self._held.setdefault(key, set())
        if len(held) >= limit:
            return False
        held.add(session_id)
        return True

    async def renew(self, key, session_id):
        return None

    async def release(self, key, session_id):
        self._held.get(key, set()).discard(session_id)


class RedisSlots:
    def __init__(self, url, prefix="speech"):
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self.prefix = prefix  # SPEECH_REDIS_PREFIX: deployments sharing a Redis never count each other

    def _name(self, key):
        return f"{self.prefix}:slots:{key}"

    async def acquire(self, key, session_id, limit):
        now = time.time()
        taken = await self._acquire(keys=[self._name(key)], args=[now, limit, now + LEASE_S, session_id, int(LEASE_S * 2000)])
        return bool(taken)

    async def renew(self, key, session_id):
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._name(key), {session_id: time.time() + LEASE_S}, xx=True)
            pipe.pexpire(self._name(key), int(LEASE_S * 2000))  # the set outlives every live lease
            await pipe.execute()

    async def release(self, key, session_id):
        await self._redis.zrem(self._name(key), session_id)


_slots = None


def get_slots():
    global _slots
    if _slots is None:
        from django.conf import settings

        _slots = RedisSlots(settings.REDIS_URL, settings.SPEECH_REDIS_PREFIX) if settings.REDIS_URL else LocalSlots()
    return _slots


class Lease:
    """One session's slot: taken at connect, renewed in the background, given back at the end."""

    def __init__(self, slots, key, session_id):
        self.slots, self.key, self.session_id = slots, key, session_id
        self._renewer = None

    def start(self):
        self._renewer = asyncio.create_task(self._renew())

    async def _renew(self):
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await self.slots.renew(self.key, self.session_id)
            except Exception:  # Redis away for a moment: the next renewal tries again
                logger.warning("could not renew a session slot lease")

    async def release(self):
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        try:
            await self.slots.release(self.key, self.session_id)
        except Exception:  # the lease runs out by itself
            logger.warning("could not release a session slot; its lease will expire")
