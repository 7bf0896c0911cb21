"""Test uploads made in memory: real audio files of every allowed container, and bad ones.

    wav_bytes(seconds=2.0)                 # stdlib `wave`, 16-bit mono
    encode("mp3", seconds=2.0)             # PyAV, into a BytesIO (no file system)
    upload("alice.wav", wav_bytes())       # a SimpleUploadedFile for the test client / forms
    GOOD["ogg"]                            # a valid sample of each allowed container, with its facts

Nothing here touches the disk. The signals are sines at half scale (never silent) unless an
amplitude is given.
"""

from __future__ import annotations

import io
import struct
import wave
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np
from django.core.files.uploadedfile import SimpleUploadedFile


def tone(seconds, rate, *, amplitude=0.5, freq=440.0):
    """A mono float32 sine."""
    t = np.arange(int(round(seconds * rate)), dtype=np.float64) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def pcm16(samples):
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def wav_bytes(seconds=2.0, rate=16000, *, amplitude=0.5, freq=440.0):
    """A RIFF/WAVE file (16-bit mono) made with the standard library."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16(tone(seconds, rate, amplitude=amplitude, freq=freq)))
    return buf.getvalue()


def raw_pcm_bytes(seconds=2.0, rate=16000, *, amplitude=0.5):
    """Headerless signed 16-bit little-endian samples (what a `.pcm` file or a lazy client sends)."""
    return pcm16(tone(seconds, rate, amplitude=amplitude))


@dataclass(frozen=True)
class Recipe:
    format: str  # FFmpeg muxer
    codec: str
    rate: int
    sample_fmt: str
    frame_size: int | None = None  # fixed encoder frame size, else 1024


# container name used by speech.voices -> how to make one
RECIPES = {
    "wav": Recipe("wav", "pcm_s16le", 16000, "s16"),
    "flac": Recipe("flac", "flac", 22050, "s16"),
    "mp3": Recipe("mp3", "libmp3lame", 44100, "fltp"),
    "ogg": Recipe("ogg", "libopus", 48000, "s16"),
    "m4a": Recipe("ipod", "aac", 44100, "fltp"),
    "webm": Recipe("webm", "libopus", 48000, "s16"),
    # not allowed
    "aiff": Recipe("aiff", "pcm_s16be", 16000, "s16"),
    "au": Recipe("au", "pcm_s16be", 16000, "s16"),
    "caf": Recipe("caf", "pcm_s16le", 16000, "s16"),
}


def encode(kind, seconds=2.0, *, rate=None, amplitude=0.5, freq=440.0):
    """A file of container `kind` (a key of RECIPES) holding a mono sine, encoded by PyAV in memory."""
    recipe = RECIPES[kind]
    rate = rate or recipe.rate
    samples = tone(seconds, rate, amplitude=amplitude, freq=freq)
    buf = io.BytesIO()
    with av.open(buf, "w", format=recipe.format) as out:
        stream = out.add_stream(recipe.codec, rate=rate)
        stream.codec_context.layout = "mono"
        stream.codec_context.format = recipe.sample_fmt
        stream.codec_context.time_base = Fraction(1, rate)
        step = stream.codec_context.frame_size or 1024
        if recipe.codec.startswith("pcm_"):
            step = 1024
        pts = 0
        for start in range(0, len(samples), step):
            block = samples[start : start + step]
            if recipe.sample_fmt == "s16":
                frame = av.AudioFrame.from_ndarray(
                    (np.clip(block, -1, 1) * 32767).astype(np.int16)[None, :], format="s16", layout="mono"
                )
            else:
                frame = av.AudioFrame.from_ndarray(block[None, :], format="fltp", layout="mono")
            frame.sample_rate = rate
            frame.pts = pts
            frame.time_base = Fraction(1, rate)
            pts += len(block)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def sample(kind, seconds=2.0, **kwargs):
    """wav through the stdlib, everything else through PyAV."""
    if kind == "wav":
        return wav_bytes(seconds, **kwargs)
    return encode(kind, seconds, **kwargs)


# What a client may honestly call each container.
NAMES = {
    "wav": "voice.wav",
    "flac": "voice.flac",
    "mp3": "voice.mp3",
    "ogg": "voice.ogg",
    "m4a": "voice.m4a",
    "webm": "voice.webm",
}
CONTENT_TYPES = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "ogg": "audio/ogg",
    "m4a": "audio/mp4",
    "webm": "audio/webm",
}
RATES = {kind: (16000 if kind == "wav" else RECIPES[kind].rate) for kind in NAMES}
ALLOWED = tuple(NAMES)

_cache: dict = {}


def good(kind, seconds=2.0):
    """A cached valid sample of an allowed container (bytes)."""
    key = (kind, seconds)
    if key not in _cache:
        _cache[key] = sample(kind, seconds)
    return _cache[key]


def upload(name, data, content_type="application/octet-stream"):
    """A file as the test client or a bound form receives it."""
    return SimpleUploadedFile(name, data, content_type=content_type)


def good_upload(kind="wav", seconds=2.0, name=None):
    return upload(name or NAMES[kind], good(kind, seconds), CONTENT_TYPES[kind])


# -- bad content ------------------------------------------------------------------------------------


def silent(kind="wav", seconds=2.0):
    return sample(kind, seconds, amplitude=0.0)


def nearly_silent(kind="wav", seconds=2.0):
    """Peak at -46 dBFS: below the -40 dBFS silence threshold."""
    return sample(kind, seconds, amplitude=0.005)


def truncated(data, keep):
    return data[:keep]


TEXT = b"Hello, this is not audio at all. " * 200
PNG = (
    b"\x89PNG\r\n\x1a\n"
    + struct.pack(">I", 13)
    + b"IHDR"
    + struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    + b"\x90wS\xde"
    + b"\x00" * 64
)
JSON = b'{"name": "alice", "audio": "not really"}' * 50
ZEROS = b"\x00" * 50000


def random_bytes(n=50000, seed=1234):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def multipart(fields, files, boundary="----speechtestboundary"):
    """A multipart/form-data body by hand: (body, content type). files: name -> (filename, bytes, ctype)."""
    lines = []
    for key, value in fields.items():
        lines.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'.encode())
    for key, (filename, data, ctype) in files.items():
        lines.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"; filename="{filename}"\r\n'
            f"Content-Type: {ctype}\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    lines.append(f"--{boundary}--\r\n".encode())
    return b"".join(lines), f"multipart/form-data; boundary={boundary}"


def video_only(fmt="mp4", codec="mpeg4", seconds=2.0, fps=10):
    """A container of an allowed kind (mp4 or webm) that holds a video stream and no audio."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(int(seconds * fps)):
            image = np.full((48, 64, 3), (i * 10) % 256, dtype=np.uint8)
            frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format="yuv420p")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()
