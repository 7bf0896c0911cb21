"""Two checkouts of the server side by side: bench/throughput.py's paragraph, interleaved with the raw engine.

    .venv/bin/python bench/compare.py OTHER_CHECKOUT [--rounds 30] [--processes 2] [--concurrency 4 8]

For deciding whether a change is worth it, not for bench/RESULTS.md (nothing is written).
OTHER_CHECKOUT is another checkout of this repository, the code before the change, say
(`git worktree add /tmp/before HEAD~1`); its server runs on this checkout's Python and packages. Every
round runs the paragraph at each C through the other checkout's server, this checkout's server and
the raw engine (this checkout's Hibari through its pool, as bench/throughput.py runs it), in an order
that rotates, so that the three see the same machine; the rounds are split over --processes pairs of
server processes. Printed per C: each server's audio seconds per wall second against the engine's
(the ratio of the medians, and the median of the ratios of the rounds next to each other), its
first audio rank by rank against the engine's first chunk (the sum of the per-rank medians over
rounds), and the CPU per audio second of its event loop, of the client (this process) and of its
synthesis threads (the other threads; the engine's are this process's other than the main one),
from the text sent to the last audio, as bench/throughput.py measures them; then this checkout
against the other one, paired round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ttsproject.settings")

from cpushare import CpuMeter  # noqa: E402
from harness import parse_with_other  # noqa: E402
from throughput import PARAGRAPH, engine_round, rank_ratio, segments, server_round  # noqa: E402

from tests.support.live import DaphneServer  # noqa: E402

SIDES = ("other", "this", "engine")


async def one_round(r, concurrency, servers, engine, texts, data):
    for c in concurrency:
        order = list(SIDES[r % 3 :] + SIDES[: r % 3])
        if (r // 3) % 2:
            order.reverse()
        for side in order:
            record = data[side, c]
            if side == "engine":
                # The engine's threads are this process's other than the main one.
                results, rate, started = await engine_round(engine, texts, c, functools.partial(CpuMeter, os.getpid()))
            else:
                # The loop's and the client's CPU from the text sent to the last audio, as bench/throughput.py
                # measures them: a server change can move both (frames, writes).
                meter = functools.partial(CpuMeter, servers[side].proc.pid)
                results, rate, started = await server_round(servers[side].ws_url, c, meter)
            reading, audio_s = started.read(), sum(audio for _, _, audio in results)
            record["threads"].append(reading["threads"] * 1000 / audio_s)
            if side != "engine":
                record["loop"].append(reading["loop"] * 1000 / audio_s)
                record["client"].append(reading["own"] * 1000 / audio_s)
            record["rate"].append(rate)
            record["ranks"].append(sorted(first * 1000 for first, _, _ in results))


async def compare(args):
    from speech.engines.hibari import HibariEngine

    texts = segments(PARAGRAPH)
    env = {"SPEECH_ENGINE": "hibari", "SPEECH_ENGINE_WORKERS": str(args.workers)}
    # "loop" and "client" (CPU per audio second) are filled for the two servers only; "threads" (the synthesis
    # threads' CPU per audio second) for all three.
    data = {
        (side, c): {"rate": [], "ranks": [], "loop": [], "client": [], "threads": []} for side in SIDES for c in args.concurrency
    }
    for block in np.array_split(np.arange(args.rounds), max(1, min(args.processes, args.rounds))):
        engine = HibariEngine(workers=args.workers)
        await engine.warm_up()
        with DaphneServer(env, root=args.other) as other, DaphneServer(env) as this:
            servers = {"other": other, "this": this}
            for c in args.concurrency:  # warm every side at every concurrency
                for server in servers.values():
                    await server_round(server.ws_url, c)
                await engine_round(engine, texts, c)
            for r in block:
                await one_round(int(r), args.concurrency, servers, engine, texts, data)
            for server in servers.values():
                server.assert_no_traceback()
        await engine.aclose()
    return data


def report(data, concurrency, rounds):
    lines = [f"{rounds} rounds; throughput and first audio against the raw engine in the same rounds"]
    for c in concurrency:
        engine = data["engine", c]
        engine_rate = np.array(engine["rate"])
        for side in ("other", "this"):
            d = data[side, c]
            rate = np.array(d["rate"])
            ranks = rank_ratio(np.array(d["ranks"]), np.array(engine["ranks"]))
            lines.append(
                f"C = {c}, {side:5s}: throughput / engine {np.median(rate) / np.median(engine_rate):.3f} "
                f"(rounds paired {np.median(rate / engine_rate):.3f}), first audio rank by rank {ranks:.3f}x, "
                f"CPU per audio s: event loop {np.median(d['loop']):.3f} ms, client {np.median(d['client']):.3f} ms, "
                f"synthesis threads {np.median(d['threads']):.2f} ms (engine's {np.median(engine['threads']):.2f})"
            )
        this, other = data["this", c], data["other", c]
        ratio = {key: np.array(this[key]) / np.array(other[key]) for key in ("rate", "loop", "threads")}
        lines.append(
            f"C = {c}, this / other, rounds paired: throughput {np.median(ratio['rate']):.3f} "
            f"(p25-p75 {np.percentile(ratio['rate'], 25):.3f}-{np.percentile(ratio['rate'], 75):.3f}), "
            f"CPU per audio s: event loop {np.median(ratio['loop']):.3f}, synthesis threads {np.median(ratio['threads']):.3f}"
        )
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--processes", type=int, default=2, help="pairs of server processes the rounds are split over")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 8])
    args = parse_with_other(parser)
    data = asyncio.run(compare(args))
    print("\n".join(report(data, args.concurrency, args.rounds)))


if __name__ == "__main__":
    main()
