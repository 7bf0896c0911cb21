"""REST endpoints: one-shot speech (OpenAI-compatible), reference voices (sglang-omni compatible),
browser tokens, session control.

Errors use the envelope `{"error": {"message", "type", "param", "code"}}` (docs/protocol.md, REST
endpoints). With SPEECH_REQUIRE_API_KEY every endpoint wants `Authorization: Bearer <key>` of a key
with the endpoint's scope (docs/security.md), and a key's requests are rate limited (speech/web/ratelimit.py).
"""

from __future__ import annotations

import functools
import logging
import math
import time

from asgiref.sync import sync_to_async

from django.core.files.uploadhandler import FileUploadHandler, StopUpload
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from . import auth, ratelimit
from ..control import signals as control, registry
from ..stream import events, messages, oneshot, wire
from .. import metrics, voices
from ..audio.codecs import MEDIA_TYPES, EncodingError
from ..audio.output import encode_segment, stream_encoder
from ..stream.frames import FIRST_FRAME_S, FRAME_S
from ..conf import conf, voice_aliases
from ..runtime import get_engine
from ..stream.engine import EngineBusy
from ..stream.errors import BAD_REQUEST, QUEUE_FULL_MESSAGE, RATE_LIMIT, SERVER_ERROR, SpeechError
from ..models import Scope, Voice

logger = logging.getLogger(__name__)

MULTIPART_SLACK = 64 * 1024  # room for the form's other fields and boundaries


def error(status, message, *, type=BAD_REQUEST, param=None):
    return JsonResponse(events.RestError.of(status, message, type=type, param=param).dump(), status=status)


def refusal(status, message, cause, *, type=SERVER_ERROR, param=None):
    """A handled refusal (503, 429): counted and logged by cause at most once an interval (metrics.refused),
    and kept out of django.request's log, which writes every 5xx response as an ERROR line."""
    metrics.refused(cause, message)
    response = error(status, message, type=type, param=param)
    response._has_been_logged = True  # django.utils.log.log_response skips a response marked so
    return response


TOO_LARGE = events.RestError.of(413, "audio_sample is larger than 10 MiB", param="audio_sample").dump()


def too_large():
    return JsonResponse(TOO_LARGE, status=413)


def refused(key, required, scopes=()):
    """The response refusing a request, or None: 401 without a key when one is required, 403 when the
    key holds none of `scopes`, 429 with Retry-After when the key is over its request rate."""
    if required and key is None:
        return error(401, auth.AUTH_FAILED, type="authentication_error")
    if required and scopes and (missing := auth.missing_scope(key, *scopes)):
        return error(403, missing, type=auth.PERMISSION_ERROR)
    limit = conf.KEY_REQUESTS_PER_MINUTE if key is None or key.requests_per_minute is None else key.requests_per_minute
    if key is not None and (wait := ratelimit.buckets.take(key.prefix, limit)):
        response = error(429, f"too many requests for this API key (limit {limit} a minute)", type=RATE_LIMIT)
        response["Retry-After"] = str(wait)
        return response
    return None


def api_view(*methods, key_required=None, scopes=()):
    """CSRF-exempt JSON view for `methods`; checks the API key, its scopes and its rate when keys are required."""

    def wrap(view):
        @csrf_exempt
        @functools.wraps(view)
        def checked(request, *args, **kwargs):
            if request.method not in methods:
                response = error(405, f"method {request.method} is not allowed here")
                response["Allow"] = ", ".join(methods)
                return response
            required = conf.REQUIRE_API_KEY if key_required is None else key_required
            request.api_key = auth.key_for(auth.bearer(request.META))
            return refused(request.api_key, required, scopes) or view(request, *args, **kwargs)

        return checked

    return wrap


def _describe(voice):
    return {
        "id": voice.name,
        "name": voice.name,
        "object": "voice",
        "type": "uploaded",
        "language": voice.language,
        "ref_text": voice.transcript,
        "sample_rate": voice.sample_rate,
        "duration_s": voice.duration_s,
        "created_at": int(voice.created_at.timestamp()),
    }


class _LimitedUpload(FileUploadHandler):
    """Stops reading a request body (even one without Content-Length) once it passes the limit."""

    def __init__(self, request, limit):
        super().__init__(request)
        self.limit, self.seen = limit, 0
        request.upload_too_large = False

    def receive_data_chunk(self, raw_data, start):
        self.seen += len(raw_data)
        if self.seen > self.limit:
            self.request.upload_too_large = True
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size):
        return None


@api_view("GET", "POST")
def voice_list(request):
    if request.method == "GET":
        caps = get_engine().capabilities
        engine_voices = [{"id": v, "name": v, "object": "voice", "type": "builtin"} for v in caps.voices]
        uploaded = [_describe(v) for v in Voice.objects.filter(is_active=True)]
        data = engine_voices + uploaded
        return JsonResponse({"object": "list", "data": data, "voices": [v["name"] for v in data]})
    return _upload(request)


def _upload(request):
    if conf.REQUIRE_API_KEY and (missing := auth.missing_scope(request.api_key, Scope.VOICES)):
        return error(403, missing, type=auth.PERMISSION_ERROR)
    length = request.META.get("CONTENT_LENGTH") or ""
    if length.isdigit() and int(length) > voices.MAX_UPLOAD_BYTES + MULTIPART_SLACK:
        return too_large()  # refused before a byte of the body is read
    request.upload_handlers.insert(0, _LimitedUpload(request, voices.MAX_UPLOAD_BYTES + MULTIPART_SLACK))
    post, files = request.POST, request.FILES
    if request.upload_too_large:
        return too_large()
    sample = files.get("audio_sample")
    if sample is None:
        return error(400, "audio_sample is required (multipart file)", param="audio_sample")
    if sample.size > voices.MAX_UPLOAD_BYTES:
        return too_large()
    try:
        voice = voices.create_voice(
            name=post.get("name", ""),
            consent=post.get("consent", ""),
            data=sample.read(),
            filename=sample.name or "",
            content_type=sample.content_type or "",
            transcript=post.get("ref_text", ""),
            language=post.get("language", ""),
            created_by=request.api_key.prefix if request.api_key else "rest",
            owner=request.api_key,
        )
    except voices.VoiceError as exc:
        return error(400, str(exc), param=exc.param)
    return JsonResponse(_describe(voice), status=201)


STARTED = int(time.time())  # a model's `created`: when this process began serving it


def served_models():
    """OpenAI's model objects for what this server serves: its engine, and an upstream's model when set."""
    engine = get_engine().capabilities.name
    ids = [engine] + ([conf.UPSTREAM_MODEL] if engine == "openai" and conf.UPSTREAM_MODEL else [])
    return [{"id": model, "object": "model", "created": STARTED, "owned_by": "speech-server"} for model in ids]


@api_view("GET")
def model_list(request):
    """OpenAI's `GET /v1/models`; clients that list models before speaking find the engine here."""
    return JsonResponse({"object": "list", "data": served_models()})


@api_view("GET")
def model_detail(request, model):
    """OpenAI's `GET /v1/models/<model>`."""
    found = next((m for m in served_models() if m["id"] == model), None)
    if found is None:
        return error(404, f"model '{model}' not found", type="not_found_error", param="model")
    return JsonResponse(found)


@api_view("DELETE", scopes=(Scope.VOICES, Scope.ADMIN))
def voice_detail(request, name):
    voice = Voice.objects.filter(name__iexact=name).first()
    if voice is None:
        return error(404, f"voice '{name}' not found", type="not_found_error", param="name")
    key = request.api_key
    if conf.REQUIRE_API_KEY and not key.allows(Scope.ADMIN) and voice.owner_id != key.pk:
        return error(403, f"voice '{voice.name}' was not uploaded under this API key", type=auth.PERMISSION_ERROR, param="name")
    voices.delete_voice(voice)
    return JsonResponse({"id": voice.name, "object": "voice", "deleted": True})


@api_view("POST", key_required=True, scopes=(Scope.SPEAK,))
def speech_tokens(request):
    token, expires_in = auth.issue_token(request.api_key)
    return JsonResponse({"token": token, "expires_in": expires_in}, status=201)


def not_found(request, exception=None):
    return error(404, "not found", type="not_found_error")


def _not_live(session_id):
    return error(404, f"no live session '{session_id}'", type="not_found_error", param="session_id")


def _signal(request, session_id, kind):
    if not control.SESSION_ID.fullmatch(session_id):  # never a session: no need to ask anyone
        return _not_live(session_id)
    # With keys, a key sees only its own sessions; one with the `admin` scope sees every session.
    key = request.api_key
    record = registry.live_session(session_id, key if conf.REQUIRE_API_KEY and not key.allows(Scope.ADMIN) else None)
    try:
        if record is not None:
            if not control.instance_alive_sync(record.instance):
                registry.lost(record)  # its instance died without closing it (its group entry remains)
                return _not_live(session_id)
            if not control.has_members_sync(session_id):  # a signal sent now would reach no one
                raise control.not_joined()
        # Without keys a session's row is written just after its handshake: in the first milliseconds
        # (no row at all yet) its group membership says it is live. With keys the row comes first and
        # says whose it is. A session with an ended row is over, whatever group entry a crash left.
        elif conf.REQUIRE_API_KEY or registry.ended(session_id) or not control.has_members_sync(session_id):
            return _not_live(session_id)
        control.send_sync(kind, session_id)
    except control.SignalsUnavailable as exc:
        return refusal(503, str(exc), metrics.SIGNALS_UNAVAILABLE)
    return JsonResponse({"session_id": session_id, "signal": kind, "status": "accepted"}, status=202)


@api_view("POST", scopes=(Scope.SPEAK, Scope.ADMIN))
def session_cancel(request, session_id):
    return _signal(request, session_id, control.CANCEL)


@api_view("DELETE", scopes=(Scope.SPEAK, Scope.ADMIN))
def session_terminate(request, session_id):
    return _signal(request, session_id, control.TERMINATE)


@csrf_exempt
async def speech(request):
    """OpenAI-compatible `POST /v1/audio/speech`: the WebSocket's config rules, plus `input` and `stream`."""
    if request.method != "POST":
        response = error(405, f"method {request.method} is not allowed here")
        response["Allow"] = "POST"
        return response
    secret = auth.bearer(request.META)
    key = await sync_to_async(auth.key_for)(secret) if secret else None  # no thread hop without a key
    if denied := refused(key, conf.REQUIRE_API_KEY, (Scope.SPEAK,)):
        return denied
    try:
        body = wire.parse_message(request.body.decode("utf-8", "replace"))
        engine = get_engine()
        # input, stream and stream_format first, then the WebSocket's session.config rules (messages.SpeechRequest)
        read = await messages.read_config(
            body,
            engine.capabilities,
            sync_to_async(voices.find_voice),
            messages.SpeechRequest,
            max_input_chars=conf.MAX_SEGMENT_CHARS,
            voice_aliases=voice_aliases(),
        )
        config, text, stream = read.config, read.input, read.stream
    except SpeechError as exc:
        return error(exc.code or 400, exc.message, type=exc.error_type, param=exc.param)
    wait = engine.estimated_wait()
    if wait > conf.MAX_QUEUE_WAIT_S:  # overloaded: refused before any work is accepted, as sessions are
        response = refusal(503, QUEUE_FULL_MESSAGE, metrics.ENGINE_BUSY)
        response["Retry-After"] = str(math.ceil(wait))
        return response
    audio = oneshot.synthesize(engine, config, text, metrics.METER, first_words=stream)
    if stream:
        try:  # the first audio before the headers: a failure is still a proper error response
            first = await anext(audio)
        except StopAsyncIteration:
            first = None
        except SpeechError as exc:
            return _synthesis_error(exc)
        fmt, rate = config.response_format, config.sample_rate
        encoder = stream_encoder(fmt, rate, FIRST_FRAME_S, FRAME_S)
        response = StreamingHttpResponse(_stream(audio, first, encoder), content_type=MEDIA_TYPES[fmt])
        response["X-Sample-Rate"], response["X-Channels"] = str(rate), "1"
        if fmt == "pcm":
            response["X-Bit-Depth"] = "16"
        return response
    try:
        chunks = [chunk async for chunk in audio]
        if not chunks:
            raise EncodingError("the engine produced no audio")
        data = await encode_segment(config.response_format, chunks, config.sample_rate, ahead_s=0.0)  # it waits for it all
    except (SpeechError, EncodingError) as exc:
        return _synthesis_error(exc)
    response = HttpResponse(data, content_type=MEDIA_TYPES[config.response_format])
    response["X-Sample-Rate"] = str(config.sample_rate)
    return response


def _synthesis_error(exc):
    """The engine's failure with its own class: bad input 400, rate limits 429, overload 503, else 500."""
    if isinstance(exc, SpeechError) and exc.code == 429:
        return refusal(429, exc.message, metrics.RATE_LIMITED, type=exc.error_type, param=exc.param)
    if isinstance(exc, SpeechError) and exc.code:
        return error(exc.code, exc.message, type=exc.error_type, param=exc.param)
    if isinstance(exc, EngineBusy):
        return refusal(503, str(exc), metrics.ENGINE_BUSY)
    return error(500, str(exc), type=SERVER_ERROR)


async def _stream(audio, first, encoder):
    """Audio as it is made (raw bytes, or whole mp3/opus/aac frames of one stream); a failure past the
    first byte can only end the stream early."""
    try:
        if first is not None:
            async for data, _ in encoder.frames(first):
                yield data
        async for chunk in audio:
            async for data, _ in encoder.frames(chunk):
                yield data
        if tail := await encoder.end_segment():
            yield tail[0]
    except (SpeechError, EncodingError) as exc:
        logger.warning("speech stream ended early: %s", exc)
    finally:
        await audio.aclose()
