"""Part (4) of bench/handshake.py: handshakes beside many idle sessions, and what held them up.

Bursts of AT_ONCE whole handshakes (connect -> `session.configured`) alternate between a server holding
`idle` idle sessions and one holding none (in-memory layer), for `rounds` bursts each and at least
AT_LEAST_S, so that the window holds the servers' keepalive pings of every idle session (daphne's
ping interval, 20 s). The idle sessions are held by this process, whose own garbage collector is frozen
while the bursts run: its full collections would otherwise walk those 2,000 connections and stop the
bursts under way, a pause of the client, not of the server (docs/decisions.md).

With `trace`, both servers record what held up their event loops (bench/looptrace/sitecustomize.py), and
the bursts holding each server's slowest 1 % of handshakes are set beside what overlapped them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path

from cancel import stats_ms, table
from looptrace.sitecustomize import events_between
from report import header

from tests.support.live import DaphneServer, open_session
from tests.support.stress_load import idle_sessions

BENCH = Path(__file__).resolve().parent
SECTION = "## Handshakes beside idle sessions (bench/handshake.py, part 4)"
CONFIG = json.dumps({"type": "session.config", "session": {"response_format": "pcm", "stream_audio": True}})
AT_ONCE = 20
WARM_UP = 10
AT_LEAST_S = 25.0  # daphne pings a connection 20 s after its last message; its passes run every 2 s


class ClientCollections:
    """This process's full collections (generation 2), as (start, end) wall times."""

    def __init__(self):
        self.spans = []
        self._since = 0.0

    def __call__(self, phase, info):
        if info["generation"] != 2:
            return
        if phase == "start":
            self._since = time.time()
        else:
            self.spans.append((self._since, time.time()))


async def burst(url, closing):
    """AT_ONCE whole handshakes at once: (start, end, [seconds each]). The sockets are appended to `closing`."""

    async def handshake():
        t0 = time.perf_counter()
        ws = await open_session(url)
        closing.append(ws)
        await ws.send(CONFIG)
        await ws.recv()
        return time.perf_counter() - t0

    start = time.time()
    latencies = await asyncio.gather(*(handshake() for _ in range(AT_ONCE)))
    return start, time.time(), latencies


async def beside_idle_sessions(urls, idle, rounds):
    """The bursts ({server: [(start, end, latencies)]}), the idle sessions' tally (tests/support/stress.py),
    the measured window."""
    bursts = {name: [] for name in urls}
    window = []

    async def measure(_admitted):
        # The sessions of a burst close while the next bursts run, as sessions end at any time on a live
        # server (a full collection that their ends set off then meets the handshakes under way).
        gc.collect()
        gc.freeze()  # this process's 2,000 connections: see the module's docstring
        sockets, closing = [], []
        trial = -WARM_UP
        try:
            while trial < rounds or time.time() - window[0] < AT_LEAST_S:
                if trial == 0:
                    window.append(time.time())
                for name, url in urls.items():
                    measured = await burst(url, sockets)
                    if trial >= 0:
                        bursts[name].append(measured)
                # Closes under way only: the bursts' connections are not kept (this process's collections).
                closing = [task for task in closing if not task.done()]
                closing += [asyncio.ensure_future(ws.close()) for ws in sockets]
                sockets.clear()
                trial += 1
            window.append(time.time())
            await asyncio.gather(*closing)
        finally:
            gc.unfreeze()

    tally = await idle_sessions(urls["loaded"], idle, measure)
    return bursts, tally, window


def idle_rows(env, idle, rounds, trace, root):
    """Part (4)'s rows, the idle sessions admitted, and with `trace` the tables of what held the servers up
    and of their slowest bursts."""
    # Idle sessions stay open while the bursts run, and wait for their config while the others open.
    env = {**env, "SPEECH_IDLE_TIMEOUT_S": "3600", "SPEECH_CONFIG_TIMEOUT_S": "3600"}
    traces = Path(tempfile.mkdtemp(prefix="bench-trace-"))
    servers = {}
    for name in ("loaded", "empty"):
        extra = {"PYTHONPATH": str(BENCH / "looptrace"), "SPEECH_BENCH_TRACE": str(traces / name)} if trace else {}
        servers[name] = DaphneServer({**env, **extra}, migrate=False, root=root).start()
    client = ClientCollections()
    gc.callbacks.append(client)
    try:
        urls = {name: server.ws_url for name, server in servers.items()}
        bursts, tally, (since, until) = asyncio.run(beside_idle_sessions(urls, idle, rounds))
    finally:
        gc.callbacks.remove(client)
        for server in servers.values():
            server.stop()
    for server in servers.values():
        if "Traceback" in server.stderr_text():
            raise SystemExit(server.stderr_text()[-4000:])
        server.cleanup()
    admitted = tally.sessions
    if admitted < idle:
        print(f"{idle - admitted} idle sessions not admitted: refused {tally.refused}, closes {dict(tally.closes)}")
    latencies = {name: [seconds for _start, _end, each in bursts[name] for seconds in each] for name in bursts}
    rows = [
        (f"{AT_ONCE} at once beside {admitted} idle sessions", stats_ms(latencies["loaded"])),
        (f"{AT_ONCE} at once beside none (alternating)", stats_ms(latencies["empty"])),
    ]
    if not trace:
        return rows, admitted, None
    events = {name: events_between(traces / name, since, until) for name in servers}
    shutil.rmtree(traces, ignore_errors=True)
    clients = [span for span in client.spans if since <= span[0] <= until]
    return rows, admitted, (pause_rows(events, clients), slowest_bursts(bursts, events, clients))


def pause_rows(events, clients):
    """Each server's collections by generation and its loop's lateness; this process's full collections."""
    rows = []
    for server, records in events.items():
        for generation in (0, 1, 2):
            spans = [r["t1"] - r["t0"] for r in records if r["kind"] == "gc" and r["generation"] == generation]
            rows.append((f"{server}: garbage collection, generation {generation}", stats_ms(spans)))
        walks = [r["t1"] - r["t0"] for r in records if r["kind"] == "gc" and r.get("everything")]
        rows.append((f"{server}: of which full collections of everything (after an unfreeze)", stats_ms(walks)))
        late = [r["t1"] - r["t0"] for r in records if r["kind"] == "late"]
        rows.append((f"{server}: loop late by more than 5 ms", stats_ms(late)))
    rows.append(("client (this process): full collections", stats_ms([end - start for start, end in clients])))
    return table(rows)


def overlap_ms(spans, start, end):
    return 1000 * sum(max(0.0, min(end, t1) - max(start, t0)) for t0, t1 in spans)


def slowest_bursts(bursts, events, clients):
    """The bursts that hold each server's slowest 1 % of handshakes, and what overlapped each: the server's
    collections, the longest time its loop was late, the pings it sent, this process's full collections."""
    lines = [
        "| server | burst start s | slowest handshake ms | server gc ms (gen 0/1/2) | full walk | loop late, longest ms "
        "| pings sent | client gc ms |",
        "|---|---:|---:|---|---|---:|---:|---:|",
    ]
    origin = min(start for each in bursts.values() for start, _end, _latencies in each)
    for server, measured in bursts.items():
        every = sorted(seconds for _start, _end, latencies in measured for seconds in latencies)
        cut = every[-max(1, len(every) // 100)]
        records = events[server]
        for start, end, latencies in measured:
            if max(latencies) < cut:
                continue
            collections = [r for r in records if r["kind"] == "gc" and r["t0"] < end and r["t1"] > start]
            by_generation = "/".join(
                f"{overlap_ms([(r['t0'], r['t1']) for r in collections if r['generation'] == g], start, end):.0f}"
                for g in (0, 1, 2)
            )
            walk = "yes" if any(r.get("everything") for r in collections) else ""
            late = [r["t1"] - r["t0"] for r in records if r["kind"] == "late" and r["t0"] < end and r["t1"] > start]
            pings = sum(1 for r in records if r["kind"] == "ping" and start <= r["t0"] <= end)
            lines.append(
                f"| {server} | {start - origin:.1f} | {1000 * max(latencies):.0f} | {by_generation} | {walk} "
                f"| {1000 * max(late, default=0):.0f} | {pings} | {overlap_ms(clients, start, end):.0f} |"
            )
    return "\n".join(lines)


def section(env, args):
    """Part 4, printed; returns its section of RESULTS.md."""
    started = time.monotonic()
    rows, admitted, traced = idle_rows(env, args.idle, args.rounds, args.trace, args.root)
    loaded, empty = rows[0][1], rows[1][1]
    ratio = loaded["p99"] / empty["p99"]
    verdict = f"p99 beside {admitted} idle / beside none = {ratio:.2f} (target <= 2)"
    report = table(rows) + ("\n\n" + "\n\n".join(traced) if traced else "")
    print(report + "\n\n" + verdict, flush=True)
    code = "" if args.root == BENCH.parent else f", servers of the checkout at {args.root}"
    command = f"python bench/handshake.py --idle-only --idle {args.idle} --rounds {args.rounds}{' --trace' * args.trace}"
    about = (
        f"* {AT_ONCE} handshakes at once (each from its connect to session.configured; the sessions close in the "
        f"background while the next bursts run), at least {args.rounds} bursts and {AT_LEAST_S:.0f} s on each of two "
        f"servers (in-memory layer, engine {args.engine}), alternating after {WARM_UP} warm-up bursts: one holds "
        f"{args.idle} idle sessions (held by the client, whose garbage collector is frozen meanwhile), the other none. "
        "Target: p99 beside them <= 2x p99 beside none. --trace: what held each server's loop up during the bursts "
        "(collections; a full walk is one after an unfreeze, speech/server/collector.py), this process's full "
        "collections, and the bursts holding each server's slowest 1 % of handshakes beside what overlapped them."
    )
    lines = [*header(SECTION, command), f"* Run time: {time.monotonic() - started:.0f} s{code}", about, "", report]
    return "\n".join([*lines, "", f"* {verdict}", "", ""])
