"""The transport port: how a session talks back to its client (the server's connection,
speech/server/connection.py, or a test's recorder). `send_bytes` waits while the connection's outgoing buffer is full: that is the
session's backpressure."""

from __future__ import annotations

from typing import Protocol


class Transport(Protocol):
    async def send_json(self, event: dict) -> None: ...
    async def send_bytes(self, data: bytes) -> None: ...
    async def close(self, code: int, audio_ahead_s: float = 0.0) -> None:
        """Close with `code`; the client may still be playing `audio_ahead_s` seconds of audio it has received."""
        ...

    def send_room(self) -> int:
        """Bytes of audio the connection would send at once, whole, right now (0: unknown)."""
        ...
