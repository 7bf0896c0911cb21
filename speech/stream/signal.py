"""A control signal to a live session (cancel its speech, or terminate it), as a pydantic model like
the client messages of messages.py. The control plane builds it (speech/control/signals.py) and sends
it over the channel layer as a plain dict; the adapter that receives it reads it here once, and the
session handles the model.

Any Django code may send a signal with the layer's `group_send` (docs/operations.md, "Control across instances"), so
reading is lenient where the senders vary: an `issued_at` that is not a number (or is missing) means
"current", a `reason` that is not a non-empty string means the default one. A kind other than
cancel or terminate is no signal of the session's (`read` answers None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

CANCEL, TERMINATE = "speech.cancel", "speech.terminate"


class ControlSignal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    type: Literal["speech.cancel", "speech.terminate"]
    session_id: str | None = None
    issued_at: float | None = None  # time.time() when sent: a cancel cuts only speech begun before it
    reason: str = ""  # a terminate's error message; empty: the session's default

    @field_validator("issued_at", mode="before")
    @classmethod
    def _a_number_or_none(cls, value: Any) -> Any:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        try:
            return float(value)
        except OverflowError:  # an integer past float's range: earlier or later than any time
            return math.inf if value > 0 else -math.inf

    @field_validator("session_id", mode="before")
    @classmethod
    def _a_string_or_none(cls, value: Any) -> Any:
        return value if isinstance(value, str) else None

    @field_validator("reason", mode="before")
    @classmethod
    def _a_string_or_empty(cls, value: Any) -> Any:
        return value if isinstance(value, str) else ""

    @classmethod
    def read(cls, message: Mapping[str, Any]) -> ControlSignal | None:
        """The signal in a channel-layer message; None when it is none of the session's."""
        try:
            return cls.model_validate(message)
        except ValidationError:
            return None
