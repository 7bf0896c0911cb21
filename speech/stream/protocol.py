"""The wire protocol's framing: a client frame's JSON, size limits, and reading session.config
(through the models of messages.py, which hold the field rules of docs/protocol.md) with the
uploaded voices looked up.
"""

from __future__ import annotations

import asyncio
import json

from . import messages
from .errors import CLOSE_POLICY, CLOSE_TOO_BIG, SpeechError

# The vocabulary lives in messages.py; these names stay importable from here for the checks and tests.
SAMPLE_RATES, SPEED_MIN, SPEED_MAX = messages.SAMPLE_RATES, messages.SPEED_MIN, messages.SPEED_MAX
Limits, SessionConfig, UnknownVoice = messages.Limits, messages.SessionConfig, messages.UnknownVoice


def utf8_length_exceeds(text, limit):
    """True when text's UTF-8 encoding is longer than limit, without encoding when length decides."""
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


def parse_message(raw, *, handshake=False):
    """A client frame's JSON object; SpeechError (fatal during the handshake) otherwise."""
    close = CLOSE_POLICY if handshake else None
    try:
        payload = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        detail = "nested too deeply"
    except json.JSONDecodeError as exc:
        detail = exc.msg
    except ValueError as exc:  # e.g. an integer longer than Python converts
        detail = str(exc)
    else:
        if not isinstance(payload, dict):
            raise SpeechError("speech WebSocket messages must be JSON objects", close_code=close)
        return payload
    raise SpeechError(f"speech WebSocket message is not valid JSON: {detail}", close_code=close)


async def parse_in_thread(raw):
    """parse_message for a large handshake, in a thread: the loop stays free. (The server's
    consumer passes a version that also reserves memory first: speech/web/budget.py.)"""
    return await asyncio.to_thread(parse_message, raw, handshake=True)


def _reject_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def size_error(kind, limit, *, handshake=False):
    return SpeechError(f"{kind} WebSocket message exceeds {limit} bytes", close_code=CLOSE_TOO_BIG if handshake else None)


async def resolve_fields(payload, capabilities, find_voice=None, model=messages.SessionFields, **context):
    """`payload` read as `model` (messages.read_fields), looking a voice the engine does not list up
    among the uploaded voices (`find_voice`: async name -> ReferenceVoice | None). An engine with an
    open voice set (`any_voice`) gets a name that is not an uploaded voice passed on as it is."""
    try:
        return messages.read_fields(payload, model, capabilities=capabilities, **context)
    except UnknownVoice as unknown:
        reference = await find_voice(unknown.requested) if find_voice else None
        if reference is None and not capabilities.any_voice:
            raise
        return messages.read_fields(payload, model, capabilities=capabilities, reference=reference,
                                    voice_checked=True, **context)


async def resolve_config(payload, capabilities, find_voice=None):
    """session.config -> SessionConfig for this engine, uploaded voices included (resolve_fields)."""
    return (await resolve_fields(payload, capabilities, find_voice)).config


def parse_config(payload, capabilities, reference=None, *, voice_checked=False):
    """session.config (nested or flat) -> SessionConfig for this engine; fatal SpeechError otherwise.

    `reference` is the uploaded voice found for a name that is not one of the engine's own;
    `voice_checked` says the uploaded voices were searched for it."""
    return messages.read_fields(payload, capabilities=capabilities, reference=reference,
                                voice_checked=voice_checked).config
