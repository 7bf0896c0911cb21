"""The audio encodings of the protocol (docs/protocol.md, Binary frames), on FFmpeg's encoders through PyAV.

Raw formats (`pcm`, `mulaw`, `alaw`) stream chunk by chunk: a `RawEncoder` turns each chunk into bytes on
its own (G.711 is one byte a sample, no state). Not streamed, every other format is one complete,
independently decodable file per segment (`encode_file`): RIFF WAV, native FLAC, MP3, Ogg Opus, ADTS
AAC; streamed, mp3, opus and aac are one stream a session (speech/audio/streaming.py).

Both are encoded off the event loop (but a streamed segment's first frame), on the threads that
`encoding_threads` picks: on the cores synthesis leaves free while the listener has audio enough to play,
beside synthesis when it would otherwise run dry
(docs/decisions.md#lossy-encoding-against-issue-43s-15--target-off-the-synthesis-cores-2026-12-06).
"""

from __future__ import annotations

import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import av
import numpy as np

from ..threads import LOWEST_NICE, SYNTHESIS_NICE, demote, synthesis_niceness
from .signal import pcm16

RAW_FORMATS = ("pcm", "mulaw", "alaw")
SAMPLE_BYTES = {"pcm": 2, "mulaw": 1, "alaw": 1}  # a raw format's bytes a sample: s16le, G.711
STREAMED_FORMATS = ("mp3", "opus", "aac")  # streamed as one stream a session (speech/audio/streaming.py)
STREAMABLE_FORMATS = RAW_FORMATS + STREAMED_FORMATS
# format -> (container, FFmpeg encoder, encoder options). Synthesis is so fast (docs/engines.md) that
# encoders dominate the cost: LAME's -q 7 and FFmpeg AAC's fast coder cut it, with no audible loss on
# speech (bench/audio_cost.py in bench/RESULTS.md).
FILE_FORMATS = {
    "wav": ("wav", "pcm_s16le", {}),
    "flac": ("flac", "flac", {}),
    "mp3": ("mp3", "libmp3lame", {"compression_level": "7"}),
    "opus": ("ogg", "libopus", {}),
    "aac": ("adts", "aac", {"aac_coder": "fast"}),
}
FORMATS = tuple(sorted(RAW_FORMATS + tuple(FILE_FORMATS)))
# The media type of each response_format (the REST response's Content-Type, the OpenAPI document) and
# of each container a reference voice may be uploaded in (speech/voices.py checks uploads against it;
# the admin serves them, the upstream engine sends them as data: URLs).
MEDIA_TYPES = {
    "pcm": "audio/pcm",
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",  # Ogg Opus
    "aac": "audio/aac",  # ADTS
    "mulaw": "audio/basic",
    "alaw": "audio/x-alaw-basic",
    "ogg": "audio/ogg",
    "m4a": "audio/mp4",
    "webm": "audio/webm",
}
OPUS_RATE = 48000  # Opus runs on a 48 kHz clock; decoders give 48 kHz whatever was put in
_G711 = {"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}


AHEAD_S = 1.0  # a listener with less audio than this still to play gets its audio encoded beside synthesis


def _placed(added):
    """An encoding thread's niceness: the process's plus `added` (on Linux each thread has its own)."""
    if hasattr(os, "setpriority"):
        demote(threading.get_native_id(), synthesis_niceness(added))


# FFmpeg's encoders release the GIL: the event loop goes on beside both pools. Spare threads, at the lowest
# niceness, get a core that synthesis wants hardly at all: synthesis goes first (bench/streamed.py's "beside"
# part). Not SCHED_IDLE: a spare thread holding the GIL there held up the loop longer (docs/decisions.md).
SPARE_THREADS = ThreadPoolExecutor(
    max_workers=os.cpu_count() or 1, thread_name_prefix="encode", initializer=_placed, initargs=(LOWEST_NICE,)
)
DUE_THREADS = ThreadPoolExecutor(
    max_workers=os.cpu_count() or 1, thread_name_prefix="encode-due", initializer=_placed, initargs=(SYNTHESIS_NICE,)
)


def encoding_threads(ahead_s):
    """Where to encode audio for a listener with `ahead_s` seconds of audio still to play: on the spare
    threads while it has AHEAD_S or more, else beside synthesis (spare threads could wait for a core until
    the listener ran dry)."""
    return SPARE_THREADS if ahead_s >= AHEAD_S else DUE_THREADS


class EncodingError(Exception):
    """An encoder refused a segment's audio."""


def output_rate(fmt, requested):
    """The rate a client really gets for this format and requested rate (what audio.start says)."""
    return OPUS_RATE if fmt == "opus" else requested


def _s16_frame(samples, rate):
    data = np.frombuffer(pcm16(samples), "<i2")
    frame = av.AudioFrame.from_ndarray(data[None, :], format="s16", layout="mono")
    frame.sample_rate = rate
    # A timestamp from 0: without it the Ogg muxer's granule positions run 312 samples long, and a
    # short Opus file (one page) decodes too long or is refused by strict decoders.
    frame.pts = 0
    frame.time_base = Fraction(1, rate)
    return frame


class RawEncoder:
    """Bytes of a raw stream, chunk by chunk: s16le for pcm, G.711 for mulaw/alaw."""

    def __init__(self, fmt, rate):
        if fmt not in RAW_FORMATS:
            raise ValueError(f"{fmt} is not a raw format")
        self.fmt = fmt
        self.rate = rate
        self._codec = None
        if fmt in _G711:
            self._codec = av.CodecContext.create(_G711[fmt], "w")
            self._codec.sample_rate = rate
            self._codec.layout = "mono"
            self._codec.format = "s16"

    def encode(self, samples):
        if self._codec is None:
            return pcm16(samples)
        if samples.size == 0:
            return b""
        try:
            return b"".join(bytes(packet) for packet in self._codec.encode(_s16_frame(samples, self.rate)))
        except av.FFmpegError as exc:
            raise EncodingError(f"{self.fmt} encoder failed: {exc}") from exc


def encode_file(fmt, samples, rate):
    """One complete file of `fmt` holding `samples` (float32 mono at `rate`)."""
    container_format, codec, options = FILE_FORMATS[fmt]
    buf = io.BytesIO()
    try:
        with av.open(buf, "w", format=container_format) as container:
            stream = container.add_stream(codec, rate=rate, layout="mono")
            stream.codec_context.options = dict(options)
            # The encoder's own sample format (s16, s32p, fltp…), converted by FFmpeg's resampler
            # at the same rate: a format change only.
            convert = av.AudioResampler(format=stream.codec_context.format, layout="mono", rate=rate)
            # Quantised to 16 bits first, as for pcm: every format carries the same samples.
            for frame in (*convert.resample(_s16_frame(samples, rate)), *convert.resample(None)):
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))
    except av.FFmpegError as exc:
        raise EncodingError(f"{fmt} encoder failed: {exc}") from exc
    return buf.getvalue()
