"""How many bytes a TCP connection sends at once: its peer's window, less what is already on its way.

A write of at most that many bytes leaves the socket at once and whole. A write of more may leave a
piece behind that waits for the window to open, and on loopback it can wait long: Linux bounds its
segment size to half the largest window the peer ever offered and sends a piece only when a whole
segment fits the window (sender-side silly-window avoidance). A client with a small receive buffer
that falls behind keeps its window below that segment size, and the piece then waits for the
zero-window probes, 0.2 s, 0.4 s, 0.8 s... (seen with 1 s frames and a 16 KiB client in
bench/cancel.py: held sessions stuck for seconds). speech/stream/pipeline.py makes a frame larger
than its usual 200 ms only when this many bytes go out at once.

Read from the kernel's `struct tcp_info` (linux/include/uapi/linux/tcp.h), whose layout only grows:
`tcpi_snd_wnd` (Linux 5.4+) is the window, bytes sent less retransmitted less acknowledged are in
flight, and `tcpi_notsent_bytes` wait in the socket. Elsewhere (another OS, an older kernel) the
room is unknown: 0. `writes_through` says whether Twisted's transport holds bytes of its own in front
of the socket (speech/server/websocket.py writes straight to the socket only when it does not).
"""

import socket
import struct

# Byte offsets in struct tcp_info (linux/include/uapi/linux/tcp.h)
_BYTES_ACKED = struct.Struct("=Q"), 120  # tcpi_bytes_acked
_NOTSENT = struct.Struct("=I"), 144  # tcpi_notsent_bytes
_SENT_RETRANS = struct.Struct("=QQ"), 200  # tcpi_bytes_sent, tcpi_bytes_retrans
_SND_WND = struct.Struct("=I"), 228  # tcpi_snd_wnd
_INFO_BYTES = 232  # up to and including tcpi_snd_wnd

# Kept back from the room for what wraps the payload (a WebSocket frame's header: up to 14 bytes) and
# for a text frame that may go out right after it (an audio.done).
FRAMING_BYTES = 512

_TCP_INFO = getattr(socket, "TCP_INFO", None)


def writes_through(tcp):
    """A Twisted TCP transport is open and holds nothing to send: a write goes straight to its socket."""
    return tcp.connected and not tcp.disconnecting and not tcp._tempDataLen and len(tcp.dataBuffer) <= tcp.offset


def send_room(sock):
    """Payload bytes that `sock` (a connected TCP socket) sends at once, whole: its peer's window less
    the bytes in flight and waiting in the socket, less FRAMING_BYTES. 0 when nothing is known."""
    if _TCP_INFO is None:
        return 0
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _INFO_BYTES)
    except OSError:  # closed, or not TCP
        return 0
    if len(info) < _INFO_BYTES:  # a kernel older than tcpi_snd_wnd
        return 0
    (acked,) = _read(info, _BYTES_ACKED)
    (notsent,) = _read(info, _NOTSENT)
    sent, retransmitted = _read(info, _SENT_RETRANS)
    (window,) = _read(info, _SND_WND)
    in_flight = sent - retransmitted - acked
    return max(0, window - in_flight - notsent - FRAMING_BYTES)


def _read(info, field):
    layout, offset = field
    return layout.unpack_from(info, offset)
