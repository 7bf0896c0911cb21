"""speech/server/tcpwindow.py on real loopback TCP connections: a write of `send_room()` bytes leaves the
socket whole and at once, even for a client with a small receive buffer that fell behind, the case where a
larger write waits for the kernel's zero-window probes. And Connection.send_room, what the pipeline
asks before each frame, on a real Twisted transport over such a connection."""

from __future__ import annotations

import socket
import struct
import sys
import time

import pytest
from twisted.internet.protocol import Protocol
from twisted.internet.tcp import Connection as TCPConnection
from twisted.internet.testing import MemoryReactor

from speech.server.connection import AsgiConnection, Connection
from speech.server.tcpwindow import FRAMING_BYTES, send_room

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="struct tcp_info is Linux's")

WAIT_S = 5.0  # a hang guard for conditions that loopback meets at once


def notsent(sock):
    """tcpi_notsent_bytes: bytes written that wait in the socket for the window (linux/tcp.h)."""
    return struct.unpack_from("=I", sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232), 144)[0]


def until(condition):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "loopback did not settle"
        time.sleep(0.001)


@pytest.fixture
def connection():
    """(server side, client side) of a loopback TCP connection whose client has a 16 KiB receive buffer,
    set before it connects, like bench/cancel.py's clients."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    server.setblocking(False)
    server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    yield server, client
    server.close()
    client.close()


def fill(server):
    """Write until the socket takes no more (the client is not reading)."""
    while True:
        try:
            server.send(b"\0" * 65536)
        except BlockingIOError:
            return


def read(client, n):
    got = 0
    while got < n:
        got += len(client.recv(n - got))


def test_a_write_of_the_room_leaves_at_once_on_a_fresh_connection(connection):
    server, client = connection
    room = send_room(server)
    assert room > 0
    assert server.send(b"\0" * room) == room
    assert notsent(server) == 0


def test_no_room_while_the_client_is_not_reading(connection):
    server, client = connection
    fill(server)
    assert notsent(server) > 0
    assert send_room(server) == 0


def test_after_a_stall_a_write_of_the_room_leaves_whole_and_a_larger_one_would_wait(connection):
    server, client = connection
    fill(server)
    # The client reads everything: the window opens again (its update arrives with the read, on loopback).
    while notsent(server):
        client.recv(1 << 20)
    client.setblocking(False)
    try:
        while client.recv(1 << 20):
            pass
    except BlockingIOError:
        pass
    until(lambda: send_room(server) > 0)
    room = send_room(server)
    assert server.send(b"\0" * room) == room
    assert notsent(server) == 0, "the room's worth left whole"
    # The same window, a write larger than it: part of it waits in the socket. This is what a frame
    # sized without the room risks, and on loopback the wait can last until a zero-window probe.
    client.setblocking(True)
    read(client, room)
    until(lambda: send_room(server) > 0)
    room = send_room(server)
    server.send(b"\0" * (room + FRAMING_BYTES + 16 * 1024))
    assert notsent(server) > 0


def test_no_room_is_reported_for_what_is_not_a_tcp_socket():
    ours, theirs = socket.socketpair()
    try:
        assert send_room(ours) == 0
    finally:
        ours.close()
        theirs.close()
    assert send_room(ours) == 0  # closed


class Upgraded:
    """What a Connection reads of daphne's protocol: its transport and the TCP transport under it."""

    def __init__(self, transport, tcp):
        self.transport, self.tcp = transport, tcp


@pytest.fixture
def transport(connection):
    server, client = connection
    tcp = TCPConnection(server, Protocol(), MemoryReactor())  # its reactor never runs: nothing is sent behind our back
    tcp.connected = True
    return tcp


def test_the_connection_reports_the_room_while_the_client_keeps_up(transport):
    connection = Connection(Upgraded(transport, transport))
    assert connection.send_room() == send_room(transport.socket) > 0


def test_the_connection_reports_no_room_while_held_or_while_twisted_holds_bytes(transport):
    connection = Connection(Upgraded(transport, transport))
    connection.flow.pauseProducing()
    assert connection.send_room() == 0
    connection.flow.resumeProducing()
    assert connection.send_room() > 0
    transport.write(b"queued by Twisted for the reactor's next turn")
    assert connection.send_room() == 0


def test_the_connection_reports_no_room_behind_tls(transport):
    tls = object()  # the TLS transport wrapping the TCP one writes records from its own buffer
    assert Connection(Upgraded(tls, transport)).send_room() == 0
    assert AsgiConnection(None).send_room() == 0  # daphne without this server's launcher, and tests
