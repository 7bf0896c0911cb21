"""LiveKit Agents plugin for the streaming speech server: `TTS` (streaming, aligned transcript)."""

from livekit.agents import Plugin

from .log import logger
from .tts import DEFAULT_URL, TTS, SynthesizeStream
from .version import __version__

__all__ = ["DEFAULT_URL", "TTS", "SynthesizeStream", "__version__"]


class SpeechServerPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


Plugin.register_plugin(SpeechServerPlugin())
