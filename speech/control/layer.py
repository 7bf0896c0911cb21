"""The channel layer with REDIS_URL: channels-redis's core `RedisChannelLayer`, made to outlive Redis.

Why the core layer and not `RedisPubSubChannelLayer` (figures in bench/RESULTS.md, "Control signals"):
joining a group is a sorted-set write that any instance can read back, so the REST endpoints can ask
Redis whether a session that has not reached the registry yet is live; one blocking BZPOPMIN per process
serves every consumer; and no Redis call happens when a consumer is created. The pub/sub layer
subscribes a channel per consumer at connect, so a connection fails outright while Redis is away.

What the stock core layer does badly, and this subclass changes:

* `receive` raises when Redis fails, and Channels' consumer `__call__` runs it inside
  `await_many_dispatch`, so one outage kills every consumer on the instance. Here `receive` never
  raises a Redis error: it waits until Redis answers again, then receives as before. And a cancelled
  `receive` always ends, even when redis-py lost the cancellation on its way (`_brpop_with_clean`).
* Redis restarted empty (or failed over to an empty replica) forgets every group. Here each process
  remembers its own memberships and joins them again as soon as it sees Redis lost its state.
* Joining a group while Redis is away would fail the handshake. Here the membership is remembered and
  joined when Redis is back; the session is served meanwhile (its signals just cannot arrive).
* One warning when Redis goes and one line when it is back, never a traceback per retry.
* Pooled connections left from before an outage would each fail once afterwards; they are closed
  when Redis answers again, so the layer comes back whole at the first heartbeat that succeeds.

The heartbeat (`<prefix>:instance:<instance id>`, renewed every BEAT_S) stays beside the layer
because the layer cannot say whether the instance holding a session is still alive: a crashed
process leaves its group memberships behind (they only expire after `group_expiry`). The REST
endpoints read it (speech/control/signals.py). Its previous value also tells when Redis lost its state.
"""

from __future__ import annotations

import asyncio
import logging
import time

from channels_redis.core import RedisChannelLayer
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError)  # redis-py's TimeoutError and ConnectionError are RedisErrors
BEAT_S = 2.0
BEAT_KEEP_S = 7 * 24 * 3600  # a timestamp kept for days: a missing one means "unknown", a stale one "gone"
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
CONNECT_TIMEOUT_S = 1.0
JOIN, LEAVE = "join", "leave"


def _raise_if_cancelled(cause=None):
    """Raise CancelledError if the running task has been asked to cancel and the request was lost on the
    way (redis-py turned it into a Redis error, or into a normal return)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from cause


class SpeechChannelLayer(RedisChannelLayer):
    # BZPOPMIN wakes every second, so a socket timeout of a few seconds tells a connection that went
    # silent (a failover that sent no reset) from one that is waiting.
    brpop_timeout = 1
    socket_timeout_s = 3.0

    def __init__(self, hosts=None, **kwargs):
        hosts = [
            {"address": host, "socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": self.socket_timeout_s}
            if isinstance(host, str)
            else host
            for host in hosts or ["redis://localhost:6379"]
        ]
        super().__init__(hosts=hosts, **kwargs)
        self.memberships: dict[str, set[str]] = {}  # group -> this process's channels in it
        self._up = None  # asyncio.Event, set while Redis answers (created on the serving loop)
        self._beat = None
        self.down = False  # a warning was logged and no "back" line yet
        self._stopping = False
        self._changes: list[tuple[str, str, str, asyncio.Future]] = []  # memberships not sent yet (_change)
        self._changing = None  # the task sending them

    def heartbeat_key(self, instance):
        return f"{self.prefix}:instance:{instance}"

    # -- receiving: never raises a Redis error into the consumer -----------------------------------
    async def receive(self, channel):
        self.start()
        while True:
            await self._up.wait()
            try:
                return await super().receive(channel)
            except REDIS_ERRORS as exc:
                self._lost(exc)

    async def _brpop_with_clean(self, index, channel, timeout):
        """One BZPOPMIN of the stock receive loop (every Redis call of `receive` goes through here), which
        tries again for as long as nothing arrives. A cancellation that lands inside redis-py can come out
        of it as a timeout that redis-py retries, or as no message at all: the loop then never ends, and
        neither did a consumer's disconnect (seen once in a full test run: a `receive` cancelled right
        after Redis came back). So a pending cancellation ends it here. A message popped meanwhile stays
        in the channel's backup queue, which the next receive on that channel puts back."""
        try:
            member = await super()._brpop_with_clean(index, channel, timeout)
        except REDIS_ERRORS as exc:
            _raise_if_cancelled(exc)
            raise
        _raise_if_cancelled()
        return member

    async def _clean_receive_backup(self, index, channel):
        """The stock layer runs this cleaner as a task nobody awaits, so a Redis error in it would end
        as a traceback ("Task exception was never retrieved"). A backup entry it could not pop only
        means the message may come again; a repeated cancel is stale by then and cuts nothing."""
        try:
            await super()._clean_receive_backup(index, channel)
        except REDIS_ERRORS as exc:
            self._lost(exc)

    # -- groups: remembered locally, joined when Redis can be reached --------------------------------
    async def group_add(self, group, channel):
        self.start()
        self.memberships.setdefault(group, set()).add(channel)
        if not self._up.is_set():
            return  # joined by _rejoin when Redis is back; never hold up a handshake
        try:
            await self._join(group, channel)
        except REDIS_ERRORS as exc:
            self._lost(exc)

    async def _join(self, group, channel):
        await self._change(JOIN, group, channel)

    async def group_discard(self, group, channel):
        members = self.memberships.get(group)
        if members is not None:
            members.discard(channel)
            if not members:
                del self.memberships[group]
        try:
            await self._change(LEAVE, group, channel)
        except REDIS_ERRORS as exc:  # not joined again later; the entry expires with group_expiry
            self._lost(exc)

    # -- memberships: sent to Redis in batches -----------------------------------------------------
    async def _change(self, change, group, channel):
        """The stock group_add (ZADD, then EXPIRE) and group_discard (ZREM), with the changes asked for in
        the same loop turn sent together: one pipeline, one round trip, one pooled connection per Redis
        host. A handshake waits for its join, and the stock layer gave 20 handshakes that arrive together
        20 connections and 40 round trips. Changes asked for while a batch is on its way go in the next."""
        done = asyncio.get_running_loop().create_future()
        self._changes.append((change, group, channel, done))
        if self._changing is None:
            self._changing = asyncio.get_running_loop().create_task(self._send_changes())
        await done

    async def _send_changes(self):
        try:
            while self._changes:
                batch, self._changes = self._changes, []
                by_host: dict[int, list] = {}
                for change in batch:
                    by_host.setdefault(self.consistent_hash(change[1]), []).append(change)
                try:
                    await asyncio.gather(*(self._send_host_changes(index, changes) for index, changes in by_host.items()))
                finally:
                    for *_, done in batch:
                        done.cancel()  # stopped on the way (stop()); a no-op for the changes answered
        finally:
            self._changing = None
            for *_, done in self._changes:  # stopped (stop()): nothing will send these
                done.cancel()
            self._changes = []

    async def _send_host_changes(self, index, changes):
        failure = None
        try:
            async with self.connection(index).pipeline(transaction=False) as pipe:
                for change, group, channel, _ in changes:
                    key = self._group_key(group)
                    if change is JOIN:
                        pipe.zadd(key, {channel: time.time()})
                        pipe.expire(key, self.group_expiry)
                    else:
                        pipe.zrem(key, channel)
                await pipe.execute()
        except REDIS_ERRORS as exc:
            failure = exc
        for *_, done in changes:
            if done.done():  # its caller was cancelled meanwhile
                continue
            if failure is None:
                done.set_result(None)
            else:
                done.set_exception(failure)

    async def _rejoin(self):
        joins = [(group, channel) for group, channels in self.memberships.items() for channel in channels]
        await asyncio.gather(*(self._join(group, channel) for group, channel in joins))

    # -- liveness: one task per process ------------------------------------------------------------
    def start(self):
        """Begin the heartbeat on this loop (the first consumer calls it; idempotent)."""
        if self._beat is None or self._beat.done():
            self._up = self._up or asyncio.Event()
            if not self.down:
                self._up.set()
            self._beat = asyncio.get_running_loop().create_task(self._heartbeat(), name="speech-layer-heartbeat")

    async def stop(self):
        """Stop the heartbeat (server shutdown: no task may be left pending). A cancellation that lands
        inside a redis-py command can be swallowed there (seen with a Redis restarted under it: stop()
        then waited for ever), so the loop also ends at its next turn when told to stop."""
        if self._beat is not None:
            self._stopping = True
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
            self._beat = None
            self._stopping = False
        if self._changing is not None:  # memberships on their way (a rejoin the heartbeat was waiting for)
            self._changing.cancel()
            await asyncio.gather(self._changing, return_exceptions=True)

    def _lost(self, exc):
        if self._up is not None:
            self._up.clear()
        if not self.down:
            self.down = True
            logger.warning("channel layer: Redis unavailable (%s); sessions go on, control signals wait", exc)

    async def _heartbeat(self):
        from .registry import instance_id

        key = self.heartbeat_key(instance_id())
        backoff = BACKOFF_MIN_S
        beaten = False  # a beat of this task has reached Redis
        while not self._stopping:
            delay = BEAT_S
            try:
                previous = await self.connection(0).set(key, repr(time.time()), ex=BEAT_KEEP_S, get=True)
                if not self._up.is_set() or (previous is None and beaten):
                    # Redis was away, or restarted empty under us: the pooled connections are from before
                    await self._drop_idle_connections()
                if previous is None or not self._up.is_set():
                    await self._rejoin()  # Redis is new, empty, or was away: our groups may be gone
                beaten = True
                if self.down:
                    self.down = False
                    logger.warning("channel layer: Redis is reachable again; %d session group(s) joined", len(self.memberships))
                self._up.set()
                backoff = BACKOFF_MIN_S
            except REDIS_ERRORS as exc:
                self._lost(exc)
                delay, backoff = backoff, min(backoff * 2, BACKOFF_MAX_S)
            await asyncio.sleep(delay)

    async def _drop_idle_connections(self):
        """Close this loop's idle pooled connections. After a Redis restart each would fail once on its
        next use, and every such failure took the layer down again for a backoff: joins deferred, a
        REST signal accepted for a session whose group was not joined yet (measured: signals came back
        ~10 s after an empty restart instead of at the next heartbeat)."""
        layer = self._layers.get(asyncio.get_running_loop())
        for client in list(layer._connections.values()) if layer is not None else ():
            await client.connection_pool.disconnect(inuse_connections=False)
