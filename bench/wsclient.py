"""The paragraph's WebSocket client (bench/throughput.py, bench/compare.py): blocking sockets, one thread
a session, and a frame reader that reads only what the server sends.

The client shares the server's two cores, so every microsecond it spends on a frame is taken from
synthesis, while the raw engine it is compared with has no client at all. Measured against the same
server at C = 4, rounds alternating (client CPU per audio second, this process, from the text sent to
the last audio): aiohttp's WebSocket (asyncio, a compiled frame reader) 0.113 ms, websocket-client
(blocking, 16 KiB reads) 0.096 ms, this one 0.072 ms, with 1.015-1.017x the audio per wall second
(medians of 16-20 adjacent pairs). What is left is waking a thread per read and the kernel's copy.

It assumes what this server does (speech/server/websocket.py, autobahn): frames unmasked and never
fragmented, no extensions; anything else fails the round (`ProtocolError`), it is never measured.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import struct
from urllib.parse import urlsplit

BUFFER = 1 << 22  # larger than a round's frames: a read takes whatever the socket holds
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, 1.3
TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class ProtocolError(AssertionError):
    """The server sent something this client does not read: the round is void."""


def frame(opcode, payload):
    """A client frame: FIN, `opcode`, masked with a random key (RFC 6455, 5.3)."""
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    key = os.urandom(4)
    mask = (key * (n // 4 + 1))[:n]
    return head + key + (int.from_bytes(payload, "little") ^ int.from_bytes(mask, "little")).to_bytes(n, "little")


class Connection:
    """One WebSocket connection; `timeout_s` bounds every read (SO_RCVTIMEO: no poll before each read).
    `buffer_bytes` only has to hold the largest text frame and a frame header."""

    def __init__(self, url, timeout_s, buffer_bytes=BUFFER):
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
        self.sock.settimeout(None)  # blocking, the kernel's receive timeout bounds each read
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(timeout_s), 0))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray(buffer_bytes)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        key = base64.b64encode(os.urandom(16))
        self.sock.sendall(
            b"GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (parts.path.encode(), parts.netloc.encode(), key)
        )
        while (end := self._buf.find(b"\r\n\r\n", 0, self._end)) < 0:
            self._fill()
        head = bytes(self._buf[:end]).decode("latin-1").split("\r\n")
        fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in head[1:])}
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        if not head[0].startswith("HTTP/1.1 101") or fields.get("sec-websocket-accept") != accept:
            raise ProtocolError(f"handshake refused: {head}")
        self._start = end + 4

    def _fill(self):
        """Read what the socket holds into the buffer, after what is there."""
        if self._end == len(self._buf):  # move what is left to the front
            if not self._start:
                raise ProtocolError(f"a text frame or handshake larger than the {len(self._buf)}-byte buffer")
            left = self._end - self._start
            self._buf[:left] = self._buf[self._start : self._end]
            self._start, self._end = 0, left
        try:
            n = self.sock.recv_into(self._view[self._end :])
        except BlockingIOError:  # SO_RCVTIMEO ran out
            raise TimeoutError("no frame from the server in time") from None
        if not n:
            raise ConnectionError("the server closed the connection without a close frame")
        self._end += n

    def _need(self, n):
        while self._end - self._start < n:
            self._fill()

    def _skip(self, n):
        """Drop the next n bytes of the stream, reading them straight into the buffer."""
        while True:
            held = min(n, self._end - self._start)
            self._start += held
            n -= held
            if not n:
                return
            self._start = self._end = 0  # all of it was dropped: read the rest from the front
            self._fill()

    def frames(self):
        """Yield (opcode, payload) for each frame the server sends; a binary frame's payload is its
        length only (the audio is counted, never copied). Pings are answered here."""
        while True:
            self._need(2)
            first, second = self._buf[self._start], self._buf[self._start + 1]
            if first & 0x70 or not first & 0x80 or second & 0x80:
                raise ProtocolError(f"a frame this client does not read (header {first:#x} {second:#x})")
            n, size = second & 0x7F, 2
            if n >= 126:
                size = 4 if n == 126 else 10
                self._need(size)
                n = int.from_bytes(self._buf[self._start + 2 : self._start + size], "big")
            opcode = first & 0x0F
            self._start += size
            if opcode == BINARY:
                self._skip(n)
                yield opcode, n
                continue
            self._need(n)
            payload = bytes(self._buf[self._start : self._start + n])
            self._start += n
            if opcode == PING:
                self.sock.sendall(frame(PONG, payload))
                continue
            yield opcode, payload

    def send_json(self, message):
        self.sock.sendall(frame(TEXT, json.dumps(message).encode()))

    def close(self, code=1000):
        """Answer the server's close frame (or start one) and close the socket."""
        try:
            self.sock.sendall(frame(CLOSE, code.to_bytes(2, "big")))
        except OSError:  # the server has gone already
            pass
        self.sock.close()
