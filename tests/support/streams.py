"""Checks of streamed mp3, opus and aac (speech/audio/streaming.py), for tests and benchmarks.

A streamed session's binary frames must each hold whole codec frames (Ogg pages for opus, numbered on
without a gap across the session), and together decode as one stream: with FFmpeg (PyAV), and for mp3
and opus also with libsndfile (mpg123, libopus), a decoder that is not the encoder's own library.
"""

from __future__ import annotations

import io
import struct

import av
import soundfile

CONTAINERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac"}


def decoded_samples(data, fmt):
    """Samples FFmpeg decodes from `data` as one stream (an error raises)."""
    with av.open(io.BytesIO(data), format=CONTAINERS[fmt]) as container:
        return sum(frame.samples for frame in container.decode(audio=0))


def decoded_by_libsndfile(data, fmt):
    """(samples, rate) libsndfile decodes from `data` (mp3, opus)."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def ogg_pages(frame):
    """The sequence number of each page of a binary frame, which must hold whole pages only."""
    numbers, at = [], 0
    while at < len(frame):
        assert frame[at : at + 4] == b"OggS"
        count = frame[at + 26]
        end = at + 27 + count + sum(frame[at + 27 : at + 27 + count])
        assert end <= len(frame), "a page cut across binary frames"
        numbers.append(struct.unpack_from("<I", frame, at + 18)[0])
        at = end
    return numbers


def assert_whole_frames(frames, fmt, first_page=0):
    """Each of `frames` (the binary frames, in order) holds whole codec frames; Ogg pages are numbered on
    from `first_page` without a gap, the header pages at the start of the stream."""
    if fmt == "opus":
        numbers = [n for frame in frames for n in ogg_pages(frame)]
        assert numbers == list(range(first_page, first_page + len(numbers)))
        if first_page == 0:
            assert frames[0].startswith(b"OggS") and b"OpusHead" in frames[0][:64]
        return
    if fmt == "aac":  # ADTS frames, each with its length in its header
        for frame in frames:
            at = 0
            while at < len(frame):
                assert frame[at] == 0xFF and frame[at + 1] & 0xF0 == 0xF0
                at += ((frame[at + 3] & 0x03) << 11) | (frame[at + 4] << 3) | (frame[at + 5] >> 5)
            assert at == len(frame)
        return
    for frame in frames:  # MPEG audio layer III frames, each as long as its header says
        at = 0
        while at < len(frame):
            at += mp3_frame_length(frame[at : at + 4])
        assert at == len(frame)


_MP3_KBPS = {
    True: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    False: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frame_length(header):
    """Bytes of the layer III frame whose 4-byte header this is (ISO/IEC 11172-3, 13818-3, MPEG 2.5)."""
    assert header[0] == 0xFF and header[1] & 0xE0 == 0xE0 and (header[1] >> 1) & 3 == 1, header.hex()
    version, bitrate, rate_index = (header[1] >> 3) & 3, header[2] >> 4, (header[2] >> 2) & 3
    mpeg1 = version == 3
    rate = _MP3_RATES[version][rate_index]
    return (144000 if mpeg1 else 72000) * _MP3_KBPS[mpeg1][bitrate] // rate + ((header[2] >> 1) & 1)
