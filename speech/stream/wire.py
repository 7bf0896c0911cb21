"""Client frames off the wire: a frame's JSON, size limits, the handshake's frame. What a frame means
is read by the models of messages.py (`messages.read_config` for session.config).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from .errors import CLOSE_POLICY, CLOSE_TOO_BIG, SpeechError, fatal

CONFIG_PARSE_OFFLOAD_BYTES = 1 << 20  # larger handshakes are parsed in a thread, within the memory budget


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


async def read_handshake(raw: str, limit: int, parse_large: Callable[[str], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """The first frame's JSON object, which must be session.config; fatal SpeechError otherwise. A frame
    over CONFIG_PARSE_OFFLOAD_BYTES is parsed by `parse_large` (parse_in_thread, or the server's)."""
    if utf8_length_exceeds(raw, limit):
        raise size_error("session", limit, handshake=True)
    payload = await parse_large(raw) if len(raw) > CONFIG_PARSE_OFFLOAD_BYTES else parse_message(raw, handshake=True)
    if payload.get("type") != "session.config":
        raise fatal("first WebSocket message must be session.config", "type")
    return payload


def read_frame(raw: str, limit: int) -> dict[str, Any]:
    """A later text frame's JSON object; SpeechError otherwise."""
    if utf8_length_exceeds(raw, limit):
        raise size_error("text", limit)
    return parse_message(raw)


def binary_frame_error(size: int, limit: int, *, handshake: bool) -> SpeechError:
    """Clients send text frames only: a binary one is refused, as too big first (fatal in the handshake)."""
    if size > limit:
        return size_error("session" if handshake else "text", limit, handshake=handshake)
    return SpeechError("speech WebSocket client messages must be text frames", close_code=CLOSE_POLICY if handshake else None)
