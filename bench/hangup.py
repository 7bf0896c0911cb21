"""Hang-ups: a probe session's first audio right after clients left mid-stream, against an idle server.

    .venv/bin/python bench/hangup.py [--rounds 40] [--burst 20] [--no-write] [--strict]

Starts one daphne (`manage.py serve`, engine Hibari, tests/support/live.py). Every round has four
probes, in rotating order: one on the idle server, one right after one session hung up mid-stream, one
right after `--burst` silent sessions (configured, no text: what their teardown alone costs) hung up at
once, and one right after `--burst` sessions hung up mid-stream at once. Those sessions (pcm, stream_audio, on
blocking sockets of their own) each speak a long text and read until their first audio frame has come;
then their sockets are reset (no close frame) and the probe sends its sentence's final mark at once. A
probe is a session configured beforehand (pcm, stream_audio), and its first audio the time from that
last text frame to its first binary frame, as in bench/ttfa.py. Before each probe the server is left
to settle until it has no session and no engine job.

Target: the probe's first audio after the hang-ups <= 1.1x the idle probe's, p90, both after one and
after the burst (p50 reported too).

Writes/replaces the section "## Hang-ups (bench/hangup.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness import first_audio, hibari_server  # noqa: E402
from report import RESULTS, header, write_section  # noqa: E402
from ttfa import SENTENCES  # noqa: E402
from wsclient import BINARY, TEXT, Connection  # noqa: E402

from tests.support.live import configure, metric, open_session, wait_for  # noqa: E402

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


def speaking(url, speak=True):
    """A session mid-stream, on a blocking socket (bench/wsclient.py: the hang-up costs the client no
    event-loop work of its own): its long text sent after session.configured, its first audio frame
    read. With `speak` false, only configured: a silent session."""
    conn = Connection(url, timeout_s=60)
    conn.send_json({"type": "session.config", "session": {"response_format": "pcm", "stream_audio": True}})
    frames = conn.frames()
    opcode, event = next(frames)
    assert opcode == TEXT and json.loads(event)["type"] == "session.configured", event
    if speak:
        conn.send_json({"type": "input.text", "text": LONG_TEXT})
        while next(frames)[0] != BINARY:
            pass
    return conn


def hang_up(conn):
    """Drop the connection with a reset (SO_LINGER 0): no close frame, no FIN wait."""
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.sock.close()


def settle(server):
    """Bounded wait until the server has no session and no engine job (running or queued)."""
    wait_for(
        lambda: metric(server, "speech_sessions_active") == 0 and metric(server, "speech_engine_queue_depth") == 0,
        "an idle server",
    )


async def one_probe(server, sentence, hangups, speak=True):
    ws = await probe_session(server.ws_url)
    try:
        if hangups:
            callers = await asyncio.gather(*(asyncio.to_thread(speaking, server.ws_url, speak) for _ in range(hangups)))
            for caller in callers:
                hang_up(caller)
        return (await first_audio(ws, sentence))[0]
    finally:
        await ws.close()


async def trials(server, rounds, burst):
    """{kind: [seconds]} for the kinds of probe: (sessions hung up before it, were they speaking)."""
    kinds = ((0, True), (1, True), (burst, False), (burst, True))
    seen = {kind: [] for kind in kinds}
    for n in range(WARM_UP + rounds):
        sentence = SENTENCES[n % len(SENTENCES)]
        for kind in kinds[n % len(kinds) :] + kinds[: n % len(kinds)]:
            await asyncio.to_thread(settle, server)
            seconds = await one_probe(server, sentence, *kind)
            if n >= WARM_UP:
                seen[kind].append(seconds)
        if n >= WARM_UP and (n - WARM_UP + 1) % 10 == 0:
            print(f"  {n - WARM_UP + 1}/{rounds} rounds", flush=True)
    return seen


def percentiles(values):
    values = np.asarray(values) * 1000
    return {name: float(np.percentile(values, q)) for name, q in (("p50", 50), ("p90", 90), ("max", 100))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--burst", type=int, default=20, help="sessions hung up at once before the third probe")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when the target is missed")
    args = parser.parse_args(argv)
    options = (("rounds", args.rounds, 40), ("burst", args.burst, 20))
    command = "python bench/hangup.py" + "".join(f" --{name} {value}" for name, value, default in options if value != default)
    started = time.monotonic()
    # Admission never refuses the callers: 20 sessions at once queue more than its 2 s estimate on a busy machine.
    with hibari_server({"SPEECH_MAX_QUEUE_WAIT_S": "60"}) as server:
        seen = asyncio.run(trials(server, args.rounds, args.burst))
        jobs = {o: metric(server, "speech_engine_jobs_total", outcome=o) for o in ("completed", "dropped", "stopped", "unheard")}
    idle = percentiles(seen[(0, True)])
    rows = ["| probe | p50 ms | p90 ms | max ms | p50 / idle | p90 / idle |", "|---|---|---|---|---|---|"]
    rows.append(f"| idle server | {idle['p50']:.1f} | {idle['p90']:.1f} | {idle['max']:.1f} | | |")
    verdicts = []
    labels = (
        ((1, True), "after 1 hang-up mid-stream"),
        ((args.burst, False), f"after {args.burst} silent sessions hung up at once (their teardown alone)"),
        ((args.burst, True), f"after {args.burst} hang-ups mid-stream at once"),
    )
    for kind, label in labels:
        after = percentiles(seen[kind])
        p50, p90 = after["p50"] / idle["p50"], after["p90"] / idle["p90"]
        rows.append(f"| {label} | {after['p50']:.1f} | {after['p90']:.1f} | {after['max']:.1f} | {p50:.3f} | {p90:.3f} |")
        if kind[1]:
            verdicts.append(f"{label} p90 {p90:.3f} **{'PASS' if p90 <= TARGET_RATIO_P90 else 'FAIL'}**")
    verdict_line = f"Verdict (target p90 <= {TARGET_RATIO_P90}x the idle probe's): " + "; ".join(verdicts) + "."
    record = ", ".join(f"{name} {value:.0f}" for name, value in jobs.items())
    print("\n".join(rows), "", verdict_line, f"engine jobs by outcome: {record}", sep="\n")
    section = "\n".join(
        [
            *header(SECTION, command),
            f"* Run time: {time.monotonic() - started:.0f} s",
            f"* One daphne (engine Hibari); {args.rounds} rounds after {WARM_UP} warm-up rounds, each four probes in "
            f"rotating order: on the idle server, right after one session hung up, right after {args.burst} silent "
            f"sessions (configured, no text) hung up at once, right after {args.burst} hung up at once mid-stream (pcm, "
            "stream_audio, a four-sentence text, first audio frame read, then the socket reset). A probe: a "
            "configured session (pcm, stream_audio) sends a sentence's final mark; first audio = that frame to the first "
            "binary frame. Percentiles by linear interpolation. Target: p90 <= 1.1x the idle probe's.",
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
    return 1 if args.strict and "FAIL" in verdict_line else 0


if __name__ == "__main__":
    sys.exit(main())
