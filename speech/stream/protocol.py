"""The wire protocol's messages: limits, the session.config handshake, and event builders.

Config checking follows docs/protocol.md ("session.config fields"): raw JSON types are checked
first, for every field in the table's order, before any value is coerced or compared; the first
failure wins.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from ..audio.codecs import FORMATS, RAW_FORMATS, output_rate
from .errors import CLOSE_POLICY, CLOSE_TOO_BIG, SpeechError, fatal

SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
TELEPHONY_FORMATS, TELEPHONY_RATE = ("mulaw", "alaw"), 8000  # G.711 defaults to the telephone rate
GRANULARITIES = ("clause", "sentence")
SPEED_MIN, SPEED_MAX = 0.25, 4.0

# Field -> raw JSON type, in the order of the fields table in docs/protocol.md.
STRING, INTEGER, NUMBER, BOOLEAN = "a string", "an integer", "a number", "a boolean"
FIELD_TYPES = {
    "model": STRING,
    "voice": STRING,
    "speaker": STRING,
    "response_format": STRING,
    "sample_rate": INTEGER,
    "speed": NUMBER,
    "stream_audio": BOOLEAN,
    "split_granularity": STRING,
    "language": STRING,
    "instructions": STRING,
    "ref_audio": STRING,
    "ref_text": STRING,
    "temperature": NUMBER,
    "top_p": NUMBER,
    "top_k": INTEGER,
    "repetition_penalty": NUMBER,
    "max_new_tokens": INTEGER,
    "seed": INTEGER,
}
# Ranges of the forwarded sampling options: what every engine can use. Hibari seeds numpy's
# generator (negative seeds raise); sglang-omni and vLLM-omni refuse temperature < 0, top_p outside
# (0, 1], top_k other than -1 or >= 1, repetition_penalty outside (0, 2] (sglang) and max_tokens < 1;
# torch seeds are at most 64 bits and sglang keeps top_k and token counts in int32. The temperature
# cap is OpenAI's documented 0..2 (it also refuses 1e400, which JSON parses to infinity).
INT32_MAX, UINT64_MAX = 2**31 - 1, 2**64 - 1
OPTION_RANGES = (
    ("temperature", lambda v: 0 <= v <= 2, "temperature must be between 0 and 2"),
    ("top_p", lambda v: 0 < v <= 1, "top_p must be greater than 0 and at most 1"),
    ("top_k", lambda v: v == -1 or 1 <= v <= INT32_MAX, f"top_k must be -1 or between 1 and {INT32_MAX}"),
    ("repetition_penalty", lambda v: 0 < v <= 2, "repetition_penalty must be greater than 0 and at most 2"),
    ("max_new_tokens", lambda v: 1 <= v <= INT32_MAX, f"max_new_tokens must be between 1 and {INT32_MAX}"),
    ("seed", lambda v: 0 <= v <= UINT64_MAX, f"seed must be between 0 and {UINT64_MAX}"),
)
FORWARDED = ("model", "language", "instructions", "ref_audio", "ref_text", "temperature", "top_p", "top_k",
             "repetition_penalty", "max_new_tokens", "seed")


def _has_type(value, kind):
    if kind == STRING:
        return isinstance(value, str)
    if kind == BOOLEAN:
        return isinstance(value, bool)
    if isinstance(value, bool):  # booleans are not numbers
        return False
    if kind == INTEGER:
        return isinstance(value, int)
    return isinstance(value, (int, float))


@dataclass(frozen=True)
class Limits:
    config_timeout_s: float
    idle_timeout_s: float
    max_config_bytes: int
    max_message_bytes: int
    max_pending_chars: int
    max_segment_chars: int

    def as_event(self):
        return {
            "config_timeout_s": self.config_timeout_s,
            "idle_timeout_s": self.idle_timeout_s,
            "max_config_bytes": self.max_config_bytes,
            "max_message_bytes": self.max_message_bytes,
            "max_pending_chars": self.max_pending_chars,
            "max_segment_chars": self.max_segment_chars,
        }


@dataclass(frozen=True)
class SessionConfig:
    voice: str
    response_format: str = "pcm"
    sample_rate: int = 24000
    speed: float = 1.0
    stream_audio: bool = False
    split_granularity: str = "sentence"
    options: dict[str, Any] = field(default_factory=dict)  # forwarded to the engine
    reference: Any = None  # an uploaded voice (speech.voices.ReferenceVoice) for engines that clone


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


class UnknownVoice(SpeechError):
    """Not a voice of the engine: the caller may look for an uploaded voice of that name."""

    def __init__(self, requested, capabilities):
        super().__init__(f"Unknown voice '{requested}'. Supported voices: {', '.join(capabilities.voices)}",
                         param="voice", close_code=CLOSE_POLICY)
        self.requested = requested


async def resolve_config(payload, capabilities, find_voice=None):
    """parse_config, looking a voice the engine does not list up among the uploaded voices
    (`find_voice`: async name -> ReferenceVoice | None). An engine with an open voice set
    (`any_voice`) gets a name that is not an uploaded voice passed on as it is."""
    try:
        return parse_config(payload, capabilities)
    except UnknownVoice as unknown:
        reference = await find_voice(unknown.requested) if find_voice else None
        if reference is None and not capabilities.any_voice:
            raise
        return parse_config(payload, capabilities, reference, voice_checked=True)


def parse_config(payload, capabilities, reference=None, *, voice_checked=False):
    """session.config (nested or flat) -> SessionConfig for this engine; fatal SpeechError otherwise.

    `reference` is the uploaded voice found for a name that is not one of the engine's own;
    `voice_checked` says the uploaded voices were searched for it."""
    raw = payload.get("session")
    if raw is None:
        raw = {key: value for key, value in payload.items() if key != "type"}
    elif not isinstance(raw, dict):
        raise fatal("session.config session must be an object", "session")
    present = {key: raw[key] for key in FIELD_TYPES if raw.get(key) is not None}
    for key, kind in FIELD_TYPES.items():
        if key in present and not _has_type(present[key], kind):
            raise fatal(f"{key} must be {kind}", key)

    caps = capabilities
    voice = _resolve_voice(present.get("voice", present.get("speaker")), caps, reference, voice_checked)

    fmt = present.get("response_format", "pcm").strip().lower()
    if fmt not in FORMATS:
        raise fatal(f"response_format must be one of: {', '.join(FORMATS)}", "response_format")

    rate = present.get("sample_rate", TELEPHONY_RATE if fmt in TELEPHONY_FORMATS else caps.sample_rate)
    if rate not in SAMPLE_RATES:
        raise fatal(f"sample_rate must be one of: {', '.join(map(str, SAMPLE_RATES))}", "sample_rate")

    speed = present.get("speed", 1.0)
    if not SPEED_MIN <= speed <= SPEED_MAX:  # compared before float(): a huge integer must not overflow
        raise fatal("speed must be between 0.25 and 4.0", "speed")
    speed = float(speed)

    stream_audio = present.get("stream_audio", False)
    if stream_audio and fmt not in RAW_FORMATS:
        raise fatal("stream_audio=true requires a raw response_format (pcm, mulaw, alaw)", "response_format")

    granularity = present.get("split_granularity", "sentence")
    if granularity not in GRANULARITIES:
        raise fatal(f"split_granularity must be one of: {', '.join(GRANULARITIES)}", "split_granularity")

    if "ref_audio" in present and not caps.reference_audio:
        raise fatal(f"ref_audio is not supported by engine '{caps.name}'", "ref_audio")
    if "instructions" in present and not caps.instructions:
        raise fatal(f"instructions is not supported by engine '{caps.name}'", "instructions")
    for key, allowed, message in OPTION_RANGES:
        if key in present and not allowed(present[key]):
            raise fatal(message, key)

    return SessionConfig(
        voice=voice,
        response_format=fmt,
        sample_rate=output_rate(fmt, rate),
        speed=speed,
        stream_audio=stream_audio,
        split_granularity=granularity,
        options={key: present[key] for key in FORWARDED if key in present},
        reference=reference,
    )


def _resolve_voice(requested, caps, reference, voice_checked):
    if requested is None or requested.strip().lower() == "default":
        return caps.default_voice
    for name in caps.voices:
        if name.lower() == requested.strip().lower():
            return name
    if reference is None:
        if caps.any_voice and voice_checked:
            return requested.strip()
        raise UnknownVoice(requested, caps)
    if not caps.reference_audio:
        raise fatal(f"voice '{requested}' needs an engine with reference audio; engine '{caps.name}' has none", "voice")
    return reference.name


def configured_event(session_id, config, capabilities, limits):
    return {
        "type": "session.configured",
        "session_id": session_id,
        "response_format": config.response_format,
        "stream_audio": config.stream_audio,
        "split_granularity": config.split_granularity,
        "sample_rate": config.sample_rate,
        "voice": config.voice,
        "engine": capabilities.name,
        "limits": limits.as_event(),
    }
