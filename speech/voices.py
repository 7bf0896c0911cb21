"""Reference voices: checking an upload, storing it, and finding one for a session.

An upload is judged by what it decodes to, not by its name: FFmpeg (PyAV) opens it, the
container must be on the allow-list, it must hold audio of 1–30 s that is not silent, and a
file name or content type that claims another type is refused. The file is stored through
Django's storage API under a random name, and the row and the file appear together or not at all.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import wave
from dataclasses import dataclass

import av
import numpy as np
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction

from .audio.codecs import MEDIA_TYPES
from .control import signals as control, registry
from .models import Voice
from .stream.engine import ReferenceVoice

logger = logging.getLogger(__name__)

VOICE_REMOVED = "speech session terminated: its voice '{}' was removed"
MAX_UPLOAD_BYTES = 10 * 1024 * 1024
MIN_SECONDS, MAX_SECONDS = 1.0, 30.0
SILENCE_PEAK = 0.01  # -40 dBFS: quieter than this throughout is silence
TRUNCATION_SLACK_S = 0.1  # decoders may drop a frame or two of a whole file
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# FFmpeg demuxer name -> our container name
CONTAINERS = {"wav": "wav", "flac": "flac", "mp3": "mp3", "ogg": "ogg", "mov,mp4,m4a,3gp,3g2,mj2": "m4a", "matroska,webm": "webm"}
# What a client may claim (file name extension or content type), per container.
EXTENSIONS = {
    "wav": {"wav", "wave"},
    "flac": {"flac"},
    "mp3": {"mp3"},
    "ogg": {"ogg", "oga", "opus"},
    "m4a": {"m4a", "mp4", "aac"},
    "webm": {"webm", "weba", "mkv"},
}
# ... and the content types it may be sent as: its media type (codecs.MEDIA_TYPES) and these others.
CONTENT_TYPES = {
    container: {MEDIA_TYPES[container], *others}
    for container, others in {
        "wav": {"audio/x-wav", "audio/wave", "audio/vnd.wave"},
        "flac": {"audio/x-flac"},
        "mp3": {"audio/mp3"},
        "ogg": {"application/ogg", "audio/opus"},
        "m4a": {"audio/m4a", "audio/x-m4a", "audio/aac", "video/mp4"},
        "webm": {"video/webm"},
    }.items()
}
NEUTRAL_CONTENT_TYPES = {"", "application/octet-stream"}


class VoiceError(ValueError):
    """A refused upload; the message is for the client (HTTP 400, or a form error)."""

    def __init__(self, message, param="audio_sample"):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class AudioFacts:
    container: str
    sample_rate: int
    duration_s: float
    peak: float


def reserved_names():
    from hibari.voices import VOICES

    from .runtime import get_engine

    return {"default", *(v.lower() for v in VOICES), *(v.lower() for v in get_engine().capabilities.voices)}


def check_name(name):
    name = (name or "").strip()
    if not NAME_RE.fullmatch(name) or not re.search(r"[A-Za-z0-9]", name):
        raise VoiceError("name must be 1 to 64 letters, digits, '.', '_' or '-', with at least one letter or digit", "name")
    if name.lower() in reserved_names():
        raise VoiceError(f"name '{name}' is reserved", "name")
    return name


def inspect_audio(data):
    """AudioFacts of an upload's bytes; VoiceError when it is not acceptable audio."""
    try:
        with av.open(_Reader(data), "r") as container:
            kind = CONTAINERS.get(container.format.name)
            if kind is None:
                raise VoiceError(f"audio_sample must be one of: {', '.join(sorted(EXTENSIONS))}")
            if not container.streams.audio:
                raise VoiceError("audio_sample holds no audio")
            stream = container.streams.audio[0]
            rate = stream.codec_context.sample_rate or stream.rate
            declared = _declared_seconds(container, data, kind)
            samples, peak = 0, 0.0
            for frame in container.decode(stream):
                block = frame.to_ndarray()
                samples += frame.samples
                peak = max(peak, float(np.max(np.abs(_as_float(block)))) if block.size else 0.0)
                if samples > (MAX_SECONDS + 1) * rate:
                    break  # too long already: no need to decode the rest
    except VoiceError:
        raise
    except (av.FFmpegError, ValueError, IndexError, EOFError, OSError):
        raise VoiceError("audio_sample is not a readable audio file") from None
    if not rate or samples == 0:
        raise VoiceError("audio_sample holds no audio")
    duration = samples / rate
    if duration > MAX_SECONDS or (declared or 0) > MAX_SECONDS + TRUNCATION_SLACK_S:
        raise VoiceError(f"audio_sample must be 1 to 30 seconds long (it is {max(duration, declared or 0):.1f} s)")
    if declared and duration < declared - max(TRUNCATION_SLACK_S, 0.05 * declared):
        raise VoiceError(f"audio_sample is truncated: its header says {declared:.1f} s, it holds {duration:.1f} s")
    if not MIN_SECONDS <= duration <= MAX_SECONDS:
        raise VoiceError(f"audio_sample must be 1 to 30 seconds long (it is {duration:.1f} s)")
    if peak < SILENCE_PEAK:
        raise VoiceError("audio_sample is silent")
    return AudioFacts(kind, int(rate), round(duration, 3), peak)


def _declared_seconds(container, data, kind):
    """The length the file's header announces, or None. FFmpeg caps a WAV's data size to the file
    it was given, so a cut WAV is measured from its RIFF header (stdlib `wave`)."""
    if kind == "wav":
        try:
            with wave.open(io.BytesIO(data)) as riff:
                return riff.getnframes() / riff.getframerate()
        except (wave.Error, EOFError, ZeroDivisionError):
            return None
    return container.duration / av.time_base if container.duration else None


def _as_float(block):
    if block.dtype.kind == "f":
        return block
    info = np.iinfo(block.dtype)
    return block.astype(np.float32) / max(abs(info.min), info.max)


class _Reader:
    """A read-only, seekable view for FFmpeg that never touches the file system."""

    def __init__(self, data):
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n=-1):
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        chunk = self._view[self._pos : end].tobytes()
        self._pos = end
        return chunk

    def seek(self, offset, whence=0):
        base = {0: 0, 1: self._pos, 2: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self):
        return self._pos


def check_claims(facts, filename, content_type):
    """A file name or content type that names another type than the content is a lie: refused."""
    ext = filename.rsplit(".", 1)[-1].lower() if filename and "." in filename else ""
    if ext and ext not in EXTENSIONS[facts.container]:
        raise VoiceError(f"audio_sample is {facts.container} audio but its name says .{ext}")
    ctype = (content_type or "").split(";")[0].strip().lower()
    if ctype not in NEUTRAL_CONTENT_TYPES and ctype not in CONTENT_TYPES[facts.container]:
        raise VoiceError(f"audio_sample is {facts.container} audio but was sent as {ctype}")


def create_voice(*, name, consent, data, filename="", content_type="", transcript="", language="", created_by="", owner=None):
    """Check everything, then store the file and the row together. Returns the Voice."""
    name = check_name(name)
    if not (consent or "").strip():
        raise VoiceError("consent must be a non-empty string", "consent")
    if len(data) > MAX_UPLOAD_BYTES:
        raise VoiceError("audio_sample is larger than 10 MiB")
    facts = inspect_audio(data)
    check_claims(facts, filename, content_type)
    voice = Voice(
        name=name,
        consent=consent.strip(),
        transcript=(transcript or "").strip(),
        language=language or "",
        container=facts.container,
        sample_rate=facts.sample_rate,
        duration_s=facts.duration_s,
        sha256=hashlib.sha256(data).hexdigest(),
        created_by=created_by,
        owner=owner,
    )
    if Voice.objects.filter(name__iexact=name).exists():
        raise VoiceError(f"a voice named '{name}' exists already", "name")
    voice.audio.save("", ContentFile(data), save=False)
    try:
        with transaction.atomic():
            voice.save()
    except IntegrityError:
        voice.audio.delete(save=False)
        raise VoiceError(f"a voice named '{name}' exists already", "name") from None
    except BaseException:
        voice.audio.delete(save=False)
        raise
    return voice


def delete_voice(voice):
    """Row first, then the file once the row is gone for good; sessions using it are ended."""
    storage, path, name = voice.audio.storage, voice.audio.name, voice.name
    voice.delete()
    transaction.on_commit(lambda: storage.delete(path))
    transaction.on_commit(lambda: end_sessions_using(name))


def deactivate_voices(queryset):
    """Make voices unusable for new sessions and end the sessions using them."""
    names = list(queryset.filter(is_active=True).values_list("name", flat=True))
    queryset.update(is_active=False)
    for name in names:
        transaction.on_commit(lambda name=name: end_sessions_using(name))
    return len(names)


def end_sessions_using(name):
    """Terminate every live session (on any instance) that speaks with this voice."""
    for session_id in registry.sessions_using_voice(name):
        try:
            control.send_sync(control.TERMINATE, session_id, VOICE_REMOVED.format(name))
        except control.SignalsUnavailable:
            logger.warning("could not end session %s: signals are unavailable", session_id)


def find_voice(name):
    """The active uploaded voice with this name (ignoring case) and its audio, or None."""
    name = name.strip()
    if not NAME_RE.fullmatch(name):  # no stored voice has such a name; don't even ask the database
        return None
    voice = Voice.objects.filter(name__iexact=name, is_active=True).first()
    if voice is None:
        return None
    with voice.audio.open("rb") as audio:
        data = audio.read()
    return ReferenceVoice(voice.name, data, voice.container, voice.transcript, voice.language)
