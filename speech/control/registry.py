"""The session registry: a row when a session is configured, its outcome when it ends.

Two writes a session, both off the per-frame path (at the handshake and after the close), from
Channels' database thread. `live_session` answers the control plane's "is it live?" question.
"""

import os
import socket

from django.conf import settings
from django.utils import timezone

from ..models import SessionRecord


def instance_id():
    return getattr(settings, "SPEECH_INSTANCE_ID", "") or f"{socket.gethostname()}:{os.getpid()}"


def opened(session_id, *, voice, engine, api_key=None):
    SessionRecord.objects.create(session_id=session_id, instance=instance_id(), api_key=api_key, voice=voice, engine=engine)


def closed(session_id, *, status, segments, bytes_sent, first_audio_s):
    SessionRecord.objects.filter(session_id=session_id).update(
        status=status,
        ended_at=timezone.now(),
        segments=segments,
        bytes_sent=bytes_sent,
        first_audio_ms=None if first_audio_s is None else round(first_audio_s * 1000, 2),
    )


def lost(record):
    """A session whose instance is gone (crashed, killed) without recording its end."""
    SessionRecord.objects.filter(pk=record.pk, status=SessionRecord.Status.ACTIVE).update(
        status=SessionRecord.Status.FAILED, ended_at=timezone.now()
    )


def live_session(session_id, api_key=None):
    """The active record, or None; with a key, only that key's sessions are visible."""
    records = SessionRecord.objects.filter(session_id=session_id, status=SessionRecord.Status.ACTIVE)
    if api_key is not None:
        records = records.filter(api_key=api_key)
    return records.first()


def ended(session_id):
    """Whether the session has a row that says it is over. (Not "any row": a live session's row may be
    written between a caller's live_session() and this question, and would make it look over.)"""
    return SessionRecord.objects.filter(session_id=session_id).exclude(status=SessionRecord.Status.ACTIVE).exists()


def sessions_using_voice(name):
    return list(
        SessionRecord.objects.filter(voice__iexact=name, status=SessionRecord.Status.ACTIVE).values_list("session_id", flat=True)
    )
