"""Audio helpers: trimming an engine's padding, loudness, and 16-bit PCM.

Engines make float32 mono arrays in [-1, 1]; everything here works on those, and `quantise` turns
them into the 16-bit samples every output format is made from.
"""

import numpy as np

GATE_FRAME_S = 0.010  # energy gate resolution
GATE_RELATIVE = 0.05  # a frame is "sound" when its peak exceeds 5 % of the chunk's peak (-26 dB)
PRE_ROLL_S = 0.020  # kept before the first sound so its attack is not cut
TAIL_KEEP_S = 0.250  # kept after the last sound: a natural pause between sentences
FADE_S = 0.004  # ramps at the cut points so a cut never clicks
TARGET_RMS = 0.10  # -20 dBFS over the sounding part
PEAK_CEILING = 0.89  # -1 dBFS


def loud_frames(samples, rate):
    """Indexes of the GATE_FRAME_S frames of `samples` (float) that hold sound: their peak is over
    GATE_RELATIVE of the whole's peak. None of silence."""
    magnitude = np.abs(samples)
    peak = float(magnitude.max()) if samples.size else 0.0
    if peak < 1e-4:
        return np.zeros(0, np.int64)
    frame = max(1, int(rate * GATE_FRAME_S))
    padded = np.zeros(-(-samples.size // frame) * frame, dtype=magnitude.dtype)
    padded[: samples.size] = magnitude
    return np.flatnonzero(padded.reshape(-1, frame).max(axis=1) > peak * GATE_RELATIVE)


def sound_bounds(samples, rate):
    """Sample index of the start of the first and the end of the last gate frame holding sound,
    or None for silence."""
    loud = loud_frames(samples, rate)
    if not loud.size:
        return None
    frame = max(1, int(rate * GATE_FRAME_S))
    return int(loud[0]) * frame, min(samples.size, (int(loud[-1]) + 1) * frame)


def trim_bounds(sound, size, rate):
    """The samples `trim_silence` keeps, `(start, end)`, of `size` samples whose sound lies at `sound`
    (`sound_bounds`): PRE_ROLL_S before it, TAIL_KEEP_S after it; `(0, 0)` for silence."""
    if sound is None:
        return 0, 0
    return max(0, sound[0] - int(rate * PRE_ROLL_S)), min(size, sound[1] + int(rate * TAIL_KEEP_S))


def trim_silence(samples, rate, bounds=None):
    """Cut leading near-silence to PRE_ROLL_S and trailing near-silence to TAIL_KEEP_S, with short fades;
    `bounds`: what `trim_bounds` says for these samples, when the caller has it already."""
    start, end = trim_bounds(sound_bounds(samples, rate), samples.size, rate) if bounds is None else bounds
    if start >= end:
        return samples[:0]
    out = np.array(samples[start:end], dtype=np.float32)
    fade = min(out.size // 2, int(rate * FADE_S))
    if fade:
        ramp = np.linspace(0.0, 1.0, fade, dtype=np.float32)
        if start > 0:
            out[:fade] *= ramp
        if end < samples.size:
            out[-fade:] *= ramp[::-1]
    return out


def loudness_gain(samples):
    """The gain `normalise` applies to `samples`: to TARGET_RMS (measured where there is sound), never
    past PEAK_CEILING; 1 for silence."""
    peak = float(np.max(np.abs(samples))) if samples.size else 0.0
    if peak < 1e-4:
        return 1.0
    sounding = samples[np.abs(samples) > peak * GATE_RELATIVE]
    rms = float(np.sqrt(np.mean(np.square(sounding, dtype=np.float64))))
    return min(TARGET_RMS / rms, PEAK_CEILING / peak)


def normalise(samples, gain=None):
    """Scale to TARGET_RMS (measured where there is sound), never past PEAK_CEILING; or by `gain`, the
    one chosen for the audio before these samples (a segment sent in pieces)."""
    gain = loudness_gain(samples) if gain is None else gain
    if gain == 1.0:
        return samples
    return (samples * np.float32(gain)).astype(np.float32, copy=False)


def quantise(samples):
    """16-bit samples (int16, little-endian), FFmpeg's convention: rounded x * 32768, saturated. The
    inverse of reading s16 as n / 32768, so 16-bit audio passes through (an upstream engine's PCM,
    say) bit for bit. Samples that are 16-bit already are returned as they are."""
    if samples.dtype == np.int16:
        return samples
    scaled = samples * np.float32(32768.0)  # one new array, then rounded and saturated in place
    np.rint(scaled, out=scaled)
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype("<i2")


def pcm16(samples):
    """Signed 16-bit little-endian bytes of float32 or 16-bit samples (`quantise`)."""
    return quantise(samples).tobytes()


def from_pcm16(data, dtype="<i2"):
    """float32 samples from 16-bit PCM bytes (`dtype` ">i2" for big-endian): n / 32768, pcm16's inverse."""
    return np.frombuffer(data, dtype=dtype).astype(np.float32) / np.float32(32768.0)
