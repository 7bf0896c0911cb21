"""A loopback HTTP/1.1 server standing in for sglang-omni / vLLM-omni / OpenAI's `/v1/audio/speech`.

It runs its own asyncio loop in a thread, so sync tests, async tests and daphne subprocesses can all
use it. Each POST takes the next scripted `Reply` (or `default`); requests are recorded.

    with StandIn() as upstream:                       # upstream.url == "http://127.0.0.1:<port>/v1"
        upstream.script(Reply(status=503), Reply(chunks=[pcm_bytes]))
        ...
        upstream.requests[0].json["input"]
        assert upstream.wait(lambda: upstream.disconnects == 1)   # the client closed its connection
        await upstream.reached(lambda: upstream.open == 0)          # the same, from async code

Replies: `chunks` are sent with chunked encoding; `hold=True` keeps the response open after them
until the client goes away (counted in `disconnects`); `hang=True` never sends headers; `drop=True`
closes the connection without a response; `raw` sends those bytes instead of HTTP; `break_after`
closes the connection after the chunks without ending the body; `interval_s` paces the chunks.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from dataclasses import dataclass, field

import h11
import numpy as np

WAIT_S = 30.0  # a hang guard for wait(), not a timing assertion


def pcm(seconds=0.2, rate=24000, freq=220.0):
    """s16le bytes of a tone."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes()


@dataclass
class Reply:
    status: int = 200
    headers: dict = field(default_factory=lambda: {"content-type": "audio/pcm"})
    chunks: list = field(default_factory=lambda: [pcm()])
    body: bytes | None = None  # a whole body with Content-Length instead of chunks
    hold: bool = False
    hang: bool = False
    drop: bool = False
    raw: bytes | None = None
    break_after: bool = False
    interval_s: float = 0.0  # a pause before each chunk after the first: an upstream that trickles


@dataclass
class Request:
    method: str
    path: str
    headers: dict
    body: bytes

    @property
    def json(self):
        return json.loads(self.body)


def error_reply(status, message, param=None, type_="BadRequestError"):
    body = json.dumps({"error": {"message": message, "type": type_, "param": param, "code": status}}).encode()
    return Reply(status=status, headers={"content-type": "application/json"}, chunks=[], body=body)


def voices_reply(voices):
    """The answer to GET /v1/audio/voices: `voices` is a JSON payload, a Reply, or None for a 404."""
    if isinstance(voices, Reply):
        return voices
    if voices is None:
        return error_reply(404, "Not Found", type_="not_found_error")
    return Reply(headers={"content-type": "application/json"}, chunks=[], body=json.dumps(voices).encode())


class StandIn:
    def __init__(self, voices=None, default=None):
        self.voices = voices  # GET /v1/audio/voices: a JSON payload, a Reply, or None for 404
        self.default = default or Reply()
        self.requests: list[Request] = []
        self.connections = 0  # accepted so far
        self.open = 0  # open right now
        self.disconnects = 0  # connections the client closed while a held or hung reply was pending
        self._script = deque()
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="standin")
        self._server = None
        self.port = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies):
        with self._cond:
            self._script.extend(replies)

    def wait(self, predicate, timeout=WAIT_S):
        with self._cond:
            return self._cond.wait_for(predicate, timeout)

    async def reached(self, predicate):
        """From async code: wait (bounded, off the loop) until predicate() holds; fail otherwise."""
        assert await asyncio.to_thread(self.wait, predicate), "the stand-in never reached the expected state"

    def __enter__(self):
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(
            WAIT_S
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc):
        async def stop():
            self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(WAIT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(WAIT_S)

    def _changed(self, **deltas):
        with self._cond:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)
            self._cond.notify_all()

    async def _serve(self, reader, writer):
        self._changed(connections=1, open=1)
        conn = h11.Connection(h11.SERVER)
        try:
            while await self._one(conn, reader, writer):
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            pass
        except asyncio.CancelledError:  # the stand-in is stopping with this connection still open
            pass
        finally:
            writer.close()
            self._changed(open=-1)

    async def _event(self, conn, reader):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data and conn.their_state is h11.IDLE:
                    return None
                continue
            return event

    async def _one(self, conn, reader, writer):
        """Serve one request; False when the connection is done."""
        event = await self._event(conn, reader)
        if event is None or isinstance(event, h11.ConnectionClosed):
            return False
        head, body = event, b""
        while True:
            event = await self._event(conn, reader)
            if isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) or event is None:
                break
        headers = {k.decode().lower(): v.decode() for k, v in head.headers}
        request = Request(head.method.decode(), head.target.decode(), headers, body)
        with self._cond:
            self.requests.append(request)
            reply = self._script.popleft() if self._script and request.method == "POST" else self.default
            self._cond.notify_all()
        if request.method == "GET":
            reply = voices_reply(self.voices)
        return await self._reply(conn, reader, writer, reply)

    async def _wait_for_close(self, reader):
        while await reader.read(65536):
            pass
        self._changed(disconnects=1)

    async def _reply(self, conn, reader, writer, reply):
        if reply.drop:
            return False
        if reply.raw is not None:
            writer.write(reply.raw)
            await writer.drain()
            return False
        if reply.hang:
            await self._wait_for_close(reader)
            return False
        headers = list(reply.headers.items())
        if reply.body is not None:
            headers.append(("content-length", str(len(reply.body))))
        else:
            headers.append(("transfer-encoding", "chunked"))
        writer.write(conn.send(h11.Response(status_code=reply.status, headers=headers)))
        for index, chunk in enumerate([reply.body] if reply.body is not None else reply.chunks):
            if index and reply.interval_s:
                await asyncio.sleep(reply.interval_s)
            if chunk:
                writer.write(conn.send(h11.Data(data=chunk)))
                await writer.drain()
        if reply.break_after:
            return False
        if reply.hold:
            await self._wait_for_close(reader)
            return False
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE
