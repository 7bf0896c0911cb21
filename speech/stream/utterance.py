"""What a context has said since it began or since its last cancel, and what of it was heard.

Each segment whose audio went out leaves a `Record`: its text, its words' times in the audio as
delivered (milliseconds from the segment's first sample, `audio.timestamps`), and how much audio
was sent. On a cancel, `Utterance.heard` walks the records with the milliseconds the listener
played (the client's figure, or real-time playback from the first frame) and splits the text at
the last word whose end was reached (docs/protocol.md, "What was heard").
"""

from __future__ import annotations

from dataclasses import dataclass

from .words import estimate

# Memory bound of one utterance's records: past this many characters the oldest records are
# forgotten (their audio still counts, their text is no longer reported).
MAX_RECORDED_CHARS = 262144
# Speaking rate assumed for a segment cut before its audio was complete when its engine gave no
# word times: the words are spread over at least the time its text takes to say.
CHARS_PER_S = 15.0


@dataclass(frozen=True)
class WordTime:
    """A word of a segment's text as `audio.timestamps` sends it: times in ms as delivered."""

    char_start: int
    char_end: int
    start_ms: int
    end_ms: int


@dataclass
class Record:
    text: str
    words: list[WordTime] | None  # None: the engine gave no times (estimated when needed)
    sent_ms: float  # audio of this segment sent to the client
    complete: bool  # all of its audio was sent

    def word_times(self) -> list[WordTime]:
        if self.words is not None:
            return self.words
        duration = self.sent_ms if self.complete else max(self.sent_ms, 1000 * len(self.text) / CHARS_PER_S)
        return [
            WordTime(w.char_start, w.char_end, int(w.start_s * 1000), int(w.end_s * 1000))
            for w in estimate(self.text, duration / 1000).words
        ]


class Utterance:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.sent_ms = 0.0  # audio of the whole utterance sent
        self.played_out_at = 0.0  # monotonic time a client playing its frames as they came has played them all
        self._forgotten_ms = 0.0
        self._chars = 0

    def sent(self, ms: float, played_out_at: float) -> None:
        """A frame of its audio went out; the session's listener will have played it by `played_out_at`."""
        self.sent_ms += ms
        self.played_out_at = played_out_at

    def played_estimate_ms(self, now: float) -> float:
        """Real-time playback from its first frame, waiting through pauses: all sent but what a
        listener playing each frame as it came would still have to play."""
        return max(0.0, self.sent_ms - 1000 * max(0.0, self.played_out_at - now))

    def add(self, record: Record) -> None:
        """A segment's audio is over (done, failed or cut)."""
        self.records.append(record)
        self._chars += len(record.text)
        while self._chars > MAX_RECORDED_CHARS and len(self.records) > 1:
            old = self.records.pop(0)
            self._chars -= len(old.text)
            self._forgotten_ms += old.sent_ms

    def heard(self, played_ms: float) -> tuple[str, list[str]]:
        """(spoken text, the unspoken rest of the recorded text in parts) for `played_ms` of this
        utterance's audio played."""
        spoken: list[str] = []
        unspoken: list[str] = []
        at = self._forgotten_ms
        for record in self.records:
            if unspoken:
                unspoken.append(record.text)
                continue
            words, cut = record.word_times(), 0
            for word in words:
                if at + word.end_ms > played_ms:
                    break
                cut = word.char_end
            if (words and cut == words[-1].char_end) or (record.complete and at + record.sent_ms <= played_ms):
                cut = len(record.text)  # every word heard: the closing punctuation with them
            spoken.append(record.text[:cut].strip())
            if cut < len(record.text):
                unspoken.append(record.text[cut:].strip())
            at += record.sent_ms
        return " ".join(part for part in spoken if part), [part for part in unspoken if part]
