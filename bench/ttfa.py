"""Time to first audio over the real socket, against the engine's own first-chunk time.

    .venv/bin/python bench/ttfa.py [--sentences 50] [--port PORT] [--workers 2] [--repeat 1]
                                   [--no-write] [--strict]

Starts its own daphne (`manage.py serve`, via tests/support/live.py). For every sentence:

* socket TTFA: a fresh WebSocket session (one utterance per connection), session.config
  (stream_audio true, pcm), the sentence without its final mark as one input.text, then the mark
  plus a space (". ", or "? " for a question) as a second input.text — the frame that completes
  the segment. t0 is taken just
  before that send, t1 when the first binary frame arrives. Then input.done, drained to the close.
* engine first chunk, in this process (no server): `HibariEngine(workers=2).stream(...)` from the
  call to its first yielded chunk, in an asyncio loop.
* overhead = TTFA - engine first chunk, for the same sentence.

The measurements are interleaved sentence by sentence (engine, socket, engine again), each with
the other side idle: they never compete for the cores, and slow drift (other load, CPU clocks)
hits both alike. A sentence's engine figure is the mean of its two engine runs, which bracket the
socket run in time; their difference is reported as the engine's jitter, the noise floor under
the overhead figures. Warm-up rounds on both sides are not counted.

Percentiles use linear interpolation (numpy's default). Writes/replaces the section
"## Time to first audio (bench/ttfa.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import first_audio, hibari_server  # noqa: E402
from report import RESULTS, header, write_section  # noqa: E402

from tests.support.live import finish_and_drain, open_session, recv_item  # noqa: E402

SECTION = "## Time to first audio (bench/ttfa.py)"
TARGET_P50_MS = 2.0
TARGET_P99_MS = 5.0
WARM_UP_ROUNDS = 3

SENTENCES = [
    "The train leaves the station at seven.",
    "Please close the window before you go to bed.",
    "My sister bought a red bicycle last week.",
    "Could you send me the report by Friday afternoon?",
    "The coffee machine on the third floor is broken again.",
    "We walked along the beach until the sun went down.",
    "Thank you for calling, how can I help you today?",
    "The museum opens at ten and closes at six.",
    "He forgot his umbrella and got soaked in the rain.",
    "Our team won the match by two goals.",
    "Turn left at the bakery and keep going straight.",
    "The new library has a quiet room for reading and study.",
    "She plays the piano every evening after dinner.",
    "I think the meeting was moved to Thursday.",
    "Fresh bread smells wonderful early in the morning.",
    "The package should arrive within three business days.",
    "Let me know if you need anything else from the store.",
    "The children built a snowman in the garden.",
    "A gentle breeze moved the leaves on the old oak tree.",
    "Your order number is printed at the top of the receipt.",
    "The flight was delayed because of heavy fog over the airport.",
    "Do not forget to water the plants while I am away.",
    "This recipe needs two eggs, a cup of flour and some milk.",
    "The river flooded the fields after a week of storms.",
    "Please hold the line while I transfer your call.",
    "Learning a new language takes patience and practice.",
    "The lights in the hallway turn on automatically at night.",
    "We should leave early to avoid the traffic on the bridge.",
    "The doctor said I should drink more water and sleep longer.",
    "Every seat in the theater was taken on opening night.",
    "He writes short stories about sailors and distant islands.",
    "The battery is low, so plug in the charger soon.",
    "Our neighbors are painting their fence bright yellow.",
    "Is there a pharmacy near the central square?",
    "The students listened carefully while the teacher explained the experiment.",
    "I would like a table for four people at eight o'clock.",
    "Mountains covered in snow rose behind the quiet village.",
    "The software update fixed several bugs and improved battery life.",
    "Remember to bring your passport and a copy of your ticket.",
    "The cat slept in a patch of warm sunlight on the floor.",
    "Sales grew steadily during the last quarter of the year.",
    "Can you recommend a good book for a long flight?",
    "The bus was crowded, so we decided to walk home instead.",
    "Bright stars filled the sky above the desert camp.",
    "The printer on the second floor is out of paper.",
    "Good ideas often come when you least expect them.",
    "The orchestra tuned their instruments before the concert began.",
    "We need to finish the painting before the guests arrive tomorrow.",
    "The baker wakes up at four to prepare the morning bread.",
    "Thanks again, and have a wonderful weekend with your family.",
]


# -- socket side -----------------------------------------------------------------------------------


async def socket_ttfa(url, sentence):
    ws = await open_session(url)
    try:
        await ws.send(json.dumps({"type": "session.config", "session": {"response_format": "pcm", "stream_audio": True}}))
        configured = await recv_item(ws)
        assert configured.data["type"] == "session.configured", configured
        seconds, start = await first_audio(ws, sentence)
        assert start is not None and start["sentence_text"] == sentence, start
        await finish_and_drain(ws)
    finally:
        await ws.close()
    return seconds


# -- engine side -----------------------------------------------------------------------------------


def build_engine(workers):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")
    import django

    django.setup()
    from speech.engines.hibari import HibariEngine

    return HibariEngine(workers=workers)


async def engine_first_chunk(engine, sentence):
    from speech.stream.engine import SynthesisRequest

    t0 = time.perf_counter()
    chunks = engine.stream(SynthesisRequest(sentence, "heart"))
    try:
        first = await anext(chunks)
        t1 = time.perf_counter()
    finally:
        await chunks.aclose()
    assert first.size > 0
    return t1 - t0


# -- statistics and report -------------------------------------------------------------------------


def stats_ms(values):
    ms = np.asarray(values, dtype=np.float64) * 1000.0
    return {
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "mean": float(ms.mean()),
        "min": float(ms.min()),
        "max": float(ms.max()),
    }


def table(rows):
    lines = ["| measure | p50 ms | p99 ms | mean ms | min ms | max ms |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in rows:
        lines.append(f"| {name} | {s['p50']:.2f} | {s['p99']:.2f} | {s['mean']:.2f} | {s['min']:.2f} | {s['max']:.2f} |")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------------


async def measure(url, engine, sentences, warm_up, repeat=1):
    """Per sentence: engine (a), socket, engine (b) — `repeat` times. The engine figure of a round is
    the mean of (a) and (b), which bracket the socket measurement in time; |a - b| is the engine's
    own run-to-run jitter, the noise floor any overhead figure sits on. With repeat > 1 a sentence's
    figures are the medians of its rounds."""
    for sentence in warm_up:
        await engine_first_chunk(engine, sentence)
        await socket_ttfa(url, sentence)
    socket_times, engine_times, jitter = [], [], []
    for i, sentence in enumerate(sentences):
        rounds = []
        for _ in range(repeat):
            first = await engine_first_chunk(engine, sentence)
            ttfa = await socket_ttfa(url, sentence)
            second = await engine_first_chunk(engine, sentence)
            rounds.append((ttfa, (first + second) / 2, abs(first - second)))
        ttfa, eng, jit = (float(np.median(column)) for column in zip(*rounds))
        socket_times.append(ttfa)
        engine_times.append(eng)
        jitter.append(jit)
        print(
            f"{i + 1:3d}/{len(sentences)}  ttfa {ttfa * 1000:7.2f} ms  engine {eng * 1000:7.2f} ms  "
            f"(jitter {jit * 1000:5.2f})  overhead {(ttfa - eng) * 1000:6.2f} ms  {sentence}",
            flush=True,
        )
    return socket_times, engine_times, jitter


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=50, help="how many sentences (the list repeats past 50)")
    parser.add_argument("--port", type=int, default=None, help="port for the daphne this script starts")
    parser.add_argument(
        "--workers", type=int, default=2, help="synthesis threads, of the in-process engine and of the server alike"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds per sentence; a sentence's figures are the medians of its rounds"
    )
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    args = parser.parse_args(argv)

    sentences = [SENTENCES[i % len(SENTENCES)] for i in range(args.sentences)]
    warm_up = ["Warming up the socket path.", "One more warm up sentence, please.", "Ready to measure now."]
    warm_up = warm_up[:WARM_UP_ROUNDS]
    command = (
        "python bench/ttfa.py"
        + (f" --sentences {args.sentences}" if args.sentences != 50 else "")
        + (f" --port {args.port}" if args.port else "")
        + (f" --repeat {args.repeat}" if args.repeat != 1 else "")
    )

    engine = build_engine(args.workers)
    asyncio.run(engine.warm_up())
    try:
        with hibari_server({"SPEECH_ENGINE_WORKERS": str(args.workers)}, port=args.port) as server:
            socket_times, engine_times, jitter = asyncio.run(measure(server.ws_url, engine, sentences, warm_up, args.repeat))
    finally:
        asyncio.run(engine.aclose())

    overhead = [s - e for s, e in zip(socket_times, engine_times)]
    ttfa_s, engine_s, over_s = stats_ms(socket_times), stats_ms(engine_times), stats_ms(overhead)
    jitter_s = stats_ms(jitter)
    verdict_p50 = "PASS" if over_s["p50"] <= TARGET_P50_MS else "FAIL"
    verdict_p99 = "PASS" if over_s["p99"] <= TARGET_P99_MS else "FAIL"

    report = table(
        [
            ("socket TTFA", ttfa_s),
            ("engine first chunk (mean of 2 runs)", engine_s),
            ("overhead (TTFA - engine)", over_s),
            ("engine run-to-run jitter (noise floor)", jitter_s),
        ]
    )
    print()
    print(report)
    print(f"\noverhead p50 {over_s['p50']:.2f} ms (target <= {TARGET_P50_MS:g} ms): {verdict_p50}")
    print(f"overhead p99 {over_s['p99']:.2f} ms (target <= {TARGET_P99_MS:g} ms): {verdict_p99}")

    section = "\n".join(
        [
            *header(SECTION, command),
            f"* {len(sentences)} sentences of 5-20 words, one fresh WebSocket session each (pcm, stream_audio); "
            "TTFA from sending the frame that completes the segment (the final mark) to the first binary frame. "
            f"Engine: in-process `HibariEngine(workers={args.workers})` (the server runs with "
            f"SPEECH_ENGINE_WORKERS={args.workers}), call to first chunk. Interleaved per "
            "sentence: engine, socket, engine again (never two at once, so they never share the cores); the "
            "sentence's engine figure is the mean of its two runs and their difference is the jitter row. "
            + (f"{args.repeat} rounds per sentence, medians per sentence. " if args.repeat > 1 else "")
            + f"{len(warm_up)} warm-up rounds not counted; percentiles by linear interpolation.",
            "",
            report,
            "",
            f"Verdict (overhead = TTFA - engine first chunk, same sentence): p50 {over_s['p50']:.2f} ms "
            f"(target <= {TARGET_P50_MS:g} ms) **{verdict_p50}**; p99 {over_s['p99']:.2f} ms "
            f"(target <= {TARGET_P99_MS:g} ms) **{verdict_p99}**.",
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.strict and "FAIL" in (verdict_p50, verdict_p99) else 0


if __name__ == "__main__":
    sys.exit(main())
