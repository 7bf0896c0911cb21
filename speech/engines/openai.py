"""Engine `openai`: speech from an upstream OpenAI-compatible server (sglang-omni, vLLM-omni, OpenAI,
or another instance of this server), streamed as raw PCM over pooled HTTP connections.

Each segment is one `POST {SPEECH_UPSTREAM_URL}/audio/speech` with `response_format: "pcm"` and
`stream_format: "audio"` (raw bytes as they are made). The session's voice, model, language,
instructions and sampling fields are forwarded; an uploaded voice travels as `ref_audio` (a
`data:` URL) with its transcript as `ref_text`, the sglang-omni / vLLM-omni convention.

Failures fail the segment with the contract's classes: 4xx -> BadRequestError 400, 429 ->
rate_limit_error, 503 -> "The request queue is full.", anything else -> server_error. Requests
are retried only before the first byte of audio, and only when the upstream could not have
started (refused connection, dropped before the response, 502/503/504). Timeouts are not retried.
Cancelling the consuming task closes the upstream response, and with it the connection.

Word timings (`request.timestamps`): none of the upstreams sends them with streamed speech (vLLM-omni
gives `X-Word-Timestamps` only on a whole, non-streamed response, and only with its forced aligner
loaded; sglang-omni and OpenAI give none), so the segment is held back whole and its words spread over
its sound and pauses (`speech.engines.spread`), marked estimated.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import time
from email.message import Message

import httpx
import numpy as np

from ..audio import signal as audio
from ..audio.codecs import MEDIA_TYPES
from ..stream.errors import BAD_REQUEST, RATE_LIMIT
from ..stream.meter import NO_METER
from ..stream.engine import Capabilities, Engine, EngineBusy, EngineError, SynthesisRequest
from .spread import spread
from .text import for_engine

logger = logging.getLogger(__name__)

# Raw 16-bit PCM content types -> sample byte order (RFC 2586: audio/L16 is big-endian)
PCM_TYPES = {"audio/pcm": "<i2", "audio/raw": "<i2", "audio/x-raw": "<i2", "application/octet-stream": "<i2", "audio/l16": ">i2"}
RETRY_STATUSES = (502, 503, 504)
# The upstream could not have started: refused, or the connection dropped before a response.
RETRY_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
ERROR_BODY_LIMIT = 64 * 1024  # bytes of an error response read for its message
DEFAULT = "default"  # the voice name that leaves the choice to the upstream
JSON = {"content-type": "application/json"}


class OpenAIEngine(Engine):
    def __init__(
        self,
        *,
        url,
        api_key="",
        model="",
        voices=(),
        sample_rate=24000,
        connect_timeout_s=5.0,
        read_timeout_s=30.0,
        retries=2,
        max_connections=100,
        rediscover_s=30.0,
        transport=None,
    ):
        self.url = url.rstrip("/")
        self.endpoint = f"{self.url}/audio/speech"
        self.model = model
        self.retries = retries
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s)
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        # None: httpx's own connection pool. Tests pass an httpx.MockTransport to check status mapping and
        # request bodies without a socket (the socket faults keep a real loopback server).
        self.transport = transport
        self.capabilities = self._capabilities(tuple(voices), sample_rate)
        self._client = None
        self._client_loop = None
        self.rediscover_s = rediscover_s
        self._voices_pending = not voices  # the upstream's listing is still to be learned
        self._next_discovery = float("inf")  # asked again only after warm_up() found the upstream away
        self.voice_refresh = None  # the background task asking the upstream again, while one runs

    @classmethod
    def from_settings(cls, conf, meter=NO_METER):
        return cls(
            url=conf.UPSTREAM_URL,
            api_key=conf.UPSTREAM_API_KEY,
            model=conf.UPSTREAM_MODEL,
            voices=conf.UPSTREAM_VOICES,
            sample_rate=conf.UPSTREAM_SAMPLE_RATE,
            connect_timeout_s=conf.UPSTREAM_CONNECT_TIMEOUT_S,
            read_timeout_s=conf.UPSTREAM_READ_TIMEOUT_S,
            retries=conf.UPSTREAM_RETRIES,
            max_connections=conf.UPSTREAM_MAX_CONNECTIONS,
        )

    @staticmethod
    def _capabilities(voices, sample_rate):
        # Speed stays with our own time-stretch (speed_range 1..1): pitch-preserving and the same on
        # every upstream, and vLLM-omni refuses speed with streamed audio.
        return Capabilities(
            name="openai",
            voices=voices,
            default_voice=voices[0] if voices else DEFAULT,
            sample_rate=sample_rate,
            reference_audio=True,
            instructions=True,
            any_voice=not voices,
        )

    def client(self):
        """The pooled client of the running loop (daphne's; warm-up runs in a loop of its own)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = httpx.AsyncClient(
                timeout=self.timeout, limits=self.limits, headers=self.headers, transport=self.transport
            )
            self._client_loop = loop
        return self._client

    async def warm_up(self):
        """Learn the upstream's voices (`GET /audio/voices`) unless SPEECH_UPSTREAM_VOICES names them.

        Until they are known the voice set is open: any name is passed on and the upstream judges
        it. An upstream without a listing (404/405) keeps it open for good; one that was away is
        asked again, in the background, at most every `rediscover_s` while segments are made."""
        if not self._voices_pending:
            return
        try:
            async with httpx.AsyncClient(timeout=self.timeout, headers=self.headers, transport=self.transport) as client:
                response = await client.get(f"{self.url}/audio/voices")
            if response.status_code in (404, 405):
                self._voices_pending = False
                logger.info("%s lists no voices: any voice name is passed on to it", self.url)
                return
            response.raise_for_status()
            voices = _voice_names(response.json())
        except (httpx.HTTPError, ValueError) as exc:
            self._next_discovery = time.monotonic() + self.rediscover_s
            logger.warning(
                "upstream voices unknown for now (%s): any voice name is passed on to %s; asking again within %g s of use",
                exc,
                self.url,
                self.rediscover_s,
            )
            return
        self._voices_pending = False
        if voices:
            self.capabilities = self._capabilities(voices, self.capabilities.sample_rate)

    async def ready(self):
        """Ready when the upstream answers HTTP below 500 (its voice listing, or a 404 without one)."""
        try:
            response = await self.client().get(f"{self.url}/audio/voices")
        except httpx.HTTPError as exc:
            raise EngineError(f"upstream {self.url} is unreachable ({type(exc).__name__})") from None
        if response.status_code >= 500:
            raise EngineError(f"upstream {self.url} answers {response.status_code}")

    def _maybe_rediscover(self):
        if self._voices_pending and self.voice_refresh is None and time.monotonic() >= self._next_discovery:
            self.voice_refresh = asyncio.create_task(self.warm_up(), name="upstream-voices")
            self.voice_refresh.add_done_callback(self._rediscovered)

    def _rediscovered(self, task):
        self.voice_refresh = None

    async def aclose(self):
        if self.voice_refresh is not None:
            self.voice_refresh.cancel()
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    async def body(self, request: SynthesisRequest):
        options = dict(request.options)
        body = {
            "model": options.pop("model", None) or self.model or None,
            "input": for_engine(request.text),
            "response_format": "pcm",
            "stream_format": "audio",
        }
        if request.voice != DEFAULT and request.reference is None:
            body["voice"] = request.voice
        if request.reference is not None:
            ref = request.reference
            body["ref_audio"] = await _data_url(ref.container, ref.audio)
            if ref.transcript:
                body["ref_text"] = ref.transcript
        body.update(options)  # language, instructions, sampling fields; a client's own ref_audio wins
        return {key: value for key, value in body.items() if value is not None}

    async def stream(self, request: SynthesisRequest):
        self._maybe_rediscover()
        body = await self.body(request)
        # Reference audio makes the body megabytes of base64: serialise it off the loop.
        content = (
            json.dumps(body).encode() if "ref_audio" not in body else await asyncio.to_thread(lambda: json.dumps(body).encode())
        )
        client = self.client()
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                async with client.stream("POST", self.endpoint, content=content, headers=JSON) as response:
                    if response.status_code not in RETRY_STATUSES or last:
                        if response.status_code != 200:
                            raise await _status_error(response)
                        dtype = self._check_format(response)
                        chunks = self._paced(_pcm(response, dtype, request.pcm16))
                        if request.timestamps:
                            chunks = _timed(chunks, request.text, self.capabilities.sample_rate)
                        async for chunk in chunks:
                            yield chunk
                        return
            except RETRY_ERRORS as exc:  # raised before any audio: after it, _pcm raises _StreamBroke
                if last:
                    raise self._transport_error(exc) from exc
            except httpx.TransportError as exc:  # timeouts, a broken stream, pool exhaustion
                raise self._transport_error(exc) from exc
            await _backoff(attempt)  # the failed response is closed by now

    async def _paced(self, chunks):
        """Fail an upstream that falls more than the read timeout behind real time: one that trickles
        a few bytes before each read timeout would otherwise hold the segment for ever."""
        started = time.monotonic()
        rate, allowed = self.capabilities.sample_rate, self.timeout.read
        audio_s = 0.0
        async for chunk in chunks:
            audio_s += chunk.size / rate
            if time.monotonic() - started - audio_s > allowed:
                raise EngineError(f"upstream speech server fell more than {allowed:g} s behind real time")
            yield chunk

    def _check_format(self, response):
        header = Message()
        header["content-type"] = response.headers.get("content-type", "")
        kind = header.get_content_type()
        if kind not in PCM_TYPES:
            shown = response.headers.get("content-type") or "no content type"
            raise EngineError(f"upstream speech server sent {shown!r}, not raw PCM audio")
        rate = response.headers.get("x-sample-rate") or header.get_param("rate")
        expected = self.capabilities.sample_rate
        if rate is not None and str(rate).strip() != str(expected):
            raise EngineError(
                f"upstream speech server sent {str(rate).strip()} Hz audio; SPEECH_UPSTREAM_SAMPLE_RATE is {expected}"
            )
        return PCM_TYPES[kind]

    def _transport_error(self, exc):
        if isinstance(exc, _StreamBroke):
            return EngineError(f"upstream speech stream broke off after {exc.received} bytes: {exc.cause}")
        if isinstance(exc, httpx.ConnectTimeout):
            return EngineError(
                f"upstream speech server at {self.url} did not accept a connection within {self.timeout.connect:g} s"
            )
        if isinstance(exc, httpx.PoolTimeout):
            return EngineError(f"no free connection to the upstream speech server within {self.timeout.pool:g} s")
        if isinstance(exc, httpx.TimeoutException):
            return EngineError(f"upstream speech server sent nothing for {self.timeout.read:g} s")
        if isinstance(exc, httpx.ConnectError):
            return EngineError(f"upstream speech server at {self.url} is unreachable: {exc or type(exc).__name__}")
        if isinstance(exc, httpx.RemoteProtocolError):
            return EngineError(f"upstream speech server sent an invalid HTTP response: {exc}")
        return EngineError(f"upstream speech request failed: {exc or type(exc).__name__}")


async def _timed(chunks, text, rate):
    """The segment's audio held back whole, then its words spread over it (`spread`: no upstream we
    speak to sends word times on a streamed response), then the audio: timings must come before the
    audio they describe, so the first audio waits for the upstream's last (docs/engines.md)."""
    held = [chunk async for chunk in chunks]
    yield spread(text, np.concatenate(held) if held else np.zeros(0, np.float32), rate)
    for chunk in held:
        yield chunk


class _StreamBroke(httpx.TransportError):
    """The connection failed after audio had started: never retried (it would repeat audio)."""

    def __init__(self, cause, received):
        super().__init__(str(cause))
        self.cause, self.received = cause, received


async def _pcm(response, dtype, pcm16):
    """Chunks of the upstream's 16-bit samples as they arrive, as they are (little-endian int16) when
    `pcm16`, else as float32; an odd byte waits for its partner."""
    carry = b""
    received = 0
    try:
        async for data in response.aiter_bytes():
            received += len(data)
            data = carry + data
            usable = len(data) - len(data) % 2
            carry = data[usable:]
            if usable:
                yield np.frombuffer(data[:usable], dtype).astype("<i2") if pcm16 else audio.from_pcm16(data[:usable], dtype)
    except (httpx.TransportError, httpx.DecodingError) as exc:
        if received == 0:
            raise
        raise _StreamBroke(exc, received) from exc
    if carry:
        raise EngineError("upstream PCM stream ended in the middle of a sample")


async def _status_error(response):
    body = b""
    try:
        async for data in response.aiter_bytes():
            body += data
            if len(body) >= ERROR_BODY_LIMIT:
                break
    except httpx.HTTPError:
        pass
    message, param = _error_message(body)
    status = response.status_code
    if status == 429:
        return EngineError(f"upstream speech server is rate limiting: {message}", error_type=RATE_LIMIT, code=429)
    if status == 503:
        return EngineBusy()
    if status in (401, 403):
        return EngineError(f"upstream speech server refused our credentials (HTTP {status}); check SPEECH_UPSTREAM_API_KEY")
    if status == 404:
        return EngineError(f"upstream speech server has no {response.request.url} (HTTP 404); check SPEECH_UPSTREAM_URL")
    if 400 <= status < 500:
        return EngineError(message, error_type=BAD_REQUEST, param=param, code=400)
    return EngineError(f"upstream speech server failed (HTTP {status}): {message}")


def _error_message(body):
    """The message (and param) of an OpenAI-style error envelope, a FastAPI detail, or the text."""
    text = body[:ERROR_BODY_LIMIT].decode("utf-8", "replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        return (text[:300] or "no details"), None
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload.get("message")))
        if isinstance(error, dict):
            param = error.get("param")
            return str(error.get("message") or error)[:1000], param if isinstance(param, str) else None
        if isinstance(error, list) and error and all(isinstance(item, dict) for item in error):
            return _validation_message(error)
        if error is not None:
            return str(error)[:1000], None
    return text[:300], None


def _validation_message(details):
    """FastAPI's 422 `detail` list (vLLM-omni, sglang-omni): "field: problem; …" and the first field."""
    fields = [".".join(str(part) for part in item.get("loc", ())[1:]) for item in details]
    message = "; ".join(
        f"{field}: {item.get('msg', 'invalid')}" if field else str(item.get("msg", "invalid"))
        for field, item in zip(fields, details)
    )
    return message[:1000], fields[0] or None


def _voice_names(payload):
    """Voice names from our own listing (`data`), vLLM-omni's (`voices` plus `uploaded_voices`), or a
    bare list."""
    if isinstance(payload, dict):
        items = payload.get("voices", payload.get("data"))
        uploaded = payload.get("uploaded_voices")
        if isinstance(items, list) and isinstance(uploaded, list):
            items = items + uploaded
    else:
        items = payload
    names = []
    for item in items if isinstance(items, list) else ():
        name = item.get("name", item.get("id")) if isinstance(item, dict) else item
        if isinstance(name, str) and name.strip() and name not in names:
            names.append(name)
    return tuple(names)


async def _backoff(attempt):
    await asyncio.sleep(0.05 * 2**attempt)


@functools.lru_cache(maxsize=4)
def _encode(container, audio):
    media_type = MEDIA_TYPES.get(container, "application/octet-stream")
    return f"data:{media_type};base64," + base64.b64encode(audio).decode("ascii")


async def _data_url(container, audio):
    """The reference as a data: URL, built once per voice (off the loop: up to 10 MiB of base64)."""
    return await asyncio.to_thread(_encode, container, audio)
