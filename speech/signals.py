"""Control signals to live sessions on any instance: cancel the current speech, or terminate.

With REDIS_URL, signals travel over Redis pub/sub (one channel per session, `speech:signal:<id>`;
every instance holds one pattern subscription and hands a signal to its session if it has it).
Pub/sub keeps no backlog: a signal is tiny and only meaningful now. Without REDIS_URL the bus is
in-process and serves one instance.

Redis going away never breaks a session: sessions keep working on their instance, publishing
raises SignalsUnavailable (the REST endpoints answer 503), and the listener reconnects with
backoff and resubscribes, so signals flow again when Redis is back, without a restart.
(Channels' RedisPubSubChannelLayer logs a traceback every second while Redis is away and does not
retry a subscription that failed, hence this small bus on redis-py.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from .registry import instance_id

logger = logging.getLogger(__name__)

CHANNEL_PREFIX = "speech:signal:"
PROBE_PREFIX = "~probe:"  # never a session id: those start with speech_ws_
HEARTBEAT_PREFIX = "speech:instance:"
PROBE_S, STALE_S = 2.0, 6.0
HEARTBEAT_KEEP_S = 7 * 24 * 3600  # long enough to tell "gone" from "unknown"; short enough to clean up
CANCEL, TERMINATE = "cancel", "terminate"
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0


class StaleSubscription(Exception):
    """The subscription stopped delivering although its connection looks open."""


class SignalsUnavailable(Exception):
    """The signal could not be sent (Redis cannot be reached)."""


def signal(kind, session_id, reason=""):
    return {"kind": kind, "session_id": session_id, "issued_at": time.time(), "reason": reason}


class LocalBus:
    """Delivery within this process; the base of RedisBus. `publish` may be called from any thread."""

    def __init__(self):
        self.handlers = {}

    def register(self, session_id, handler):
        """handler(signal) is called on the registering event loop for every signal to session_id."""
        self.handlers[session_id] = (asyncio.get_running_loop(), handler)

    def unregister(self, session_id):
        self.handlers.pop(session_id, None)

    def deliver(self, message):
        session_id = message.get("session_id")
        if not isinstance(session_id, str):
            return
        entry = self.handlers.get(session_id)
        if entry is not None:
            loop, handler = entry
            loop.call_soon_threadsafe(handler, message)

    def publish(self, message):
        self.deliver(message)

    async def subscribe(self, session_id, handler):
        self.register(session_id, handler)

    def instance_alive(self, instance):
        """One instance only: the sessions of an earlier process (a crash) are not live."""
        return instance == instance_id()

    async def stop(self):
        """Nothing runs in the background here."""


class RedisBus(LocalBus):
    def __init__(self, url):
        super().__init__()
        import redis

        self.url = url
        self._publisher = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=2.0)
        self._listeners = {}  # event loop -> (listener task, asyncio.Event set while subscribed)

    async def subscribe(self, session_id, handler, *, wait_s=0.5):
        """Register; the first time on this loop, wait (briefly) until the subscription is live so a
        signal sent right after session.configured is not missed."""
        self.register(session_id, handler)
        loop = asyncio.get_running_loop()
        task, live = self._listeners.get(loop, (None, None))
        if task is None or task.done():
            live = asyncio.Event()
            task = loop.create_task(self._listen(live), name="speech-signal-listener")
            self._listeners[loop] = (task, live)
            try:
                await asyncio.wait_for(live.wait(), wait_s)
            except TimeoutError:
                pass  # Redis away: the session works on, the listener keeps retrying

    def listening(self):
        loop = asyncio.get_running_loop()
        _, live = self._listeners.get(loop, (None, None))
        return live is not None and live.is_set()

    async def stop(self):
        """Stop this loop's listener (server shutdown)."""
        task, _ = self._listeners.pop(asyncio.get_running_loop(), (None, None))
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def publish(self, message):
        from redis.exceptions import RedisError

        try:
            self._publisher.publish(CHANNEL_PREFIX + message["session_id"], json.dumps(message))
        except (RedisError, OSError) as exc:
            raise SignalsUnavailable(f"signals are unavailable: Redis cannot be reached ({exc})") from None

    async def _listen(self, live):
        import redis.asyncio as aredis
        from redis.exceptions import RedisError

        client = aredis.Redis.from_url(self.url, socket_connect_timeout=1.0, socket_timeout=PROBE_S)
        backoff, down = BACKOFF_MIN_S, False
        try:
            while True:
                pubsub = client.pubsub()
                try:
                    await pubsub.psubscribe(CHANNEL_PREFIX + "*")
                    live.set()
                    if down:
                        logger.warning("signals: Redis is reachable again; listening")
                    backoff, down = BACKOFF_MIN_S, False
                    await self._pump(client, pubsub)
                except (RedisError, OSError, StaleSubscription) as exc:
                    live.clear()
                    if not down:
                        logger.warning("signals: Redis unavailable (%s); sessions go on, retrying", exc)
                    down = True
                finally:
                    try:
                        await asyncio.wait_for(pubsub.aclose(), PROBE_S)
                    except (RedisError, OSError, TimeoutError):
                        pass
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        finally:
            live.clear()
            await client.aclose()

    async def _pump(self, client, pubsub):
        """Deliver messages; every PROBE_S, publish a probe to ourselves and renew this instance's
        heartbeat. A subscription that has not seen its own probe for STALE_S is dead even if its
        socket never said so (a failover that leaves the old connection silent): reconnect."""
        probe = CHANNEL_PREFIX + PROBE_PREFIX + instance_id()
        loop = asyncio.get_running_loop()
        heard = next_probe = loop.time()
        while True:
            now = loop.time()
            if now - heard > STALE_S:
                raise StaleSubscription(f"no probe came back for {STALE_S:.0f} s")
            if now >= next_probe:
                await client.publish(probe, "{}")
                await client.set(HEARTBEAT_PREFIX + instance_id(), repr(time.time()), ex=HEARTBEAT_KEEP_S)
                next_probe = now + PROBE_S
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=PROBE_S)
            if message is None or message.get("type") != "pmessage":
                continue
            if message["channel"].decode(errors="replace") == probe:
                heard = loop.time()
            else:
                self._receive(message["data"])

    def instance_alive(self, instance):
        """Whether the instance holding a session still listens: its last heartbeat is recent.

        The heartbeat is a timestamp kept for days, not a key that expires, so a missing one means
        "unknown" (Redis restarted empty, flushed, failed over to an empty node, evicted it) and
        raises SignalsUnavailable; only a stale timestamp proves the instance gone."""
        from redis.exceptions import RedisError

        try:
            beat = self._publisher.get(HEARTBEAT_PREFIX + instance)
        except (RedisError, OSError) as exc:
            raise SignalsUnavailable(f"signals are unavailable: Redis cannot be reached ({exc})") from None
        if beat is None:
            raise SignalsUnavailable("signals are unavailable: the instance holding the session has not been "
                                     "heard from since Redis lost its state; try again shortly")
        return time.time() - float(beat) < 2 * STALE_S

    def _receive(self, data):
        try:
            message = json.loads(data)
        except (ValueError, RecursionError):
            logger.warning("signals: ignored a message that is not JSON")
            return
        if isinstance(message, dict):
            self.deliver(message)


_bus = None


def get_bus():
    """This process's bus (built on first use from REDIS_URL)."""
    global _bus
    if _bus is None:
        from django.conf import settings

        _bus = RedisBus(settings.REDIS_URL) if settings.REDIS_URL else LocalBus()
    return _bus
