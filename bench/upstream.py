"""The latency an upstream hop adds: instance A (SPEECH_ENGINE=openai) in front of instance B (Hibari).

    .venv/bin/python bench/upstream.py [--sentences 30] [--repeat 5] [--workers 2] [--no-write]

Starts two daphne processes (`manage.py serve`, via tests/support/live.py), each with its own SQLite file:
B with the embedded Hibari engine, then A with SPEECH_ENGINE=openai and SPEECH_UPSTREAM_URL set to
B's /v1 (A learns B's voices at start-up). For every sentence, `repeat` rounds; each round opens a
fresh WebSocket session on B directly and a fresh one on A (which asks B's `POST /v1/audio/speech`
for the same segment), one after the other, the order alternating from round to round so slow drift
hits both alike. Per session (pcm, stream_audio, seed fixed so both sides synthesise the same audio):

* the sentence without its final mark as one input.text, then the mark plus a space as a second
  input.text — the frame that completes the segment; t0 just before that send;
* TTFA = t0 -> first binary frame; total = t0 -> the segment's audio.done (all its audio received);
* then input.done and drained to the close, so the servers are idle before the next measurement.

hop cost = A - B of the same round (measured seconds apart); a sentence's figure is the median of its
rounds. Warm-up sessions on both sides are not counted. Percentiles by linear interpolation (numpy's
default). Both servers and this client share the machine's cores: B synthesises while A relays, so
the hop cost includes A's share of the CPU. No targets: the script prints figures, it asserts none.

Writes/replaces the section "## Upstream hop latency (bench/upstream.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness import split_final_mark  # noqa: E402
from report import RESULTS, header, write_section  # noqa: E402
from ttfa import SENTENCES  # noqa: E402

from tests.support.live import DaphneServer, finish_and_drain, open_session, recv_item  # noqa: E402

SECTION = "## Upstream hop latency (bench/upstream.py)"
SEED = 7
WARM_UP = ["Warming up the upstream path.", "One more warm up sentence, please.", "Ready to measure now."]


async def measure_once(url, sentence):
    """(ttfa_s, total_s, audio_bytes, engine) of one sentence in a fresh session on `url`."""
    body, tail = split_final_mark(sentence)
    ws = await open_session(url)
    try:
        await ws.send(
            json.dumps({"type": "session.config", "session": {"response_format": "pcm", "stream_audio": True, "seed": SEED}})
        )
        configured = await recv_item(ws)
        assert configured.data["type"] == "session.configured", configured
        await ws.send(json.dumps({"type": "input.text", "text": body}))
        last = json.dumps({"type": "input.text", "text": tail})
        t0 = time.perf_counter()
        await ws.send(last)
        first = done = None
        audio = 0
        while done is None:
            item = await recv_item(ws)
            if item.kind == "audio":
                first = item.at if first is None else first
                audio += len(item.data)
                continue
            kind = item.data["type"]
            if kind == "audio.start":
                assert item.data["sentence_text"] == sentence, item.data
            elif kind == "audio.done":
                if item.data["error"] or first is None:
                    raise RuntimeError(f"segment failed on {url}: {item.data}")
                done = item.at
            else:
                raise RuntimeError(f"unexpected event on {url}: {item.data}")
        await finish_and_drain(ws)
    finally:
        await ws.close()
    return first - t0, done - t0, audio, configured.data["engine"]


async def measure(b_url, a_url, sentences, repeat):
    for sentence in WARM_UP:
        await measure_once(b_url, sentence)
        await measure_once(a_url, sentence)
    rows = []  # per sentence: medians over its rounds
    for i, sentence in enumerate(sentences):
        rounds = []
        for r in range(repeat):
            order = (("b", b_url), ("a", a_url)) if r % 2 == 0 else (("a", a_url), ("b", b_url))
            got = {}
            for side, url in order:
                got[side] = await measure_once(url, sentence)
            (b_ttfa, b_total, b_bytes, b_engine), (a_ttfa, a_total, a_bytes, a_engine) = got["b"], got["a"]
            assert (b_engine, a_engine) == ("hibari", "openai"), (b_engine, a_engine)
            rounds.append((b_ttfa, a_ttfa, a_ttfa - b_ttfa, b_total, a_total, a_total - b_total, abs(a_bytes - b_bytes) / 2))
        row = [float(np.median(column)) for column in zip(*rounds)]
        rows.append(row)
        print(
            f"{i + 1:3d}/{len(sentences)}  TTFA B {row[0] * 1000:7.2f}  A {row[1] * 1000:7.2f}  "
            f"hop {row[2] * 1000:6.2f} ms"
            f" | total B {row[3] * 1000:7.2f}  A {row[4] * 1000:7.2f}  hop {row[5] * 1000:6.2f} ms  {sentence}",
            flush=True,
        )
    return rows


async def http_round_trip(url, n=50):
    """B's bare HTTP cost, for scale: GET /healthz over one kept-alive connection, as A's pooled client
    talks to B."""
    async with httpx.AsyncClient() as client:
        (await client.get(url)).raise_for_status()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            response = await client.get(url)
            times.append(time.perf_counter() - t0)
            response.raise_for_status()
    return times


def stats_ms(values):
    ms = np.asarray(values, dtype=np.float64) * 1000.0
    return {
        "p50": float(np.percentile(ms, 50)),
        "p90": float(np.percentile(ms, 90)),
        "p99": float(np.percentile(ms, 99)),
        "max": float(ms.max()),
        "mean": float(ms.mean()),
        "min": float(ms.min()),
    }


def table(rows):
    lines = ["| measure | p50 ms | p90 ms | p99 ms | max ms | mean ms | min ms |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows:
        lines.append(
            f"| {name} | {s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f} | {s['max']:.2f} | {s['mean']:.2f} | {s['min']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sentences", type=int, default=30, help=f"how many sentences (the list of {len(SENTENCES)} repeats past its end)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds per sentence; its figures are the medians")
    parser.add_argument("--workers", type=int, default=2, help="SPEECH_ENGINE_WORKERS of B")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.repeat < 1:
        parser.error("--sentences and --repeat must be at least 1")
    sentences = [SENTENCES[i % len(SENTENCES)] for i in range(args.sentences)]
    command = (
        "python bench/upstream.py"
        + (f" --sentences {args.sentences}" if args.sentences != 30 else "")
        + (f" --repeat {args.repeat}" if args.repeat != 5 else "")
        + (f" --workers {args.workers}" if args.workers != 2 else "")
    )

    started = time.monotonic()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    b = DaphneServer({"SPEECH_ENGINE": "hibari", "SPEECH_ENGINE_WORKERS": str(args.workers), "SPEECH_REQUIRE_API_KEY": "false"})
    a = None
    servers = [b]
    try:
        b.start()
        a = DaphneServer(
            {"SPEECH_ENGINE": "openai", "SPEECH_UPSTREAM_URL": f"{b.http_url}/v1", "SPEECH_REQUIRE_API_KEY": "false"}
        )
        servers.insert(0, a)
        a.start()
        print(f"servers up: B (hibari) {b.http_url}, A (openai -> B) {a.http_url}", flush=True)
        rows = asyncio.run(measure(b.ws_url, a.ws_url, sentences, args.repeat))
        bare = asyncio.run(http_round_trip(f"{b.http_url}/healthz"))
    finally:
        for server in servers:  # A first: it is B's client
            server.stop()
    for server in servers:
        if "Traceback" in server.stderr_text():
            print(server.stderr_text()[-4000:], file=sys.stderr)
            raise SystemExit("a server logged a traceback during the benchmark")
        server.cleanup()
    elapsed = time.monotonic() - started

    columns = list(zip(*rows))
    names = [
        "TTFA, B direct",
        "TTFA, A via B",
        "TTFA hop cost (A - B, same round)",
        "segment total, B direct",
        "segment total, A via B",
        "segment total hop cost (A - B, same round)",
    ]
    report = table(
        [(name, stats_ms(column)) for name, column in zip(names, columns[:6])]
        + [("for scale: HTTP round trip to B (GET /healthz, kept-alive connection)", stats_ms(bare))]
    )
    max_len_diff = max(columns[6])
    print()
    print(report)
    print(
        f"\n{len(sentences)} sentences x {args.repeat} rounds, {elapsed:.0f} s; largest A/B audio length difference "
        f"{max_len_diff:.0f} samples"
    )

    section = "\n".join(
        [
            *header(SECTION, command),
            f"* Run time: {elapsed:.0f} s; load average at the start {load_start}.",
            "* Two daphne processes (`manage.py serve`): B with the embedded Hibari engine "
            f"(SPEECH_ENGINE_WORKERS={args.workers}), A with SPEECH_ENGINE=openai pointed at B's /v1 (voices learned "
            "from B). Same machine, loopback TCP.",
            f"* {len(sentences)} sentences of 5-20 words (bench/ttfa.py's list), {args.repeat} rounds each; a round is one "
            "fresh WebSocket session on B and one on A (pcm, stream_audio, seed fixed), order alternating per round. "
            "TTFA = from sending the frame that completes the segment (its final mark) to the first binary frame; "
            "total = from that send to the segment's audio.done. Hop cost = A - B of the same round; per sentence "
            f"the median of its rounds; percentiles over sentences (linear interpolation). {len(WARM_UP)} warm-up "
            "sessions per side not counted.",
            "",
            report,
            "",
            (
                "Same seed on both sides: A's audio had exactly the length of B's in every round. "
                if max_len_diff == 0
                else f"Same seed on both sides, yet A's and B's audio lengths differed by up to {max_len_diff:.0f} samples. "
            )
            + "No target is set for the hop cost; these are measurements. For scale, a bare HTTP round trip to B "
            f"(GET /healthz through Django's ASGI handler under daphne) takes {stats_ms(bare)['p50']:.2f} ms at p50, "
            f"{stats_ms(bare)['p50'] / stats_ms(columns[2])['p50']:.0%} of the TTFA hop cost at p50 (a GPU upstream "
            "brings its own HTTP stack instead).",
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
