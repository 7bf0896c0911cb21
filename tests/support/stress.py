"""Stress scenarios against a real daphne (tests/support/live.DaphneServer), shared by tests/test_stress.py
(reduced sizes, in `make test`) and bench/stress.py (full sizes, figures in bench/RESULTS.md).

Each scenario is a coroutine that returns a Tally: frames sent, answers outside the contract
(tests/fuzz_frames.error_problem), close codes, sentences accepted and lost, handshake refusals.
ProcWatch reads the server's RSS, descriptors and threads from /proc; `active_sessions` reads the
session registry from the server's own SQLite file: what the server itself believes is running.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import os
import socket
import sqlite3
import struct
import threading
from dataclasses import dataclass, field

from websockets.exceptions import ConnectionClosed

from .fuzz_frames import CONTRACT_CLOSES, error_problem, handshake_frames, session_frames
from .live import open_session, recv_item, send_json

SENTENCES = (
    "The train leaves the station at seven and arrives in the city shortly after nine.",
    "Please close the window before you go to bed, because the night will be cold.",
    "My sister bought a red bicycle last week and rides it to work every morning.",
    "We walked along the beach until the sun went down behind the old lighthouse.",
    "Turn left at the bakery and keep going straight until you see the blue gate.",
)
QUEUE_FULL = "The request queue is full."
READ_S = 120.0  # hang guard for one frame under load


# -- the server process -----------------------------------------------------------------------------


class ProcWatch:
    def __init__(self, pid):
        self.pid = pid

    def _status(self, key):
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        raise KeyError(key)

    def rss(self):
        return self._status("VmRSS") * 1024

    def threads(self):
        return self._status("Threads")

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def snapshot(self):
        return {"rss": self.rss(), "fds": self.fds(), "threads": self.threads()}

    @contextlib.contextmanager
    def peak_rss(self, interval=0.02):
        """Samples RSS in a thread while the block runs; yields a dict whose "peak" is the maximum."""
        result = {"peak": self.rss()}
        stop = threading.Event()

        def sample():
            while not stop.wait(interval):
                result["peak"] = max(result["peak"], self.rss())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield result
        finally:
            stop.set()
            sampler.join()
            result["peak"] = max(result["peak"], self.rss())


def active_sessions(server):
    """Sessions the server's registry holds as active (configured and not yet ended)."""
    with contextlib.closing(sqlite3.connect(server.workdir / "db.sqlite3", timeout=10)) as db:
        return db.execute("SELECT count(*) FROM speech_sessionrecord WHERE status = 'active'").fetchone()[0]


def tracebacks(server):
    return server.stderr_text().count("Traceback")


# -- outcomes -----------------------------------------------------------------------------------------


@dataclass
class Tally:
    frames: int = 0
    sessions: int = 0
    problems: list = field(default_factory=list)  # answers outside the contract
    errors: collections.Counter = field(default_factory=collections.Counter)  # error messages seen
    closes: collections.Counter = field(default_factory=collections.Counter)
    accepted: int = 0  # sentences a session accepted (counted in its session.done)
    lost: int = 0  # accepted sentences without their audio
    refused: int = 0  # sessions refused at the handshake (capacity: 4013 before session.configured)
    configured: int = 0  # sessions that got session.configured (where that is what is counted)

    def see(self, event):
        if event.get("type") != "error":
            return
        self.errors[event.get("message")] += 1
        problem = error_problem(event)
        if problem:
            self.problems.append(problem)

    def closed(self, code):
        code = int(code)
        self.closes[code] += 1
        if code not in CONTRACT_CLOSES:
            self.problems.append(f"close code {code}")


async def _send(ws, kind, data):
    if kind == "binary":
        await ws.send(bytes(data))
    elif kind == "raw_text":
        await ws.send(data, text=True)  # websockets does not validate bytes sent as text
    else:
        await ws.send(data)


async def _drain(ws, tally, timeout=READ_S):
    """Read to the close; every event is judged. Returns the events."""
    events = []
    while True:
        try:
            item = await recv_item(ws, timeout=timeout)
        except ConnectionClosed:
            tally.closed(ws.close_code if ws.close_code is not None else 1006)
            return events
        if item.kind == "event":
            tally.see(item.data)
            events.append(item.data)


async def admitted(ws, config, tally):
    """Send session.config; True once session.configured arrives. A refusal at the handshake (the
    server at capacity: an error, then close 4013, possibly before the config was even read) is
    counted in tally.refused and returns False."""
    try:
        await send_json(ws, {"type": "session.config", "session": config})
        first = await recv_item(ws, timeout=READ_S)
    except ConnectionClosed:
        first = None
    if first is not None and first.kind == "event" and first.data.get("type") == "session.configured":
        return True
    if first is not None:
        tally.see(first.data)
    await _drain(ws, tally)
    if ws.close_code == 4013:
        tally.refused += 1
    return False


async def bounded(coros, concurrency):
    """Run coroutines with at most `concurrency` at once."""
    gate = asyncio.Semaphore(concurrency)

    async def run(coro):
        async with gate:
            return await coro

    return await asyncio.gather(*(run(coro) for coro in coros))


# -- fuzz --------------------------------------------------------------------------------------------


async def fuzz_first_frame(url, kind, data, tally):
    tally.frames += 1
    tally.sessions += 1
    ws = await open_session(url)
    try:
        try:
            await _send(ws, kind, data)
            first = await recv_item(ws, timeout=READ_S)
        except ConnectionClosed:
            tally.closed(ws.close_code if ws.close_code is not None else 1006)
            return
        if first.kind == "event":
            tally.see(first.data)
            if first.data.get("type") == "session.configured":
                await send_json(ws, {"type": "input.done"})
        await _drain(ws, tally)
    finally:
        await ws.close()


async def fuzz_session(url, rng, count, tally):
    """A configured session gets `count` frames from session_frames, then input.done."""
    tally.sessions += 1
    ws = await open_session(url)
    try:
        if not await admitted(ws, {"stream_audio": True, "split_granularity": rng.choice(("sentence", "clause"))}, tally):
            return
        reader = asyncio.create_task(_drain(ws, tally))
        frames = session_frames(rng)
        for _ in range(count):
            if reader.done():
                break
            kind, data = next(frames)
            with contextlib.suppress(ConnectionClosed):
                await _send(ws, kind, data)
                tally.frames += 1
        with contextlib.suppress(ConnectionClosed):
            await send_json(ws, {"type": "input.done"})
        await reader
    finally:
        await ws.close()


async def fuzz(url, rng, frames, *, first_share=0.5, per_session=50, concurrency=16):
    """`frames` hostile frames: about `first_share` of them as first frames, each on its own
    connection, the rest inside configured sessions of `per_session` frames."""
    tally = Tally()
    firsts = handshake_frames(rng)
    first_count = int(frames * first_share)
    jobs = [fuzz_first_frame(url, *next(firsts), tally) for _ in range(first_count)]
    rest = frames - first_count
    jobs += [fuzz_session(url, rng, min(per_session, rest - at), tally) for at in range(0, rest, per_session)]
    rng.shuffle(jobs)
    await bounded(jobs, concurrency)
    return tally


# -- abrupt disconnects ----------------------------------------------------------------------------


async def raw_upgrade(host, port, path="/v1/audio/speech/stream"):
    """A WebSocket opened by hand (asyncio streams), for frames a library would not send half of."""
    reader, writer = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    response = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_S)
    assert response.startswith(b"HTTP/1.1 101"), response[:200]
    return reader, writer


def frame_header(length, opcode=0x1):
    """A masked client frame header for `length` payload bytes (mask 0: payload goes as is)."""
    if length < 126:
        return bytes((0x80 | opcode, 0x80 | length)) + b"\0\0\0\0"
    if length < 1 << 16:
        return bytes((0x80 | opcode, 0x80 | 126)) + length.to_bytes(2, "big") + b"\0\0\0\0"
    return bytes((0x80 | opcode, 0x80 | 127)) + length.to_bytes(8, "big") + b"\0\0\0\0"


def abort(writer_or_ws):
    transport = writer_or_ws.transport
    transport.abort()


async def vanish_after_config(server, config=None):
    """A client that sends its session.config and resets the connection at once: the config and the reset
    usually reach the server before its loop polls, which is when uvloop closed the socket's handle under
    daphne (speech/server/websocket.py `_to_transport`)."""
    _reader, writer = await raw_upgrade(server.host, server.port)
    body = json.dumps({"type": "session.config", "session": config or {"response_format": "pcm"}}).encode()
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.write(frame_header(len(body)) + body)
    abort(writer)


async def abrupt_disconnect(server, rng, tally):
    """One client that vanishes (TCP reset, no close frame) at a random moment."""
    tally.sessions += 1
    moment = rng.choice(("after_upgrade", "mid_config_frame", "after_config", "mid_text", "mid_audio", "after_done"))
    if moment in ("after_upgrade", "mid_config_frame"):
        _reader, writer = await raw_upgrade(server.host, server.port)
        if moment == "mid_config_frame":
            body = json.dumps({"type": "session.config", "session": {"stream_audio": True}}).encode()
            writer.write(frame_header(len(body) + 2_000_000) + body)
            await writer.drain()
        await asyncio.sleep(rng.random() * 0.05)
        abort(writer)
        return
    ws = await open_session(server.ws_url)
    if not await admitted(ws, {"stream_audio": rng.random() < 0.7}, tally):
        await ws.close()
        return
    if moment != "after_config":
        await send_json(ws, {"type": "input.text", "text": " ".join(rng.sample(SENTENCES, 3))})
        if moment == "after_done":
            await send_json(ws, {"type": "input.done"})
        if moment in ("mid_audio", "after_done"):
            with contextlib.suppress(ConnectionClosed, TimeoutError):
                while (await recv_item(ws, timeout=READ_S)).kind != "audio":
                    pass
    await asyncio.sleep(rng.random() * 0.2)
    abort(ws)


async def disconnects(server, rng, count, *, concurrency=20):
    tally = Tally()
    await bounded([abrupt_disconnect(server, rng, tally) for _ in range(count)], concurrency)
    tally.frames = count
    return tally
