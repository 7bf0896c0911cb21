"""First words first (issue 43): this checkout's server against the code before, interleaved in one run.

    .venv/bin/python bench/firstwords.py OTHER_CHECKOUT [--rounds 6] [--sentences 120] [--no-write]

OTHER_CHECKOUT is the code before the change (`git worktree add /tmp/before main`), run on this
checkout's Python and packages. Each round, in an order that rotates: one-sentence first audio
(bench/ttfa.py's sentences and socket_ttfa: a streamed pcm session, the clock from the text's last
piece to the first binary frame) on the other server and this one, sentence by sentence; then
bench/throughput.py's paragraph at C = 1, 4, 8 through both servers and the raw engine (first
audio, last audio, audio seconds per wall second). The reference implementation this server
replaced is not on this machine: no figures against it.

First, in this process: the engine's own first chunk, whole and in pieces, for the same sentences
and the paragraph's first; then the quality of the pieces on bench/timestamps_corpus.py's sentences (numbers,
money, times, dates, abbreviations, names), each rendered by this checkout's engine whole and in
pieces (`first_words`), with the same seed: at each join, the sample step against the largest step
within 10 ms around it, and the spectral flux (tests/test_first_words.py's `flux`) against the same
place of the whole render, over the two renders' own difference elsewhere (p95); the loudness of the
pieces against the whole; and Whisper tiny.en's word error rate over both (the round trip).

Writes the section "## First words first (bench/firstwords.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")

from harness import parse_with_other  # noqa: E402
from report import header, write_section  # noqa: E402
from throughput import PARAGRAPH, engine_round, segments, server_round  # noqa: E402
from timestamps_corpus import sentences as corpus  # noqa: E402
from ttfa import SENTENCES, socket_ttfa  # noqa: E402

from tests.support.live import DaphneServer  # noqa: E402

SECTION = "## First words first (bench/firstwords.py)"
CONCURRENCY = (1, 4, 8)
RATE = 24000
HOP = 300
ENGINE_ROUNDS = 10


async def speed_rounds(args):
    from speech.engines.hibari import HibariEngine

    sentences = [s for s in SENTENCES if 32 <= len(s) <= 115]
    texts = segments(PARAGRAPH)
    env = {"SPEECH_ENGINE": "hibari", "SPEECH_ENGINE_WORKERS": str(args.workers)}
    ttfa = {"other": [], "this": []}
    para = {(side, c): {"first": [], "last": [], "rate": []} for side in ("other", "this", "engine") for c in CONCURRENCY}
    engine = HibariEngine(workers=args.workers)
    await engine.warm_up()
    with DaphneServer(env, root=args.other) as other, DaphneServer(env) as this:
        urls = {"other": other.ws_url, "this": this.ws_url}
        for side in urls:  # warm up both
            for sentence in sentences[:3]:
                await socket_ttfa(urls[side], sentence)
            await server_round(urls[side], 1)
        for r in range(args.rounds):
            order = ["other", "this"] if r % 2 == 0 else ["this", "other"]
            for sentence in sentences:
                for side in order:
                    ttfa[side].append(await socket_ttfa(urls[side], sentence))
            for c in CONCURRENCY:
                sides = ["other", "this", "engine"]
                sides = sides[r % 3 :] + sides[: r % 3]
                for side in sides:
                    if side == "engine":
                        results, rate, _ = await engine_round(engine, texts, c)
                    else:
                        results, rate, _ = await server_round(urls[side], c)
                    record = para[side, c]
                    record["first"].append(np.median([first for first, _, _ in results]))
                    record["last"].append(np.median([last for _, last, _ in results]))
                    record["rate"].append(rate)
            print(
                f"round {r + 1}/{args.rounds}: ttfa p50 other {np.median(ttfa['other']) * 1000:.1f} ms, "
                f"this {np.median(ttfa['this']) * 1000:.1f} ms",
                flush=True,
            )
        other.assert_no_traceback()
        this.assert_no_traceback()
    await engine.aclose()
    return ttfa, para, len(sentences)


def flux(samples):
    frames = samples[: samples.size // HOP * HOP].reshape(-1, HOP) * np.hanning(HOP)
    spectra = np.log(np.abs(np.fft.rfft(frames, axis=1)) + 1e-4)
    return np.sqrt(np.mean(np.square(np.diff(spectra, axis=0)), axis=1))


def loudness_db(samples):
    sounding = samples[np.abs(samples) > 0.01]
    return 20 * np.log10(np.sqrt(np.mean(np.square(sounding))))


async def quality(count):
    from speech.engines.hibari import HibariEngine
    from speech.stream.engine import Alignment, SynthesisRequest
    from tests.support.speech_check import load_whisper, normalise, transcribe, word_errors

    engine = HibariEngine(workers=1)
    await engine.warm_up()

    async def render(text, first_words):
        request = SynthesisRequest(text, engine.capabilities.default_voice, options={"seed": 7}, first_words=first_words)
        return [item async for item in engine.stream(request) if not isinstance(item, Alignment)]

    # The engine's own first chunk, whole or in pieces, one request after the other (no server, no client).
    async def first_chunk(text, first_words):
        t0 = time.perf_counter()
        stream = engine.stream(SynthesisRequest(text, engine.capabilities.default_voice, first_words=first_words))
        try:
            await anext(stream)
            return time.perf_counter() - t0
        finally:
            await stream.aclose()

    first = {(kind, fw): [] for kind in ("sentence", "paragraph") for fw in (False, True)}
    one = [s for s in SENTENCES if 32 <= len(s) <= 115]
    for r in range(ENGINE_ROUNDS):
        for kind, texts in (("sentence", one), ("paragraph", segments(PARAGRAPH)[:1])):
            for text in texts:
                for fw in (False, True) if r % 2 == 0 else (True, False):
                    first[kind, fw].append(await first_chunk(text, fw))

    whisper = load_whisper()
    steps, fluxes, control, loudness, errors, words, split = [], [], [], [], {False: 0, True: 0}, 0, 0
    for text in corpus(count):
        whole = np.concatenate(await render(text, False))
        pieces = await render(text, True)
        joined = np.concatenate(pieces)
        reference = normalise(text)
        words += len(reference)
        for first_words, audio in ((False, whole), (True, joined)):
            errors[first_words] += word_errors(reference, normalise(transcribe(whisper, audio, RATE)))
        if len(pieces) < 2:
            continue
        split += 1
        join = pieces[0].size
        around = np.abs(np.diff(joined[join - 240 : join + 240]))
        steps.append(abs(float(joined[join]) - float(joined[join - 1])) / max(float(np.max(around)), 1e-9))
        frames = min(joined.size, whole.size)  # their trims may differ by a gate frame
        excess = flux(joined[:frames]) - flux(whole[:frames])
        own = np.percentile(np.abs(excess), 95)
        at = join // HOP
        fluxes.append(float(np.max(excess[at - 2 : at + 2]) / own))
        # The same figure elsewhere in the same renders: what two renders' differences give by chance.
        control += [float(np.max(excess[p - 2 : p + 2]) / own) for p in range(6, len(excess) - 6, 5) if abs(p - at) > 10]
        loudness.append(loudness_db(joined) - loudness_db(whole))
    await engine.aclose()
    return {
        "first": {key: float(np.median(v)) for key, v in first.items()},
        "sentences": count,
        "split": split,
        "steps": steps,
        "fluxes": fluxes,
        "control": control,
        "loudness": loudness,
        "wer": {k: v / words for k, v in errors.items()},
        "words": words,
    }


def report(ttfa, para, sentence_count, q, args):
    lines = []
    other, this = np.array(ttfa["other"]), np.array(ttfa["this"])
    lines += [
        f"{args.rounds} interleaved rounds, {sentence_count} sentences of 32-115 characters a round on each "
        "server (bench/ttfa.py's), then bench/throughput.py's paragraph at C = 1, 4, 8 on each server "
        "and the raw engine (`HibariEngine`, the same pool size). The reference implementation this "
        "server replaced is not available on this machine: no figures against it.",
        "",
        "| measure | before | this | this / before | target |",
        "|---|---:|---:|---:|---|",
        f"| one sentence, first audio p50 | {np.median(other) * 1000:.1f} ms | {np.median(this) * 1000:.1f} ms "
        f"| {np.median(this) / np.median(other):.2f} | <= 0.5 |",
        f"| one sentence, first audio p90 | {np.percentile(other, 90) * 1000:.1f} ms | "
        f"{np.percentile(this, 90) * 1000:.1f} ms | {np.percentile(this, 90) / np.percentile(other, 90):.2f} | |",
    ]
    for c in CONCURRENCY:
        o, t, e = para["other", c], para["this", c], para["engine", c]
        first = np.median(t["first"]) / np.median(o["first"])
        last = np.median(t["last"]) / np.median(o["last"])
        lines.append(
            f"| paragraph C = {c}, first audio p50 (session median) | {np.median(o['first']) * 1000:.1f} ms | "
            f"{np.median(t['first']) * 1000:.1f} ms | {first:.2f} | {'<= 0.5' if c == 1 else ''} |"
        )
        paired_last = np.median(np.array(t["last"]) / np.array(o["last"]))
        paired_rate = np.median(np.array(t["rate"]) / np.array(o["rate"]))
        lines.append(
            f"| paragraph C = {c}, last audio p50 | {np.median(o['last']) * 1000:.0f} ms | "
            f"{np.median(t['last']) * 1000:.0f} ms | {last:.3f} (rounds paired {paired_last:.3f}) | not later |"
        )
        lines.append(
            f"| paragraph C = {c}, throughput / raw engine | {np.median(o['rate']) / np.median(e['rate']):.3f} | "
            f"{np.median(t['rate']) / np.median(e['rate']):.3f} | {paired_rate:.3f} (rounds paired) | >= 0.95 |"
        )
    f = q["first"]
    lines += [
        "",
        f"The engine alone (in process, `HibariEngine(workers=1)`, {ENGINE_ROUNDS} rounds, whole and in pieces one "
        "after the other): first chunk p50, one sentence "
        f"{f['sentence', False] * 1000:.1f} -> {f['sentence', True] * 1000:.1f} ms "
        f"({f['sentence', True] / f['sentence', False]:.2f}x), the paragraph's first sentence "
        f"{f['paragraph', False] * 1000:.1f} -> {f['paragraph', True] * 1000:.1f} ms "
        f"({f['paragraph', True] / f['paragraph', False]:.2f}x).",
    ]
    lines += [
        "",
        f"Quality, in process: {q['sentences']} sentences of bench/timestamps_corpus.py, {q['split']} of them "
        "long enough to be sent in pieces (the rest go whole), rendered whole and in pieces with one seed.",
        "",
        "| measure | median | max | target |",
        "|---|---:|---:|---|",
        f"| sample step at the join / largest step within 10 ms | {np.median(q['steps']):.3f} | "
        f"{np.max(q['steps']):.3f} | <= 1 |",
        f"| spectral flux at the join, over the whole render's there, / p95 of their difference | "
        f"{np.median(q['fluxes']):.2f} | {np.max(q['fluxes']):.2f} | |",
        f"| the same elsewhere in the same renders (control, {len(q['control'])} places) | "
        f"{np.median(q['control']):.2f} | {np.max(q['control']):.2f} | |",
        f"| share of those over 1: joins / control | {np.mean(np.array(q['fluxes']) > 1):.0%} | "
        f"{np.mean(np.array(q['control']) > 1):.0%} | joins <= control |",
        f"| loudness, pieces - whole (dB) | {np.median(q['loudness']):+.2f} | "
        f"{q['loudness'][int(np.argmax(np.abs(q['loudness'])))]:+.2f} | |",
        "",
        f"Whisper tiny.en round trip, {q['words']} words: WER whole {q['wer'][False] * 100:.1f} %, in pieces "
        f"{q['wer'][True] * 100:.1f} % (the issue's figure before: 3.4 %, from a set not in this repository).",
    ]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=120, help="sentences of the quality part")
    parser.add_argument("--no-write", action="store_true")
    args = parse_with_other(parser)
    q = asyncio.run(quality(args.sentences))
    ttfa, para, count = asyncio.run(speed_rounds(args))
    command = f".venv/bin/python bench/firstwords.py {args.other} --rounds {args.rounds} --sentences {args.sentences}"
    lines = report(ttfa, para, count, q, args)
    print("\n".join(lines))
    if not args.no_write:
        write_section(SECTION, "\n".join([*header(SECTION, command), "", *lines]) + "\n")


if __name__ == "__main__":
    main()
