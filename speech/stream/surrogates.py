"""Client text as valid Unicode: JSON may carry UTF-16 halves (\\ud83d) and a client may split a pair
across frames."""

from __future__ import annotations


class SurrogateJoiner:
    """A trailing high surrogate waits for the next frame, pairs are joined, and a lone half becomes
    U+FFFD, so engines and events only ever see valid text."""

    def __init__(self) -> None:
        self._high = ""

    def join(self, text: str) -> str:
        text, self._high = self._high + text, ""
        if text and "\ud800" <= text[-1] <= "\udbff":
            text, self._high = text[:-1], text[-1]
        if not text.isascii():
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return text
