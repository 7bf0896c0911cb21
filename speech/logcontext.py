"""The session a log record belongs to, on every record logged while that session's code runs.

A session binds its id to a context variable when it is created (in the consumer's task).
asyncio copies the context into every task created from there (the pipeline's producers and
delivery), so each of their records carries the id too, without passing it around. The filter sits
on the console handler, so records of every logger (Django's, daphne's, ours) get it.
"""

import contextvars
import logging

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

_session_id = contextvars.ContextVar("speech_session_id", default=None)


def bind(session_id):
    """Records logged from now on in this context (and tasks created from it) carry session_id."""
    _session_id.set(session_id)


def current():
    return _session_id.get()


class SessionFilter(logging.Filter):
    """Adds `session_id` (None outside a session) and `session` (the id, or "-") to a record."""

    def filter(self, record):
        session_id = _session_id.get()
        record.session_id = session_id
        record.session = session_id or "-"
        return True


class JsonFormatter(_JsonFormatter):
    """python-json-logger's formatter, one JSON object a line; the plain format's `session` field
    is left out (JSON has `session_id`, null outside a session)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("reserved_attrs", [*RESERVED_ATTRS, "session"])
        super().__init__(*args, **kwargs)
