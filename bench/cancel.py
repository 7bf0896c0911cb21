"""Cancel latency: a local `input.cancel`, and a REST cancel on another instance, over real sockets.

    .venv/bin/python bench/cancel.py [--trials 200] [--redis-url URL] [--no-write] [--strict]

Starts a private `redis-server` (free port, no persistence; or uses --redis-url) and two daphne
instances A and B (`manage.py serve`, tests/support/live.py) sharing it and a temp SQLite database, engine
Hibari. Sessions live on A and are reused (their clients take 16 KiB a socket, see tests/support/live.py):
after every cancel the next trial speaks a new utterance on the same socket (new text after a cancel
takes the next free sentence index).

(1) Local: a session speaks a long text (pcm, stream_audio); input.cancel is sent right after a
    binary frame, then the client reads to input.cancelled. Per trial: binary frames received after
    the cancel was sent, time from sending it to the last of those frames, to the cancelled
    audio.done and to input.cancelled. Two regimes, alternating:
      * held: the client reads N = 1..8 frames, then stops reading until A holds the session
        (backpressure: A's `speech_sessions_held` gauge), then cancels. A's own audio-bytes counter
        (`speech_audio_sent_bytes_total`) before the cancel and after input.cancelled gives the
        audio the server sent after getting the cancel. The target "stops within one audio frame"
        is checked here: at most 1 frame, every trial. (The client still reads what was already
        in the socket buffers; those frames are counted separately, for information.)
      * burst: the cancel comes after the N-th frame of the utterance, N = 1..40, while the server
        is still pushing audio as fast as the client reads. The count mixes frames already on
        their way when the cancel was sent with any the server sent after getting it.
(2) Cross-instance: a session on A speaks (held, as above), `POST /v1/audio/speech/sessions/<id>/cancel` on B
    over one kept-alive HTTP connection (http.client, in a thread while the loop keeps reading A's
    socket); latency from just before the request to the arrival of input.cancelled (origin "server")
    on A's socket. Target: p99 < 50 ms.

Writes/replaces the section "## Cancel latency (bench/cancel.py)" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.client
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from report import RESULTS, header, write_section  # noqa: E402

from tests.support.live import DaphneServer, configure, held, metric, open_session, recv_item, send_json  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

SECTION = "## Cancel latency (bench/cancel.py)"
TARGET_FRAMES_AFTER = 1  # local: at most one audio frame sent after input.cancel (held regime, every trial)
TARGET_CROSS_P99_MS = 50.0
RATE = 24000
# A held session's frames after each segment's first: 200 ms of 16-bit pcm (its window is closed; only a
# client that reads ahead gets larger ones, speech/server/tcpwindow.py). Audio counted in these units.
FRAME_BYTES = int(RATE * 0.2) * 2
AUDIO_SENT = "speech_audio_sent_bytes_total"
WARM_UP = 5
SENTENCES = [
    "The train leaves the station at seven and arrives in the city shortly after nine.",
    "Please close the window before you go to bed, because the night will be cold.",
    "My sister bought a red bicycle last week and rides it to work every morning.",
    "Could you send me the report by Friday afternoon so that I can read it over the weekend?",
    "The coffee machine on the third floor is broken again, so we walk down to the café.",
    "We walked along the beach until the sun went down behind the old lighthouse.",
    "Thank you for calling, how can I help you today with your order or your account?",
    "The museum opens at ten and closes at six, except on Mondays when it stays closed.",
    "He forgot his umbrella and got soaked in the rain on the way to the station.",
    "Our team won the match by two goals after a very long and difficult second half.",
    "Turn left at the bakery and keep going straight until you see the blue gate.",
    "The new library has a quiet room for reading and study on the upper floor.",
]


def utterance(trial, sentences):
    """A long text (sentences * ~4 s of speech), rotated per trial so the engine never repeats itself."""
    start = trial % len(SENTENCES)
    return " ".join(SENTENCES[(start + i) % len(SENTENCES)] for i in range(sentences)) + " "


class Socket:
    """A reused session on A with the bookkeeping the trials need."""

    def __init__(self, ws, session_id):
        self.ws = ws
        self.session_id = session_id

    @classmethod
    async def open(cls, url):
        ws = await open_session(url, small_buffers=True)
        configured = await configure(ws, {"response_format": "pcm", "stream_audio": True})
        return cls(ws, configured["session_id"])

    async def speak(self, text):
        await send_json(self.ws, {"type": "input.text", "text": text})
        return time.perf_counter()

    async def frames(self, until):
        """Read until `until(frames_so_far, item)` is true for a binary frame; returns the count."""
        count = 0
        while True:
            item = await recv_item(self.ws)
            if item.kind == "audio":
                count += 1
                if until(count, item):
                    return count
            elif item.data["type"] in ("error", "session.done"):
                raise RuntimeError(f"unexpected event while speaking: {item.data}")

    async def until_held(self, server):
        """Stop reading until `server` holds this session mid-segment (backpressure)."""
        await asyncio.to_thread(held, server)

    async def after_cancel(self, t0):
        """Read to input.cancelled. Returns a dict of what came after t0."""
        frames, last_frame, done, done_at = 0, None, None, None
        while True:
            item = await recv_item(self.ws)
            if item.kind == "audio":
                frames += 1
                last_frame = item.at
                continue
            event = item.data
            if event["type"] == "audio.done":
                done, done_at = event, item.at
            elif event["type"] == "input.cancelled":
                return {
                    "frames_after": frames,
                    "last_frame_s": None if last_frame is None else last_frame - t0,
                    "done_s": None if done_at is None else done_at - t0,
                    "cut": bool(done and done["cancelled"]),
                    "cancelled_s": item.at - t0,
                    "event": event,
                }
            elif event["type"] != "audio.start":
                raise RuntimeError(f"unexpected event after the cancel: {event}")


# -- (1) local input.cancel --------------------------------------------------------------------------------


async def local_trials(server, trials, rng):
    sock = await Socket.open(server.ws_url)
    results = []
    try:
        for trial in range(-WARM_UP, trials):
            regime = "held" if trial % 2 == 0 else "burst"
            n = rng.randint(1, 8) if regime == "held" else rng.randint(1, 40)
            await sock.speak(utterance(trial, 12))
            await sock.frames(lambda count, item, n=n: count >= n)
            if regime == "held":
                await sock.until_held(server)
                sent_before = await asyncio.to_thread(metric, server, AUDIO_SENT)
            t0 = time.perf_counter()
            await send_json(sock.ws, {"type": "input.cancel"})
            result = await sock.after_cancel(t0)
            assert result["event"]["origin"] == "client", result["event"]
            if regime == "held":
                sent_after = await asyncio.to_thread(metric, server, AUDIO_SENT) - sent_before
                result["server_frames_after"] = -(-int(sent_after) // FRAME_BYTES)
            if trial >= 0:
                results.append({"regime": regime, "n": n, **result})
    finally:
        await sock.ws.close()
    return results


# -- (2) REST cancel on B -> input.cancelled on A ------------------------------------------------------------


class KeptAlive:
    """One HTTP/1.1 connection to B, reused for every request (from a worker thread)."""

    def __init__(self, host, port):
        self.conn = http.client.HTTPConnection(host, port, timeout=30)

    def post(self, path):
        started = time.perf_counter()
        self.conn.request("POST", path, body=b"", headers={"Content-Length": "0"})
        response = self.conn.getresponse()
        body = json.loads(response.read())
        return response.status, body, time.perf_counter() - started

    def close(self):
        self.conn.close()


async def cross_trials(a_server, b_server, trials):
    sock = await Socket.open(a_server.ws_url)
    client = KeptAlive(b_server.host, b_server.port)
    path = f"/v1/audio/speech/sessions/{sock.session_id}/cancel"
    results = []
    try:
        for trial in range(-WARM_UP, trials):
            await sock.speak(utterance(trial, 12))
            await sock.frames(lambda count, item: True)
            await sock.until_held(a_server)  # the server is mid-segment
            t0 = time.perf_counter()
            request = asyncio.ensure_future(asyncio.to_thread(client.post, path))
            result = await sock.after_cancel(t0)
            status, body, rest_s = await request
            if status != 202:
                raise RuntimeError(f"REST cancel answered {status}: {body}")
            assert result["event"]["origin"] == "server", result["event"]
            if trial >= 0:
                results.append({**result, "rest_s": rest_s})
    finally:
        client.close()
        await sock.ws.close()
    return results


# -- statistics and report ------------------------------------------------------------------------------------


def stats_ms(values):
    ms = np.asarray(values, dtype=np.float64) * 1000.0
    if ms.size == 0:
        return None
    return {
        "n": int(ms.size),
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
        "mean": float(ms.mean()),
        "min": float(ms.min()),
        "max": float(ms.max()),
    }


def table(rows):
    lines = ["| measure | n | p50 ms | p99 ms | mean ms | min ms | max ms |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows:
        if s is None:
            lines.append(f"| {name} | 0 | – | – | – | – | – |")
        else:
            lines.append(
                f"| {name} | {s['n']} | {s['p50']:.2f} | {s['p99']:.2f} | {s['mean']:.2f} | {s['min']:.2f} | {s['max']:.2f} |"
            )
    return "\n".join(lines)


def frames_table(local):
    """Distribution of binary frames received after input.cancel was sent, per regime."""
    regimes = ["held", "burst"]
    counts = {r: collections.Counter(t["frames_after"] for t in local if t["regime"] == r) for r in regimes}
    totals = {r: sum(counts[r].values()) for r in regimes}
    buckets = [(0, 0), (1, 1), (2, 2), (3, 5), (6, 10), (11, 25), (26, 10**9)]
    lines = ["| frames the client read after input.cancel | held | burst |", "|---|---:|---:|"]
    for low, high in buckets:
        label = str(low) if low == high else (f"{low}-{high}" if high < 10**9 else f">= {low}")
        cells = []
        for r in regimes:
            k = sum(v for f, v in counts[r].items() if low <= f <= high)
            cells.append(f"{k} ({100 * k / totals[r]:.0f} %)" if totals[r] else "0")
        if any(not c.startswith("0") for c in cells) or low <= 2:
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| trials | " + " | ".join(str(totals[r]) for r in regimes) + " |")
    lines.append("| max | " + " | ".join(str(max(counts[r]) if counts[r] else "–") for r in regimes) + " |")
    lines.append(
        "| audio.done cancelled:true | "
        + " | ".join(str(sum(1 for t in local if t["regime"] == r and t["cut"])) for r in regimes)
        + " |"
    )
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200, help="trials of each kind (local, cross-instance)")
    parser.add_argument("--redis-url", default=None, help="use this Redis instead of a private redis-server")
    parser.add_argument("--seed", type=int, default=1, help="seed of the N choices")
    parser.add_argument("--no-write", action="store_true", help="do not touch bench/RESULTS.md")
    parser.add_argument("--strict", action="store_true", help="exit with status 1 when a target is missed")
    args = parser.parse_args(argv)
    command = (
        "python bench/cancel.py"
        + (f" --trials {args.trials}" if args.trials != 200 else "")
        + (" --redis-url URL" if args.redis_url else "")
    )

    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bench-cancel-"))
    redis_server = None if args.redis_url else RedisServer().start()
    redis_url = args.redis_url or redis_server.url(0)
    env = {
        "SPEECH_ENGINE": "hibari",
        "SPEECH_REQUIRE_API_KEY": "false",
        "REDIS_URL": redis_url,
        "DATABASE_URL": f"sqlite:///{workdir / 'db.sqlite3'}",
        "MEDIA_ROOT": str(workdir / "media"),
    }
    servers = []
    try:
        a = DaphneServer({**env, "SPEECH_INSTANCE_ID": "bench-A"}).start()
        servers.append(a)
        b = DaphneServer({**env, "SPEECH_INSTANCE_ID": "bench-B"}, migrate=False).start()
        servers.append(b)
        rng = random.Random(args.seed)
        print(f"servers up: A {a.http_url}, B {b.http_url}, Redis {redis_url}", flush=True)
        local = asyncio.run(local_trials(a, args.trials, rng))
        print(f"local: {len(local)} trials in {time.monotonic() - started:.0f} s", flush=True)
        cross = asyncio.run(cross_trials(a, b, args.trials))
        print(f"cross-instance: {len(cross)} trials in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        for server in servers:
            server.stop()
        if redis_server is not None:
            redis_server.cleanup()
    for server in servers:
        if "Traceback" in server.stderr_text():
            print(server.stderr_text()[-4000:], file=sys.stderr)
            raise SystemExit("a server logged a traceback during the benchmark")
        server.cleanup()
    shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started

    held_trials = [t for t in local if t["regime"] == "held"]
    burst = [t for t in local if t["regime"] == "burst"]
    local_rows = []
    for name, group in (("held", held_trials), ("burst", burst)):
        local_rows += [
            (
                f"{name}: cancel -> last frame after it (trials with one)",
                stats_ms([t["last_frame_s"] for t in group if t["last_frame_s"] is not None]),
            ),
            (f"{name}: cancel -> audio.done cancelled:true", stats_ms([t["done_s"] for t in group if t["cut"]])),
            (f"{name}: cancel -> input.cancelled", stats_ms([t["cancelled_s"] for t in group])),
        ]
    cross_rows = [
        ("REST cancel on B -> input.cancelled on A", stats_ms([t["cancelled_s"] for t in cross])),
        ("REST response (202) on B", stats_ms([t["rest_s"] for t in cross])),
    ]
    worst_held = max(t["server_frames_after"] for t in held_trials)
    within = sum(1 for t in held_trials if t["server_frames_after"] <= TARGET_FRAMES_AFTER)
    local_verdict = "PASS" if worst_held <= TARGET_FRAMES_AFTER else "FAIL"
    cross_p99 = cross_rows[0][1]["p99"]
    cross_verdict = "PASS" if cross_p99 < TARGET_CROSS_P99_MS else "FAIL"

    report_local = frames_table(local) + "\n\n" + table(local_rows)
    report_cross = table(cross_rows)
    verdict = (
        f"Verdict: local (held) at most {TARGET_FRAMES_AFTER} frame sent by the server after input.cancel in "
        f"{within}/{len(held_trials)} trials, worst {worst_held} **{local_verdict}**; "
        f"cross-instance p99 {cross_p99:.2f} ms "
        f"(target < {TARGET_CROSS_P99_MS:g} ms) **{cross_verdict}**."
    )
    print()
    print(report_local)
    print()
    print(report_cross)
    print()
    print(verdict)

    section = "\n".join(
        [
            *header(SECTION, command),
            f"* Run time: {elapsed:.0f} s",
            "* Two daphne instances (`manage.py serve`, engine Hibari) sharing a "
            f"temp SQLite database and {'a private redis-server' if redis_server else 'Redis'}; one reused WebSocket "
            "session on A per part (pcm, stream_audio, a new utterance after every cancel). "
            f"{WARM_UP} warm-up trials per part not counted; percentiles by linear interpolation.",
            f"* (1) Local `input.cancel`, {len(local)} trials, alternating: *held* = the client read 1-8 frames, "
            "then stopped reading until the server held the session (backpressure), then cancelled; the server's "
            "own audio counter says what it sent after the cancel; *burst* = sent after the N-th frame of an "
            "utterance, N = 1-40, while the server still pushes audio as fast as the client reads. The tables count "
            "frames the client read after sending the cancel, which includes what was already in the socket "
            "buffers (for information). Target: the server sends at most one frame after the cancel (held, every "
            "trial).",
            "",
            report_local,
            "",
            f"* (2) Cross-instance, {len(cross)} trials: `POST /v1/audio/speech/sessions/<id>/cancel` on B over one "
            "kept-alive HTTP connection while A's session is held mid-segment, from just before the request to "
            "`input.cancelled` (origin server) on A's socket. Target: p99 < 50 ms.",
            "",
            report_cross,
            "",
            verdict,
            "",
        ]
    )
    if not args.no_write:
        write_section(SECTION, section)
        print(f"\nwrote {RESULTS.relative_to(ROOT)}")
    return 1 if args.strict and "FAIL" in (local_verdict, cross_verdict) else 0


if __name__ == "__main__":
    sys.exit(main())
