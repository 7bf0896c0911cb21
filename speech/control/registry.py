"""The session registry: a row when a session is configured, its outcome when it ends.

Two writes a session, both off the per-frame path (at the handshake and after the close): the serving
loop hands them to speech/control/registry_writer.py, which runs them here in batches (`write_batch`).
`live_session` answers the control plane's "is it live?" question.
"""

from __future__ import annotations

import os
import socket

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from ..models import SessionRecord


def instance_id():
    return getattr(settings, "SPEECH_INSTANCE_ID", "") or f"{socket.gethostname()}:{os.getpid()}"


def opened(session_id, *, voice, engine, api_key=None):
    SessionRecord.objects.create(session_id=session_id, instance=instance_id(), api_key=api_key, voice=voice, engine=engine)


ENDED_FIELDS = ("status", "ended_at", "segments", "bytes_sent", "first_audio_ms")


def _ended(end):
    """The row's values for an end (a dict of RegistryWriter.closed's arguments and `ended_at`), by
    ENDED_FIELDS."""
    first_audio_s = end["first_audio_s"]
    first_audio_ms = None if first_audio_s is None else round(first_audio_s * 1000, 2)
    return (end["status"], end["ended_at"], end["segments"], end["bytes_sent"], first_audio_ms)


def apply_end(record, end):
    """An end on a row not written yet."""
    for field, value in zip(ENDED_FIELDS, _ended(end)):
        setattr(record, field, value)


def _record_ends(ends):
    """Sessions' outcomes, as one UPDATE statement run for each (executemany): the ORM's update()
    compiles a statement per session (docs/decisions.md#the-registrys-writes-in-batches-off-the-loop)."""
    ops = connection.ops
    meta = SessionRecord._meta

    def column(name):
        return ops.quote_name(meta.get_field(name).column)

    assignments = ", ".join(f"{column(name)} = %s" for name in ENDED_FIELDS)
    sql = f"UPDATE {ops.quote_name(meta.db_table)} SET {assignments} WHERE {column('session_id')} = %s"
    rows = []
    for end in ends:
        status, ended_at, segments, bytes_sent, first_audio_ms = _ended(end)
        rows.append((status, ops.adapt_datetimefield_value(ended_at), segments, bytes_sent, first_audio_ms, end["session_id"]))
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def write_batch(writes):
    """Registry writes (new rows as SessionRecords, ends as dicts made by RegistryWriter.closed) in one
    transaction: the new rows in one INSERT, then the ends. Returns each write's exception, or None, in
    order: if the batch fails, its writes are tried one by one, so a bad write fails alone."""
    try:
        with transaction.atomic():
            _write(writes)
        return [None] * len(writes)
    except Exception as exc:
        if len(writes) == 1:
            return [exc]
    outcomes = []
    for write in writes:
        try:
            with transaction.atomic():
                _write([write])
            outcomes.append(None)
        except Exception as exc:
            outcomes.append(exc)
    return outcomes


def _write(writes):
    rows = [write for write in writes if isinstance(write, SessionRecord)]
    if rows:
        SessionRecord.objects.bulk_create(rows)
    ends = [write for write in writes if not isinstance(write, SessionRecord)]
    if ends:
        _record_ends(ends)


def lost(record):
    """A session whose instance is gone (crashed, killed) without recording its end."""
    SessionRecord.objects.filter(pk=record.pk, status=SessionRecord.Status.ACTIVE).update(
        status=SessionRecord.Status.FAILED, ended_at=timezone.now()
    )


def active_instances():
    """The instances that hold a session, as the registry's rows say."""
    return set(SessionRecord.objects.filter(status=SessionRecord.Status.ACTIVE).values_list("instance", flat=True).distinct())


def instances_lost(instances, *, own_before=None):
    """Every session of `instances` (gone: crashed, killed) is lost, as `lost` marks one; and with `own_before`,
    every session of this instance's id that started before then (a process that had this id before this
    one). Returns how many rows were marked."""
    active = SessionRecord.objects.filter(status=SessionRecord.Status.ACTIVE)
    gone = Q(instance__in=list(instances))
    if own_before is not None:
        gone |= Q(instance=instance_id(), started_at__lt=own_before)
    return active.filter(gone).update(status=SessionRecord.Status.FAILED, ended_at=timezone.now())


def instance_stopped(started):
    """Graceful shutdown, once every session of this process (which started at `started`) has ended and
    recorded its end: a row of this process still active is a session whose end could not be recorded, and
    the shutdown ended it. Returns how many rows were marked."""
    rows = SessionRecord.objects.filter(status=SessionRecord.Status.ACTIVE, instance=instance_id(), started_at__gte=started)
    return rows.update(status=SessionRecord.Status.TERMINATED, ended_at=timezone.now())


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
