"""bench/wsclient.py, the benchmarks' hand-written WebSocket client, against a real daphne: what it counts
must be what the server sent, or the throughput it reports means nothing."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import socket
import struct
import threading
from pathlib import Path

import pytest

from tests.support.live import RECV_TIMEOUT_S, serving

# Loaded from its file: bench/ is not a package, and on sys.path its modules would shadow others'.
_spec = importlib.util.spec_from_file_location("wsclient", Path(__file__).resolve().parent.parent / "bench" / "wsclient.py")
wsclient = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wsclient)

pytestmark = pytest.mark.live

TEXT = "The first sentence is short. The second one is a little longer than the first. And a third."


@pytest.fixture(scope="module")
def server():
    with serving({"SPEECH_ENGINE": "fake"}) as srv:
        yield srv


def unmask(data):
    """A client frame's opcode and payload, unmasked."""
    first, second = data[0], data[1]
    n, at = second & 0x7F, 2
    if n == 126:
        n, at = int.from_bytes(data[2:4], "big"), 4
    elif n == 127:
        n, at = int.from_bytes(data[2:10], "big"), 10
    key, payload = data[at : at + 4], data[at + 4 :]
    assert second & 0x80 and first & 0x80 and len(payload) == n
    return first & 0x0F, bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def server_frame(opcode, payload):
    n = len(payload)
    if n < 126:
        return struct.pack("!BB", 0x80 | opcode, n) + payload
    if n < 1 << 16:
        return struct.pack("!BBH", 0x80 | opcode, 126, n) + payload
    return struct.pack("!BBQ", 0x80 | opcode, 127, n) + payload


class ScriptedServer:
    """A one-connection WebSocket server on a thread: it answers the handshake, sends `stream` in one
    write and keeps what the client sends back."""

    def __init__(self, stream):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"ws://127.0.0.1:{self.listener.getsockname()[1]}/x"
        self.stream, self.received = stream, b""
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            lines = request.split(b"\r\n")
            key = next(line.split(b":")[1].strip() for line in lines if line.lower().startswith(b"sec-websocket-key"))
            accept = base64.b64encode(hashlib.sha1(key + wsclient.GUID).digest())
            conn.sendall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: %s\r\n\r\n" % accept
            )
            conn.sendall(self.stream)
            try:
                while chunk := conn.recv(65536):
                    self.received += chunk
            except ConnectionResetError:  # the client closed with frames unread (a failed round)
                pass

    def join(self):
        self.thread.join(RECV_TIMEOUT_S)
        self.listener.close()


def test_the_reader_parses_frames_across_reads_wraps_its_buffer_and_answers_pings():
    """Text frames that straddle the end of a 300-byte buffer (what is left is moved to the front), binary
    frames of each length encoding larger than the buffer (read and dropped), a ping in between."""
    texts = [json.dumps({"type": "t", "k": k, "pad": "x" * (150 + 7 * k)}).encode() for k in range(6)]
    frames = [
        (wsclient.TEXT, texts[0]),
        (wsclient.BINARY, b"\1" * 100),
        (wsclient.TEXT, texts[1]),
        (wsclient.PING, b"hi"),
        (wsclient.BINARY, b"\2" * 1000),
        (wsclient.TEXT, texts[2]),
        (wsclient.TEXT, texts[3]),
        (wsclient.BINARY, b"\3" * 70000),
        (wsclient.TEXT, texts[4]),
        (wsclient.TEXT, texts[5]),
        (wsclient.CLOSE, (1000).to_bytes(2, "big")),
    ]
    server = ScriptedServer(b"".join(server_frame(opcode, payload) for opcode, payload in frames))
    ws = wsclient.Connection(server.url, RECV_TIMEOUT_S, buffer_bytes=300)
    read = []
    for opcode, payload in ws.frames():
        read.append((opcode, payload))
        if opcode == wsclient.CLOSE:
            break
    ws.close()
    server.join()
    expected = [(op, len(data) if op == wsclient.BINARY else data) for op, data in frames if op != wsclient.PING]
    assert read == expected
    first = len(server_frame(wsclient.PONG, b"hi")) + 4  # the client's frames are masked: 4 bytes more
    assert unmask(server.received[:first]) == (wsclient.PONG, b"hi")
    assert unmask(server.received[first:]) == (wsclient.CLOSE, (1000).to_bytes(2, "big"))


def test_a_text_frame_larger_than_the_buffer_fails_the_round_by_name():
    server = ScriptedServer(server_frame(wsclient.TEXT, b"x" * 400))
    ws = wsclient.Connection(server.url, RECV_TIMEOUT_S, buffer_bytes=300)
    with pytest.raises(wsclient.ProtocolError, match="larger than the 300-byte buffer"):
        next(ws.frames())
    ws.close()
    server.join()


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536])
def test_client_frames_are_masked_and_sized_for_each_length_encoding(size):
    payload = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    assert unmask(wsclient.frame(wsclient.TEXT, payload)) == (wsclient.TEXT, payload)


def read_session(url, buffer_bytes):
    ws = wsclient.Connection(url, RECV_TIMEOUT_S, buffer_bytes)
    events, audio = [], 0
    try:
        ws.send_json({"type": "session.config", "session": {"stream_audio": True}})
        ws.send_json({"type": "input.text", "text": TEXT})
        ws.send_json({"type": "input.done"})
        for opcode, payload in ws.frames():
            if opcode == wsclient.BINARY:
                audio += payload
                events[-1]["counted"] = events[-1].get("counted", 0) + payload
            elif opcode == wsclient.CLOSE:
                return events, audio, int.from_bytes(payload[:2], "big")
            else:
                events.append(json.loads(payload))
    finally:
        ws.close()
    raise AssertionError("no close frame")


@pytest.mark.parametrize("buffer_bytes", [wsclient.BUFFER, 4096])
def test_it_counts_every_audio_byte_the_server_sends(server, buffer_bytes):
    """With a 4 KiB buffer every audio frame spans several reads: the counts must not change."""
    events, audio, code = read_session(server.ws_url, buffer_bytes)
    kinds = [event["type"] for event in events]
    assert kinds[0] == "session.configured" and kinds[-1] == "session.done", kinds
    starts = [event for event in events if event["type"] == "audio.start"]
    assert len(starts) == 3
    # Each audio.start event carries the frames that followed it; its audio.done says how many bytes they held.
    dones = [event for event in events if event["type"] == "audio.done"]
    assert [start["counted"] for start in starts] == [done["total_bytes"] for done in dones]
    assert audio == sum(done["total_bytes"] for done in dones) > 0
    assert code == 1000
