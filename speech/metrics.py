"""Prometheus metrics of this process, served at /metrics (prometheus-client's default registry).

Every metric is defined here and fed from a few places only: the admission at a session's start and
end (its SessionSummary), `PrometheusMeter`, the Meter (speech/stream/meter.py) the server hands the
session core and the engine's synthesis pool (engine time per segment, the first audio frame, every
audio frame sent, cancels, error events, each pool job's wait, run and end), the handled refusals and
the API's HTTP handler (speech/web/apihandler.py). Each daphne process has its own registry: with several instances,
Prometheus scrapes every instance (its own address), not the load balancer.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import threading
import time
import weakref

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

from . import logcontext
from .engines.jobs import pending
from .server.flowcontrol import FlowControl

logger = logging.getLogger(__name__)

SESSIONS_ACTIVE = Gauge("speech_sessions_active", "WebSocket speech sessions open in this process")
SESSIONS_ENDED = Counter("speech_sessions_ended", "WebSocket speech sessions ended, by outcome", ["outcome"])
TTFA = Histogram(
    "speech_time_to_first_audio_seconds",
    "A session's first segment: from its text being queued to its first audio frame sent",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
)
SEGMENT_SYNTHESIS = Histogram(
    "speech_segment_synthesis_seconds",
    "Time spent waiting for the engine's audio of one segment (queueing included)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
)
SEGMENT_RTF = Histogram(
    "speech_segment_real_time_factor",
    "Engine time over audio duration for one segment (below 1: faster than real time)",
    buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0),
)
ENGINE_QUEUE = Gauge(
    "speech_engine_queue_depth", "Synthesis jobs in the engine's pool (speech/engines/pool.py), running or waiting for a thread"
)
ENGINE_JOB_WAIT = Histogram(
    "speech_engine_job_wait_seconds",
    "Time a synthesis job waited for a thread of the engine's pool",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
ENGINE_JOB = Histogram(
    "speech_engine_job_seconds",
    "Time a synthesis job ran on a thread of the engine's pool (a sentence, or the first one with its G2P)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
ENGINE_JOBS = Counter(
    "speech_engine_jobs",
    "Synthesis jobs of the engine's pool by how they ended: completed, failed, dropped (never started: "
    "its listener had gone, or shutdown), stopped (at its next step, its listener gone), unheard (ran to its "
    "end after its listener left)",
    ["outcome"],
)
CANCELS = Counter("speech_cancels", "Barge-ins (input.cancelled), by origin: client or server", ["origin"])
ERRORS = Counter("speech_errors", "error events sent to WebSocket clients, by error_type and code", ["type", "code"])
AUDIO_BYTES = Counter("speech_audio_sent_bytes", "Audio bytes sent to WebSocket clients")
AUDIO_SECONDS = Counter("speech_audio_sent_seconds", "Seconds of audio sent to WebSocket clients")
REFUSALS = Counter(
    "speech_refusals",
    "Requests and sessions refused as designed (overload, limits, control signals unavailable), by cause",
    ["cause"],
)
REST_REQUESTS = Counter(
    "speech_rest_requests", "HTTP API requests, by endpoint (route name), method and status", ["endpoint", "method", "status"]
)

# Sessions started and not yet ended, by id (a session dropped without an end leaves too).
_live: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()
SESSIONS_ACTIVE.set_function(lambda: len(_live))


ENGINE_QUEUE.set_function(pending)  # read at scrape time from the process's pools (the engine's, if it has one)
HELD = Gauge(
    "speech_sessions_held",
    "WebSocket connections whose client is not reading fast enough right now: their audio waits "
    "(backpressure, speech/server/flowcontrol.py)",
)
HELD.set_function(lambda: FlowControl.held)


# -- sessions (speech/web/admission.py) --------------------------------------------------------
def session_started(session):
    """The socket is accepted: the session counts as active, and every log record from here on (in
    this task and the tasks it creates) carries its id."""
    logcontext.bind(session.session_id)
    _live[session.session_id] = session
    logger.info("session started")


def session_ended(summary):
    """Once per session, after its work has stopped (its SessionSummary, speech/stream/outcomes.py):
    its outcome and one summary log line."""
    if _live.pop(summary.session_id, None) is None:
        return
    SESSIONS_ENDED.labels(summary.outcome).inc()
    logger.info(
        "session ended: %s, %d segments, %d audio bytes, first audio %s",
        summary.outcome,
        summary.segments,
        summary.bytes_sent,
        "none" if summary.first_audio_s is None else f"{summary.first_audio_s:.3f} s",
    )


# -- handled refusals ------------------------------------------------------------------------------
# A refusal is the server working as designed (503 while control signals are unavailable or the engine is
# full, 429 and close 4013 at a limit), so it is never an ERROR, and an outage or an overload that refuses
# a request a millisecond must not write a line a millisecond: one WARNING line per cause per interval,
# saying how many were refused since the last one; every refusal counts in speech_refusals_total.
REFUSAL_LOG_INTERVAL_S = 30.0
SIGNALS_UNAVAILABLE, ENGINE_BUSY, RATE_LIMITED = "signals_unavailable", "engine_busy", "rate_limited"
KEY_SESSION_LIMIT, MEMORY_BUDGET = "key_session_limit", "memory_budget"
_refusal_lines: dict[str, tuple[float, int]] = {}  # cause -> (when its last line was written, refusals since)
_refusal_lock = threading.Lock()  # REST views also run in Django's threads


def refused(cause, detail):
    """Count a handled refusal of `cause`, and log it unless a line for that cause was written lately."""
    REFUSALS.labels(cause).inc()
    now = time.monotonic()
    with _refusal_lock:
        last, since = _refusal_lines.get(cause, (-REFUSAL_LOG_INTERVAL_S, 0))
        if now - last < REFUSAL_LOG_INTERVAL_S:
            _refusal_lines[cause] = (last, since + 1)
            return
        _refusal_lines[cause] = (now, 0)
    more = f" (and {since} more since the last line)" if since else ""
    logger.warning("refused (%s): %s%s", cause, detail, more)


# -- the core's and the synthesis pool's instrumentation (speech/stream/meter.py) ------------------
class PrometheusMeter:
    """The Meter (speech/stream/meter.py) of this process: each figure into its metric above."""

    def first_audio(self, seconds):
        TTFA.observe(seconds)

    def audio_sent(self, nbytes, seconds):
        AUDIO_BYTES.inc(nbytes)
        AUDIO_SECONDS.inc(seconds)

    def segment_synthesised(self, engine_s, audio_s):
        SEGMENT_SYNTHESIS.observe(engine_s)
        SEGMENT_RTF.observe(engine_s / audio_s)

    def cancelled(self, origin):
        CANCELS.labels(origin).inc()

    def error_sent(self, error_type, code):
        ERRORS.labels(error_type, "" if code is None else str(code)).inc()

    def engine_job(self, waited, ran):
        ENGINE_JOB_WAIT.observe(waited)
        ENGINE_JOB.observe(ran)

    def engine_job_end(self, outcome):
        ENGINE_JOBS.labels(outcome).inc()


METER = PrometheusMeter()


# -- /metrics ----------------------------------------------------------------------------------
def allowed(request, token):
    """With a token: `Authorization: Bearer <token>` from anyone. Without: loopback clients only.
    REMOTE_ADDR is the connection's peer: daphne runs without --proxy-headers, so an
    X-Forwarded-For header cannot pass for a local client (nginx refuses /metrics for its own part)."""
    if token:
        presented = request.META.get("HTTP_AUTHORIZATION", "")
        return hmac.compare_digest(presented.encode(), f"Bearer {token}".encode())
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR") or "").is_loopback
    except ValueError:
        return False


def exposition():
    """(body, content type) of this process's metrics in Prometheus' text format."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def rest_request(request, response):
    match = getattr(request, "resolver_match", None)
    endpoint = match.url_name if match is not None and match.url_name else "unmatched"
    REST_REQUESTS.labels(endpoint, request.method, str(response.status_code)).inc()
