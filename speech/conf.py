"""The speech app's settings: one table (SETTINGS) of every SPEECH_* setting, and `conf` to read them.

Each row gives the variable, django-environ's parser for it, its default, the default and meaning
cells of the settings tables (docs/settings.md, and the README's main ones), and the rule
`manage.py check` holds it to. ttsproject/settings.py reads the environment through the table,
speech/checks.py derives its checks from it, and tests/test_settings_table.py fails when a settings
table of the docs says otherwise.

Modelled on django-cors-headers' conf.py: the code asks `conf.MAX_PENDING_CHARS` and tests can
override a setting with `override_settings`. This module is imported by the settings module, so it
imports nothing of the app at load: the allowed values of a choice are named by dotted path and
imported only when the checks run.
"""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings


@dataclass(frozen=True)
class Rule:
    """A check on one setting's value: `message` is formatted with name, value and choices."""

    id: str
    message: str
    test: Callable[[Any, Any], bool]  # (value, allowed values or None) -> valid
    choices: str = ""  # dotted path of the allowed values, for one_of


def positive(id="speech.E004"):
    return Rule(id, "{name} must be positive.", lambda value, _: value > 0)


AT_LEAST_ONE = Rule("speech.E002", "{name} must be at least 1.", lambda value, _: value >= 1)
NOT_NEGATIVE = Rule("speech.E007", "{name} must not be negative.", lambda value, _: value >= 0)
ENGINE_NAME = Rule(
    "speech.E001",
    "{name} is {value!r}; it must be one of: {choices}.",
    lambda value, allowed: value in allowed,
    choices="speech.runtime.ENGINES",
)
UPSTREAM_RATE = Rule(
    "speech.E006",
    "{name} must be one of: {choices}.",
    lambda value, allowed: value in allowed,
    choices="speech.stream.config.SAMPLE_RATES",
)


def _http_url(value, _):
    url = urlsplit(value)
    return url.scheme in ("http", "https") and bool(url.netloc)


UPSTREAM_URL = Rule(
    "speech.E005",
    "SPEECH_ENGINE is 'openai' but {name} is {value!r}; it must be the http(s) base "
    "URL of an OpenAI-compatible speech server, e.g. http://gpu-host:8000/v1.",
    _http_url,
)


# SPEECH_VOICE_ALIASES' default: every built-in voice of the openai SDK's types (`audio.speech`'s
# voices and the Live API's BuiltInVoice, openai 3.57) and the default voice of the omni servers'
# example clients: Qwen3-TTS's `Vivian` (vLLM-omni's streaming_speech_client.py and sglang-omni's
# QWEN3_TTS_DEFAULT_CUSTOM_VOICE) and Qwen3-Omni's `Ethan` (sglang-omni's talker). `default` is the
# engine's default voice.
OPENAI_VOICES = (
    "alloy", "ash", "ballad", "beacon", "bossa", "cedar", "cinder", "coral", "delta", "echo", "fable", "gleam",
    "marin", "meridian", "nova", "onyx", "quartz", "ripple", "sage", "shida", "shimmer", "stone", "tempo",
    "verse", "vesper", "willow",
)  # fmt: skip
OMNI_VOICES = ("vivian", "ethan")


def _alias_pairs(value, _):
    return all(len(item.split("=")) == 2 and all(part.strip() for part in item.split("=")) for item in value)


VOICE_ALIASES = Rule("speech.E009", "{name} must be a comma list of alias=voice pairs; got {value!r}.", _alias_pairs)


@dataclass(frozen=True)
class Setting:
    name: str
    parse: str  # django-environ's parser: Env.str, Env.int, Env.float, Env.bool or Env.list
    default: Any
    meaning: str  # the meaning cell of the docs' settings tables
    shown: str = ""  # the docs' default cell when it is not the default itself (unset, computed)
    rule: Rule | None = None
    engine: str = ""  # checked only when SPEECH_ENGINE is this engine

    def read(self, env):
        return getattr(env, self.parse)(self.name, default=self.default)

    @property
    def readme_default(self):
        if self.shown:
            return self.shown
        value = self.default
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = format(value, "g")
        else:
            text = str(value)
        return f"`{text}`"


SETTINGS = (
    Setting(
        "SPEECH_REDIS_PREFIX",
        "str",
        "speech",
        "prefix of every Redis key and channel (channel layer, per-key slots, heartbeats): deployments "
        "sharing one Redis need different prefixes",
    ),
    Setting("SPEECH_INSTANCE_ID", "str", "", "the instance's name in the session registry", shown="`hostname:pid`"),
    Setting(
        "SPEECH_ENGINE",
        "str",
        "hibari",
        "`hibari`; `openai` for an upstream server; `fake` is the test double (tones), only when chosen",
        rule=ENGINE_NAME,
    ),
    Setting(
        "SPEECH_ENGINE_WORKERS",
        "int",
        # The cores this process may run on (a container's cpuset limits them; os.cpu_count() is the host's).
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
        "synthesis threads per process",
        shown="number of cores",
        rule=AT_LEAST_ONE,
    ),
    Setting(
        "SPEECH_MAX_QUEUE_WAIT_S",
        "float",
        2.0,
        "new sessions (and REST requests) are refused while a new first segment would wait longer than this for synthesis",
        rule=positive("speech.E003"),
    ),
    Setting("SPEECH_CONFIG_TIMEOUT_S", "float", 10.0, "wait for `session.config`", rule=positive()),
    Setting(
        "SPEECH_IDLE_TIMEOUT_S", "float", 30.0, "wait for the next client frame while nothing is generating", rule=positive()
    ),
    Setting("SPEECH_MAX_CONFIG_BYTES", "int", 16 * 1024 * 1024, "`session.config` frame (UTF-8 bytes)", rule=positive()),
    Setting(
        "SPEECH_CONFIG_BUDGET_BYTES",
        "int",
        64 * 1024 * 1024,
        "memory for frames of 1 MiB or more in flight, per process (3 × each frame); past it such frames are "
        "refused with 4013. At least 3 × `SPEECH_MAX_CONFIG_BYTES` (`manage.py check`)",
    ),
    Setting("SPEECH_MAX_MESSAGE_BYTES", "int", 131072, "any later frame", rule=positive()),
    Setting("SPEECH_MAX_PENDING_CHARS", "int", 262144, "unsegmented + queued text", rule=positive()),
    Setting("SPEECH_MAX_CONTEXTS", "int", 32, "open contexts (turns) per WebSocket session", rule=positive()),
    Setting("SPEECH_MAX_SEGMENT_CHARS", "int", 4096, "one segment", rule=positive()),
    Setting("SPEECH_REQUIRE_API_KEY", "bool", False, "`true`: the WebSocket and every REST endpoint need a key"),
    Setting("SPEECH_MAX_SESSIONS_PER_KEY", "int", 8, "concurrent WebSocket sessions per key, across all instances"),
    Setting(
        "SPEECH_KEY_REQUESTS_PER_MINUTE",
        "int",
        600,
        "REST requests a key may make per minute on each instance (a minute's worth at once; a key's own rate "
        "overrides it); past it 429 with "
        "`Retry-After`. `0`: no limit",
        rule=NOT_NEGATIVE,
    ),
    Setting(
        "SPEECH_INSECURE",
        "bool",
        False,
        "`true` lets the server listen off loopback with the development key or without API keys (for trusted "
        "networks only); otherwise it refuses to start there",
    ),
    # empty: speech/web/origin.py follows DJANGO_ALLOWED_HOSTS
    Setting("SPEECH_ALLOWED_ORIGINS", "list", [], "browser origins allowed on the WebSocket", shown="`DJANGO_ALLOWED_HOSTS`"),
    Setting(
        "SPEECH_VOICE_ALIASES",
        "list",
        [f"{name}=default" for name in OPENAI_VOICES + OMNI_VOICES],
        "`alias=voice,alias=voice`: other servers' voice names taken for voices here (`default`: the engine's "
        "default voice); empty turns the defaults off; an alias never hides an uploaded or engine voice of its name",
        shown="OpenAI's voice names (`alloy`, `ash`, … `verse`, `marin`, `cedar`), `vivian`, `ethan` → `default`",
        rule=VOICE_ALIASES,
    ),
    Setting("SPEECH_WARM_UP", "bool", True, "warm the engine up before daphne listens (upstream: learn its voices)"),
    # SPEECH_ENGINE=openai: an OpenAI-compatible speech server (sglang-omni, vLLM-omni, OpenAI)
    Setting(
        "SPEECH_UPSTREAM_URL",
        "str",
        "",
        "`SPEECH_ENGINE=openai`: base URL of an OpenAI-compatible server, ending in `/v1` (`manage.py check` "
        "refuses to start without it)",
        shown="unset",
        rule=UPSTREAM_URL,
        engine="openai",
    ),
    Setting("SPEECH_UPSTREAM_API_KEY", "str", "", "sent as `Authorization: Bearer …`", shown="unset"),
    Setting(
        "SPEECH_UPSTREAM_MODEL",
        "str",
        "",
        "`model` when the client names none (OpenAI needs one, e.g. `gpt-4o-mini-tts`)",
        shown="unset",
    ),
    Setting(
        "SPEECH_UPSTREAM_VOICES",
        "list",
        [],
        "comma list of the upstream's voices, the first is the default (OpenAI has no voice listing: `alloy,ash,coral,…`)",
        shown="unset: asked of the upstream",
    ),
    Setting(
        "SPEECH_UPSTREAM_SAMPLE_RATE",
        "int",
        24000,
        "the rate of the upstream's PCM (OpenAI, Qwen3-TTS: 24000); a different `X-Sample-Rate` fails the segment",
        rule=UPSTREAM_RATE,
        engine="openai",
    ),
    Setting(
        "SPEECH_UPSTREAM_CONNECT_TIMEOUT_S",
        "float",
        5.0,
        "connecting, and waiting for a free pooled connection",
        rule=positive(),
        engine="openai",
    ),
    Setting(
        "SPEECH_UPSTREAM_READ_TIMEOUT_S",
        "float",
        30.0,
        "the longest silence of the upstream (before the first byte and between chunks), and how far its "
        "audio may fall behind real time",
        rule=positive(),
        engine="openai",
    ),
    Setting(
        "SPEECH_UPSTREAM_RETRIES",
        "int",
        2,
        "retries before the first byte (refused, dropped, 502/503/504)",
        rule=NOT_NEGATIVE,
        engine="openai",
    ),
    Setting(
        "SPEECH_UPSTREAM_MAX_CONNECTIONS",
        "int",
        100,
        "pooled connections to the upstream (a session holds at most two)",
        rule=positive(),
        engine="openai",
    ),
    Setting(
        "SPEECH_METRICS_TOKEN",
        "str",
        "",
        "set: `/metrics` wants `Authorization: Bearer <token>`",
        shown="unset: `/metrics` for clients on this machine only",
    ),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}


def from_environment(env):
    """Every SPEECH_* setting read from the environment by django-environ: name -> value."""
    return {setting.name: setting.read(env) for setting in SETTINGS}


class Settings:
    """Attribute access to the SPEECH_* settings: `conf.ENGINE` reads SPEECH_ENGINE."""

    def __getattr__(self, name):
        key = f"SPEECH_{name}"
        if key not in BY_NAME:
            raise AttributeError(name)
        return getattr(settings, key, BY_NAME[key].default)


conf = Settings()


def stream_limits():
    """The session core's Limits from the settings: the core itself reads no Django settings."""
    # Imported here: the settings module imports this one for its table, before the stream core
    # (and the audio libraries under it) is needed.
    from .stream.config import Limits

    return Limits(
        config_timeout_s=conf.CONFIG_TIMEOUT_S,
        idle_timeout_s=conf.IDLE_TIMEOUT_S,
        max_config_bytes=conf.MAX_CONFIG_BYTES,
        max_message_bytes=conf.MAX_MESSAGE_BYTES,
        max_pending_chars=conf.MAX_PENDING_CHARS,
        max_segment_chars=conf.MAX_SEGMENT_CHARS,
        max_contexts=conf.MAX_CONTEXTS,
    )


def voice_aliases():
    """SPEECH_VOICE_ALIASES as the session core takes it: lower-cased alias -> voice (read per session,
    so a changed setting applies at once; parsed once per value)."""
    return _alias_map(tuple(conf.VOICE_ALIASES))


@functools.cache
def _alias_map(items):
    pairs = (item.split("=", 1) for item in items if "=" in item)
    return MappingProxyType({alias.strip().lower(): voice.strip() for alias, voice in pairs})
