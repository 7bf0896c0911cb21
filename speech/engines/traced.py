"""Text rewritten step by step that remembers, for every character, where in the original it came from.

Engines normalise text before reading it ("Dr." becomes "Doctor", "7:30" becomes "seven thirty"); to
say which words of the client's text a sound belongs to, every rewrite is traced back. `Traced.sub`
and `Traced.replace` work as `re.sub` and `str.replace` do; the characters a match put in take their
origins from the characters it replaced, matched letter for letter where the two agree ("7:30 p.m."
-> "seven thirty P.M.": "P.M." comes from "p.m.", "seven thirty" from "7:30"). `Traced.rewritten`
follows any other transform (NFKC, say) by the same character match.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

Span = tuple[int, int]


class Traced:
    """`text`, and for each of its characters the `(start, end)` of the original it came from."""

    __slots__ = ("origin", "text")

    def __init__(self, text: str, origin: list[Span]):
        self.text, self.origin = text, origin

    @classmethod
    def of(cls, text: str) -> Traced:
        return cls(text, [(i, i + 1) for i in range(len(text))])

    def __getitem__(self, item: slice) -> Traced:
        return Traced(self.text[item], self.origin[item])

    def span(self, start: int, end: int) -> Span | None:
        """The original's span that `text[start:end]` came from (None for nothing)."""
        if start >= end:
            return None
        origins = self.origin[start:end]
        return min(o[0] for o in origins), max(o[1] for o in origins)

    def strip(self) -> Traced:
        stripped = self.text.lstrip()
        start = len(self.text) - len(stripped)
        return self[start : start + len(stripped.rstrip())]

    def replace(self, old: str, new: str) -> Traced:
        return self.sub(re.compile(re.escape(old)), lambda _: new) if old in self.text else self

    def sub(self, pattern: re.Pattern[str], repl: str | Callable[[re.Match[str]], str]) -> Traced:
        """`pattern.sub(repl, text)`, traced."""
        text, origin, at = [], [], 0
        for match in pattern.finditer(self.text):
            start, end = match.span()
            new = repl(match) if callable(repl) else match.expand(repl) if "\\" in repl else repl
            text.append(self.text[at:start])
            origin += self.origin[at:start]
            text.append(new)
            origin += _origins(self, start, end, new)
            at = end
        if not text:
            return self
        text.append(self.text[at:])
        origin += self.origin[at:]
        return Traced("".join(text), origin)

    def rewritten(self, new: str) -> Traced:
        """`new`, a transform of this text, traced by matching the two character by character."""
        if new == self.text:
            return self
        return Traced(new, _origins(self, 0, len(self.text), new))


def _origins(traced: Traced, start: int, end: int, new: str) -> list[Span]:
    """Origins of `new`, which took the place of `traced.text[start:end]`: a character matched (case
    aside) takes its counterpart's origin, a replaced run the origin of what it replaced, an inserted
    run that of the character before it (or after it, at the start)."""
    old = traced.text[start:end]
    whole = traced.span(start, end) or _point(traced, start)
    if not old or not new:
        return [whole] * len(new)
    if old.lower() == new.lower():
        return traced.origin[start:end]
    origin: list[Span] = []
    matcher = difflib.SequenceMatcher(None, old.lower(), new.lower(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            origin += traced.origin[start + i1 : start + i2]
        elif tag == "replace":
            origin += [traced.span(start + i1, start + i2) or whole] * (j2 - j1)
        elif tag == "insert":
            near = start + i1 - 1 if i1 > 0 else start + i1
            origin += [traced.origin[near]] * (j2 - j1)
    return origin


def _point(traced: Traced, at: int) -> Span:
    """Where an insertion at `at` (an empty match) sits in the original."""
    if at < len(traced.origin):
        return traced.origin[at][0], traced.origin[at][0]
    end = traced.origin[-1][1] if traced.origin else 0
    return end, end
