"""The instrumentation port: what the session core and the engines' synthesis pool report as they
work. speech/metrics.py implements it with Prometheus; the default records nothing, so the core
runs (in tests, in another program) without a metrics library."""

from __future__ import annotations

from typing import Protocol


class Meter(Protocol):
    def first_audio(self, seconds: float) -> None:
        """A session's first segment: from its text being queued to its first audio frame sent."""

    def audio_sent(self, nbytes: int, seconds: float) -> None:
        """An audio frame went to a client."""

    def segment_synthesised(self, engine_s: float, audio_s: float) -> None:
        """An engine's stream of one segment ended normally: time spent waiting for it, audio it made."""

    def cancelled(self, origin: str) -> None:
        """A barge-in was answered (input.cancelled), asked for by the client or the server."""

    def error_sent(self, error_type: str, code: int | None) -> None:
        """An `error` event was built to be sent to a WebSocket client."""

    def engine_job(self, waited: float, ran: float) -> None:
        """A synthesis pool's job ran: seconds it waited for a thread, and ran on it."""

    def engine_job_end(self, outcome: str) -> None:
        """A synthesis pool's job ended: completed, failed, dropped, stopped or unheard."""


class NullMeter:
    """Records nothing."""

    def first_audio(self, seconds: float) -> None:
        pass

    def audio_sent(self, nbytes: int, seconds: float) -> None:
        pass

    def segment_synthesised(self, engine_s: float, audio_s: float) -> None:
        pass

    def cancelled(self, origin: str) -> None:
        pass

    def error_sent(self, error_type: str, code: int | None) -> None:
        pass

    def engine_job(self, waited: float, ran: float) -> None:
        pass

    def engine_job_end(self, outcome: str) -> None:
        pass


NO_METER: Meter = NullMeter()
