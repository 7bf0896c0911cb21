"""Soak: mixed load for an hour against two instances sharing Redis, and nothing left to clean up after.

    .venv/bin/python bench/soak.py [--minutes 60] [--seed 46] [--no-write]

Starts a private redis-server and two `manage.py serve` (Hibari) sharing it and a SQLite database, and
for --minutes keeps on each instance: streaming sessions that read their audio at real-time speed and
barge in (input.cancel) partway, sessions that send their text word by word, REST one-shots
(POST /v1/audio/speech), clients that vanish (TCP reset at a random moment, or right after their
session.config), and hostile frames (tests/support/fuzz_frames.py). Redis is killed and started again,
empty, at half time. A probe session on each instance every PROBE_S measures first audio.

Reports: each instance's RSS every minute; tracebacks in their logs; answers outside the contract;
accepted sentences lost (a session's sentences, less those it cancelled, without their audio);
registry rows still `active` once every client is gone, and after both instances have stopped (SIGTERM);
first audio over time. Targets (issue 46): RSS at the end within 10 % of minute 10 (the run's sixth),
0 tracebacks, 0 accepted sentences lost, 0 stale rows, first audio p99 over the last ten minutes (the
run's last sixth) <= 1.2x that of minutes 5-15 (its twelfth to quarter). `--minutes 5` is the reduced
form in `make test` (tests/test_soak.py asserts the zero counts; timings are only reported). Writes
"## Soak (bench/soak.py)" in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from websockets.exceptions import ConnectionClosed

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from report import header, write_section  # noqa: E402

from tests.support.live import DaphneServer, open_session, recv_item, send_json, wait_for  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402
from tests.support.stress import SENTENCES, ProcWatch, Tally, abrupt_disconnect, fuzz, vanish_after_config  # noqa: E402
from tests.support.stress_load import probe_first_audio  # noqa: E402

SECTION = "## Soak (bench/soak.py)"
RATE, SAMPLE_BYTES = 24000, 2
READ_AHEAD_S = 0.5  # a real-time reader stays this far ahead of playback
PROBE_S, RSS_S = 10.0, 60.0
STREAMING, WORDS = 2, 1  # concurrent sessions of each kind per instance
PAUSES_S = {"rest": 4.0, "vanish": 1.5, "hostile": 5.0}  # between one-offs of each kind, per instance
HANG_S = 120.0  # hang guard for one frame, and for a client's last turn after the end
MB = 1e6


@dataclass
class Counts:
    tally: Tally = field(default_factory=Tally)  # answers outside the contract, close codes
    sessions: dict = field(default_factory=dict)  # kind -> sessions run
    accepted: int = 0  # sentences accepted and not cancelled
    lost: int = 0  # of those, without their audio
    rest_failed: list = field(default_factory=list)  # REST one-shots that got neither audio nor a refusal
    client_errors: list = field(default_factory=list)  # what went wrong on the client's side, by kind
    first_audio: list = field(default_factory=list)  # (seconds into the run, instance, seconds)
    rss: list = field(default_factory=list)  # (minute, RSS of A, RSS of B) in bytes

    def ran(self, kind):
        self.sessions[kind] = self.sessions.get(kind, 0) + 1

    def session_end(self, events):
        """Sentences of a finished session: delivered ones against accepted and not cancelled."""
        total = cancelled = delivered = 0
        for event in events:
            self.tally.see(event)
            kind = event["type"]
            if kind == "audio.done" and not event.get("error") and not event.get("cancelled"):
                delivered += 1
            elif kind == "input.cancelled":
                cancelled += event["cancelled_sentences"]
            elif kind == "session.done":
                total = event["total_sentences"]
        self.accepted += total - cancelled
        self.lost += max(0, total - cancelled - delivered)


def paragraph(rng, sentences):
    return " ".join(rng.choice(SENTENCES) for _ in range(sentences)) + " "


async def read(ws, counts, events, *, real_time=False, until_event=None, audio_s=None):
    """Frames until the socket closes, until `until_event(event)`, or until `audio_s` seconds of audio have
    come; events into `events`, audio read at real-time speed with `real_time`."""
    started, heard = time.monotonic(), 0.0
    while audio_s is None or heard < audio_s:
        try:
            item = await recv_item(ws, timeout=HANG_S)
        except ConnectionClosed:
            counts.tally.closed(ws.close_code if ws.close_code is not None else 1006)
            return
        if item.kind == "audio":
            heard += len(item.data) / (RATE * SAMPLE_BYTES)
            if real_time:
                await asyncio.sleep(max(0.0, heard - (time.monotonic() - started) - READ_AHEAD_S))
            continue
        events.append(item.data)
        if until_event is not None and until_event(item.data):
            return


@contextlib.asynccontextmanager
async def session(server, counts, kind):
    """A configured streaming session of `kind`: (socket, its events); counted once it is closed."""
    counts.ran(kind)
    events = []
    ws = await open_session(server.ws_url)
    try:
        await send_json(ws, {"type": "session.config", "session": {"stream_audio": True, "response_format": "pcm"}})
        yield ws, events
    finally:
        await ws.close()
    counts.session_end(events)


async def streaming(server, rng, counts):
    """A session read at real time that barges in after a few seconds of audio, then says one more thing."""
    async with session(server, counts, "streaming") as (ws, events):
        await send_json(ws, {"type": "input.text", "text": paragraph(rng, 6)})
        await read(ws, counts, events, real_time=True, audio_s=rng.uniform(1.0, 5.0))
        await send_json(ws, {"type": "input.cancel"})
        await read(ws, counts, events, real_time=True, until_event=lambda event: event["type"] == "input.cancelled")
        await send_json(ws, {"type": "input.text", "text": paragraph(rng, 1)})
        await send_json(ws, {"type": "input.done"})
        await read(ws, counts, events, real_time=True)


async def word_by_word(server, rng, counts):
    async with session(server, counts, "word by word") as (ws, events):
        for word in paragraph(rng, 2).split():
            await send_json(ws, {"type": "input.text", "text": word + " "})
            await asyncio.sleep(rng.uniform(0.02, 0.15))
        await send_json(ws, {"type": "input.done"})
        await read(ws, counts, events)


def rest_once(server, text):
    """POST /v1/audio/speech: (status, audio bytes)."""
    body = json.dumps({"input": text, "response_format": "pcm"}).encode()
    request = urllib.request.Request(server.http_url + "/v1/audio/speech", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HANG_S) as response:
            return response.status, len(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, 0


async def rest(server, rng, counts):
    counts.ran("REST one-shot")
    status, size = await asyncio.to_thread(rest_once, server, paragraph(rng, 1))
    if not (status == 200 and size > 0) and status != 503:  # 503: refused at capacity, as designed
        counts.rest_failed.append(status)


async def vanish(server, rng, counts):
    counts.ran("vanished")
    if rng.random() < 0.3:
        await vanish_after_config(server)
    else:
        await abrupt_disconnect(server, rng, counts.tally)


async def hostile(server, rng, counts):
    counts.ran("fuzzed (20 frames)")
    counts.tally.problems += (await fuzz(server.ws_url, rng, 20, concurrency=4)).problems


async def keep_running(scenario, server, rng, counts, until, pause=0.0):
    while time.monotonic() < until:
        try:
            await asyncio.wait_for(scenario(server, rng, counts), HANG_S * 3)
        except Exception as exc:
            counts.client_errors.append(f"{scenario.__name__}: {type(exc).__name__}: {exc}"[:300])
        await asyncio.sleep(rng.uniform(0.5, 1.5) * pause)


async def probes(servers, counts, started, until):
    while time.monotonic() < until:
        for name, server in servers.items():
            try:
                counts.first_audio.append((time.monotonic() - started, name, await probe_first_audio(server.ws_url)))
            except Exception as exc:
                counts.client_errors.append(f"probe: {type(exc).__name__}: {exc}"[:300])
        await asyncio.sleep(PROBE_S)


async def samples(watches, counts, started, until):
    while True:
        counts.rss.append(((time.monotonic() - started) / 60, *(watch.rss() for watch in watches)))
        if time.monotonic() + RSS_S > until + 1:
            return
        await asyncio.sleep(RSS_S)


async def redis_restart(redis_server, at):
    await asyncio.sleep(at)
    redis_server.kill()
    await asyncio.sleep(3.0)
    await asyncio.to_thread(redis_server.start)  # empty: no persistence


async def load(servers, redis_server, minutes, seed, counts):
    started = time.monotonic()
    until = started + minutes * 60
    rng = random.Random(seed)
    work = [redis_restart(redis_server, minutes * 30), probes(servers, counts, started, until)]
    work.append(samples([ProcWatch(server.proc.pid) for server in servers.values()], counts, started, until))
    for server in servers.values():
        work += [keep_running(streaming, server, random.Random(rng.random()), counts, until) for _ in range(STREAMING)]
        work += [keep_running(word_by_word, server, random.Random(rng.random()), counts, until) for _ in range(WORDS)]
        for scenario in (rest, vanish, hostile):
            work.append(keep_running(scenario, server, random.Random(rng.random()), counts, until, PAUSES_S[scenario.__name__]))
    await asyncio.gather(*work)


def active_rows(db):
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as connection:
        return connection.execute("SELECT count(*) FROM speech_sessionrecord WHERE status = 'active'").fetchone()[0]


def p99(values):
    return float(np.percentile(values, 99)) if values else float("nan")


@dataclass
class Result:
    counts: Counts
    tracebacks: int
    stale_rows: int  # active rows once every client had gone
    stale_after_stop: int  # active rows once both instances had stopped
    exit_codes: list
    minutes: float

    def first_audio_p99(self, start_min, end_min):
        return p99([s for at, _, s in self.counts.first_audio if start_min * 60 <= at < end_min * 60])

    def counted(self):
        """What the reduced soak's test asserts, as JSON-able values."""
        counts = self.counts
        return {
            "tracebacks": self.tracebacks,
            "problems": counts.tally.problems,
            "accepted": counts.accepted,
            "lost": counts.lost,
            "stale_rows": self.stale_rows,
            "stale_after_stop": self.stale_after_stop,
            "exit_codes": self.exit_codes,
            "client_errors": counts.client_errors,
            "rest_failed": counts.rest_failed,
            "sessions": counts.sessions,
        }

    def rss_near(self, minute):
        return min(self.counts.rss, key=lambda sample: abs(sample[0] - minute))


def run_soak(minutes, seed=46):
    """The soak, start to end; returns its Result (the test asserts its zero counts)."""
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    db = workdir / "db.sqlite3"
    redis_server = RedisServer().start()
    env = {
        "SPEECH_ENGINE": "hibari",
        "SPEECH_REQUIRE_API_KEY": "false",
        "DATABASE_URL": f"sqlite:///{db}",
        "MEDIA_ROOT": str(workdir / "media"),
        "REDIS_URL": redis_server.url(5),
    }
    servers = {}
    counts = Counts()
    try:
        for name in ("A", "B"):
            servers[name] = DaphneServer({**env, "SPEECH_INSTANCE_ID": name}, migrate=not servers, start_timeout=180).start()
        asyncio.run(load(servers, redis_server, minutes, seed, counts))
        with contextlib.suppress(AssertionError):  # rows left active are what is reported
            wait_for(lambda: active_rows(db) == 0, "every session's end recorded", timeout=30)
        stale = active_rows(db)
        codes = [server.stop() for server in servers.values()]
        return Result(
            counts=counts,
            tracebacks=sum(server.stderr_text().count("Traceback") for server in servers.values()),
            stale_rows=stale,
            stale_after_stop=active_rows(db),
            exit_codes=codes,
            minutes=minutes,
        )
    finally:
        for server in servers.values():
            server.stop()
            server.cleanup()
        redis_server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def report(result):
    """The report's lines (Markdown), targets included."""
    counts, minutes = result.counts, result.minutes
    base = result.first_audio_p99(minutes / 12, minutes / 4)
    last = result.first_audio_p99(minutes * 5 / 6, minutes)
    early, end = result.rss_near(minutes / 6), counts.rss[-1]
    growth = [(end[i] - early[i]) / early[i] for i in (1, 2)]
    lines = [
        "| minute | RSS A (MB) | RSS B (MB) |",
        "|---:|---:|---:|",
        *(f"| {minute:.1f} | {a / MB:.0f} | {b / MB:.0f} |" for minute, a, b in counts.rss),
        "",
        "| minutes | probes | first audio p50 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|",
    ]
    step = max(1.0, minutes / 12)
    for start in np.arange(0.0, minutes, step):
        window = [s * 1000 for at, _, s in counts.first_audio if start * 60 <= at < (start + step) * 60]
        if window:
            p50 = np.percentile(window, 50)
            lines.append(f"| {start:.0f}-{start + step:.0f} | {len(window)} | {p50:.0f} | {p99(window):.0f} |")
    rss = f"A {growth[0]:+.1%}, B {growth[1]:+.1%}"
    window = f"minutes {minutes / 12:.1f}-{minutes / 4:.1f}"
    checks = [
        (f"RSS at the end vs minute {early[0]:.1f}", rss, all(abs(g) <= 0.10 for g in growth)),
        ("tracebacks", str(result.tracebacks), result.tracebacks == 0),
        ("answers outside the contract", str(len(counts.tally.problems)), not counts.tally.problems),
        ("accepted sentences lost", f"{counts.lost} of {counts.accepted}", counts.lost == 0),
        ("stale rows after the run / after SIGTERM", f"{result.stale_rows} / {result.stale_after_stop}", not result.stale_rows),
        (f"first audio p99, last sixth / {window}", f"{last:.3f} / {base:.3f} s", last <= 1.2 * base),
    ]
    lines += [
        "",
        "| target | measured | met |",
        "|---|---|---|",
        *(f"| {name} | {value} | {'yes' if ok else 'NO'} |" for name, value, ok in checks),
        "",
        "* Sessions run: " + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.sessions.items())),
        f"* REST one-shots without audio (503 refusals excluded): {len(counts.rest_failed)} {counts.rest_failed[:10]}",
        f"* Client-side errors: {len(counts.client_errors)}",
        *(f"  * {error}" for error in counts.client_errors[:10]),
        f"* Close codes: {dict(sorted(counts.tally.closes.items()))}; exit codes after SIGTERM: {result.exit_codes}",
    ]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--no-write", action="store_true", help="print only; leave bench/RESULTS.md alone")
    parser.add_argument("--json", type=Path, help="also write the counts there (tests/support/soak_run.py reads them)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = run_soak(args.minutes, args.seed)
    lines = report(result)
    print("\n".join(lines), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result.counted()))
    if not args.no_write:
        section = [
            *header(SECTION, f"python bench/soak.py --minutes {args.minutes:g} --seed {args.seed}"),
            f"* Run time: {(time.monotonic() - started) / 60:.1f} min. Two instances (Hibari, default workers) sharing a "
            f"private Redis (restarted empty at half time) and SQLite; per instance {STREAMING} real-time streaming "
            f"sessions with a barge-in and {WORDS} word-by-word session at all times, a REST one-shot, a vanishing "
            "client and 20 fuzzed frames every few seconds, a first-audio probe every 10 s.",
            "",
            *lines,
        ]
        write_section(SECTION, "\n".join(section) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
