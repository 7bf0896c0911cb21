"""The engine port: one segment in, an async stream of audio chunks out, cancellable.

Shaped like httpx's transport base class: a small abstract class the session calls, and a test
double (`speech.engines.fake.FakeEngine`) beside the real ones (speech/engines/ implements it).
`Ticket`: a segment's place in an engine's synthesis queue, and `abandon` when nobody will hear it.
"""

from __future__ import annotations

import abc
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .errors import QUEUE_FULL_MESSAGE, SERVER_ERROR, SpeechError
from .meter import NO_METER, Meter


class TicketQueue(Protocol):
    """A synthesis queue that holds work of tickets (speech/engines/pool.py)."""

    def abandon(self, ticket: Ticket) -> bool:
        """Drop the ticket's waiting jobs and stop its running one; True when it held any. The tasks
        awaiting them are not told: the ticket's owner cancels those."""


queues: weakref.WeakSet[TicketQueue] = weakref.WeakSet()  # every queue of the process, for Ticket.abandon


class Ticket:
    """A segment's place in the queue. The pipeline sets `current` when the segment becomes the one
    being delivered; until then its jobs wait behind every current one. `deadline` (time.monotonic()
    seconds) is when the session's client runs out of audio; None: due when the job was queued."""

    __slots__ = ("current", "deadline", "abandoned")

    def __init__(self, current: bool = True, deadline: float | None = None) -> None:
        self.current = current
        self.deadline = deadline
        self.abandoned = False

    def abandon(self) -> bool:
        """Nobody will hear this segment (hang-up, cancel): every queue drops its waiting jobs now and gives
        the place of a running one to the next job at once; that one stops at its next release point.
        True when a queue held work of it: the tasks awaiting that work hear nothing, and the caller
        cancels them when it suits it. Once: a hang-up reaches it twice (the connection's loss, then the
        disconnect), and a queue has nothing of an abandoned ticket left to drop (docs/decisions.md,
        "Hang-ups: where the probe's time went")."""
        if self.abandoned:
            return False
        self.abandoned = True
        held = False
        for queue in list(queues):
            held = queue.abandon(self) or held
        return held


CURRENT = Ticket()  # for work with no look-ahead (REST speech, warm-up): due when queued; never abandoned


@dataclass(frozen=True)
class Capabilities:
    """What an engine offers; the handshake validates a session's config against it."""

    name: str
    voices: tuple[str, ...]
    default_voice: str
    sample_rate: int
    speed_range: tuple[float, float] = (1.0, 1.0)
    reference_audio: bool = False
    instructions: bool = False
    any_voice: bool = False  # the voice list is not known: any name is passed on for the engine to judge
    # Word timings come from the model itself and cost next to nothing: the session asks for them
    # always (what was heard on a cancel), not only when the client wants `audio.timestamps`.
    aligns: bool = False


@dataclass(frozen=True)
class ReferenceVoice:
    """What an engine that clones voices gets for an uploaded voice."""

    name: str
    audio: bytes
    container: str
    transcript: str
    language: str


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    voice: str
    speed: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict)  # model, language, seed, temperature, …
    reference: ReferenceVoice | None = None  # audio + transcript, for engines that clone
    ticket: Ticket = CURRENT  # the segment's place in a synthesis queue (Ticket)
    # The caller takes 16-bit samples (no transform follows): chunks are int16, quantised as
    # speech.audio.signal.quantise does, by the engine where the audio is made (Engine.stream).
    pcm16: bool = False
    # The caller wants word timings: the stream also yields `Alignment`s (Engine.stream).
    timestamps: bool = False
    # The listener has no audio in hand: an engine that can sends the segment's first words before the
    # rest of its first sentence is rendered (Hibari: speech.engines.hibari_pieces).
    first_words: bool = False


@dataclass(frozen=True)
class WordTiming:
    """One word of a request's text: `text[char_start:char_end]`, heard from `start_s` to `end_s`,
    in seconds from the first sample the engine's stream yields (after the engine's own trimming)."""

    char_start: int
    char_end: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Alignment:
    """Timings of some words of the request's text (`speech.stream.words.word_spans` says what a word
    is). `estimated`: the engine could not align and spread the words over its audio instead."""

    words: tuple[WordTiming, ...]
    estimated: bool = False


class EngineError(SpeechError):
    """A failure of one segment; the session reports it and goes on with the next segment."""

    def __init__(
        self, message: str, *, error_type: str = SERVER_ERROR, param: str | None = None, code: int | None = None
    ) -> None:
        super().__init__(message, error_type=error_type, param=param, code=code)


class EngineBusy(EngineError):
    def __init__(self) -> None:
        super().__init__(QUEUE_FULL_MESSAGE)


class Engine(abc.ABC):
    capabilities: Capabilities

    @classmethod
    def from_settings(cls, conf: Any, meter: Meter = NO_METER) -> Engine:
        """The engine as the SPEECH_* settings describe it; `meter` takes its synthesis pool's figures."""
        return cls()

    @abc.abstractmethod
    def stream(self, request: SynthesisRequest) -> AsyncIterator[np.ndarray | Alignment]:
        """Yield mono chunks at `capabilities.sample_rate`: float32 in [-1, 1], or int16 when
        `request.pcm16` (`speech.audio.signal.quantise`'s samples).

        With `request.timestamps`, also yield `Alignment`s: together they cover every word of
        `request.text` once, in order, each before the first chunk that holds audio of its words;
        times never decrease and never pass the end of the audio yielded in the end.

        Quantise where the audio is made: on the synthesis thread that made it, or straight from an
        upstream's own 16-bit PCM, never on the event loop, which would read the float32 array again from
        another core's cache (docs/decisions.md#delivery-frames-and-writes).

        An engine may start work when this is called, before the first iteration (Hibari queues the
        segment's first job): whoever asks for a stream reads it to its end or closes it. Cancelling
        the consuming task, or closing the iterator (read or not), must abort the engine's work for
        this request (queued work is dropped; running work stops at its next step)."""

    def estimated_wait(self) -> float:
        """Seconds a new session's first segment would wait before its synthesis starts here;
        the handshake refuses new sessions past SPEECH_MAX_QUEUE_WAIT_S. Engines without a local
        queue (an upstream server) answer 0: the upstream judges its own load."""
        return 0.0

    async def warm_up(self) -> None:
        """Load lazily-loaded parts so the first client does not pay for them."""

    async def ready(self) -> None:
        """Readiness (`GET /health`): raise EngineError saying why this engine cannot serve now.
        An embedded engine that was built is ready."""

    async def aclose(self) -> None:
        """Release threads and connections."""
