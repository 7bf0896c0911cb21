"""Control signals to live sessions on any instance: cancel the current speech, or terminate.

A live session's consumer is a member of the channel-layer group `speech.session.<session_id>` from
just before its `session.configured` until it ends, and handles `speech.cancel` and
`speech.terminate` messages. Any Django code reaches it with the layer's `group_send` (docs/operations.md,
"Control across instances"); `send` below adds what the product's own senders want: the time the signal was
issued (so a cancel that was late cannot cut speech begun after it) and SignalsUnavailable when
Redis cannot be reached (the REST endpoints answer 503).

Whether a session is live is the registry's answer (a row, written in the background right after the
handshake, whose instance still beats its heartbeat: speech/control/layer.py), and in the first
milliseconds, before that row exists, the group's membership in the layer.
"""

from __future__ import annotations

import re
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from ..stream.signal import ControlSignal
from .registry import instance_id

CANCEL, TERMINATE = "cancel", "terminate"
SESSION_ID = re.compile(r"speech_ws_[0-9a-f]{32}")  # speech/stream/session.py new_session_id
STALE_S = 6.0  # a heartbeat older than this (3 missed beats) means the instance is gone


class SignalsUnavailable(Exception):
    """The signal could not be sent (Redis cannot be reached)."""


def group(session_id):
    return f"speech.session.{session_id}"


def message(kind, session_id, reason=""):
    """The channel-layer message of a signal (speech/stream/signal.py), issued now."""
    return ControlSignal(type=f"speech.{kind}", session_id=session_id, issued_at=time.time(), reason=reason).model_dump()


def _redis_layer(layer):
    from .layer import SpeechChannelLayer

    return layer if isinstance(layer, SpeechChannelLayer) else None


def redis_layer():
    """The process's channel layer when it is Redis's (REDIS_URL), else None."""
    return _redis_layer(get_channel_layer())


def _unavailable(exc):
    return SignalsUnavailable(f"signals are unavailable: Redis cannot be reached ({exc})")


async def send(kind, session_id, reason=""):
    from .layer import REDIS_ERRORS

    try:
        await get_channel_layer().group_send(group(session_id), message(kind, session_id, reason))
    except REDIS_ERRORS as exc:
        raise _unavailable(exc) from None


send_sync = async_to_sync(send)


async def has_members(session_id):
    """Whether a consumer has joined the session's group (and not left it)."""
    from .layer import REDIS_ERRORS

    layer = get_channel_layer()
    name = group(session_id)
    redis_layer = _redis_layer(layer)
    if redis_layer is None:  # the in-memory layer: this process's groups
        return bool(layer.groups.get(name))
    try:
        key = redis_layer._group_key(name)
        connection = redis_layer.connection(redis_layer.consistent_hash(name))
        cutoff = time.time() - redis_layer.group_expiry
        return await connection.zcount(key, cutoff, "+inf") > 0
    except REDIS_ERRORS as exc:
        raise _unavailable(exc) from None


async def instance_alive(instance):
    """Whether the instance holding a session still beats.

    The heartbeat is a timestamp kept for days, not a key that expires, so a missing one means
    "unknown" (Redis restarted empty, flushed, failed over to an empty node, evicted it) and raises
    SignalsUnavailable; only a stale timestamp proves the instance gone."""
    from .layer import REDIS_ERRORS

    redis_layer = _redis_layer(get_channel_layer())
    if redis_layer is None:  # one instance only: the sessions of an earlier process (a crash) are not live
        return instance == instance_id()
    try:
        beat = await redis_layer.connection(0).get(redis_layer.heartbeat_key(instance))
    except REDIS_ERRORS as exc:
        raise _unavailable(exc) from None
    if beat is None:
        raise SignalsUnavailable(
            "signals are unavailable: the instance holding the session has not been "
            "heard from since Redis lost its state; try again shortly"
        )
    return time.time() - float(beat) < STALE_S


instance_alive_sync = async_to_sync(instance_alive)


def not_joined():
    """A live session (its row says so, its instance beats) that is not in its group can take no signal
    now: its instance has not joined the group again since Redis lost it. Answered with 503, not 202."""
    return SignalsUnavailable(
        "signals are unavailable: the instance holding the session has not rejoined the control "
        "channel since Redis lost its state; try again shortly"
    )


has_members_sync = async_to_sync(has_members)


async def stop():
    """Server shutdown: stop this process's heartbeat."""
    redis_layer = _redis_layer(get_channel_layer())
    if redis_layer is not None:
        await redis_layer.stop()
