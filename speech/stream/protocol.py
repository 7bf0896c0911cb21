"""The wire protocol's framing: a client frame's JSON, size limits, and reading session.config
(through the models of messages.py, which hold the field rules of docs/protocol.md) with the
uploaded voices looked up.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from . import messages
from .errors import CLOSE_POLICY, CLOSE_TOO_BIG, SpeechError

if TYPE_CHECKING:  # for the annotations only: the stream core imports nothing of Django at run time
    from ..engines.base import Capabilities
    from ..voices import ReferenceVoice

    FindVoice = Callable[[str], Awaitable[ReferenceVoice | None]]  # an uploaded voice by name

# The vocabulary lives in messages.py; these names stay importable from here for the checks and tests.
SAMPLE_RATES, SPEED_MIN, SPEED_MAX = messages.SAMPLE_RATES, messages.SPEED_MIN, messages.SPEED_MAX
Limits, SessionConfig, UnknownVoice = messages.Limits, messages.SessionConfig, messages.UnknownVoice


def utf8_length_exceeds(text: str, limit: int) -> bool:
    """True when text's UTF-8 encoding is longer than limit, without encoding when length decides."""
    if len(text) > limit:
        return True
    if len(text) * 4 <= limit:
        return False
    return len(text.encode("utf-8", "surrogatepass")) > limit


def parse_message(raw: str, *, handshake: bool = False) -> dict[str, Any]:
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


async def parse_in_thread(raw: str) -> dict[str, Any]:
    """parse_message for a large handshake, in a thread: the loop stays free. (The server's
    consumer passes a version that also reserves memory first: speech/server/budget.py.)"""
    return await asyncio.to_thread(parse_message, raw, handshake=True)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def size_error(kind: str, limit: int, *, handshake: bool = False) -> SpeechError:
    return SpeechError(f"{kind} WebSocket message exceeds {limit} bytes", close_code=CLOSE_TOO_BIG if handshake else None)


async def resolve_fields(
    payload: dict[str, Any],
    capabilities: Capabilities,
    find_voice: FindVoice | None = None,
    model: type[messages.SessionFields] = messages.SessionFields,
    **context: Any,
) -> messages.SessionFields:
    """`payload` read as `model` (messages.read_fields), looking a voice the engine does not list up
    among the uploaded voices (`find_voice`: async name -> ReferenceVoice | None), then among the
    aliases (context `voice_aliases`: lower-cased alias -> voice, which may be an uploaded voice). An
    engine with an open voice set (`any_voice`) gets any other name passed on as it is."""
    try:
        return messages.read_fields(payload, model, capabilities=capabilities, **context)
    except UnknownVoice as unknown:
        reference = await find_voice(unknown.requested) if find_voice else None
        target = (context.get("voice_aliases") or {}).get(unknown.requested.strip().lower())
        if reference is None and find_voice and target and messages.engine_voice(target, capabilities) is None:
            reference = await find_voice(target)
        return messages.read_fields(payload, model, capabilities=capabilities, reference=reference, voice_checked=True, **context)


async def resolve_config(
    payload: dict[str, Any],
    capabilities: Capabilities,
    find_voice: FindVoice | None = None,
    voice_aliases: Mapping[str, str] | None = None,
) -> messages.SessionConfig:
    """session.config -> SessionConfig for this engine, uploaded voices and aliases included (resolve_fields)."""
    return (await resolve_fields(payload, capabilities, find_voice, voice_aliases=voice_aliases)).config


def parse_config(
    payload: dict[str, Any], capabilities: Capabilities, reference: ReferenceVoice | None = None, *, voice_checked: bool = False
) -> messages.SessionConfig:
    """session.config (nested or flat) -> SessionConfig for this engine; fatal SpeechError otherwise.

    `reference` is the uploaded voice found for a name that is not one of the engine's own;
    `voice_checked` says the uploaded voices were searched for it."""
    return messages.read_fields(payload, capabilities=capabilities, reference=reference, voice_checked=voice_checked).config
