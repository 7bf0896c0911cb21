"""Streamed mp3, opus and aac: one encoder object per session, whose output over the whole session is
one stream (docs/protocol.md, streamed compressed audio).

`SessionEncoder.encode` turns a segment's samples into whole codec frames (MP3 frames, ADTS frames, Ogg
pages of Opus packets) as they are made; `end_segment` gives the segment's tail, so that all of its
audio is out before its `audio.done`; `cut` forgets an unfinished segment after a cancel.

Each segment is coded by a fresh FFmpeg encoder (PyAV), so a segment's tail can be flushed without
waiting for the next segment's audio, and a cut segment leaves nothing behind in an encoder. An encoder
begins with `priming` samples of its own (LAME's delay, Opus' pre-skip, AAC's priming frame); the
segment is preceded by just enough zeros that priming and zeros fill whole codec frames, and those
frames are not sent: the segment's first frame starts with its first sample. Its last frame is
completed with zeros, and frames holding only those zeros are not sent either. So a segment decodes
to its own samples followed by less than one codec frame of silence (where the segment already ends
in its natural pause, speech/audio/signal.py), and the decoder's state runs on from one segment into
the next. MP3 is coded without LAME's bit reservoir, so that no frame needs bytes of a frame that was
not sent (the zeros' frames, or a cancelled segment's). Settings and their cost: docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
import zlib
from fractions import Fraction

import av
import numpy as np

from .codecs import EncodingError, encoding_threads
from .signal import pcm16

# format -> (FFmpeg encoder, options, bit rate); docs/decisions.md says why.
ENCODERS = {
    "mp3": ("libmp3lame", {"compression_level": "7", "reservoir": "0"}, None),
    "opus": ("libopus", {"application": "voip", "compression_level": "0"}, 32000),
    "aac": ("aac", {"aac_coder": "fast"}, None),
}
# Sample formats fed as they are: LAME's s16p spares a conversion to s32p, for the same bytes out
# (docs/decisions.md#lossy-encoding-against-issue-43s-15--target-off-the-synthesis-cores-2026-12-06).
SHORT_FORMATS = ("s16", "s16p")
_priming: dict[tuple[str, int], tuple[int, int]] = {}  # (format, rate) -> (frame size, priming samples)


class StreamedAudio:
    """A SessionEncoder driven by a session's delivery on the event loop. A segment's audio is encoded
    `first_s` at a time in the loop until its first bytes come (a few codec frames: under a
    millisecond or two), then `later_s` at a time on an encoding thread, picked by how much audio the
    listener has still to play (codecs.py); and what it handed out is known to have been sent or not, so
    that `cut` keeps an Ogg stream numbered on from the last page the client got."""

    def __init__(self, fmt, rate, first_s, later_s):
        self.encoder = SessionEncoder(fmt, rate)
        self.rate, self.first_s, self.later_s = rate, first_s, later_s
        self._opening = True  # the segment has handed out nothing yet
        self._fed_s = 0.0  # seconds of audio fed and not yet in bytes handed out
        self._working: asyncio.Future[list[tuple[int, bytes]]] | None = None  # packets, from an encoding thread
        self._unsent = False  # the last bytes handed out have not been `sent` yet
        self._played_out = 0.0  # time.monotonic() when the listener will have played what was handed out

    async def frames(self, samples):
        """(bytes, seconds of audio they complete) for a chunk of the segment, whole codec frames each."""
        at = 0
        while at < samples.size:
            piece = samples[at : at + int(self.rate * (self.first_s if self._opening else self.later_s))]
            at += piece.size
            self._fed_s += piece.size / self.rate
            if self._opening:
                data = self._handed(self.encoder.encode(piece))
            else:
                data = self._handed(self.encoder.wrap(await self._off_loop(self.encoder.code, piece)))
            if data:
                yield data, self._seconds()

    async def end_segment(self):
        """(bytes, seconds) of the segment's tail, or None; the next `frames` begins a new segment."""
        data = self._handed(self.encoder.wrap(await self._off_loop(self.encoder.finish)))
        self._opening = True
        return (data, self._seconds()) if data else None

    def sent(self):
        """The bytes last handed out are with the transport."""
        self._unsent = False

    async def cut(self):
        """After a cancel: the unfinished segment is forgotten at once. An encoder call still under way
        (on a spare thread it may wait long for a core) is left to end with its encoder, whose packets
        nobody wraps; a successor goes on with the stream."""
        working, self._working = self._working, None
        if working is not None and not working.done():  # asyncio.shield retrieves its failure, if any
            self.encoder = self.encoder.successor(lost=self._unsent)
        else:
            self.encoder.cut(lost=self._unsent)
        self._unsent, self._opening, self._fed_s = False, True, 0.0
        self._played_out = 0.0  # the client drops what it had not played of the cut segment

    async def _off_loop(self, method, *args):
        threads = encoding_threads(self._played_out - time.monotonic())
        self._working = asyncio.get_running_loop().run_in_executor(threads, method, *args)
        # Shielded: a cancelled delivery leaves the encoder's call to end, and `cut` sees it under way.
        packets = await asyncio.shield(self._working)
        self._working = None
        return packets

    def _handed(self, data):
        self._unsent = bool(data)
        if data:
            self._opening = False
        return data

    def _seconds(self):
        seconds, self._fed_s = self._fed_s, 0.0
        self._played_out = max(self._played_out, time.monotonic()) + seconds
        return seconds


class SessionEncoder:
    """The session's streamed audio of one compressed format at `rate`. `code` and `finish` touch nothing
    that a `successor` shares (another thread may run them); `wrap` makes their packets bytes of the
    stream, numbering Ogg pages on."""

    def __init__(self, fmt, rate, ogg=None):
        self.fmt, self.rate = fmt, rate
        self.frame_size, self.priming = _measure(fmt, rate)
        self._ogg = (ogg or OggOpusPages()) if fmt == "opus" else None
        self._codec = None  # the current segment's encoder, from its first samples
        # The next segment's encoder, opened ahead (LAME's open takes about half a millisecond): after a
        # segment's tail, on the encoding thread, not on the way to the next segment's first frame.
        self._ready = _open(fmt, rate)
        self._lead = 0  # zeros fed before the segment's first sample
        self._fed = 0  # samples fed to the current encoder, zeros included
        self._pending = np.zeros(0, np.int16)  # fed samples not yet a whole codec frame

    def encode(self, samples):
        """Whole frames (pages) of `samples`, float32 mono at the session's rate; b"" while the encoder
        still gathers a frame."""
        return self.wrap(self.code(samples))

    def end_segment(self):
        """The segment's last frames, its tail completed with zeros; the next `encode` starts a new segment."""
        return self.wrap(self.finish())

    def code(self, samples):
        """The codec packets of `samples`, as `encode`."""
        if self._codec is None:
            self._codec, self._ready = self._ready or _open(self.fmt, self.rate), None
            self._lead = (self.frame_size - self.priming % self.frame_size) % self.frame_size
            self._fed = 0
            self._pending = np.zeros(self._lead, np.int16)
        pending = np.concatenate([self._pending, np.frombuffer(pcm16(samples), "<i2")])
        whole = pending.size - pending.size % self.frame_size
        self._pending = pending[whole:]
        return self._frames(pending[:whole])

    def finish(self):
        """The codec packets of the segment's end, as `end_segment`."""
        if self._codec is None:
            return []
        end = self._fed + self._pending.size  # where the segment's samples end, in the encoder's count
        tail = np.zeros(-self._pending.size % self.frame_size, np.int16)
        packets = self._frames(np.concatenate([self._pending, tail]), flush=True)
        self._codec, self._pending = None, np.zeros(0, np.int16)
        self._ready = self._ready or _open(self.fmt, self.rate)
        return [packet for packet in packets if packet[0] < end]

    def cut(self, lost):
        """After a cancel: the unfinished segment is forgotten (nothing of it is sent later). `lost`: the
        last bytes `encode` or `end_segment` returned never reached the client (an Ogg stream then
        numbers its next page as if they had not been made)."""
        self._codec, self._pending = None, np.zeros(0, np.int16)
        self._ready = self._ready or _open(self.fmt, self.rate)
        if lost and self._ogg is not None:
            self._ogg.rewind()

    def successor(self, lost):
        """After a cancel while this encoder is still busy with the cut segment (on another thread): a
        new one that goes on with the stream, its Ogg pages numbered on as `cut` would."""
        if lost and self._ogg is not None:
            self._ogg.rewind()
        return SessionEncoder(self.fmt, self.rate, self._ogg)

    def _frames(self, samples, flush=False):
        """(pts, bytes) of each codec packet out of the encoder for `samples` (whole frames), keeping
        those that hold some of the segment: the ones of the priming and the lead zeros are left out."""
        packets = []
        try:
            for start in range(0, samples.size, self.frame_size):
                packets += self._codec.encode(_frame(self._codec, samples[start : start + self.frame_size], self._fed))
                self._fed += self.frame_size
            if flush:
                packets += self._codec.encode(None)
        except av.FFmpegError as exc:
            raise EncodingError(f"{self.fmt} encoder failed: {exc}") from exc
        return [(packet.pts, bytes(packet)) for packet in packets if packet.pts >= self._lead]

    def wrap(self, packets):
        """The bytes of packets from `code` or `finish`, in order: whole frames, or Ogg pages numbered on."""
        if self.fmt == "aac":  # FFmpeg's AAC encoder gives raw frames: each gets its ADTS header
            return b"".join(adts_header(len(data), self.rate) + data for _, data in packets)
        if self._ogg is None:
            return b"".join(data for _, data in packets)
        return self._ogg.pages([data for _, data in packets], self.frame_size)


def _frame(codec, samples, pts):
    """A frame of `samples` (int16) in the encoder's own sample format: s16 or s16p as they are (mono:
    the same bytes), else float (AAC)."""
    fmt = codec.format.name
    data = samples if fmt in SHORT_FORMATS else samples.astype(np.float32) / 32768.0
    frame = av.AudioFrame.from_ndarray(data[None], format=fmt, layout="mono")
    frame.sample_rate, frame.pts, frame.time_base = codec.sample_rate, pts, Fraction(1, codec.sample_rate)
    return frame


def _open(fmt, rate):
    name, options, bit_rate = ENCODERS[fmt]
    codec = av.CodecContext.create(name, "w")
    codec.sample_rate, codec.layout, codec.time_base = rate, "mono", Fraction(1, rate)
    formats = [f.name for f in codec.codec.audio_formats]
    codec.format = next((f for f in SHORT_FORMATS if f in formats), formats[0])
    if bit_rate:
        codec.bit_rate = bit_rate
    codec.options = dict(options)
    codec.open()
    return codec


def _measure(fmt, rate):
    """(frame size, priming) of the format's encoder at `rate`, from a throwaway encoder's first packet."""
    key = (fmt, rate)
    if key not in _priming:
        codec = _open(fmt, rate)
        size = codec.frame_size
        packets = [*codec.encode(_frame(codec, np.zeros(size, np.int16), 0)), *codec.encode(None)]
        _priming[key] = size, -packets[0].pts
    return _priming[key]


class OggOpusPages:
    """One Ogg logical stream of Opus packets (RFC 7845): its two header pages first, then a page for
    each batch of packets, numbered on. Pre-skip is 0: SessionEncoder sends no priming."""

    MAX_SEGMENTS = 255

    def __init__(self):
        self.serial = random.getrandbits(32)
        self.sequence = 0
        self.granule = 0
        self._before = (0, 0)  # sequence and granule before the last pages made
        head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 0, 48000, 0, 0)
        vendor = b"speech"
        tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)
        self._headers = self._page([head], 0x02, granule=0) + self._page([tags], 0, granule=0)

    def pages(self, packets, samples_per_packet):
        """The packets as pages (none: b""), the header pages before the first."""
        if not packets:
            return b""  # the header pages wait for the first audio
        self._before = (self.sequence, self.granule)
        out, batch = [self._headers], []
        for packet in packets:
            if sum(len(p) // 255 + 1 for p in batch) + len(packet) // 255 + 1 > self.MAX_SEGMENTS:
                out.append(self._page(batch, 0, self.granule))
                batch = []
            batch.append(packet)
            self.granule += samples_per_packet  # Opus' granule counts 48 kHz samples: its only rate here
        out.append(self._page(batch, 0, self.granule))
        self._headers = b""
        return b"".join(out)

    def rewind(self):
        self.sequence, self.granule = self._before

    def _page(self, packets, flags, granule):
        lacing = b"".join(bytes([255] * (len(p) // 255) + [len(p) % 255]) for p in packets)
        header = b"OggS" + struct.pack("<BBqIIIB", 0, flags, granule, self.serial, self.sequence, 0, len(lacing))
        self.sequence += 1
        page = header + lacing + b"".join(packets)
        return page[:22] + struct.pack("<I", ogg_crc(page)) + page[26:]


ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)


def adts_header(size, rate):
    """The 7-byte ADTS header (ISO/IEC 13818-7, no CRC) of an AAC-LC mono frame of `size` bytes."""
    length = size + 7
    index = ADTS_RATES.index(rate)
    return bytes(
        [0xFF, 0xF1, (1 << 6) | (index << 2), (1 << 6) | (length >> 11), (length >> 3) & 0xFF, ((length & 0x7) << 5) | 0x1F, 0xFC]
    )


_REVERSED = bytes(int(f"{b:08b}"[::-1], 2) for b in range(256))


def ogg_crc(data):
    """Ogg's CRC-32 (polynomial 0x04c11db7, not reflected, initial value and final xor 0), by zlib's
    reflected CRC-32 on bit-reversed bytes."""
    reflected = zlib.crc32(data.translate(_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)
