"""Load scenarios (tests/support/stress.py has the fuzz and disconnect ones, and the shared Tally):
idle sessions, stalled readers, an overload burst, concurrent large configs, and a probe session."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from websockets.exceptions import ConnectionClosed

from .live import configure, open_session, recv_item, send_json
from .stress import READ_S, SENTENCES, Tally, abort, admitted, bounded

PROBE_TEXT = "Hello there. "


async def probe_first_audio(url):
    """Seconds from the input.text that completes a sentence to its first audio frame."""
    ws = await open_session(url)
    try:
        await configure(ws, {"stream_audio": True})
        sent = time.perf_counter()
        await send_json(ws, {"type": "input.text", "text": PROBE_TEXT})
        while (item := await recv_item(ws, timeout=READ_S)).kind != "audio":
            if item.data.get("type") == "error":
                raise AssertionError(f"probe session failed: {item.data}")
        first = item.at - sent
        await send_json(ws, {"type": "input.done"})
        with contextlib.suppress(ConnectionClosed):
            while True:
                await recv_item(ws, timeout=READ_S)
        return first
    finally:
        await ws.close()


async def idle_sessions(url, count, hold, *, concurrency=50):
    """`count` configured sessions that send nothing; `hold(n)` runs while all are open (measure
    there). Then they all close normally."""
    tally = Tally()
    sockets = await bounded([open_session(url) for _ in range(count)], concurrency)
    try:
        admissions = await bounded([admitted(ws, {}, tally) for ws in sockets], concurrency)
        tally.sessions = sum(admissions)
        await hold(tally.sessions)
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    return tally


async def stalled_readers(url, count, seconds, *, keepalive):
    """Sessions that ask for a long text and never read the audio (optionally sending a
    session.keepalive every second), then vanish after `seconds`."""
    tally = Tally()
    text = " ".join(SENTENCES * 4)

    async def one():
        ws = await open_session(url, max_queue=1)  # the client stops reading: TCP pushes back on the server
        if not await admitted(ws, {"stream_audio": True}, tally):
            await ws.close()
            return
        await send_json(ws, {"type": "input.text", "text": text})
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            if keepalive:
                with contextlib.suppress(ConnectionClosed):
                    await send_json(ws, {"type": "session.keepalive"})
        abort(ws)

    await asyncio.gather(*(one() for _ in range(count)))
    tally.sessions = count
    return tally


async def speaking_session(url, sentences, tally, *, config=None):
    """One session that sends `sentences` sentences at once, then input.done, and reads everything.
    Accepted sentences are those of its session.done (or all it sent if the session was cut);
    lost ones are accepted sentences without a successful audio.done."""
    tally.sessions += 1
    ws = await open_session(url)
    try:
        if not await admitted(ws, config or {}, tally):
            return
        text = " ".join(SENTENCES[i % len(SENTENCES)] for i in range(sentences))
        await send_json(ws, {"type": "input.text", "text": text + " "})
        await send_json(ws, {"type": "input.done"})
        delivered, total = 0, sentences
        while True:
            try:
                item = await recv_item(ws, timeout=READ_S)
            except ConnectionClosed:
                tally.closed(ws.close_code)
                break
            if item.kind != "event":
                continue
            event = item.data
            tally.see(event)
            if event["type"] == "audio.done" and not event["error"]:
                delivered += 1
            elif event["type"] == "session.done":
                total = event["total_sentences"]
        tally.accepted += total
        tally.lost += max(0, total - delivered)
    finally:
        await ws.close()


async def overload_burst(url, sessions, sentences):
    """`sessions` sessions of `sentences` sentences each, all started at the same moment."""
    tally = Tally()
    await asyncio.gather(*(speaking_session(url, sentences, tally) for _ in range(sessions)))
    return tally


def large_config(size):
    """A valid session.config of `size` bytes: the padding is an unknown key (ignored)."""
    head = json.dumps({"type": "session.config", "session": {"stream_audio": True}, "padding": ""})
    return head[:-2] + "x" * (size - len(head)) + '"}'


async def large_configs(url, count, size):
    """`count` connections each sending a `size`-byte session.config at once. Counted: sessions
    configured (then finished normally) and refused at the handshake (capacity, 4013)."""
    tally = Tally()
    frame = large_config(size)

    async def one():
        tally.sessions += 1
        ws = await open_session(url, open_timeout=READ_S)
        try:
            await ws.send(frame)
            first = await recv_item(ws, timeout=READ_S)
            tally.see(first.data)
            if first.data.get("type") == "session.configured":
                tally.configured += 1
                await send_json(ws, {"type": "input.done"})
            with contextlib.suppress(ConnectionClosed):
                while True:
                    tally.see((await recv_item(ws, timeout=READ_S)).data)
        except ConnectionClosed:  # refused while the frame was still going out: the close code says why
            pass
        finally:
            await ws.close()
            tally.closed(ws.close_code if ws.close_code is not None else 1006)
            if ws.close_code == 4013:
                tally.refused += 1

    await asyncio.gather(*(one() for _ in range(count)))
    tally.frames = count
    return tally
