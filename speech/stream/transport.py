"""The transport port: how a session talks back to its client (the Channels consumer in the server,
a recorder in tests). `send_bytes` waits while the connection's outgoing buffer is full: that is the
session's backpressure."""

from __future__ import annotations

from typing import Protocol


class Transport(Protocol):
    async def send_json(self, event: dict) -> None: ...
    async def send_bytes(self, data: bytes) -> None: ...
    async def close(self, code: int) -> None: ...

    def send_room(self) -> int:
        """Bytes of audio the connection would send at once, whole, right now (0: unknown)."""
        ...
