"""Words of a segment's text, and word timings spread over audio when an engine cannot align.

A word is a run of non-space characters with the punctuation at its ends taken off ("Hello," is
`Hello`; `$3.50`, `e.g` and `well-known` stay whole); a run of punctuation alone is no word
(docs/protocol.md, `audio.timestamps`). Text without spaces (Chinese, Japanese) is one word per run.
"""

from __future__ import annotations

import re
import unicodedata

from .engine import Alignment, WordTiming

_RUN = re.compile(r"\S+")
_VOWELS = re.compile(r"[aeiouyAEIOUY]+")
PAUSE_WEIGHT = {",": 1.0, ";": 1.5, ":": 1.5, ".": 2.5, "!": 2.5, "?": 2.5, "…": 2.5}  # in syllables


def _punctuation(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def word_spans(text: str) -> list[tuple[int, int]]:
    """`(char_start, char_end)` of every word of `text`, in order."""
    spans = []
    for run in _RUN.finditer(text):
        start, end = run.span()
        while start < end and _punctuation(text[start]):
            start += 1
        while end > start and _punctuation(text[end - 1]):
            end -= 1
        if start < end:
            spans.append((start, end))
    return spans


def _weight(word: str) -> float:
    """About the word's syllables: vowel groups, a digit one each, at least one."""
    digits = sum(char.isdigit() for char in word)
    return max(1.0, len(_VOWELS.findall(word)) + digits + 0.3 * (len(word) - digits) / 4)


def estimate(text: str, duration_s: float, spans: list[tuple[int, int]] | None = None) -> Alignment:
    """Words spread over `duration_s` seconds of speech by their syllables, with the pauses that
    punctuation after a word usually brings; marked `estimated`."""
    spans = word_spans(text) if spans is None else spans
    if not spans:
        return Alignment((), estimated=True)
    weights, pauses = [], []
    for index, (start, end) in enumerate(spans):
        weights.append(_weight(text[start:end]))
        following = text[end : spans[index + 1][0] if index + 1 < len(spans) else len(text)]
        pauses.append(max((PAUSE_WEIGHT.get(char, 0.0) for char in following), default=0.0) if index + 1 < len(spans) else 0.0)
    unit = duration_s / (sum(weights) + sum(pauses))
    words, at = [], 0.0
    for (start, end), weight, pause in zip(spans, weights, pauses, strict=True):
        words.append(WordTiming(start, end, at, min(duration_s, at + weight * unit)))
        at += (weight + pause) * unit
    return Alignment(tuple(words), estimated=True)
