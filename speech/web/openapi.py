"""Machine-readable descriptions generated from the wire vocabulary (speech/stream/messages.py, events.py):
the JSON Schema of the WebSocket's messages (`GET /v1/audio/speech/stream/schema.json`) and the
OpenAPI 3.1 document of the REST API (`GET /v1/openapi.json`). Both are built once per process:
the models do not change while it runs.
"""

from __future__ import annotations

import functools

from django.http import JsonResponse
from pydantic.json_schema import models_json_schema

from ..audio.codecs import FORMATS, MEDIA_TYPES
from ..stream import events, messages

WEBSOCKET_PATH = "/v1/audio/speech/stream"
SCHEMA_PATH = "/v1/audio/speech/stream/schema.json"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _defs(models, ref_template):
    """Validation schemas of what the server reads, serialization schemas of what it sends."""
    read = {messages.SpeechRequest, *messages.CLIENT_MESSAGES}
    _, schema = models_json_schema(
        [(m, "validation" if m in read else "serialization") for m in models], ref_template=ref_template
    )
    return schema["$defs"]


def _one_of(models, template):
    return {"oneOf": [{"$ref": template.format(model=m.__name__)} for m in models]}


@functools.cache
def websocket_schema():
    """One JSON Schema (2020-12): a frame is a ClientMessage (client to server) or a ServerEvent."""
    template = "#/$defs/{model}"
    defs = _defs([*messages.CLIENT_MESSAGES, *events.SERVER_EVENTS], template)
    defs["ClientMessage"] = _one_of(messages.CLIENT_MESSAGES, template)
    defs["ServerEvent"] = _one_of(events.SERVER_EVENTS, template)
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": SCHEMA_PATH,
        "title": f"Speech WebSocket messages ({WEBSOCKET_PATH})",
        "description": "Text frames are JSON objects: ClientMessage from the client (session.config first), "
        "ServerEvent from the server; audio travels in binary frames (docs/protocol.md).",
        "oneOf": [{"$ref": "#/$defs/ClientMessage"}, {"$ref": "#/$defs/ServerEvent"}],
        "$defs": defs,
    }


def _json(ref):
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _errors(*statuses):
    return {
        str(status): {"description": description, "content": _json("RestError")}
        for status, description in (
            (400, "invalid request"),
            (401, "missing or unknown API key"),
            (403, "the API key lacks the scope (docs/security.md)"),
            (404, "not found"),
            (405, "method not allowed"),
            (413, "upload too large"),
            (429, "the API key is over its request rate (Retry-After)"),
            (503, "overloaded or unavailable"),
        )
        if status in statuses
    }


def _ok(status, description, content=None):
    response = {"description": description}
    if content is not None:
        response["content"] = content
    return {str(status): response}


AUDIO = {
    media: {"schema": {"type": "string", "contentMediaType": media}}
    for media in dict.fromkeys(media for fmt, media in MEDIA_TYPES.items() if fmt in FORMATS)
}
JSON_OBJECT = {"application/json": {"schema": {"type": "object"}}}
SESSION_ID = {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
VOICE_UPLOAD = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["name", "consent", "audio_sample"],
            "properties": {
                "name": {"type": "string"},
                "consent": {"type": "string"},
                "audio_sample": {"type": "string", "contentMediaType": "application/octet-stream"},
                "ref_text": {"type": "string"},
                "language": {"type": "string"},
            },
        }
    }
}


@functools.cache
def openapi_document():
    """OpenAPI 3.1 for the REST endpoints; the speech request body and the error envelope are the models'."""
    schemas = _defs([messages.SpeechRequest, events.RestError], "#/components/schemas/{model}")
    paths = {
        "/v1/audio/speech": {
            "post": {
                "summary": "One-shot speech (OpenAI-compatible): the session.config fields plus input, stream, "
                "stream_format; response_format defaults to mp3 (pcm with stream: true)",
                "requestBody": {"required": True, "content": _json("SpeechRequest")},
                "responses": {
                    **_ok(200, "the audio, whole or streamed (raw formats)", AUDIO),
                    **_errors(400, 401, 403, 405, 429, 503),
                },
            }
        },
        "/v1/models": {
            "get": {
                "summary": "What this server serves, in OpenAI's shape (object list of model objects)",
                "responses": {**_ok(200, "model list", JSON_OBJECT), **_errors(401)},
            }
        },
        "/v1/models/{model}": {
            "get": {
                "summary": "One model object",
                "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {**_ok(200, "the model", JSON_OBJECT), **_errors(401, 404)},
            }
        },
        "/v1/audio/voices": {
            "get": {
                "summary": "The engine's voices and the uploaded ones",
                "responses": {**_ok(200, "voice list", JSON_OBJECT), **_errors(401, 429)},
            },
            "post": {
                "summary": "Upload a reference voice",
                "requestBody": {"required": True, "content": VOICE_UPLOAD},
                "responses": {**_ok(201, "the voice", JSON_OBJECT), **_errors(400, 401, 403, 413, 429)},
            },
        },
        "/v1/audio/voices/{name}": {
            "delete": {
                "summary": "Delete an uploaded voice",
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {**_ok(200, "deleted", JSON_OBJECT), **_errors(401, 403, 404, 429)},
            }
        },
        "/v1/audio/speech/tokens": {
            "post": {
                "summary": "A short-lived browser token for the WebSocket (API key required)",
                "responses": {**_ok(201, "token and expires_in", JSON_OBJECT), **_errors(401, 403, 429)},
            }
        },
        "/v1/audio/speech/sessions/{session_id}/cancel": {
            "post": {
                "summary": "Barge in on a live session (as input.cancel, origin server)",
                "parameters": [SESSION_ID],
                "responses": {**_ok(202, "signal accepted", JSON_OBJECT), **_errors(401, 403, 404, 429, 503)},
            }
        },
        "/v1/audio/speech/sessions/{session_id}": {
            "delete": {
                "summary": "Terminate a live session (error event, close 4001)",
                "parameters": [SESSION_ID],
                "responses": {**_ok(202, "signal accepted", JSON_OBJECT), **_errors(401, 403, 404, 429, 503)},
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness and what this instance serves",
                "security": [],
                "responses": _ok(200, "status ok, engine, voices, sample_rate", JSON_OBJECT),
            }
        },
        "/health": {
            "get": {
                "summary": "Readiness of the database, Redis and the engine",
                "security": [],
                "responses": {
                    **_ok(200, "ready: status ok, or degraded with Redis away", JSON_OBJECT),
                    **_ok(503, "unavailable: the database or the engine is not ready", JSON_OBJECT),
                },
            }
        },
        "/v1/openapi.json": {
            "get": {"summary": "This document", "security": [], "responses": _ok(200, "OpenAPI 3.1", JSON_OBJECT)}
        },
        SCHEMA_PATH: {
            "get": {
                "summary": f"JSON Schema of the WebSocket messages of {WEBSOCKET_PATH}",
                "security": [],
                "responses": _ok(200, "JSON Schema 2020-12", JSON_OBJECT),
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": JSON_SCHEMA_DIALECT,
        "info": {
            "title": "Streaming speech API",
            "version": "1",
            "description": f"REST endpoints of the speech server. The streaming WebSocket ({WEBSOCKET_PATH}) "
            f"is described by {SCHEMA_PATH}; both are specified in docs/protocol.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "an API key (when SPEECH_REQUIRE_API_KEY)"}
            },
        },
        "security": [{"apiKey": []}],
    }


def openapi_json(request):
    return JsonResponse(openapi_document())


def websocket_schema_json(request):
    return JsonResponse(websocket_schema())
