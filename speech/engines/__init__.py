"""Engines by name, and the process's engine (built once from settings, warmed up at start)."""

from .base import Capabilities, Engine, EngineBusy, EngineError, SynthesisRequest

ENGINES = {
    "hibari": "speech.engines.hibari.HibariEngine",
    "fake": "speech.engines.fake.FakeEngine",
    "openai": "speech.engines.openai.OpenAIEngine",
}

__all__ = ["Capabilities", "Engine", "EngineBusy", "EngineError", "SynthesisRequest", "build_engine", "get_engine"]

_engine = None


def build_engine(name):
    try:
        dotted = ENGINES[name]
    except KeyError:
        raise ValueError(f"SPEECH_ENGINE must be one of: {', '.join(sorted(ENGINES))} (got {name!r})") from None
    # Django is imported here, not at the top: the session core imports this package for the engine
    # interface and must load without Django settings (tests/test_layout.py).
    from django.utils.module_loading import import_string

    from ..conf import conf

    return import_string(dotted).from_settings(conf)


def get_engine():
    """The engine of this process, built on first use from SPEECH_ENGINE."""
    global _engine
    if _engine is None:
        from ..conf import conf

        _engine = build_engine(conf.ENGINE)
    return _engine
