"""Pipecat service for the streaming speech server: `SpeechServerTTSService` (see tts.py)."""

from .tts import DEFAULT_URL, SpeechServerError, SpeechServerTTSService

__all__ = ["DEFAULT_URL", "SpeechServerError", "SpeechServerTTSService"]
