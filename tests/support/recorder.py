"""A recording Transport for SpeechSession tests.

Every call the session makes (`send_json`, `send_bytes`, `close`) is appended to `log` and put
on an asyncio queue the test reads in order. Events are round-tripped through JSON, so a value
that would not serialise on the wire fails the test. Anything sent after `close` is recorded in
`after_close` (a contract violation the tests assert is empty). `send_room()` reports `room`, which a
test sets to play a connection that sends that many bytes at once (0 by default: 200 ms frames).

With `yield_on_send=True` each send suspends once before recording, like a real transport with
back-pressure (an ASGI server that awaits its socket): it exposes code that relies on sends never
yielding. Reading an item uses `asyncio.wait_for(..., timeout)` purely as a hang guard.
"""

from __future__ import annotations

import asyncio
import json

HANG_GUARD_S = 5.0


class Recorder:
    def __init__(self, *, yield_on_send=False):
        self.yield_on_send = yield_on_send
        # Cleared: the client "stops reading" and send_bytes waits, as the consumer's does on a
        # full socket (speech/server/flowcontrol.py).
        self.writable = asyncio.Event()
        self.writable.set()
        self.held_sends = 0  # send_bytes calls that found the transport not writable
        self.room = 0  # what send_room() reports: bytes the "connection" would send at once
        self.queue: asyncio.Queue = asyncio.Queue()
        self.log: list[tuple[str, object]] = []
        self.close_code = None
        self.after_close: list[tuple[str, object]] = []

    # -- the Transport protocol ------------------------------------------------------------------
    async def send_json(self, event):
        if self.yield_on_send:
            await asyncio.sleep(0)  # a suspension point, as a real socket write may have
        self._record("json", json.loads(json.dumps(event, allow_nan=False)))

    async def send_bytes(self, data):
        if not self.writable.is_set():
            self.held_sends += 1
            await self.writable.wait()
        if self.yield_on_send:
            await asyncio.sleep(0)
        assert isinstance(data, (bytes, bytearray)), f"send_bytes got {type(data).__name__}"
        self._record("bytes", bytes(data))

    def send_room(self):
        return self.room

    async def close(self, code, audio_ahead_s=0.0):
        if self.yield_on_send:
            await asyncio.sleep(0)
        self._record("close", code)
        if self.close_code is None:
            self.close_code = code

    def _record(self, kind, value):
        item = (kind, value)
        if self.close_code is not None:
            self.after_close.append(item)
        self.log.append(item)
        self.queue.put_nowait(item)

    # -- reading, in order -----------------------------------------------------------------------
    async def next(self, timeout=HANG_GUARD_S):
        return await asyncio.wait_for(self.queue.get(), timeout)

    async def event(self, type_=None, **fields):
        """The next item, which must be a JSON event (of `type_`, with these field values)."""
        kind, value = await self.next()
        assert kind == "json", f"expected a JSON event, got {kind}: {_short(value)}"
        if type_ is not None:
            assert value.get("type") == type_, f"expected {type_!r}, got {value}"
        for key, expected in fields.items():
            assert value.get(key) == expected, (
                f"{type_ or value.get('type')}.{key}: {value.get(key)!r} != {expected!r} in {value}"
            )
        return value

    async def binary(self):
        kind, value = await self.next()
        assert kind == "bytes", f"expected a binary frame, got {kind}: {_short(value)}"
        return value

    async def closed(self, code=None):
        kind, value = await self.next()
        assert kind == "close", f"expected close, got {kind}: {_short(value)}"
        if code is not None:
            assert value == code, f"close code {value} != {code}"
        return value

    async def until(self, type_):
        """Items up to and including the JSON event of `type_` (returned last)."""
        items = []
        while True:
            item = await self.next()
            items.append(item)
            if item[0] == "json" and item[1].get("type") == type_:
                return items

    async def until_closed(self):
        """Every item up to and including the close."""
        items = []
        while True:
            item = await self.next()
            items.append(item)
            if item[0] == "close":
                return items

    def pending(self):
        """Items recorded but not read yet (a non-blocking look)."""
        return list(self.queue._queue)  # noqa: SLF001 - a test helper peeking at its own queue


def _short(value):
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return value


def check_segment_order(items, first=0):
    """The ordering of docs/protocol.md over a recorded stream. Returns {sentence_index: (start, frames, done)}.

    Binary frames only between an audio.start and its audio.done; everything of segment k before
    anything of segment k+1; indexes increase by one; audio.done.total_bytes == bytes sent."""
    segments = {}
    current = None  # index of the segment between its audio.start and audio.done
    last_index = first - 1
    for kind, value in items:
        if kind == "bytes":
            assert current is not None, "binary frame outside audio.start/audio.done"
            segments[current][1].append(value)
            continue
        if kind != "json":
            continue
        kind_ = value.get("type")
        if kind_ == "audio.start":
            assert current is None, f"audio.start {value['sentence_index']} inside segment {current}"
            index = value["sentence_index"]
            assert index == last_index + 1, f"sentence_index {index} after {last_index}"
            assert value["id"].endswith(f"-{index}")
            current = index
            segments[index] = (value, [], None)
        elif kind_ == "error" and "sentence_index" in value:
            index = value["sentence_index"]
            if current is None:  # a failing segment that never started: it takes the next index
                assert index == last_index + 1, f"error sentence_index {index} after {last_index}"
                current = index
                segments[index] = (None, [], None)
            else:
                assert index == current
        elif kind_ == "audio.done":
            index = value["sentence_index"]
            assert current == index, f"audio.done {index} while segment {current} is open"
            start, frames, _ = segments[index]
            assert value["total_bytes"] == sum(map(len, frames)), value
            segments[index] = (start, frames, value)
            last_index, current = index, None
    assert current is None, f"segment {current} never got its audio.done"
    return segments
