"""An independent forced aligner for bench/timestamps.py: PocketSphinx (CMU's HMM recogniser, BSD; its
US English acoustic model ships inside the `pocketsphinx` wheel, requirements-bench.txt).

It is told what was said, so it only places the words: each word's pronunciation is Hibari's own
phonemes for it (the very ones the model spoke, `hibari_words.plan`), turned into the aligner's
ARPAbet, so no dictionary or spelling-to-sound guess stands between the text and the audio. Its frames
are 10 ms; between words it may put a silence. Its own error is measured by the bench on the same
control as Whisper's (words spoken one by one, starts known).
"""

from __future__ import annotations

import numpy as np

from tests.support.speech_check import resample_to_16k

RATE = 16000
FRAME_S = 0.01

# Hibari's phoneme characters (misaki's US set: "A" is eɪ, "I" aɪ, "W" aʊ, "Y" ɔɪ, "O" oʊ, "T" a flap)
# as ARPAbet; stress marks, length and pauses have no phone. "əɹ"/"ɜɹ" read as one ER.
ARPABET = {
    "ɑ": "AA", "ɒ": "AA", "æ": "AE", "ʌ": "AH", "ə": "AH", "ᵊ": "AH", "ɐ": "AH", "ɔ": "AO", "W": "AW",
    "I": "AY", "ɛ": "EH", "ɜ": "ER", "ɚ": "ER", "A": "EY", "ɪ": "IH", "ᵻ": "IH", "i": "IY", "O": "OW",
    "Q": "OW", "Y": "OY", "ʊ": "UH", "u": "UW", "b": "B", "ʧ": "CH", "d": "D", "ð": "DH", "f": "F",
    "ɡ": "G", "g": "G", "h": "HH", "ʤ": "JH", "k": "K", "l": "L", "m": "M", "n": "N", "ŋ": "NG",
    "p": "P", "ɹ": "R", "s": "S", "ʃ": "SH", "t": "T", "T": "T", "ɾ": "T", "ʔ": "T", "θ": "TH",
    "v": "V", "w": "W", "j": "Y", "z": "Z", "ʒ": "ZH",
}  # fmt: skip


def arpabet(phonemes: str) -> list[str]:
    """ARPAbet phones of a string of Hibari's phoneme characters."""
    phones, i = [], 0
    while i < len(phonemes):
        if phonemes[i] in "ɜə" and phonemes[i + 1 : i + 2] == "ɹ":
            phones.append("ER")
            i += 2
            continue
        if phonemes[i] in ARPABET:
            phones.append(ARPABET[phonemes[i]])
        i += 1
    return phones


def spoken_words(tts, text: str):
    """[(first word, last word, phones)] of `text` as Hibari speaks it: its words in order, each with the
    phones of the ids that speak it (several words spoken by one reading are one item; words nothing
    speaks are left out)."""
    from speech.engines.hibari_words import plan

    names = {index: char for char, index in tts.vocab.items()}
    out = []
    for part in plan(tts, text).parts:
        for lo, hi, spoken in part.entries:
            phones = [ph for a, b in spoken for ph in arpabet("".join(names[i] for i in part.ids[a:b]))]
            if phones:
                out.append((lo, hi, phones))
    return out


class Aligner:
    def __init__(self):
        from pocketsphinx import Decoder

        self.decoder = Decoder(samprate=RATE, loglevel="FATAL")

    def align(self, samples: np.ndarray, rate: int, items) -> list[tuple[float, float]] | None:
        """(start_s, end_s) of each of `items` (`spoken_words`) in `samples`, or None when the aligner
        finds no path through them."""
        names = []
        for _, _, phones in items:
            name = "w_" + "_".join(phones).lower()  # one dictionary entry per pronunciation
            if self.decoder.lookup_word(name) is None:
                self.decoder.add_word(name, " ".join(phones), True)
            names.append(name)
        self.decoder.set_align_text(" ".join(names))
        pcm = (np.clip(resample_to_16k(samples, rate), -1.0, 1.0) * 32767).astype("<i2").tobytes()
        self.decoder.start_utt()
        self.decoder.process_raw(pcm, full_utt=True)
        self.decoder.end_utt()
        found = [(s.start_frame * FRAME_S, (s.end_frame + 1) * FRAME_S) for s in self.decoder.seg() if s.word.startswith("w_")]
        return found if len(found) == len(names) else None
