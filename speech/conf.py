"""The speech app's settings, read from django.conf.settings with their defaults.

Modelled on django-cors-headers' conf.py: the code asks `conf.MAX_PENDING_CHARS` and tests can
override a setting with `override_settings`. It names every SPEECH_* setting but one:
SPEECH_INSTANCE_ID is read straight from django.conf.settings by speech/control/registry.py, as REDIS_URL
is by the cross-instance control plane. The README's Settings table lists every setting.
"""

import os

from django.conf import settings

from .stream.protocol import Limits

DEFAULTS = {
    "SPEECH_ENGINE": "hibari",
    "SPEECH_ENGINE_WORKERS": os.cpu_count() or 1,
    "SPEECH_MAX_QUEUE_WAIT_S": 2.0,
    "SPEECH_CONFIG_TIMEOUT_S": 10.0,
    "SPEECH_IDLE_TIMEOUT_S": 30.0,
    "SPEECH_MAX_CONFIG_BYTES": 16 * 1024 * 1024,
    "SPEECH_CONFIG_BUDGET_BYTES": 64 * 1024 * 1024,
    "SPEECH_MAX_MESSAGE_BYTES": 131072,
    "SPEECH_MAX_PENDING_CHARS": 262144,
    "SPEECH_MAX_SEGMENT_CHARS": 4096,
    "SPEECH_ALLOWED_ORIGINS": [],
    "SPEECH_WARM_UP": True,
    "SPEECH_REQUIRE_API_KEY": False,
    "SPEECH_MAX_SESSIONS_PER_KEY": 8,
    "SPEECH_UPSTREAM_URL": "",
    "SPEECH_UPSTREAM_API_KEY": "",
    "SPEECH_UPSTREAM_MODEL": "",
    "SPEECH_UPSTREAM_VOICES": [],
    "SPEECH_UPSTREAM_SAMPLE_RATE": 24000,
    "SPEECH_UPSTREAM_CONNECT_TIMEOUT_S": 5.0,
    "SPEECH_UPSTREAM_READ_TIMEOUT_S": 30.0,
    "SPEECH_UPSTREAM_RETRIES": 2,
    "SPEECH_UPSTREAM_MAX_CONNECTIONS": 100,
    "SPEECH_METRICS_TOKEN": "",
}


class Settings:
    """Attribute access to the SPEECH_* settings: `conf.ENGINE` reads SPEECH_ENGINE."""

    def __getattr__(self, name):
        key = f"SPEECH_{name}"
        if key not in DEFAULTS:
            raise AttributeError(name)
        return getattr(settings, key, DEFAULTS[key])


conf = Settings()


def stream_limits():
    """The session core's Limits from the settings: the core itself reads no Django settings."""
    return Limits(
        config_timeout_s=conf.CONFIG_TIMEOUT_S,
        idle_timeout_s=conf.IDLE_TIMEOUT_S,
        max_config_bytes=conf.MAX_CONFIG_BYTES,
        max_message_bytes=conf.MAX_MESSAGE_BYTES,
        max_pending_chars=conf.MAX_PENDING_CHARS,
        max_segment_chars=conf.MAX_SEGMENT_CHARS,
    )
