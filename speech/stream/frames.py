"""How a segment's streamed audio is cut into binary frames.

A segment's first frame is short, so that playback starts at once; later frames hold FRAME_S, or
more, up to MAX_FRAME_S, while the connection sends that much at once (`Transport.send_room`: a
client that reads faster than the audio comes). Every frame costs the event loop and the client
(bench/RESULTS.md). Frames never outgrow the window, because on loopback a write larger than it may
wait seconds (speech/server/tcpwindow.py); a client that falls behind gets FRAME_S frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

FIRST_FRAME_S = 0.04  # a segment's first streamed frame: 40 ms
FRAME_S = 0.2  # later frames: fewer, larger writes
MAX_FRAME_S = 1.0  # later frames up to this while the connection sends that much at once


def first_frame_samples(rate: int) -> int:
    return max(1, int(rate * FIRST_FRAME_S))


def frame_sizes(total: int, width: int, rate: int, *, first: bool, room: Callable[[], int]) -> Iterator[int]:
    """Sizes in bytes of the frames that send `total` bytes of `width`-byte samples; `first`: they
    begin the segment. `room` is asked before each large frame, after the previous one was sent."""
    at = 0
    if first:
        at = min(total, first_frame_samples(rate) * width)
        yield at
    step = max(1, int(rate * FRAME_S)) * width
    largest = max(1, int(rate * MAX_FRAME_S)) * width
    while at < total:
        space = room() if total - at > step else 0  # else one FRAME_S frame holds the rest
        size = min(largest, space - space % width) if space > step else step
        size = min(size, total - at)
        at += size
        yield size
