"""Hang-ups: a probe session's first audio right after clients left mid-stream, against an idle server.

    .venv/bin/python bench/hangup.py [--rounds 40] [--hangups 20] [--no-write] [--strict]

Starts one daphne (`manage.py serve`, engine Hibari, tests/support/live.py). Every round has two
probes, in alternating order: one on the idle server, and one right after `--hangups` sessions hung up
mid-stream. Those sessions (pcm, stream_audio) each speak a long text and read until their first audio
frame has come; then every socket is dropped at once (no close frame: the TCP connection ends) and the
probe sends its sentence's final mark at once. A probe is a session configured beforehand (pcm,
stream_audio), and its first audio the time from that last text frame to its first binary frame, as in
bench/ttfa.py. Between rounds the server is left to settle until it has no session and no engine job.

Target: the probe's first audio after the hang-ups <= 1.1x the idle probe's, p90 (and p50 reported).

Writes/replaces the section "## Hang-ups (bench/hangup.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import RESULTS, header, write_section  # noqa: E402
from ttfa import SENTENCES, split_final_mark  # noqa: E402

from tests.support.live import DaphneServer, configure, metric, open_session, recv_item, send_json, wait_for  # noqa: E402

SECTION = "## Hang-ups (bench/hangup.py)"
TARGET_RATIO_P90 = 1.1
WARM_UP = 3
LONG_TEXT = (
    "The train leaves the station at seven and arrives in the city shortly after nine. "
    "Please close the window before you go to bed, because the night will be cold. "
    "My sister bought a red bicycle last week and rides it to work every morning. "
    "Could you send me the report by Friday afternoon so that I can read it over the weekend? "
)


async def probe_session(url):
    ws = await open_session(url)
    await configure(ws, {"response_format": "pcm", "stream_audio": True})
    return ws


async def probe(ws, sentence):
    """Send `sentence` (its final mark last); seconds from that frame to the first binary frame."""
    body, tail = split_final_mark(sentence)
    await send_json(ws, {"type": "input.text", "text": body})
    t0 = time.perf_counter()
    await send_json(ws, {"type": "input.text", "text": tail})
    while (item := await recv_item(ws)).kind != "audio":
        assert item.data["type"] == "audio.start", item.data
    return item.at - t0


async def speaking(url):
    """A session mid-stream: its long text sent, its first audio frame read."""
    ws = await open_session(url)
    await configure(ws, {"response_format": "pcm", "stream_audio": True})
    await send_json(ws, {"type": "input.text", "text": LONG_TEXT})
    while (await recv_item(ws)).kind != "audio":
        pass
    return ws


def settle(server):
    """Bounded wait until the server has no session and no engine job (running or queued)."""
    wait_for(
        lambda: metric(server, "speech_sessions_active") == 0 and metric(server, "speech_engine_queue_depth") == 0,
        "an idle server",
    )


async def one_probe(server, sentence, hangups):
    ws = await probe_session(server.ws_url)
    try:
        if hangups:
            callers = await asyncio.gather(*(speaking(server.ws_url) for _ in range(hangups)))
            for caller in callers:
                caller.transport.abort()  # the client is gone: no close frame
        return await probe(ws, sentence)
    finally:
        await ws.close()


async def trials(server, rounds, hangups):
    idle, after = [], []
    for n in range(WARM_UP + rounds):
        sentence = SENTENCES[n % len(SENTENCES)]
        order = (0, hangups) if n % 2 else (hangups, 0)
        for count in order:
            await asyncio.to_thread(settle, server)
            seconds = await one_probe(server, sentence, count)
            if n >= WARM_UP:
                (after if count else idle).append(seconds)
        if n >= WARM_UP and (n - WARM_UP + 1) % 10 == 0:
            print(f"  {n - WARM_UP + 1}/{rounds} rounds", flush=True)
    return idle, after


def percentiles(values):
    values = np.asarray(values) * 1000
    return {name: float(np.percentile(values, q)) for name, q in (("p50", 50), ("p90", 90), ("max", 100))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--hangups", type=int, default=20, help="sessions hung up at once before each probe")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when the target is missed")
    args = parser.parse_args(argv)
    options = (("rounds", args.rounds, 40), ("hangups", args.hangups, 20))
    command = "python bench/hangup.py" + "".join(f" --{name} {value}" for name, value, default in options if value != default)
    started = time.monotonic()
    server = DaphneServer({"SPEECH_ENGINE": "hibari", "SPEECH_REQUIRE_API_KEY": "false"}).start()
    try:
        idle, after = asyncio.run(trials(server, args.rounds, args.hangups))
        jobs = {o: metric(server, "speech_engine_jobs_total", outcome=o) for o in ("completed", "dropped", "stopped", "unheard")}
    finally:
        server.stop()
    if "Traceback" in server.stderr_text():
        print(server.stderr_text()[-4000:], file=sys.stderr)
        raise SystemExit("the server logged a traceback during the benchmark")
    server.cleanup()
    a, b = percentiles(idle), percentiles(after)
    ratio = {key: b[key] / a[key] for key in a}
    verdict = "PASS" if ratio["p90"] <= TARGET_RATIO_P90 else "FAIL"
    rows = [
        "| probe | p50 ms | p90 ms | max ms |",
        "|---|---|---|---|",
        f"| idle server | {a['p50']:.1f} | {a['p90']:.1f} | {a['max']:.1f} |",
        f"| after {args.hangups} hang-ups | {b['p50']:.1f} | {b['p90']:.1f} | {b['max']:.1f} |",
        f"| ratio | {ratio['p50']:.3f} | {ratio['p90']:.3f} | {ratio['max']:.3f} |",
    ]
    verdict_line = f"Verdict: p90 ratio {ratio['p90']:.3f} (target <= {TARGET_RATIO_P90}) **{verdict}**."
    record = ", ".join(f"{name} {value:.0f}" for name, value in jobs.items())
    print("\n".join(rows), "", verdict_line, f"engine jobs by outcome: {record}", sep="\n")
    section = "\n".join(
        [
            *header(SECTION, command),
            f"* Run time: {time.monotonic() - started:.0f} s",
            f"* One daphne (engine Hibari); {args.rounds} rounds after {WARM_UP} warm-up rounds, each an idle probe and "
            f"a probe right after {args.hangups} sessions (pcm, stream_audio, a four-sentence text, first audio frame "
            "read) dropped their TCP connections at once, alternating which goes first. A probe: a configured session "
            "(pcm, stream_audio) sends a sentence's final mark; first audio = that frame to the first binary frame. "
            "Percentiles by linear interpolation. Target: p90 after the hang-ups <= 1.1x the idle probe's.",
            f"* The pool's record over the run (`speech_engine_jobs_total` by outcome): {record}.",
            "",
            *rows,
            "",
            verdict_line,
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.strict and verdict == "FAIL" else 0


if __name__ == "__main__":
    sys.exit(main())
