"""Client text made safe for an engine: what reaches `Engine.stream` is text the engine can read.

Clients send any Unicode. Engines read a narrower set: Hibari's number reading calls int() on
whatever str.isdigit() accepts, and `int('⑵')` raises (circled, parenthesised, superscript and
dingbat digits are digits to isdigit() but not to int()). Found by fuzzing Hibari's text path with
every character of every Unicode category (tests/test_stress.py keeps those cases).

`for_engine` (every engine): NFKC, which spells compatibility characters the plain way (`⑵` ->
`(2)`, `²` -> `2`, full-width letters -> ASCII, ligatures split), then drops what no engine should
read: control characters become spaces, format characters (zero-width joiners, bidi marks),
surrogates, private-use and unassigned code points are dropped.

`for_number_reader` (engines that read digits with int(), Hibari): also every digit NFKC leaves
that int() does not take (`➊`, `⓵`) becomes its ASCII digit, and so do decimal digits of other
scripts (`٣` -> `3`), which such an engine would otherwise read in a language it does not speak.
"""

from __future__ import annotations

import unicodedata

_DROP = frozenset(("Cf", "Cs", "Co", "Cn"))


def _readable(ch):
    category = unicodedata.category(ch)
    if category == "Cc":
        return ch if ch == "\n" else " "  # Hibari splits paragraphs at newlines; other controls part words
    return "" if category in _DROP else ch


def for_engine(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    if text.isascii() and (text.isprintable() or "\n" in text and text.replace("\n", "").isprintable()):
        return text
    return "".join(map(_readable, text))


def for_number_reader(text: str) -> str:
    text = for_engine(text)
    if text.isascii():
        return text
    return "".join(str(unicodedata.digit(ch)) if ch.isdigit() and not ch.isascii() else ch for ch in text)
