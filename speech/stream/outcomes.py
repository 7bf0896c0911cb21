"""How a session ended, and its figures at the end: what the adapters (the registry, the metrics,
the log) read of a session once it is over."""

from __future__ import annotations

from dataclasses import dataclass

# A client that disconnects ends its session "disconnected"; a cancel (barge-in) ends no session.
OUTCOME_COMPLETED, OUTCOME_DISCONNECTED = "completed", "disconnected"
OUTCOME_TERMINATED, OUTCOME_FAILED = "terminated", "failed"


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    outcome: str  # one of the OUTCOME_* above
    segments: int  # sentence indexes given: segments announced (audio.start, or their error)
    bytes_sent: int  # audio bytes of the whole session
    first_audio_s: float | None  # the first segment: queued -> first audio frame sent; None: no audio
