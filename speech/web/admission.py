"""A WebSocket session's admission and its place in the control plane, for the consumer to call.

`admit` decides whether a new session may run (engine capacity, API key, the key's concurrent
session slot), `join` starts joining an admitted session's channel-layer group while its
session.config is on its way, `register` makes a configured session reachable (that group, and its
session registry row), `signal` runs a control signal against it, and `release` gives everything
back when it ends. The consumer itself keeps to Channels' hooks.
"""

import asyncio
import logging

from .. import metrics
from ..conf import conf
from ..control import registry
from ..control.registry_writer import registry_writer
from ..control import signals as control
from ..control.slots import Lease, get_slots
from ..models import Scope
from ..stream.errors import (
    CLOSE_CAPACITY,
    CLOSE_POLICY,
    RATE_LIMIT,
    SpeechError,
    at_capacity,
)
from . import auth
from .database import on_database_thread

logger = logging.getLogger(__name__)

# The handshake's database work, on the thread that keeps its connection (speech/web/database.py).
_websocket_key = on_database_thread(auth.websocket_key)
_record_opened = on_database_thread(registry.opened)


class Admission:
    def __init__(self, channel_layer, channel_name):
        self.channel_layer = channel_layer
        self.channel_name = channel_name
        self.api_key = None
        self.lease = None
        self.registering = None  # the registry row's write (a future), once configured
        self.group = None  # the channel-layer group this session has joined, or is joining
        self.joining = None  # the join under way (a task), from `join` until `release`
        self._signal_tasks = set()

    async def admit(self, scope, session):
        """The error the session is refused with, or None: it may run. Keys and slots are settled
        here, once: nothing touches the database per frame."""
        metrics.session_started(session)
        if session.engine.estimated_wait() > conf.MAX_QUEUE_WAIT_S:
            metrics.refused(metrics.ENGINE_BUSY, "a WebSocket session: the engine is at capacity (4013)")
            return at_capacity()  # before a slot is taken: nothing to give back
        if conf.REQUIRE_API_KEY:
            key = self.api_key = await _websocket_key(scope)
            if key is None:
                return SpeechError(auth.AUTH_FAILED, error_type="authentication_error", code=401, close_code=CLOSE_POLICY)
            if missing := auth.missing_scope(key, Scope.SPEAK):  # as the 401 above: the event, then 4008
                return SpeechError(missing, error_type=auth.PERMISSION_ERROR, code=403, close_code=CLOSE_POLICY)
            if not await self._take_slot(key, session):
                metrics.refused(metrics.KEY_SESSION_LIMIT, f"a WebSocket session of key {key.prefix}: at its limit (4013)")
                return SpeechError(
                    f"Too many concurrent sessions for this API key (limit {self._limit(key)})",
                    error_type=RATE_LIMIT,
                    code=429,
                    close_code=CLOSE_CAPACITY,
                )
        return None

    @staticmethod
    def _limit(key):
        return conf.MAX_SESSIONS_PER_KEY if key.max_sessions is None else key.max_sessions

    async def _take_slot(self, key, session):
        slots = get_slots()
        try:
            taken = await slots.acquire(key.prefix, session.session_id, self._limit(key))
        except Exception:  # Redis away: serve rather than refuse; the limit is not enforced meanwhile
            logger.warning("session slots unavailable; per-key limit not enforced for this session")
            return True
        if taken:
            self.lease = Lease(slots, key.prefix, session.session_id)
            self.lease.start()
        return taken

    def join(self, session):
        """The session is admitted (the consumer has not answered the upgrade yet): start joining its
        group now. With Redis that is a round trip (bench/handshake.py), made while the upgrade's answer
        and the client's session.config travel instead of after them. Signals
        that reach the session before it is configured are ignored (nobody has its id yet)."""
        self.group = control.group(session.session_id)
        self.joining = asyncio.ensure_future(self.channel_layer.group_add(self.group, self.channel_name))

    async def register(self, session):
        """session.configured is about to go out: the session's group is joined (`join` began it), so a
        cancel or terminate sent from now on reaches it, and it is recorded in the registry. Without keys
        the row goes in the registry's next batch (no database wait or thread hop in the handshake; the
        REST endpoints find the session by its group until then); with keys the row says whose session it
        is, so it comes first."""
        # Shielded: a handshake cut short must not cancel the join halfway; release() waits for it
        # and then leaves the group.
        await asyncio.shield(self.joining)
        row = {"voice": session.config.voice, "engine": session.engine.capabilities.name}
        if self.api_key is None:
            self.registering = registry_writer().opened(session.session_id, **row)
        else:
            self.registering = asyncio.ensure_future(_record_opened(session.session_id, api_key=self.api_key, **row))
            await self.registering

    def signal(self, session, signal):
        """A cancel or terminate (speech/stream/signal.py) for the session, run in its own task: never
        held up here, since the consumer's dispatch also carries the client's frames."""
        task = asyncio.create_task(session.handle_signal(signal))
        self._signal_tasks.add(task)
        task.add_done_callback(self._signal_tasks.discard)

    async def release(self, session):
        """The session has ended (or the server is stopping): stop signals under way, close the session
        and give the slot back. Its end then goes to the registry's next batch, and it leaves its group
        once that is written, in the background (`Admission.settle` awaits what is left at shutdown).
        In that order a signal sent meanwhile still finds the session (and does nothing), and once it has
        left, the registry says it is over (404), never that it is live but unreachable (503)."""
        await self._stop_signals()
        summary = await session.aclose()
        metrics.session_ended(summary)
        await self.release_slot()
        registering, self.registering = self.registering, None
        group, self.group = self.group, None
        joining, self.joining = self.joining, None
        if registering is not None or group is not None:
            task = asyncio.ensure_future(self._leave(summary, registering, group, joining))
            Admission._leaving.add(task)
            task.add_done_callback(Admission._leaving.discard)

    async def release_slot(self):
        """The key's session slot is given back (once; `release` does it too)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            await lease.release()

    def release_slot_soon(self):
        """`release_slot` for a caller that cannot wait (the connection's loss), in a task of its own
        that `Admission.settle` awaits at shutdown. Nothing to do for a session without a slot."""
        if self.lease is not None:
            task = asyncio.ensure_future(self.release_slot())
            Admission._leaving.add(task)
            task.add_done_callback(Admission._leaving.discard)

    _leaving: set[asyncio.Future] = set()  # sessions of this process still recording their end and slots given back

    @classmethod
    async def settle(cls):
        """Server shutdown: wait until every ended session has recorded its end and left its group."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(task for task in cls._leaving if task.get_loop() is loop), return_exceptions=True)

    async def _leave(self, summary, registering, group, joining):
        if registering is not None:
            await self._record_end(summary, registering)
        if joining is not None:  # left after it joined, never before
            await asyncio.gather(joining, return_exceptions=True)
        if group is not None:
            await self.channel_layer.group_discard(group, self.channel_name)
        await self._stop_signals()

    async def _stop_signals(self):
        pending = [task for task in self._signal_tasks if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    @staticmethod
    async def _record_end(summary, registering):
        # Queued before the row's own write is awaited: a row not written yet is then written once, ended.
        ending = registry_writer().closed(
            summary.session_id,
            status=summary.outcome,
            segments=summary.segments,
            bytes_sent=summary.bytes_sent,
            first_audio_s=summary.first_audio_s,
        )
        for write, what in ((registering, "session"), (ending, "end of session")):
            try:
                await write
            except Exception:
                logger.exception("could not record the %s %s in the registry", what, summary.session_id)
                return
