"""Engines by name, and the process's engine (built once from settings, warmed up at start)."""

from importlib import import_module

from ..conf import conf
from .base import Capabilities, Engine, EngineBusy, EngineError, SynthesisRequest

ENGINES = {
    "hibari": "speech.engines.hibari.HibariEngine",
    "fake": "speech.engines.fake.FakeEngine",
    "openai": "speech.engines.upstream.OpenAIEngine",
}

__all__ = ["Capabilities", "Engine", "EngineBusy", "EngineError", "SynthesisRequest", "build_engine", "get_engine"]

_engine = None


def build_engine(name):
    try:
        dotted = ENGINES[name]
    except KeyError:
        raise ValueError(f"SPEECH_ENGINE must be one of: {', '.join(sorted(ENGINES))} (got {name!r})") from None
    module, cls = dotted.rsplit(".", 1)
    return getattr(import_module(module), cls).from_settings(conf)


def get_engine():
    """The engine of this process, built on first use from SPEECH_ENGINE."""
    global _engine
    if _engine is None:
        _engine = build_engine(conf.ENGINE)
    return _engine
