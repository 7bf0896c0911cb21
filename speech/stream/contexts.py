"""A session's contexts: the turns it speaks one after another (docs/protocol.md, "Contexts").

Text without a `context_id` belongs to the default context; a named context is made by its first
`input.text` and lives until `context.done` or its cancel closes it. Contexts speak in the order
they were made: the one at the head holds the floor until it is closed, and the next waits, its
first segment synthesised ahead. The default context never closes: it gives up the floor whenever
it has nothing left to say, and text for it later takes a place at the back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from .errors import SpeechError
from .segmenter import Segmenter
from .utterance import Utterance

REMEMBERED_CLOSED = 1024  # closed ids refused later; the oldest are forgotten past this many
# Closed contexts whose utterance is kept: a listener still playing a turn whose audio was all sent
# may cut it after its context.done, and is told what it heard.
REMEMBERED_UTTERANCES = 4


class Context:
    def __init__(self, context_id: str | None, granularity: str, order: int) -> None:
        self.id = context_id
        self.segmenter = Segmenter(granularity)
        self.order = order  # its place in the speaking order
        self.utterance = Utterance()  # what it said since it began or since its last cancel
        self.jobs = 0  # its segments in the pipeline (queued, synthesising or being sent)
        self.sentences = 0  # its segments accepted and not dropped: its total_sentences
        self.finishing = False  # input.done named it: context.done once its last segment is done
        self.closed = False

    @property
    def named(self) -> bool:
        return self.id is not None

    @property
    def holds_floor(self) -> bool:
        """Later contexts wait for this one: it has segments, or it is a named context still open."""
        return not self.closed and (self.jobs > 0 or self.named)


class Contexts:
    def __init__(self, granularity: str, max_open: int) -> None:
        self.granularity = granularity
        self.max_open = max_open  # named contexts open at once; the default context is not counted
        self.default = Context(None, granularity, 0)
        self._named: dict[str, Context] = {}
        self._closed: OrderedDict[str, Context | None] = OrderedDict()
        self._order = 0

    def __iter__(self) -> Iterator[Context]:
        """Every open context, in speaking order."""
        return iter(sorted([self.default, *self._named.values()], key=lambda context: context.order))

    def find(self, context_id: str | None) -> Context | None:
        """The open context of that id (None: the default one); None when there is none."""
        return self.default if context_id is None else self._named.get(context_id)

    def ended(self, context_id: str) -> Context | None:
        """A context closed lately, for what was heard of it; None if unknown or long gone."""
        return self._closed.get(context_id)

    def for_text(self, context_id: str | None) -> Context:
        """The context new text goes to, made if needed; SpeechError if it is closed or one too many."""
        if context_id is None:
            if self.default.jobs == 0 and not self.default.segmenter.pending_chars:
                self.default.order = self._next()  # it gave up the floor: back of the line
            return self.default
        context = self._named.get(context_id)
        if context is not None:
            return context
        self.check_open(context_id)
        if len(self._named) >= self.max_open:
            raise SpeechError(f"too many open contexts (max {self.max_open})", param="context_id")
        context = self._named[context_id] = Context(context_id, self.granularity, self._next())
        return context

    def check_open(self, context_id: str) -> None:
        if context_id in self._closed:
            raise SpeechError(f"context '{context_id}' is closed", param="context_id")

    def close(self, context: Context) -> None:
        """A named context ends (done or cancelled); its id is refused from now on."""
        context.closed = True
        if context.id is not None and self._named.pop(context.id, None) is not None:
            self._closed[context.id] = context
            if len(self._closed) > REMEMBERED_UTTERANCES:
                self._closed[next(reversed(list(self._closed)[:-REMEMBERED_UTTERANCES]))] = None
            while len(self._closed) > REMEMBERED_CLOSED:
                self._closed.popitem(last=False)

    def head(self) -> Context | None:
        """The context that speaks now: the first in order that holds the floor."""
        return next((context for context in self if context.holds_floor), None)

    def _next(self) -> int:
        self._order += 1
        return self._order
