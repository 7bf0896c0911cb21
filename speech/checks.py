"""System checks (`manage.py check`): settings that would only fail once a client connects."""

from urllib.parse import urlsplit

from django.core import checks

from .web.budget import FRAME_COST_FACTOR
from .conf import conf
from .engines import ENGINES
from .stream.protocol import SAMPLE_RATES


@checks.register(checks.Tags.compatibility)
def check_speech_settings(app_configs, **kwargs):
    errors = []
    if conf.ENGINE not in ENGINES:
        errors.append(checks.Error(
            f"SPEECH_ENGINE is {conf.ENGINE!r}; it must be one of: {', '.join(sorted(ENGINES))}.",
            id="speech.E001"))
    if conf.ENGINE_WORKERS < 1:
        errors.append(checks.Error("SPEECH_ENGINE_WORKERS must be at least 1.", id="speech.E002"))
    if conf.MAX_QUEUE_WAIT_S <= 0:
        errors.append(checks.Error("SPEECH_MAX_QUEUE_WAIT_S must be positive.", id="speech.E003"))
    for name in ("CONFIG_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_CONFIG_BYTES", "MAX_MESSAGE_BYTES",
                 "MAX_PENDING_CHARS", "MAX_SEGMENT_CHARS"):
        if getattr(conf, name) <= 0:
            errors.append(checks.Error(f"SPEECH_{name} must be positive.", id="speech.E004"))
    if conf.CONFIG_BUDGET_BYTES < FRAME_COST_FACTOR * conf.MAX_CONFIG_BYTES:
        errors.append(checks.Error(
            f"SPEECH_CONFIG_BUDGET_BYTES must be at least {FRAME_COST_FACTOR} x SPEECH_MAX_CONFIG_BYTES "
            f"({FRAME_COST_FACTOR * conf.MAX_CONFIG_BYTES}): a largest session.config costs that much in flight.",
            id="speech.E008"))
    if conf.MAX_MESSAGE_BYTES > conf.MAX_CONFIG_BYTES:
        errors.append(checks.Warning("SPEECH_MAX_MESSAGE_BYTES is larger than SPEECH_MAX_CONFIG_BYTES; "
                                     "daphne's frame limit follows the larger one.", id="speech.W001"))
    if conf.ENGINE == "openai":
        errors += _upstream_errors()
    return errors


def _upstream_errors():
    errors = []
    url = urlsplit(conf.UPSTREAM_URL)
    if url.scheme not in ("http", "https") or not url.netloc:
        errors.append(checks.Error(
            f"SPEECH_ENGINE is 'openai' but SPEECH_UPSTREAM_URL is {conf.UPSTREAM_URL!r}; it must be the http(s) "
            "base URL of an OpenAI-compatible speech server, e.g. http://gpu-host:8000/v1.", id="speech.E005"))
    if conf.UPSTREAM_SAMPLE_RATE not in SAMPLE_RATES:
        errors.append(checks.Error(f"SPEECH_UPSTREAM_SAMPLE_RATE must be one of: {', '.join(map(str, SAMPLE_RATES))}.",
                                   id="speech.E006"))
    for name in ("UPSTREAM_CONNECT_TIMEOUT_S", "UPSTREAM_READ_TIMEOUT_S", "UPSTREAM_MAX_CONNECTIONS"):
        if getattr(conf, name) <= 0:
            errors.append(checks.Error(f"SPEECH_{name} must be positive.", id="speech.E004"))
    if conf.UPSTREAM_RETRIES < 0:
        errors.append(checks.Error("SPEECH_UPSTREAM_RETRIES must not be negative.", id="speech.E007"))
    return errors
