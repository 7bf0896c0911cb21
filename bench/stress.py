"""Stress: hostile and unlucky clients against a real daphne (Hibari, 2 workers), one scenario at a time.

    .venv/bin/python bench/stress.py [--reduced] [--only NAME ...] [--seed N] [--no-write]

Starts its own `manage.py serve` (tests/support/live.DaphneServer: free port, private SQLite) with
SPEECH_ENGINE_WORKERS=2, and a private `redis-server` for the Redis scenario.
Scenarios (full size; --reduced divides them to prove the script works in a minute or two):

  fuzz         10,000 hostile frames (tests/support/fuzz_frames.py): wrong types for every config field, huge
               numbers, deep nesting, invalid JSON and UTF-8, binary, protocol violations, oversized
  disconnects  1,000 clients that vanish (TCP reset) at random moments, mid-frame included
  idle         1,000 configured sessions that send nothing (RSS per session reported)
  stalled      20 sessions that never read their audio, silent; then 20 that send keep-alives
  burst        40 sessions x 60 sentences at once on the 2 workers
  configs      20 concurrent 16 MiB session.config frames (SPEECH_CONFIG_BUDGET_BYTES)
  redis        Redis killed and restarted empty while sessions speak; REST cancel checked after

For each: tracebacks in the server's stderr, answers outside the contract, sentences lost (of those
accepted), sessions refused at the handshake, server RSS before / peak / after (after: once the
registry shows no session and RSS has settled), descriptors and threads before / after, and a probe
session's first audio (ms) before and after. Writes the section "## Stress (bench/stress.py)".
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import header, write_section  # noqa: E402

from speech.memory import QUIET_TRIM_AFTER_S  # noqa: E402
from tests.support.live import DaphneServer, configure, open_session, recv_item, send_json, wait_for  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.stress import ProcWatch, Tally, active_sessions, disconnects, fuzz, tracebacks  # noqa: E402
from tests.support.stress_load import (  # noqa: E402
    idle_sessions,
    large_configs,
    overload_burst,
    probe_first_audio,
    speaking_session,
    stalled_readers,
)

SECTION = "## Stress (bench/stress.py)"
MB = 1e6
FULL = {
    "fuzz": 10_000,
    "disconnects": 1_000,
    "idle": 1_000,
    "stalled": (20, 30.0),
    "burst": (40, 60),
    "configs": (20, 16 * 1024 * 1024 - 64),
    "redis": (8, 20),
}
REDUCED = {
    "fuzz": 600,
    "disconnects": 60,
    "idle": 60,
    "stalled": (5, 4.0),
    "burst": (6, 6),
    "configs": (20, 16 * 1024 * 1024 - 64),
    "redis": (3, 6),
}
SERVER_ENV = {"SPEECH_ENGINE_WORKERS": "2"}


def settle(server, watch):
    """The server is idle again: no active session in its registry, and RSS no longer falling."""
    wait_for(lambda: active_sessions(server) == 0, "sessions ended", timeout=120)
    time.sleep(QUIET_TRIM_AFTER_S + 1.0)  # a quiet server gives a burst's memory back after this
    return steady_rss(watch)


def steady_rss(watch):
    """RSS once it stops moving."""
    last = watch.rss()
    for _ in range(20):
        time.sleep(0.5)
        now = watch.rss()
        if abs(now - last) < 0.005 * last:
            return now
        last = now
    return last


def measure(server, watch, name, size, run):
    """Run one scenario (`run()` returns a Tally and optional notes) and its row of figures."""
    settle(server, watch)
    probe_before = asyncio.run(probe_first_audio(server.ws_url))
    settle(server, watch)
    before, traces = watch.snapshot(), tracebacks(server)
    with watch.peak_rss() as peak:
        tally, notes = run()
    settle(server, watch)
    after = watch.snapshot()
    probe_after = asyncio.run(probe_first_audio(server.ws_url))
    row = {
        "name": name,
        "size": size,
        "tally": tally,
        "notes": notes,
        "before": before,
        "peak": peak["peak"],
        "after": after,
        "tracebacks": tracebacks(server) - traces,
        "probe": (probe_before * 1000, probe_after * 1000),
    }
    print(format_row(row), flush=True)
    for problem in tally.problems[:10]:
        print("   outside the contract:", problem)
    return row


def format_row(row):
    t, b, a = row["tally"], row["before"], row["after"]
    change = (a["rss"] - b["rss"]) / b["rss"] * 100
    lost = f"{t.lost} of {t.accepted}" if t.accepted else "-"
    return (
        f"| {row['name']} | {row['size']} | {row['tracebacks']} | {len(t.problems)} | {lost} | {t.refused} | "
        f"{b['rss'] / MB:.0f} / {row['peak'] / MB:.0f} / {a['rss'] / MB:.0f} | {change:+.1f} % | "
        f"{b['fds']} / {a['fds']} | {b['threads']} / {a['threads']} | "
        f"{row['probe'][0]:.0f} / {row['probe'][1]:.0f} | {row['notes']} |"
    )


# -- scenarios -----------------------------------------------------------------------------------------


def run_fuzz(server, watch, rng, frames):
    tally = asyncio.run(fuzz(server.ws_url, rng, frames))
    return tally, f"{tally.sessions} connections; closes {dict(sorted(tally.closes.items()))}"


def run_disconnects(server, watch, rng, count):
    return asyncio.run(disconnects(server, rng, count)), ""


def run_idle(server, watch, count):
    held = {}

    async def hold(n):
        wait_for(lambda: active_sessions(server) >= n, "idle sessions registered", timeout=120)
        held["rss"] = steady_rss(watch)

    base = steady_rss(watch)
    tally = asyncio.run(idle_sessions(server.ws_url, count, hold))
    return tally, f"{(held['rss'] - base) / count / 1024:.0f} KiB a session while open"


def run_stalled(server, watch, count, seconds, keepalive):
    tally = asyncio.run(stalled_readers(server.ws_url, count, seconds, keepalive=keepalive))
    return tally, f"held {seconds:.0f} s, then dropped"


def run_burst(server, watch, sessions, sentences):
    started = time.perf_counter()
    tally = asyncio.run(overload_burst(server.ws_url, sessions, sentences))
    return tally, f"{time.perf_counter() - started:.0f} s; errors {dict(tally.errors)}"


def run_configs(server, watch, count, size):
    tally = asyncio.run(large_configs(server.ws_url, count, size))
    return tally, f"{tally.configured} configured, {tally.refused} refused (4013)"


def run_redis(server, watch, redis_server, sessions, sentences):
    async def load():
        tally = Tally()
        speakers = [asyncio.create_task(speaking_session(server.ws_url, sentences, tally)) for _ in range(sessions)]
        await asyncio.sleep(1.0)
        redis_server.kill()
        await asyncio.sleep(3.0)
        await asyncio.to_thread(redis_server.start)  # empty: no persistence
        restarted = time.perf_counter()
        back = await cancel_back(server)
        await asyncio.gather(*speakers)
        return tally, back - restarted

    tally, back_s = asyncio.run(load())
    return tally, f"Redis down 3 s under {sessions} sessions; REST cancel worked {back_s:.1f} s after the restart"


async def cancel_back(server, timeout=60.0):
    """Poll until a REST cancel reaches a live session (input.cancelled, origin server); the time it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws = await open_session(server.ws_url)
        try:
            configured = await configure(ws, {"stream_audio": True})
            await send_json(ws, {"type": "input.text", "text": "This sentence keeps the session busy for a while. " * 6})
            while (await recv_item(ws)).kind != "audio":
                pass
            request = urllib.request.Request(
                f"{server.http_url}/v1/audio/speech/sessions/{configured['session_id']}/cancel", method="POST"
            )
            try:
                status = await asyncio.to_thread(lambda r=request: urllib.request.urlopen(r, timeout=10).status)
            except urllib.error.HTTPError as exc:
                status = exc.code
            while status == 202:
                try:
                    item = await recv_item(ws, timeout=10)
                except TimeoutError:
                    break
                if item.kind == "event" and item.data["type"] == "input.cancelled":
                    return time.perf_counter()
        finally:
            await ws.close()
        await asyncio.sleep(0.2)
    raise AssertionError("REST cancel did not work again after the Redis restart")


# -- main --------------------------------------------------------------------------------------------------

HEAD = (
    "| scenario | size | tracebacks | outside contract | sentences lost | refused at handshake | "
    "RSS before / peak / after (MB) | after vs before | fds before / after | threads before / after | "
    "probe first audio before / after (ms) | notes |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reduced", action="store_true", help="small sizes: proves the script works")
    parser.add_argument("--only", nargs="*", choices=sorted(FULL), help="run only these scenarios")
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    args = parser.parse_args()
    sizes = REDUCED if args.reduced else FULL
    rng = random.Random(args.seed)
    redis_server = RedisServer().start()
    try:
        with DaphneServer({**SERVER_ENV, "REDIS_URL": redis_server.url()}, start_timeout=180) as server:
            watch = ProcWatch(server.proc.pid)
            rows = []
            chosen = args.only or list(FULL)
            print(HEAD)
            steps = {
                "fuzz": lambda: ("fuzz", f"{sizes['fuzz']} frames", lambda: run_fuzz(server, watch, rng, sizes["fuzz"])),
                "disconnects": lambda: (
                    "abrupt disconnects",
                    f"{sizes['disconnects']} clients",
                    lambda: run_disconnects(server, watch, rng, sizes["disconnects"]),
                ),
                "idle": lambda: ("idle sessions", f"{sizes['idle']} sessions", lambda: run_idle(server, watch, sizes["idle"])),
                "burst": lambda: (
                    "overload burst",
                    "{} sessions x {} sentences".format(*sizes["burst"]),
                    lambda: run_burst(server, watch, *sizes["burst"]),
                ),
                "configs": lambda: (
                    "large configs",
                    "{} x {:.0f} MiB".format(sizes["configs"][0], sizes["configs"][1] / 2**20),
                    lambda: run_configs(server, watch, *sizes["configs"]),
                ),
                "redis": lambda: (
                    "Redis kill + empty restart",
                    "{} sessions x {} sentences".format(*sizes["redis"]),
                    lambda: run_redis(server, watch, redis_server, *sizes["redis"]),
                ),
            }
            for name in chosen:
                if name == "stalled":
                    count, seconds = sizes["stalled"]
                    for keepalive in (False, True):
                        label = "stalled readers, " + ("keep-alives" if keepalive else "silent")
                        rows.append(
                            measure(
                                server,
                                watch,
                                label,
                                f"{count} sessions",
                                lambda k=keepalive, n=count, s=seconds: run_stalled(server, watch, n, s, k),
                            )
                        )
                    continue
                label, size, run = steps[name]()
                rows.append(measure(server, watch, label, size, run))
            stderr_tail = server.stderr_text()
        print(f"server stderr: {stderr_tail.count('Traceback')} tracebacks in all")
    finally:
        redis_server.cleanup()
    if not args.no_write:
        command = "python bench/stress.py" + (" --reduced" if args.reduced else "")
        lines = (
            header(SECTION, command)
            + [
                "* Server: `manage.py serve`, Hibari, SPEECH_ENGINE_WORKERS=2, private Redis; "
                "RSS after = once the registry shows no session and RSS has settled.",
                *(["* Reduced sizes (`--reduced`): proves the script works; not figures of record."] if args.reduced else []),
                "",
                HEAD,
            ]
            + [format_row(row) for row in rows]
        )
        write_section(SECTION, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
