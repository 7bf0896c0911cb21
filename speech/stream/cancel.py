"""Cancels: a context's speech (or every context's) is cut, and the answer says what was heard.

`input.cancel` and the control plane's cancel come here from the session. The answer,
`input.cancelled`, reports the utterance that was playing (or the named context's): how much of it
was played, by the client's figure or the server's estimate, and the text heard and not heard
(utterance.py). The context is reset: a named one is closed, the default one begins a new utterance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from .events import InputCancelled
from .utterance import Utterance

if TYPE_CHECKING:
    from .contexts import Context, Contexts
    from .meter import Meter
    from .pipeline import Pipeline
    from .transport import Transport

Origin = Literal["client", "server"]  # who asked for a cancel: input.cancel, or the control plane


class Canceller:
    def __init__(
        self,
        session_id: str,
        transport: Transport,
        contexts: Contexts,
        pipeline: Pipeline,
        total: Callable[[Context | None], int],
        meter: Meter,
    ) -> None:
        self.session_id = session_id
        self.transport = transport
        self.contexts = contexts
        self.pipeline = pipeline
        self.total = total  # total_sentences of an event about a context (session.py)
        self.meter = meter

    async def cancel(self, context_id: str | None, played_ms: float | None, origin: Origin) -> None:
        if context_id is None:
            await self._cancel_all(played_ms, origin)
        else:
            await self._cancel_context(context_id, played_ms, origin)

    async def answer_stale(self) -> None:
        """A control-plane cancel issued before the current speech began: answered, cutting nothing."""
        await self._send_cancelled(0, "server", self._speaking(), None, [], cut=False)

    async def _cancel_all(self, played_ms: float | None, origin: Origin) -> None:
        """Every context is cut; the heard text is the one that was speaking's (or next to speak)."""
        reported = self._speaking()
        unsaid = self._unsaid(reported)
        cancelled = await self.pipeline.cancel()
        await self._send_cancelled(cancelled, origin, reported, played_ms, unsaid)
        for context in list(self.contexts):
            self._reset(context)

    def _speaking(self) -> Context:
        """The context whose audio is playing, or is next to play."""
        return self.contexts.head() or self.contexts.default

    async def _cancel_context(self, context_id: str, played_ms: float | None, origin: Origin) -> None:
        context = self.contexts.find(context_id)
        if context is None:  # never made, or already closed: nothing to cut; what was heard if known
            ended = self.contexts.ended(context_id)
            await self._send_cancelled(0, origin, ended, played_ms, [], context_id=context_id)
            return
        unspoken = self._unsaid(context)
        cancelled = await self.pipeline.cancel(context)
        await self._send_cancelled(cancelled, origin, context, played_ms, unspoken)
        self._reset(context)
        self.pipeline.resume()  # the next context speaks now

    def _unsaid(self, context: Context) -> list[str]:
        """The text a context accepted that has no audio out yet: queued segments and its buffer."""
        queued = [job.text for job in self.pipeline.jobs if job.context is context and not job.announced]
        return [*queued, context.segmenter.pending_text]

    def _reset(self, context: Context) -> None:
        """After its cancel: a named context is closed; the default one starts a new utterance."""
        context.segmenter.clear()
        if context.named:
            self.contexts.close(context)
        else:
            context.utterance = Utterance()

    async def _send_cancelled(
        self,
        cancelled: int,
        origin: Origin,
        context: Context | None,
        played_ms: float | None,
        unsaid: list[str],
        *,
        context_id: str | None = None,
        cut: bool = True,
    ) -> None:
        """input.cancelled with what the listener heard of `context`'s utterance: `played_ms` from the
        client, or the server's estimate of real-time playback. A cancel that `cut` it means the
        client stops playing it."""
        utterance = context.utterance if context is not None else Utterance()
        source: Literal["client", "estimate"] = "client" if played_ms is not None and origin == "client" else "estimate"
        if source == "estimate":
            played_ms = utterance.played_estimate_ms(time.monotonic())
        played = min(float(played_ms), utterance.sent_ms)  # type: ignore[arg-type]  # set above
        spoken, unspoken = utterance.heard(played)
        if cut:
            self.pipeline.drop_unplayed(utterance)
        self.meter.cancelled(origin)
        await self.transport.send_json(
            InputCancelled(
                session_id=self.session_id,
                context_id=context.id if context is not None else context_id,
                cancelled_sentences=cancelled,
                total_sentences=self.total(context) if context is not None else 0,
                origin=origin,
                played_ms=round(played, 1),
                played_ms_source=source,
                spoken_text=spoken,
                unspoken_text=" ".join(part for part in [*unspoken, *unsaid] if part),
            ).dump()
        )
