"""What clients send, as pydantic models: every client message of the WebSocket and the REST request
body of `POST /v1/audio/speech` (docs/protocol.md), with the handshake's field and value rules (on the
vocabulary of config.py); `read_config` is the one way to read a handshake or a request body. What
the server sends is events.py. The session and the REST views read client input only through this
module; the JSON Schema of the WebSocket messages and the OpenAPI document (speech/web/openapi.py)
are generated from the two.

Reading the handshake keeps the contract of docs/protocol.md ("session.config fields"): the models
are strict (no coercion: booleans are not numbers, 24000.0 is not an integer), every field's raw JSON
type is checked in the table's order before any value rule runs, the first failure wins, and its
message is the product's (`<field> must be a string`, ...), mapped from pydantic's error by field and
error type. The value rules run in an after-validator and raise the product's own SpeechError, which
pydantic lets through unchanged (it wraps only ValueError and AssertionError).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..audio.codecs import FORMATS, RAW_FORMATS, STREAMABLE_FORMATS, output_rate
from .config import (
    FORWARDED,
    GRANULARITIES,
    OPTION_RANGES,
    SAMPLE_RATES,
    SPEED_MAX,
    SPEED_MIN,
    TELEPHONY_FORMATS,
    TELEPHONY_RATE,
    TIMESTAMPS,
    SessionConfig,
    UnknownVoice,
    engine_voice,
    resolve_voice,
)
from .errors import CLOSE_POLICY, SpeechError, fatal

if TYPE_CHECKING:  # for the annotations only: the stream core imports nothing of Django at run time
    from .engine import Capabilities, ReferenceVoice

    FindVoice = Callable[[str], Awaitable[ReferenceVoice | None]]  # an uploaded voice by name

# pydantic's type errors -> the contract's words. A number is StrictInt | StrictFloat, whose error
# names the union's member in its location: any error at such a location means "a number".
TYPE_WORDS = {"string_type": "a string", "int_type": "an integer", "bool_type": "a boolean"}
Number = StrictInt | StrictFloat


class Message(BaseModel):
    """A client message: strict (no coercion), unknown keys ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    # Messages for errors on a field that are not "<field> must be <type>".
    field_messages: ClassVar[dict[str, str]] = {}

    @classmethod
    def read(cls, data: Any, *, context: dict[str, Any] | None = None, close_code: int | None = CLOSE_POLICY) -> Self:
        """The validated model; the first failure as the product's SpeechError otherwise."""
        try:
            return cls.model_validate(data, context=context)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
            name = str(first["loc"][0]) if first["loc"] else None  # a field name: the models hold no lists
            message = cls.field_messages.get(name or "")
            if message is None:
                words = "a number" if len(first["loc"]) > 1 else TYPE_WORDS.get(first["type"], "valid")
                message = f"{name} must be {words}"
            raise SpeechError(message, param=name, close_code=close_code) from None


# -- client messages --------------------------------------------------------------------------------


class SessionFields(Message):
    """The fields of session.config, in the order of the fields table (the order of the type checks)."""

    model: StrictStr | None = None
    voice: StrictStr | None = None
    speaker: StrictStr | None = None  # another name for voice
    response_format: StrictStr | None = None
    sample_rate: StrictInt | None = None
    speed: Number | None = None
    stream_audio: StrictBool | None = None
    split_granularity: StrictStr | None = None
    timestamps: StrictStr | None = None
    language: StrictStr | None = None
    instructions: StrictStr | None = None
    ref_audio: StrictStr | None = None
    ref_text: StrictStr | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    repetition_penalty: Number | None = None
    max_new_tokens: StrictInt | None = None
    seed: StrictInt | None = None

    _config: SessionConfig | None = PrivateAttr(None)

    @property
    def config(self) -> SessionConfig:
        """The configuration the value rules resolved (validation context `capabilities` required)."""
        return self._config  # type: ignore[return-value]  # set by the value rules of every read

    @model_validator(mode="after")
    def _value_rules(self, info: ValidationInfo) -> Self:
        context = info.context or {}
        self._check_values(context)
        return self

    def _default_format(self) -> str:
        return "pcm"  # the WebSocket's, as the contract says

    def _check_values(self, context: dict[str, Any]) -> None:
        """The value rules in the contract's order; the engine's capabilities come in the context,
        with `reference` (an uploaded voice found for the name) and `voice_checked` (they were searched)."""
        caps, reference = context["capabilities"], context.get("reference")
        voice = resolve_voice(
            self.voice if self.voice is not None else self.speaker,
            caps,
            reference,
            context.get("voice_checked", False),
            context.get("voice_aliases") or {},
        )

        fmt = (self._default_format() if self.response_format is None else self.response_format).strip().lower()
        if fmt not in FORMATS:
            raise fatal(f"response_format must be one of: {', '.join(FORMATS)}", "response_format")

        rate = self.sample_rate
        if rate is None:
            rate = TELEPHONY_RATE if fmt in TELEPHONY_FORMATS else caps.sample_rate
        if rate not in SAMPLE_RATES:
            raise fatal(f"sample_rate must be one of: {', '.join(map(str, SAMPLE_RATES))}", "sample_rate")

        speed = 1.0 if self.speed is None else self.speed
        if not SPEED_MIN <= speed <= SPEED_MAX:  # compared before float(): a huge integer must not overflow
            raise fatal("speed must be between 0.25 and 4.0", "speed")

        stream_audio = bool(self.stream_audio)
        if stream_audio and fmt not in STREAMABLE_FORMATS:
            raise fatal(
                f"stream_audio=true requires a streamable response_format ({', '.join(STREAMABLE_FORMATS)})", "response_format"
            )

        granularity = "sentence" if self.split_granularity is None else self.split_granularity
        if granularity not in GRANULARITIES:
            raise fatal(f"split_granularity must be one of: {', '.join(GRANULARITIES)}", "split_granularity")

        timestamps = "none" if self.timestamps is None else self.timestamps
        if timestamps not in TIMESTAMPS:
            raise fatal(f"timestamps must be one of: {', '.join(TIMESTAMPS)}", "timestamps")

        if self.ref_audio is not None and not caps.reference_audio:
            raise fatal(f"ref_audio is not supported by engine '{caps.name}'", "ref_audio")
        if self.instructions is not None and not caps.instructions:
            raise fatal(f"instructions is not supported by engine '{caps.name}'", "instructions")
        for key, allowed, message in OPTION_RANGES:
            value = getattr(self, key)
            if value is not None and not allowed(value):
                raise fatal(message, key)

        self._config = SessionConfig(
            voice=voice,
            response_format=fmt,
            sample_rate=output_rate(fmt, rate),
            speed=float(speed),
            stream_audio=stream_audio,
            split_granularity=granularity,
            timestamps=timestamps == "word",
            options={key: getattr(self, key) for key in FORWARDED if getattr(self, key) is not None},
            reference=reference,
        )


class SessionConfigMessage(SessionFields):
    """The first message: the fields nested under `session`, or flat beside `type` (`session` absent or null)."""

    type: Literal["session.config"]
    session: SessionFields | None = None


async def read_config(
    payload: dict[str, Any],
    capabilities: Capabilities,
    find_voice: FindVoice | None = None,
    model: type[SessionFields] = SessionFields,
    **context: Any,
) -> SessionFields:
    """session.config's fields (nested or flat) read as `model` (the REST body: SpeechRequest), value
    rules included, for this engine; fatal SpeechError otherwise. The resolved SessionConfig is the
    result's `config`. A voice the engine does not list is looked up among the uploaded voices
    (`find_voice`: async name -> ReferenceVoice | None), then among the aliases (context
    `voice_aliases`: lower-cased alias -> voice, which may be an uploaded voice). An engine with an
    open voice set (`any_voice`) gets any other name passed on as it is."""
    try:
        return _read(payload, model, capabilities=capabilities, **context)
    except UnknownVoice as unknown:
        reference = await find_voice(unknown.requested) if find_voice else None
        target = (context.get("voice_aliases") or {}).get(unknown.requested.strip().lower())
        if reference is None and find_voice and target and engine_voice(target, capabilities) is None:
            reference = await find_voice(target)
        return _read(payload, model, capabilities=capabilities, reference=reference, voice_checked=True, **context)


def _read(payload: dict[str, Any], model: type[SessionFields], **context: Any) -> SessionFields:
    """One read of the fields, with the lookups done so far in `context`. A request model's own fields
    (`model.own_fields`) are read from the payload's top level."""
    raw = payload.get("session")
    if raw is None:
        raw = {key: value for key, value in payload.items() if key != "type"}
    elif not isinstance(raw, dict):
        raise fatal("session.config session must be an object", "session")
    else:
        own = getattr(model, "own_fields", ())
        raw = {**{k: v for k, v in raw.items() if k not in own}, **{k: payload[k] for k in own if k in payload}}
    return model.read(raw, context=context)


class ContextMessage(Message):
    """A message that may name a context (docs/protocol.md, contexts); none is the default context."""

    context_id: StrictStr | None = None

    field_messages: ClassVar[dict[str, str]] = {"context_id": "context_id must be a string"}

    @field_validator("context_id")
    @classmethod
    def _context_id_rule(cls, value: str | None) -> str | None:
        if value is not None and not CONTEXT_ID.fullmatch(value):
            raise SpeechError(CONTEXT_ID_MESSAGE, param="context_id")
        return value


CONTEXT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
CONTEXT_ID_MESSAGE = "context_id must be 1 to 64 letters, digits, '.', '_' or '-'"


class InputText(ContextMessage):
    """Text to speak; the segmenter cuts it into segments."""

    type: Literal["input.text"]
    text: StrictStr

    field_messages = {**ContextMessage.field_messages, "text": "input.text text must be a string"}


class InputCommit(ContextMessage):
    """Speak what is buffered now, even without a sentence end."""

    type: Literal["input.commit"]


class InputCancel(ContextMessage):
    """Barge-in: stop the current segment, drop the queued ones and the buffered text (of one context,
    or of all). `played_ms`: how much of the cancelled utterance's audio the client played."""

    type: Literal["input.cancel"]
    played_ms: Number | None = None

    field_messages = {**ContextMessage.field_messages, "played_ms": "played_ms must be a number"}

    @field_validator("played_ms")
    @classmethod
    def _played_rule(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value < float("inf"):
            raise SpeechError("played_ms must be at least 0", param="played_ms")
        return value


class SessionKeepalive(Message):
    """Resets the idle timer (as every frame does)."""

    type: Literal["session.keepalive"]


class InputDone(ContextMessage):
    """No more text: the buffered text is spoken, then session.done and close 1000; with a
    `context_id`, that context's text is spoken, then context.done, and the session goes on."""

    type: Literal["input.done"]


CLIENT_MESSAGES = (SessionConfigMessage, InputText, InputCommit, InputCancel, SessionKeepalive, InputDone)


# -- the REST request body ----------------------------------------------------------------------------


class SpeechOptions(Message):
    """`POST /v1/audio/speech`'s own fields, read (and checked) before the session.config fields."""

    input: StrictStr
    stream: StrictBool = False
    # OpenAI's stream_format: "audio" is raw audio as it is made (what upstream engines ask for); no SSE
    stream_format: Literal["audio"] | None = None

    own_fields: ClassVar[tuple[str, ...]] = ("input", "stream", "stream_format")
    field_messages = {
        "input": "input must be a non-empty string",
        "stream": "stream must be a boolean",
        "stream_format": "stream_format must be one of: audio",
    }

    @field_validator("input")
    @classmethod
    def _input_rules(cls, text: str, info: ValidationInfo) -> str:
        if not text.strip():
            raise SpeechError("input must be a non-empty string", param="input")
        limit = (info.context or {}).get("max_input_chars")
        if limit is not None and len(text) > limit:
            raise SpeechError(f"input must be at most {limit} characters", param="input")
        return text


class SpeechRequest(SessionFields, SpeechOptions):
    """The body of `POST /v1/audio/speech`: its own fields first (pydantic orders the fields of the
    bases from the last), then the session.config fields with the WebSocket's rules."""

    def _default_format(self) -> str:
        # OpenAI's default is mp3 (its clients save the body as speech.mp3); `stream: true` streams raw audio.
        return "pcm" if self.stream else "mp3"

    def _check_values(self, context: dict[str, Any]) -> None:
        super()._check_values(context)
        if self.stream_format == "audio" and self.config.response_format in RAW_FORMATS:
            self.stream = True
        if self.stream and self.config.response_format not in STREAMABLE_FORMATS:
            raise SpeechError(
                f"stream=true requires a streamable response_format ({', '.join(STREAMABLE_FORMATS)})", param="response_format"
            )
