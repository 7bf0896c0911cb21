"""What the server sends, as pydantic models: every WebSocket event and the REST endpoints' error
envelope (docs/protocol.md). What clients send is messages.py. The session, the pipeline and the REST
views build events only through this module; `dump()` is the JSON object sent, fields in the model's
order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Self

from pydantic import BaseModel, ConfigDict

from .errors import BAD_REQUEST
from .config import Limits

if TYPE_CHECKING:  # for the annotations only
    from .config import SessionConfig
    from .engine import Capabilities


class Event(BaseModel):
    """A server event; `dump()` is the JSON object sent, with fields in this order."""

    model_config = ConfigDict(extra="forbid")

    def dump(self) -> dict:
        return self.model_dump()


class ContextEvent(Event):
    """An event about a context: `context_id` is sent only for a named context, so a client that uses
    none sees the events of docs/protocol.md's first release unchanged."""

    context_id: str | None = None

    def dump(self) -> dict:
        data = self.model_dump()
        context_id = data.pop("context_id")
        if context_id is None:
            return data
        after = "sentence_index" if "sentence_index" in data else "session_id"
        items = list(data.items())
        at = next(i for i, (key, _) in enumerate(items) if key == after) + 1
        return dict([*items[:at], ("context_id", context_id), *items[at:]])


class SessionConfigured(Event):
    type: Literal["session.configured"] = "session.configured"
    session_id: str
    response_format: str
    stream_audio: bool
    split_granularity: str
    sample_rate: int
    voice: str
    engine: str
    limits: Limits

    @classmethod
    def of(cls, session_id: str, config: SessionConfig, capabilities: Capabilities, limits: Limits) -> Self:
        return cls(
            session_id=session_id,
            response_format=config.response_format,
            stream_audio=config.stream_audio,
            split_granularity=config.split_granularity,
            sample_rate=config.sample_rate,
            voice=config.voice,
            engine=capabilities.name,
            limits=limits,
        )


class InputCommitted(ContextEvent):
    type: Literal["input.committed"] = "input.committed"
    session_id: str
    segment_index: int
    segment_sentences: int
    total_sentences: int


class InputCancelled(ContextEvent):
    """A cancel's answer, with what the listener heard of the utterance it cut (docs/protocol.md)."""

    type: Literal["input.cancelled"] = "input.cancelled"
    session_id: str
    cancelled_sentences: int
    total_sentences: int
    origin: Literal["client", "server"]
    played_ms: float
    played_ms_source: Literal["client", "estimate"]
    spoken_text: str
    unspoken_text: str


class ContextDone(Event):
    type: Literal["context.done"] = "context.done"
    context_id: str
    total_sentences: int


class SessionDone(Event):
    type: Literal["session.done"] = "session.done"
    session_id: str
    total_sentences: int


class AudioStart(ContextEvent):
    type: Literal["audio.start"] = "audio.start"
    id: str
    sentence_index: int
    sentence_text: str
    format: str
    sample_rate: int


class Word(BaseModel):
    """One word of `sentence_text`, as `audio.timestamps` lists it."""

    word: str
    start_ms: int
    end_ms: int
    char_start: int
    char_end: int


class AudioTimestamps(ContextEvent):
    """Words of a segment with their times in its audio as delivered, sent before that audio.
    `estimated` only when the engine could not align (then true)."""

    type: Literal["audio.timestamps"] = "audio.timestamps"
    id: str
    sentence_index: int
    words: list[Word]
    estimated: Literal[True] | None = None

    def dump(self) -> dict:
        data = super().dump()
        if data["estimated"] is None:
            del data["estimated"]
        return data


class AudioDone(ContextEvent):
    type: Literal["audio.done"] = "audio.done"
    id: str
    sentence_index: int
    total_bytes: int
    error: bool
    cancelled: bool


class ErrorEvent(Event):
    """`param` and `code` only when set; `id` and `sentence_index` only for a segment's error,
    `partial_audio` only when some of that segment's audio was sent."""

    type: Literal["error"] = "error"
    message: str
    error_type: str
    param: str | None = None
    code: int | None = None
    id: str | None = None
    sentence_index: int | None = None
    context_id: str | None = None
    partial_audio: Literal[True] | None = None

    def dump(self) -> dict:
        return self.model_dump(exclude_none=True)


SERVER_EVENTS = (
    SessionConfigured,
    InputCommitted,
    InputCancelled,
    SessionDone,
    AudioStart,
    AudioTimestamps,
    AudioDone,
    ContextDone,
    ErrorEvent,
)


# -- REST errors ------------------------------------------------------------------------------------------


class RestErrorDetail(Event):
    message: str
    type: str
    param: str | None  # null when no one field is at fault
    code: int  # the HTTP status


class RestError(Event):
    """The REST endpoints' error envelope (OpenAI's): `{"error": {message, type, param, code}}`."""

    error: RestErrorDetail

    @classmethod
    def of(cls, status: int, message: str, *, type: str = BAD_REQUEST, param: str | None = None) -> Self:
        return cls(error=RestErrorDetail(message=message, type=type, param=param, code=status))
