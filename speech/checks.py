"""System checks (`manage.py check`): settings that would only fail once a client connects."""

from django.core import checks

from .conf import conf
from .engines import ENGINES


@checks.register(checks.Tags.compatibility)
def check_speech_settings(app_configs, **kwargs):
    errors = []
    if conf.ENGINE not in ENGINES:
        errors.append(checks.Error(
            f"SPEECH_ENGINE is {conf.ENGINE!r}; it must be one of: {', '.join(sorted(ENGINES))}.",
            id="speech.E001"))
    if conf.ENGINE_WORKERS < 1:
        errors.append(checks.Error("SPEECH_ENGINE_WORKERS must be at least 1.", id="speech.E002"))
    if conf.ENGINE_QUEUE_SIZE < 0:
        errors.append(checks.Error("SPEECH_ENGINE_QUEUE_SIZE must not be negative.", id="speech.E003"))
    for name in ("CONFIG_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_CONFIG_BYTES", "MAX_MESSAGE_BYTES",
                 "MAX_PENDING_CHARS", "MAX_SEGMENT_CHARS"):
        if getattr(conf, name) <= 0:
            errors.append(checks.Error(f"SPEECH_{name} must be positive.", id="speech.E004"))
    if conf.MAX_MESSAGE_BYTES > conf.MAX_CONFIG_BYTES:
        errors.append(checks.Warning("SPEECH_MAX_MESSAGE_BYTES is larger than SPEECH_MAX_CONFIG_BYTES; "
                                     "daphne's frame limit follows the larger one.", id="speech.W001"))
    return errors
