"""The process's engine: built once from SPEECH_ENGINE (speech/conf.py) with the process's meter
(speech/metrics.py), warmed up at start (ttsproject/asgi.py). The engine package knows nothing of
settings: this adapter picks and builds the engine by name."""

from __future__ import annotations

from django.utils.module_loading import import_string

from . import metrics
from .conf import conf
from .stream.engine import Engine

ENGINES = {
    "hibari": "speech.engines.hibari.HibariEngine",
    "fake": "speech.engines.fake.FakeEngine",
    "openai": "speech.engines.openai.OpenAIEngine",
}

_engine: Engine | None = None


def build_engine(name: str) -> Engine:
    try:
        dotted = ENGINES[name]
    except KeyError:
        raise ValueError(f"SPEECH_ENGINE must be one of: {', '.join(sorted(ENGINES))} (got {name!r})") from None
    return import_string(dotted).from_settings(conf, metrics.METER)


def get_engine() -> Engine:
    """The engine of this process, built on first use from SPEECH_ENGINE."""
    global _engine
    if _engine is None:
        _engine = build_engine(conf.ENGINE)
    return _engine
