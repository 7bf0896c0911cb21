"""Independent decoders and signal measures for the audio-format tests (tests and bench may use them).

The product encodes with FFmpeg (through PyAV). To check it, its output is decoded with something
else wherever something else exists:

* WAV  -> the standard library's `wave` (and the header is read field by field);
* FLAC, MP3, Ogg Opus -> `soundfile` (libsndfile 1.2 with libFLAC, mpg123 and libopus bundled);
* G.711 mulaw / alaw -> the standard library's `audioop` (deprecated, still in Python 3.11);
* ADTS AAC -> PyAV, i.e. FFmpeg's own AAC decoder: there is no non-FFmpeg AAC decoder at hand
  (libsndfile has none). It is still a decode of the bytes as a client would do it, so it checks
  the container, rate, channel count and content, but not FFmpeg against itself.

Measures: tone frequency (spectral peak), SNR, largest sample-to-sample jump, fundamental frequency
(autocorrelation for one steady signal, a YIN-style per-frame track with its median for speech),
and the span of sound (first to last frame above a threshold).
"""

from __future__ import annotations

import io
import warnings
import wave
from dataclasses import dataclass

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop  # noqa: E402  (deprecated in 3.11, removed in 3.13; the independent G.711 codec)


@dataclass
class Decoded:
    samples: np.ndarray  # float32 mono in [-1, 1)
    rate: int
    channels: int
    detail: str  # container/codec as the decoder saw it


# -- raw -------------------------------------------------------------------------------------------


def pcm16_ints(data: bytes) -> np.ndarray:
    assert len(data) % 2 == 0, f"pcm length {len(data)} is odd"
    return np.frombuffer(data, dtype="<i2")


def ints_to_float(ints: np.ndarray) -> np.ndarray:
    return ints.astype(np.float32) / 32768.0


def g711_ints(fmt: str, data: bytes) -> np.ndarray:
    """G.711 bytes (one a sample) -> int16 samples, decoded by audioop."""
    decode = {"mulaw": audioop.ulaw2lin, "alaw": audioop.alaw2lin}[fmt]
    return np.frombuffer(decode(bytes(data), 2), dtype="<i2")


def decode_raw(fmt: str, data: bytes, rate: int) -> Decoded:
    ints = pcm16_ints(data) if fmt == "pcm" else g711_ints(fmt, data)
    return Decoded(ints_to_float(ints), rate, 1, fmt)


# -- files -----------------------------------------------------------------------------------------


def wav_ints(data: bytes) -> tuple[np.ndarray, int, int, int]:
    """(int16 samples, rate, channels, sample width) of a RIFF WAV, read by the stdlib `wave`."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", f"not RIFF/WAVE: {data[:12]!r}"
    with wave.open(io.BytesIO(data), "rb") as wav:
        rate, channels, width = wav.getframerate(), wav.getnchannels(), wav.getsampwidth()
        assert wav.getcomptype() == "NONE"
        frames = wav.readframes(wav.getnframes())
    assert width == 2, f"sample width {width}"
    return np.frombuffer(frames, dtype="<i2"), rate, channels, width


def _soundfile(data: bytes, expect_format: str, expect_subtype: str | None, dtype: str):
    import soundfile

    info = soundfile.info(io.BytesIO(data))
    assert info.format == expect_format, f"container {info.format} != {expect_format}"
    if expect_subtype is not None:
        assert info.subtype == expect_subtype, f"codec {info.subtype} != {expect_subtype}"
    samples, rate = soundfile.read(io.BytesIO(data), dtype=dtype, always_2d=True)
    return samples, rate, info


def flac_ints(data: bytes) -> tuple[np.ndarray, int, int]:
    assert data[:4] == b"fLaC", f"not native FLAC: {data[:4]!r}"
    samples, rate, info = _soundfile(data, "FLAC", "PCM_16", "int16")
    return samples[:, 0].copy(), rate, info.channels


def _adts_aac(data: bytes) -> Decoded:
    # No decoder outside FFmpeg reads ADTS AAC here (libsndfile has no AAC), so PyAV decodes it.
    import av

    assert data[:2] in (b"\xff\xf1", b"\xff\xf9"), f"no ADTS sync word: {data[:2]!r}"
    # ADTS header: profile (2 bits) then sampling-frequency index (4 bits) then channel config.
    channel_config = ((data[2] & 0x01) << 2) | (data[3] >> 6)
    with av.open(io.BytesIO(data), format="aac") as container:
        stream = container.streams.audio[0]
        codec = stream.codec_context
        rate, channels, name = codec.sample_rate, codec.layout.nb_channels, codec.name
        parts = [frame.to_ndarray() for frame in container.decode(stream)]
    assert channels == channel_config, f"layout {channels} channels, ADTS header says {channel_config}"
    # fltp: one row per channel
    samples = np.concatenate([p[0] for p in parts]).astype(np.float32) if parts else np.zeros(0, np.float32)
    return Decoded(samples, rate, channels, f"adts/{name}")


def decode_file(fmt: str, data: bytes) -> Decoded:
    """One complete file of `fmt` -> its first channel as float32, the rate and the channel count."""
    if fmt == "wav":
        ints, rate, channels, _ = wav_ints(data)
        return Decoded(ints_to_float(ints[::channels]), rate, channels, "RIFF/PCM_16")
    if fmt == "flac":
        ints, rate, channels = flac_ints(data)
        return Decoded(ints_to_float(ints), rate, channels, "FLAC/PCM_16")
    if fmt == "mp3":
        assert data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0), f"not MPEG audio: {data[:4]!r}"
        samples, rate, info = _soundfile(data, "MP3", "MPEG_LAYER_III", "float32")
        return Decoded(samples[:, 0].astype(np.float32), rate, info.channels, "MP3/MPEG_LAYER_III")
    if fmt == "opus":
        assert data[:4] == b"OggS" and b"OpusHead" in data[:64], f"not Ogg Opus: {data[:40]!r}"
        samples, rate, info = _soundfile(data, "OGG", "OPUS", "float32")
        return Decoded(samples[:, 0].astype(np.float32), rate, info.channels, "OGG/OPUS")
    if fmt == "aac":
        return _adts_aac(data)
    raise ValueError(f"not a file format: {fmt}")


def opus_head(data: bytes) -> dict:
    """Fields of the OpusHead packet (RFC 7845, section 5.1) of an Ogg Opus file."""
    at = data.index(b"OpusHead")
    head = data[at : at + 19]
    return {
        "channels": head[9],
        "pre_skip": int.from_bytes(head[10:12], "little"),
        "input_rate": int.from_bytes(head[12:16], "little"),
    }


# -- measures --------------------------------------------------------------------------------------


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    reference = np.asarray(reference, np.float64)
    noise = np.asarray(test, np.float64) - reference
    power = np.sum(np.square(noise))
    return float("inf") if power == 0 else float(10 * np.log10(np.sum(np.square(reference)) / power))


def tone_frequency(samples: np.ndarray, rate: int) -> float:
    """Frequency of the strongest spectral peak (Hann window, parabolic interpolation on log power)."""
    x = np.asarray(samples, np.float64)
    size = 1 << int(np.ceil(np.log2(max(x.size, 2))))
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size), n=4 * size)) + 1e-20
    k = int(np.argmax(spectrum[1:-1])) + 1
    a, b, c = np.log(spectrum[k - 1 : k + 2])
    offset = 0.5 * (a - c) / (a - 2 * b + c) if (a - 2 * b + c) != 0 else 0.0
    return (k + offset) * rate / (4 * size)


def best_lag(a: np.ndarray, b: np.ndarray, max_lag: int) -> tuple[int, float]:
    """The shift of `b` against `a` (b[i + lag] ~ a[i]) with the highest normalised correlation."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    best = (0, -2.0)
    for lag in range(0, max_lag + 1):
        n = min(a.size, b.size - lag)
        if n <= 0:
            break
        x, y = a[:n], b[lag : lag + n]
        denominator = np.sqrt(np.dot(x, x) * np.dot(y, y))
        score = float(np.dot(x, y) / denominator) if denominator else 0.0
        if score > best[1]:
            best = (lag, score)
    return best


def max_jump(samples: np.ndarray) -> float:
    """Largest sample-to-sample step: a click at a chunk join shows here."""
    return float(np.max(np.abs(np.diff(np.asarray(samples, np.float64))))) if samples.size > 1 else 0.0


def autocorr_f0(samples: np.ndarray, rate: int, fmin: float = 60.0, fmax: float = 500.0) -> float:
    """Fundamental frequency of a steady periodic signal: the first lag whose normalised
    autocorrelation comes within 10 % of the best one in [1/fmax, 1/fmin] (so the period, not a
    multiple of it), refined by parabolic interpolation."""
    x = np.asarray(samples, np.float64)
    x = x - x.mean()
    n = x.size
    spectrum = np.fft.rfft(x, n=2 * n)
    ac = np.fft.irfft(spectrum * np.conj(spectrum))[:n]
    ac = ac / (ac[0] or 1.0)
    ac = ac / (1 - np.arange(n) / n)  # unbias: longer lags have fewer terms
    lo, hi = max(2, int(rate / fmax)), min(n - 2, int(rate / fmin))
    window = ac[lo : hi + 1]
    peak = float(window.max())
    candidates = [
        i
        for i in range(1, window.size - 1)
        if window[i] >= window[i - 1] and window[i] >= window[i + 1] and window[i] >= 0.9 * peak
    ]
    i = (candidates[0] if candidates else int(np.argmax(window))) + lo
    a, b, c = ac[i - 1], ac[i], ac[i + 1]
    offset = 0.5 * (a - c) / (a - 2 * b + c) if (a - 2 * b + c) != 0 else 0.0
    return rate / (i + offset)


def f0_track(
    samples: np.ndarray,
    rate: int,
    fmin: float = 70.0,
    fmax: float = 400.0,
    frame_s: float = 0.040,
    hop_s: float = 0.010,
    threshold: float = 0.15,
) -> np.ndarray:
    """F0 of every voiced frame, YIN-style (cumulative mean normalised difference, absolute
    threshold, parabolic refinement). Frames quieter than 5 % of the loudest frame's RMS, or with no
    dip under `threshold`, are unvoiced and left out."""
    x = np.asarray(samples, np.float64)
    frame, hop = int(rate * frame_s), int(rate * hop_s)
    max_lag = int(rate / fmin) + 1
    min_lag = max(2, int(rate / fmax))
    if x.size < frame + max_lag:
        return np.zeros(0)
    starts = range(0, x.size - frame - max_lag, hop)
    energies = np.array([rms(x[s : s + frame]) for s in starts])
    gate = 0.05 * (energies.max() if energies.size else 0.0)
    out = []
    for s, energy in zip(starts, energies):
        if energy <= gate:
            continue
        w = x[s : s + frame]
        d = np.array([np.sum(np.square(w - x[s + tau : s + tau + frame])) for tau in range(max_lag + 1)])
        cumulative = np.cumsum(d[1:])
        cmnd = np.ones_like(d)
        cmnd[1:] = d[1:] * np.arange(1, d.size) / np.where(cumulative == 0, 1, cumulative)
        below = np.flatnonzero(cmnd[min_lag:max_lag] < threshold)
        if below.size == 0:
            continue
        tau = int(below[0]) + min_lag
        while tau + 1 < max_lag and cmnd[tau + 1] < cmnd[tau]:
            tau += 1
        a, b, c = cmnd[tau - 1], cmnd[tau], cmnd[tau + 1]
        offset = 0.5 * (a - c) / (a - 2 * b + c) if (a - 2 * b + c) != 0 else 0.0
        out.append(rate / (tau + offset))
    return np.array(out)


def median_f0(samples: np.ndarray, rate: int, **kwargs) -> float:
    track = f0_track(samples, rate, **kwargs)
    assert track.size >= 10, f"only {track.size} voiced frames: no pitch to measure"
    return float(np.median(track))


def sound_span(samples: np.ndarray, rate: int, relative_db: float = -30.0, frame_s: float = 0.010) -> tuple[float, float]:
    """(start, end) in seconds of the first and last 10 ms frame whose RMS is within
    `relative_db` of the loudest frame's: the speech, without leading/trailing near-silence."""
    x = np.asarray(samples, np.float64)
    frame = max(1, int(rate * frame_s))
    count = x.size // frame
    assert count > 0, "no audio"
    energies = np.sqrt(np.mean(np.square(x[: count * frame].reshape(count, frame)), axis=1))
    loud = np.flatnonzero(energies > energies.max() * 10 ** (relative_db / 20))
    return loud[0] * frame / rate, (loud[-1] + 1) * frame / rate


def sound_duration(samples: np.ndarray, rate: int, **kwargs) -> float:
    start, end = sound_span(samples, rate, **kwargs)
    return end - start


def harmonic(rate: int, seconds: float, f0: float = 150.0, harmonics: int = 6, amplitude: float = 0.5) -> np.ndarray:
    """A vowel-like steady tone: f0 and its harmonics at 1/k amplitude, peak below `amplitude`."""
    t = np.arange(int(rate * seconds)) / rate
    x = sum(np.sin(2 * np.pi * f0 * k * t + k) / k for k in range(1, harmonics + 1))
    return (amplitude * x / np.max(np.abs(x))).astype(np.float32)


def sine(rate: int, seconds: float, freq: float = 440.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(rate * seconds))) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def chunked(samples: np.ndarray, rng: np.random.Generator, low: int = 1, high: int = 4000):
    """Random-size consecutive pieces of `samples` (some tiny), covering it exactly."""
    at = 0
    while at < samples.size:
        size = int(rng.integers(low, high))
        yield samples[at : at + size]
        at += size
