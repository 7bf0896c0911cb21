"""Hibari's text path (`Hibari.phonemize`), redone so that every phoneme knows its word of the client's text.

Hibari reads a segment as: our `for_number_reader` (NFKC and digits), its sentence split, its
normaliser (times, dates, units, titles, abbreviations... "7:30 p.m." -> "seven thirty P.M."), its
tokeniser and lexicon (a token's phonemes, a space after a token that had whitespace after it), and
a split of sentences over `MAX_PHONEMES` at clause punctuation. Each step is followed here with the
same code, except the normaliser, whose steps are replayed on a `Traced` string (its own patterns and
readers, in its order) so each normalised character knows the span of the request's text it came
from. The phoneme strings are the very ones `Hibari.phonemize` makes (tests/test_hibari_align.py
checks it over varied text), so audio does not depend on whether timings are asked for.

Tokens map to words whitespace run by whitespace run: the tokeniser ends a run of the normalised text
with a token that has whitespace after it, so the n-th run of tokens is the n-th run of normalised
text, which `Traced` maps to a span of the request's text, and so to its words (`word_spans`). A run
of punctuation alone that is spoken ("&" -> "and") belongs to the word before it. Should the runs ever
not pair up (a Hibari change), the sentence's words are spread over its phonemes and the part is
marked estimated.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from ..stream.words import word_spans
from .text import for_number_reader
from .traced import Traced

# Phoneme characters that are pauses or intonation, no word's sound: punctuation and the word space.
GAPS = frozenset(' ;:,.!?—…"()“”→↓↗↘')
_RUN = re.compile(r"\S+")


@dataclass(frozen=True)
class Part:
    """One model call: `phonemes` (exactly as `Hibari.phonemize` gives them) and the words they speak.

    `entries`: `(first_word, last_word, id_ranges)` in order, covering the words this part reports;
    `id_ranges` are `(first, end)` indexes into the part's phoneme ids (0 pads included) of the
    tokens that speak those words; none for words nothing speaks (they take no time)."""

    phonemes: str
    ids: tuple[int, ...]
    entries: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...]
    estimated: bool


@dataclass(frozen=True)
class Plan:
    text: str
    spans: list[tuple[int, int]]  # word_spans(text)
    parts: tuple[Part, ...]


def normalised(t: Traced) -> Traced:
    """`hibari.g2p.normalize.normalize`, step for step, on a traced string."""
    n = importlib.import_module("hibari.g2p.normalize")  # the package's `normalize` attribute is the function

    t = t.sub(n.RE_WS, " ").strip()
    if not t.text:
        return t
    for old, new in (("\xa0", " "), ("’", "'"), ("‒", "-"), ("―", "—")):
        t = t.replace(old, new)
    for pattern, repl in (
        (n.RE_TIME, n._time),
        (n.RE_DATE_ISO, n._date_iso),
        (n.RE_DATE_US, n._date_us),
        (n.RE_BIG_MONEY, n._big_money),
        (n.RE_CENTS, lambda m: f"{m.group(1)} {n._plural(m.group(1), n.CURRENCY_WORDS['¢'])}"),
        (n.RE_CURRENCY, n._currency),
        (n.RE_DEG, n._deg),
        (n.RE_UNIT, n._unit),
        (n.RE_MONTH_DAY, n._month_day),
        (n.RE_DAY_MONTH, n._day_month),
        (n.RE_TITLE, lambda m: n.TITLES[m.group(1)] + " "),
        (
            n.RE_ABBREV,
            lambda m: n.ABBREV[m.group(1)] + ("." if m.end() == len(m.string) and m.group(1).endswith(".") else ""),
        ),
        (n.RE_NO, lambda m: "Number " if m.group(1) == "No" else "Numbers "),
        (n.RE_HASH, "number "),
        (n.RE_ROMAN_C, lambda m: f"{m.group(1)} {n._roman(m.group(2))}"),
        (n.RE_ROMAN_O, lambda m: f"{m.group(1)} the {n.N.ordinal(n._roman(m.group(2)))}"),
        (n.RE_PHONE, lambda m: " ".join(m.group(0).replace("-", ", "))),
        (n.RE_FRACTION, n._fraction),
        (n.RE_RANGE, lambda m: f"{m.group(1)} to {m.group(2)}"),
        (n.RE_PLUS, "plus "),
    ):
        t = t.sub(pattern, repl)
    for sym, word in n.SYMBOLS.items():
        if sym in t.text:
            pat = rf"(?<=\S) ?{re.escape(sym)} ?(?=\S)" if sym in "=<>~" else re.escape(sym)
            t = t.sub(re.compile(pat), f" {word} " if word else " ")
    return t.sub(n.RE_WS, " ").sub(n.RE_SPACE_PUNCT, lambda m: m.group(1)).strip()


def plan(tts, text: str) -> Plan:
    """The parts Hibari renders for `text`, each with the words of `text` it speaks."""
    from hibari.tts import _CLAUSE, MAX_PHONEMES

    spans = word_spans(text)
    owner = _word_of_char(text, spans)
    readable = Traced.of(text).rewritten(for_number_reader(text))
    pieces: list[tuple[str, list[int | None], bool]] = []
    units: list[tuple[int, int] | None] = []  # the words each unit's phonemes speak
    at = 0
    for sentence in tts.split_sentences(readable.text):
        start = readable.text.index(sentence, at)
        at = start + len(sentence)
        phonemes, labels, estimated = _sentence(tts.g2p, normalised(readable[start:at]), owner, units)
        if phonemes:
            pieces += [(p, lab, estimated) for p, lab in _clauses(phonemes, labels, _CLAUSE, MAX_PHONEMES)]
    vocab = tts.vocab
    parts, next_word = [], 0
    for index, (phonemes, labels, estimated) in enumerate(pieces):
        ranges: dict[int, list[int]] = {}
        ids = [0]
        for char, label in zip(phonemes, labels, strict=True):
            if char in vocab:
                ids.append(vocab[char])
                if label is not None:
                    ranges.setdefault(label, [len(ids) - 1, len(ids)])[1] = len(ids)
        ids.append(0)
        last = len(spans) - 1 if index == len(pieces) - 1 else None
        entries, next_word = _entries(ranges, units, next_word, last)
        parts.append(Part(phonemes, tuple(ids), entries, estimated))
    return Plan(text, spans, tuple(parts))


def _word_of_char(text: str, spans: list[tuple[int, int]]) -> list[int]:
    """For each character of `text`, the index of the word its whitespace run holds (-1 for whitespace);
    a run with no word (punctuation alone) belongs to the word before it, or the first one."""
    owner = [-1] * len(text)
    word = 0
    for run in _RUN.finditer(text):
        start, end = run.span()
        while word < len(spans) and spans[word][1] <= start:
            word += 1
        inside = word < len(spans) and spans[word][0] < end
        holder = word if inside else word - 1 if word > 0 else 0 if spans else -1
        owner[start:end] = [holder] * (end - start)
    return owner


def _words(owner: list[int], span: tuple[int, int] | None) -> tuple[int, int] | None:
    if span is None:
        return None
    words = [owner[i] for i in range(*span) if owner[i] >= 0]
    return (min(words), max(words)) if words else None


def _runs(text: str) -> list[tuple[int, int]]:
    """Spans of the whitespace runs the tokeniser ends with a token that has whitespace after it: runs of
    non-space characters, a `[text](/phonemes/)` link counting as non-space throughout."""
    from hibari.g2p import LINK_RE

    links = [m.span() for m in LINK_RE.finditer(text)]
    if not links:
        return [m.span() for m in _RUN.finditer(text)]
    solid = [not char.isspace() for char in text]
    for start, end in links:
        solid[start:end] = [True] * (end - start)
    runs, start = [], None
    for i, inside in enumerate([*solid, False]):
        if inside and start is None:
            start = i
        elif not inside and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _sentence(g2p, sentence: Traced, owner: list[int], units: list) -> tuple[str, list[int | None], bool]:
    """`G2P.__call__` on a normalised sentence: its phoneme string, each character's unit (an index into
    `units`, which this extends; None for gaps), and whether the words had to be estimated."""
    tokens = g2p.phonemize_tokens(g2p.tokenize(sentence.text))
    runs = _runs(sentence.text)
    groups = 1 + sum(1 for token in tokens[:-1] if token.whitespace) if tokens else 0
    estimated = groups != len(runs)
    first = len(units)
    if estimated:  # the runs do not pair up: the sentence is one unit
        units.append(_words(owner, sentence.span(0, len(sentence.text))))
    else:
        units += [_words(owner, sentence.span(*run)) for run in runs]
    text: list[str] = []
    labels: list[int | None] = []
    unit = first
    for token in tokens:
        phonemes = g2p.unk if token.phonemes is None else token.phonemes
        text.append(phonemes)
        labels += [None if char in GAPS else unit for char in phonemes]
        if token.whitespace:
            text.append(" ")
            labels.append(None)
            unit += 0 if estimated else 1
    joined = "".join(text)
    lead = len(joined) - len(joined.lstrip())
    kept = len(joined.strip())
    return joined[lead : lead + kept], labels[lead : lead + kept], estimated


def _clauses(phonemes: str, labels: list[int | None], clause: re.Pattern[str], limit: int):
    """`Hibari.phonemize`'s split of a long sentence at clause punctuation, labels kept alongside."""
    if len(phonemes) <= limit:
        return [(phonemes, labels)]
    bounds, at = [], 0
    for match in clause.finditer(phonemes):
        bounds.append((at, match.start()))
        at = match.end()
    bounds.append((at, len(phonemes)))
    out, text = [], ""
    kept: list[int | None] = []
    for start, end in bounds:
        piece = phonemes[start:end]
        if text and len(text) + len(piece) + 1 > limit:
            out.append((text, kept))
            text, kept = piece, labels[start:end]
        elif text:
            text, kept = f"{text} {piece}", [*kept, None, *labels[start:end]]
        else:
            text, kept = piece, labels[start:end]
    if text:
        out.append((text, kept))
    return out


def _entries(ranges: dict[int, list[int]], units: list, next_word: int, last: int | None):
    """A part's words in order from `next_word`: units whose words overlap are one entry (their tokens
    spoke those words together); words no unit speaks get an entry of their own, timeless. With `last`,
    the entries run to that word (the last part reports the words after the spoken ones)."""
    entries: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    floor = next_word  # the words before it were reported by an earlier part
    for unit, (first, end) in ranges.items():
        words = units[unit]
        if words is None or words[1] < floor:
            continue  # no word, or one an earlier part reported (a clause split inside a word's reading)
        if entries and entries[-1][2] and words[0] <= entries[-1][1]:
            lo, hi, spoken = entries[-1]
            entries[-1] = (lo, max(hi, words[1]), (*spoken, (first, end)))
        else:
            lo = max(words[0], next_word)
            if lo > next_word:
                entries.append((next_word, lo - 1, ()))
            entries.append((lo, words[1], ((first, end),)))
        next_word = max(next_word, words[1] + 1)
    if last is not None and next_word <= last:
        entries.append((next_word, last, ()))
        next_word = last + 1
    return tuple(entries), next_word
