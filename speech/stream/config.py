"""What a session is configured with (docs/protocol.md, session.config fields): the contract's
vocabulary of values, the SessionConfig a handshake resolves to, the session's Limits, and how a
voice name resolves for an engine. The fields are read by the models of messages.py
(`messages.read_config`), whose value rules use what is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import CLOSE_POLICY, SpeechError, fatal

if TYPE_CHECKING:  # for the annotations only: the stream core imports nothing of Django at run time
    from .engine import Capabilities, ReferenceVoice

SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
TELEPHONY_FORMATS, TELEPHONY_RATE = ("mulaw", "alaw"), 8000  # G.711 defaults to the telephone rate
GRANULARITIES = ("clause", "sentence")
TIMESTAMPS = ("none", "word")
SPEED_MIN, SPEED_MAX = 0.25, 4.0
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
FORWARDED = (
    "model",
    "language",
    "instructions",
    "ref_audio",
    "ref_text",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "max_new_tokens",
    "seed",
)


@dataclass(frozen=True)
class Limits:
    """The session's limits, as session.configured reports them."""

    config_timeout_s: float
    idle_timeout_s: float
    max_config_bytes: int
    max_message_bytes: int
    max_pending_chars: int
    max_segment_chars: int
    max_contexts: int = 32


@dataclass(frozen=True)
class SessionConfig:
    """A session's configuration once read and resolved against the engine (not a wire message)."""

    voice: str
    response_format: str = "pcm"
    sample_rate: int = 24000
    speed: float = 1.0
    stream_audio: bool = False
    split_granularity: str = "sentence"
    timestamps: bool = False  # `audio.timestamps` before each segment's audio (timestamps: "word")
    options: dict[str, Any] = field(default_factory=dict)  # forwarded to the engine
    reference: Any = None  # an uploaded voice (speech.stream.engine.ReferenceVoice) for engines that clone


class UnknownVoice(SpeechError):
    """Not a voice of the engine: the caller may look for an uploaded voice of that name."""

    def __init__(self, requested: str, capabilities: Capabilities) -> None:
        super().__init__(
            f"Unknown voice '{requested}'. Supported voices: {', '.join(capabilities.voices)}",
            param="voice",
            close_code=CLOSE_POLICY,
        )
        self.requested = requested


def engine_voice(name: str, caps: Capabilities) -> str | None:
    """The engine's own spelling of `name` (its default for `default`), ignoring case and outer spaces."""
    wanted = name.strip().lower()
    if wanted == "default":
        return caps.default_voice
    return next((voice for voice in caps.voices if voice.lower() == wanted), None)


def resolve_voice(
    requested: str | None,
    caps: Capabilities,
    reference: ReferenceVoice | None,
    voice_checked: bool,
    aliases: Mapping[str, str],
) -> str:
    """An engine voice, else an uploaded one (`reference`, found by the caller for the name or for its
    alias's target), else an alias (SPEECH_VOICE_ALIASES: alias -> voice), so that an alias never hides
    a voice of the same name; an engine with an open voice set takes any other name as it is."""
    if requested is None:
        return caps.default_voice
    own = engine_voice(requested, caps)
    if own is not None:
        return own
    if reference is not None:
        if not caps.reference_audio:
            raise fatal(f"voice '{requested}' needs an engine with reference audio; engine '{caps.name}' has none", "voice")
        return reference.name
    if not voice_checked:
        raise UnknownVoice(requested, caps)  # the caller looks among the uploaded voices, then reads again
    target = aliases.get(requested.strip().lower())
    aliased = engine_voice(target, caps) if target is not None else None
    if aliased is not None:
        return aliased
    if caps.any_voice:
        return (target or requested).strip()
    raise UnknownVoice(requested, caps)
