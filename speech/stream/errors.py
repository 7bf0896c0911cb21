"""Errors of the speech protocol: the exact `error` events and close codes (docs/protocol.md, Errors, Close codes)."""

from __future__ import annotations

from typing import Any

# Close codes (docs/protocol.md, Close codes): 4000 + the RFC 6455 code they stand for.
CLOSE_NORMAL = 1000
CLOSE_TERMINATED = 4001
CLOSE_POLICY = 4008
CLOSE_TOO_BIG = 4009
CLOSE_INTERNAL = 4011
CLOSE_CAPACITY = 4013

BAD_REQUEST = "BadRequestError"
SERVER_ERROR = "server_error"
RATE_LIMIT = "rate_limit_error"

QUEUE_FULL_MESSAGE = "The request queue is full."


class SpeechError(Exception):
    """One `error` event. `close_code` set means fatal: the session closes with it after the event."""

    def __init__(
        self,
        message: str,
        *,
        error_type: str = BAD_REQUEST,
        param: str | None = None,
        code: int | None = 400,
        close_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.close_code = close_code

    @property
    def fatal(self) -> bool:
        return self.close_code is not None

    def event(self, **extra: Any) -> dict[str, Any]:
        """The `error` event (events.ErrorEvent) as sent; `extra`: the segment's id, sentence_index, partial_audio."""
        from .events import ErrorEvent  # here: events.py and messages.py import this module

        return ErrorEvent(message=self.message, error_type=self.error_type, param=self.param, code=self.code, **extra).dump()


def bad_request(message: str, param: str | None = None, *, close_code: int | None = None) -> SpeechError:
    return SpeechError(message, param=param, close_code=close_code)


def fatal(message: str, param: str | None = None, *, close_code: int = CLOSE_POLICY) -> SpeechError:
    return SpeechError(message, param=param, close_code=close_code)


def server_error(message: str) -> SpeechError:
    return SpeechError(message, error_type=SERVER_ERROR, code=None)


def at_capacity() -> SpeechError:
    """The handshake's refusal when this instance cannot start a new session's speech in time."""
    return SpeechError(QUEUE_FULL_MESSAGE, error_type=SERVER_ERROR, code=None, close_code=CLOSE_CAPACITY)
