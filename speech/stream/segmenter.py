"""Cut streamed text (chunks of language-model tokens) into segments to synthesise one by one.

Rules (docs/protocol.md, Segmentation):

* Sentence ends: a run of ``. ! ? …`` followed by whitespace; ``。！？`` immediately; a blank line
  (newline, optional horizontal whitespace, newline). Closing quotes/brackets (``CLOSERS``) right
  after the mark stay with the sentence; marks and closers may alternate within one run. A run
  holding a CJK mark ends at the first character that is neither a mark nor a closer.
* ``granularity="clause"`` adds ``, ; :`` (followed by whitespace) and ``，；、`` (immediately).
* Not ends: a lone ``.`` closing an abbreviation of ``ABBREVIATIONS`` (case-insensitive) or a single
  cased letter (initials: ``J. R. R.``; ``U.S.``); anything without whitespace after a Latin mark
  (``3.14``, ``1,000``, ``example.com``, ``v1.2``). Abbreviation checks look back only.
* A segment with no letter or digit is never returned alone: it is prefixed to the next segment
  (one space between if there was whitespace). At ``flush`` such a remainder, and such a held
  prefix, are dropped: nothing speakable is left.
* When a segment grows past ``max_chars_without_end`` characters without an end in its first
  ``max_chars_without_end`` characters, it is cut before the last whitespace in that window (in
  sentence granularity also after a ``，；、`` if later); with none there, before the first
  whitespace (or ``，；、``) that comes later. A run with neither is never cut. Repeat.

Text is processed one character at a time by a small state machine whose decisions depend only on
the characters seen so far, so any split of the input into chunks gives the same segments (a
decision that needs the next character waits for it, or for ``flush``). ``feed`` is amortised
linear: every character is handled once, and a forced cut rescans at most the current segment.
"""

from __future__ import annotations

import re

ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "e.g.", "i.e.", "a.m.", "p.m."})
CLOSERS = frozenset("\"'”’)]}」』】）»›〉》〕］｝")
_LATIN_ENDS, _CJK_ENDS = ".!?…", "。！？"
_LATIN_CLAUSE, _CJK_CLAUSE = ",;:", "，；、"
_NORMAL, _RUN, _NEWLINE = "normal", "run", "newline"  # states of the scanner
_LOOKBACK = 7  # longer than any abbreviation stem plus the character before it


def _speakable(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def _closes_abbreviation(before: str) -> bool:
    """True if a '.' right after ``before`` (the segment's last few characters) is not an end."""
    for abbr in ABBREVIATIONS:
        stem = abbr[:-1]
        k = len(stem)
        if before[-k:].lower() == stem and (len(before) == k or not before[-k - 1].isalnum()):
            return True
    last = before[-1:]
    is_initial = last.isalpha() and last.lower() != last.upper()  # a cased letter: not CJK
    return is_initial and (len(before) == 1 or not before[-2].isalnum())


class Segmenter:
    """Incremental segmenter: ``feed`` chunks, ``flush`` at commit/done, ``clear`` on barge-in."""

    def __init__(self, granularity: str = "sentence", max_chars_without_end: int = 400) -> None:
        if granularity not in ("sentence", "clause"):
            raise ValueError(f"granularity must be 'sentence' or 'clause', not {granularity!r}")
        if max_chars_without_end < 1:
            raise ValueError("max_chars_without_end must be at least 1")
        clause = granularity == "clause"
        self._max = max_chars_without_end
        self._cjk = frozenset(_CJK_ENDS + (_CJK_CLAUSE if clause else ""))
        self._marks = self._cjk | frozenset(_LATIN_ENDS + (_LATIN_CLAUSE if clause else ""))
        # Where a forced cut may fall; in clause granularity CJK clause marks are ends already.
        self._cut_marks = frozenset() if clause else frozenset(_CJK_CLAUSE)
        cut_class = r"\s" if clause else r"[\s" + _CJK_CLAUSE + "]"
        self._last_cut = re.compile(r"(?s).*" + cut_class)
        self._next_cut = re.compile(cut_class)
        self._chars: list[str] = []
        self.clear()

    def clear(self) -> None:
        """Drop everything held (barge-in)."""
        self._chars.clear()  # the current segment, without its leading whitespace
        self._mode = _NORMAL
        self._pend_at = 0  # index of the mark run / newline the scanner is waiting on
        self._run_cjk = False  # the pending run holds a CJK mark
        self._abbr = False  # the pending run is a lone '.' closing an abbreviation or initial
        self._nocut = False  # no forced cut is possible before the next whitespace
        self._gap = False  # whitespace was dropped before the current segment
        self._carry = ""  # segments without letters or digits, waiting for the next one

    @property
    def pending_chars(self) -> int:
        """Characters held and not yet returned (current segment plus any held prefix)."""
        return len(self._chars) + len(self._carry)

    @property
    def pending_text(self) -> str:
        """The text waiting for a segment end (what `flush` would cut now, before its clean-up)."""
        return f"{self._carry} {''.join(self._chars)}".strip()

    def feed(self, text: str) -> list[str]:
        out: list[str] = []
        for ch in text:
            self._step(ch, out)
        return out

    def flush(self) -> list[str]:
        out: list[str] = []
        self._emit("".join(self._chars), out)
        self.clear()  # drops a carry that found no speakable segment to join
        return out

    def _step(self, ch: str, out: list[str]) -> None:
        chars = self._chars
        if self._mode == _RUN:
            if ch in self._marks or ch in CLOSERS:
                chars.append(ch)
                self._abbr = False
                self._run_cjk = self._run_cjk or ch in self._cjk
                self._force_cuts(out)
                return
            self._mode = _NORMAL
            if self._run_cjk or (ch.isspace() and not self._abbr):
                self._emit_all(out)  # ch starts the next segment (or is dropped whitespace)
        elif self._mode == _NEWLINE:
            if ch == "\n":  # blank line
                self._emit_all(out)
                self._gap = True
                return
            if ch.isspace():
                chars.append(ch)
                self._force_cuts(out)
                return
            self._mode = _NORMAL
        if ch.isspace():
            if not chars or self._nocut:
                if chars:
                    self._emit_all(out)
                self._gap = True
                return
            if ch == "\n":
                self._mode, self._pend_at = _NEWLINE, len(chars)
        elif ch in self._marks:
            self._mode, self._pend_at = _RUN, len(chars)
            self._run_cjk = ch in self._cjk
            self._abbr = ch == "." and _closes_abbreviation("".join(chars[-_LOOKBACK:]))
        chars.append(ch)
        if self._nocut and ch in self._cut_marks:
            self._emit_all(out)
        else:
            self._force_cuts(out)

    def _force_cuts(self, out: list[str]) -> None:
        """Apply the max_chars_without_end rule, unless an end may still come inside the window."""
        chars, limit = self._chars, self._max
        while len(chars) > limit and not self._nocut and (self._mode == _NORMAL or self._pend_at >= limit):
            text = "".join(chars)
            m = self._last_cut.match(text, 0, limit) or self._next_cut.search(text, limit)
            if m is None:
                self._nocut = True
                return
            cut = m.end() if text[m.end() - 1] in self._cut_marks else m.end() - 1
            self._emit(text[:cut], out)
            rest = text[cut:].lstrip()
            self._gap = len(rest) < len(text) - cut
            self._pend_at -= len(text) - len(rest)
            if self._pend_at < 0:  # the pending newline was cut away with its whitespace
                self._mode = _NORMAL
            chars[:] = rest

    def _emit_all(self, out: list[str]) -> None:
        self._emit("".join(self._chars), out)
        self._chars.clear()
        self._mode = _NORMAL
        self._nocut = False

    def _emit(self, text: str, out: list[str]) -> None:
        text = text.strip()
        if not text:
            return
        if self._carry:
            text = self._carry + (" " if self._gap else "") + text
        if _speakable(text):
            out.append(text)
            self._carry = ""
        else:
            self._carry = text
        self._gap = False
