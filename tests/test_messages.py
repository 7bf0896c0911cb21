"""The wire vocabulary (speech/stream/messages.py, events.py): every server event's JSON is today's, the generated
JSON Schema and OpenAPI documents are served through the API handler, and the schema of session.config
has the contract's fields (docs/protocol.md, session.config fields)."""

from __future__ import annotations

import json

import pytest
from asgiref.testing import ApplicationCommunicator

from speech.stream import events, messages
from speech.stream.errors import SpeechError, server_error
from speech.stream.messages import Limits
from speech.web.apihandler import APIHandler, PathRouter

SID = "speech_ws_0123456789abcdef0123456789abcdef"
LIMITS = Limits(
    config_timeout_s=10.0,
    idle_timeout_s=60.0,
    max_config_bytes=65536,
    max_message_bytes=65536,
    max_pending_chars=20000,
    max_segment_chars=4096,
)

# The contract's session.config fields in its table's order, with their raw JSON types.
CONTRACT_FIELDS = {
    "model": ["string"],
    "voice": ["string"],
    "speaker": ["string"],
    "response_format": ["string"],
    "sample_rate": ["integer"],
    "speed": ["integer", "number"],
    "stream_audio": ["boolean"],
    "split_granularity": ["string"],
    "timestamps": ["string"],
    "language": ["string"],
    "instructions": ["string"],
    "ref_audio": ["string"],
    "ref_text": ["string"],
    "temperature": ["integer", "number"],
    "top_p": ["integer", "number"],
    "top_k": ["integer"],
    "repetition_penalty": ["integer", "number"],
    "max_new_tokens": ["integer"],
    "seed": ["integer"],
}


class Caps:
    name = "fake"


class Config:
    response_format, stream_audio, split_granularity, sample_rate, voice = "pcm", True, "clause", 16000, "alt"


EVENTS = [
    (
        events.SessionConfigured.of(SID, Config, Caps, LIMITS),
        {
            "type": "session.configured",
            "session_id": SID,
            "response_format": "pcm",
            "stream_audio": True,
            "split_granularity": "clause",
            "sample_rate": 16000,
            "voice": "alt",
            "engine": "fake",
            "limits": {
                "config_timeout_s": 10.0,
                "idle_timeout_s": 60.0,
                "max_config_bytes": 65536,
                "max_message_bytes": 65536,
                "max_pending_chars": 20000,
                "max_segment_chars": 4096,
                "max_contexts": 32,
            },
        },
    ),
    (
        events.InputCommitted(session_id=SID, segment_index=2, segment_sentences=1, total_sentences=5),
        {"type": "input.committed", "session_id": SID, "segment_index": 2, "segment_sentences": 1, "total_sentences": 5},
    ),
    (
        events.InputCancelled(
            session_id=SID,
            cancelled_sentences=3,
            total_sentences=4,
            origin="server",
            played_ms=1250.0,
            played_ms_source="estimate",
            spoken_text="Hello there.",
            unspoken_text="How are you?",
        ),
        {
            "type": "input.cancelled",
            "session_id": SID,
            "cancelled_sentences": 3,
            "total_sentences": 4,
            "origin": "server",
            "played_ms": 1250.0,
            "played_ms_source": "estimate",
            "spoken_text": "Hello there.",
            "unspoken_text": "How are you?",
        },
    ),
    (
        events.InputCommitted(session_id=SID, context_id="turn-2", segment_index=0, segment_sentences=1, total_sentences=1),
        {
            "type": "input.committed",
            "session_id": SID,
            "context_id": "turn-2",
            "segment_index": 0,
            "segment_sentences": 1,
            "total_sentences": 1,
        },
    ),
    (
        events.AudioTimestamps(
            id=f"{SID}-3",
            sentence_index=3,
            context_id="turn-2",
            words=[events.Word(word="Hi", start_ms=0, end_ms=180, char_start=0, char_end=2)],
            estimated=True,
        ),
        {
            "type": "audio.timestamps",
            "id": f"{SID}-3",
            "sentence_index": 3,
            "context_id": "turn-2",
            "words": [{"word": "Hi", "start_ms": 0, "end_ms": 180, "char_start": 0, "char_end": 2}],
            "estimated": True,
        },
    ),
    (
        events.AudioTimestamps(
            id=f"{SID}-0", sentence_index=0, words=[events.Word(word="Hi", start_ms=0, end_ms=180, char_start=0, char_end=2)]
        ),
        {
            "type": "audio.timestamps",
            "id": f"{SID}-0",
            "sentence_index": 0,
            "words": [{"word": "Hi", "start_ms": 0, "end_ms": 180, "char_start": 0, "char_end": 2}],
        },
    ),
    (
        events.ContextDone(context_id="turn-2", total_sentences=2),
        {"type": "context.done", "context_id": "turn-2", "total_sentences": 2},
    ),
    (events.SessionDone(session_id=SID, total_sentences=7), {"type": "session.done", "session_id": SID, "total_sentences": 7}),
    (
        events.AudioStart(id=f"{SID}-0", sentence_index=0, sentence_text="Hi.", format="wav", sample_rate=24000),
        {
            "type": "audio.start",
            "id": f"{SID}-0",
            "sentence_index": 0,
            "sentence_text": "Hi.",
            "format": "wav",
            "sample_rate": 24000,
        },
    ),
    (
        events.AudioDone(id=f"{SID}-1", sentence_index=1, total_bytes=9600, error=False, cancelled=True),
        {"type": "audio.done", "id": f"{SID}-1", "sentence_index": 1, "total_bytes": 9600, "error": False, "cancelled": True},
    ),
]


@pytest.mark.parametrize("event,expected", EVENTS, ids=[e["type"] for _, e in EVENTS])
def test_every_event_serialises_to_todays_json(event, expected):
    assert json.dumps(event.dump()) == json.dumps(expected)  # same keys in the same order
    assert type(event).model_validate(event.dump()) == event


@pytest.mark.parametrize(
    "error,extra,expected",
    [
        (
            SpeechError("speed must be between 0.25 and 4.0", param="speed", close_code=4008),
            {},
            {
                "type": "error",
                "message": "speed must be between 0.25 and 4.0",
                "error_type": "BadRequestError",
                "param": "speed",
                "code": 400,
            },
        ),
        (
            server_error("speech synthesis failed"),
            {"id": f"{SID}-2", "sentence_index": 2, "partial_audio": None},
            {
                "type": "error",
                "message": "speech synthesis failed",
                "error_type": "server_error",
                "id": f"{SID}-2",
                "sentence_index": 2,
            },
        ),
        (
            server_error("speech synthesis failed"),
            {"id": f"{SID}-2", "sentence_index": 2, "partial_audio": True},
            {
                "type": "error",
                "message": "speech synthesis failed",
                "error_type": "server_error",
                "id": f"{SID}-2",
                "sentence_index": 2,
                "partial_audio": True,
            },
        ),
    ],
    ids=["param-and-code", "segment", "segment-partial"],
)
def test_error_events_leave_out_what_is_not_set(error, extra, expected):
    assert json.dumps(error.event(**extra)) == json.dumps(expected)


def test_rest_error_envelope_keeps_a_null_param():
    assert events.RestError.of(404, "not found", type="not_found_error").dump() == {
        "error": {"message": "not found", "type": "not_found_error", "param": None, "code": 404}
    }


def test_the_session_config_schema_has_the_contracts_fields_in_order():
    schema = messages.SessionFields.model_json_schema()
    properties = schema["properties"]
    assert list(properties) == list(CONTRACT_FIELDS)
    for name, kinds in CONTRACT_FIELDS.items():
        assert [option["type"] for option in properties[name]["anyOf"]] == [*kinds, "null"], name
    assert schema.get("required", []) == []


def test_input_text_reads_only_strings():
    assert messages.InputText.read({"type": "input.text", "text": "Hi."}).text == "Hi."
    with pytest.raises(SpeechError) as info:
        messages.InputText.read({"type": "input.text", "text": 5}, close_code=None)
    assert (info.value.message, info.value.param, info.value.fatal) == ("input.text text must be a string", "text", False)


async def not_the_site(scope, receive, send):
    raise AssertionError(f"{scope['path']} went to the browser stack, not the API handler")


async def get(path):
    """GET through the project's path router and lean API handler (as ttsproject/asgi.py wires them;
    importing that module would warm the engine up)."""
    application = PathRouter(api=APIHandler(), site=not_the_site)
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
        "root_path": "",
    }
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(10)
    body = b""
    while True:
        message = await app.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await app.wait(10)
    return start["status"], dict(start["headers"]), json.loads(body)


async def test_openapi_document_is_served_with_every_rest_path():
    status, headers, document = await get("/v1/openapi.json")
    assert status == 200 and headers[b"Content-Type"] == b"application/json"
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) >= {
        "/v1/audio/speech",
        "/v1/audio/voices",
        "/v1/audio/voices/{name}",
        "/v1/audio/speech/tokens",
        "/v1/audio/speech/sessions/{session_id}/cancel",
        "/v1/audio/speech/sessions/{session_id}",
        "/healthz",
        "/health",
        "/v1/openapi.json",
        "/v1/audio/speech/stream/schema.json",
    }
    speech = document["paths"]["/v1/audio/speech"]["post"]
    assert speech["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SpeechRequest"}
    body = document["components"]["schemas"]["SpeechRequest"]
    assert list(body["properties"]) == ["input", "stream", "stream_format", *CONTRACT_FIELDS]
    assert body["required"] == ["input"]
    assert speech["responses"]["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/RestError"}
    assert set(document["paths"]["/v1/audio/speech/sessions/{session_id}"]) == {"delete"}


async def test_websocket_schema_is_served_with_every_message():
    status, _, schema = await get("/v1/audio/speech/stream/schema.json")
    assert status == 200
    defs = schema["$defs"]
    client = [ref["$ref"].rsplit("/", 1)[1] for ref in defs["ClientMessage"]["oneOf"]]
    server = [ref["$ref"].rsplit("/", 1)[1] for ref in defs["ServerEvent"]["oneOf"]]
    types = {name: defs[name]["properties"]["type"]["const"] for name in client + server}
    assert sorted(types[name] for name in client) == sorted(
        ["session.config", "input.text", "input.commit", "input.cancel", "session.keepalive", "input.done"]
    )
    assert sorted(types[name] for name in server) == sorted(
        [
            "session.configured",
            "input.committed",
            "input.cancelled",
            "session.done",
            "audio.start",
            "audio.timestamps",
            "audio.done",
            "context.done",
            "error",
        ]
    )
    config = defs["SessionConfigMessage"]
    assert set(config["properties"]) == {"type", "session", *CONTRACT_FIELDS}
    assert config["properties"]["session"]["anyOf"][0] == {"$ref": "#/$defs/SessionFields"}
