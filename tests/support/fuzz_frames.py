"""Hostile client frames for the stress tier and bench/stress.py, and the contract's vocabulary to
judge the answers by (every `error` event and close code must be one the contract names).

`handshake_frames(rng)` yields first frames (each on a new connection: handshake errors are fatal);
`session_frames(rng)` yields frames sent after session.configured (errors there are recoverable).
A frame is (kind, data): kind "text" (a str), "binary" (bytes) or "raw_text" (bytes sent as a text
frame without UTF-8 validation: invalid UTF-8, which the WebSocket layer itself drops).
"""

from __future__ import annotations

import json
import re

from speech.stream.messages import SessionFields

CONFIG_FIELDS = tuple(SessionFields.model_fields)  # every session.config field, from the wire vocabulary
WRONG_VALUES = (
    [],
    {},
    "",
    "x",
    " PCM ",
    0,
    -1,
    1.5,
    -0.0,
    True,
    False,
    10**30,
    -(10**30),
    2**64,
    1e308,
    -1e308,
    "\u0000",
    "⑵",
    "\ud800",
    "a" * 5000,
    [[[]]],
    {"a": {"b": []}},
    4.0000001,
    0.2499,
    48000,
    7,
)
RAW_NUMBERS = ("1e400", "-1e400", "1" * 5000, "0." + "0" * 5000 + "1", "123456789012345678901234567890")
INVALID_UTF8 = (b"\xff", b'{"type":"input.text","text":"\xc3\x28"}', b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")


def _config(session, rng):
    if rng.random() < 0.5:
        return json.dumps({"type": "session.config", "session": session})
    return json.dumps({"type": "session.config", **session})


def nested(depth, opener="[", closer="]"):
    return opener * depth + closer * depth


def handshake_frames(rng):
    """An endless mix of bad (and a few good) first frames."""
    while True:
        roll = rng.random()
        if roll < 0.55:
            field = rng.choice(CONFIG_FIELDS)
            yield "text", _config({field: rng.choice(WRONG_VALUES)}, rng)
        elif roll < 0.65:
            field = rng.choice(CONFIG_FIELDS)
            number = rng.choice(RAW_NUMBERS)
            yield "text", '{"type":"session.config","session":{"%s":%s}}' % (field, number)
        elif roll < 0.72:
            depth = rng.choice((50, 1000, 100_000))
            yield "text", '{"type":"session.config","session":%s}' % nested(depth, *rng.choice((("[", "]"), ('{"a":', "}"))))
        elif roll < 0.80:
            yield (
                "text",
                rng.choice(
                    (
                        "{",
                        "",
                        "null",
                        "1",
                        '"s"',
                        "[]",
                        "NaN",
                        '{"type":NaN}',
                        '{"type":1}',
                        '{"type":"SESSION.CONFIG"}',
                        '{"type":"input.text","text":"hi"}',
                        '{"type":"session.config","session":[]}',
                        '{"type":"session.config","session":1}',
                        '{"type":"session.config"} trailing',
                        '\ufeff{"type":"session.config"}',
                    )
                ),
            )
        elif roll < 0.85:
            yield "binary", bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 1, 64, 4096))))
        elif roll < 0.90:
            yield "raw_text", rng.choice(INVALID_UTF8)
        else:
            yield (
                "text",
                _config({"voice": "default", "speed": rng.choice((0.25, 1, 4.0)), "seed": rng.choice((0, 2**64 - 1))}, rng),
            )


def session_frames(rng, *, max_message_bytes=131072):
    """An endless mix of frames for a configured session: wrong types, junk, protocol violations,
    oversized frames, and some real text (short, often cancelled, so the engine is busy but bounded)."""
    while True:
        roll = rng.random()
        if roll < 0.30:
            yield "text", json.dumps({"type": "input.text", "text": rng.choice(WRONG_VALUES[:16] + (None,))})
        elif roll < 0.40:
            yield (
                "text",
                json.dumps(
                    {
                        "type": rng.choice(
                            (
                                "session.config",
                                "input.unknown",
                                "",
                                "INPUT.TEXT",
                                None,
                                1,
                                [],
                                "session.configured",
                                "audio.start",
                                "error",
                            )
                        )
                    }
                ),
            )
        elif roll < 0.50:
            yield (
                "text",
                rng.choice(
                    (
                        "{",
                        "[]",
                        "1",
                        "null",
                        '"x"',
                        '{"type":NaN}',
                        nested(100_000),
                        '{"type":"input.text"',
                        '{"type":"input.text","text":%s}' % rng.choice(RAW_NUMBERS),
                    )
                ),
            )
        elif roll < 0.56:
            yield "binary", bytes(rng.getrandbits(8) for _ in range(rng.choice((0, 3, 1024))))
        elif roll < 0.58:
            yield "text", json.dumps({"type": "input.text", "text": "x" * (max_message_bytes + rng.choice((1, 4096)))})
        elif roll < 0.75:
            yield "text", json.dumps({"type": "input.text", "text": random_text(rng)})
        elif roll < 0.80:
            yield "text", json.dumps({"type": rng.choice(("input.cancel", "input.commit", "session.keepalive"))})
        elif roll < 0.85:  # the voice-agent fields: contexts (a handful of ids, so some get closed) and played_ms
            kind = rng.choice(("input.text", "input.commit", "input.cancel", "input.done"))
            context = rng.choice((f"c{rng.randint(0, 40)}", *WRONG_VALUES[:12]))
            frame = {"type": kind, "context_id": context, "text": random_text(rng)}
            if kind == "input.cancel":
                frame["played_ms"] = rng.choice((rng.uniform(0, 5000), *WRONG_VALUES[:12]))
            yield "text", json.dumps(frame)
        else:
            yield "text", json.dumps({"type": "input.text", "text": random_text(rng), "extra": {"deep": nested(50)}})


# Characters from the blocks the engines found hard: digits int() does not take, controls, format
# characters, surrogate halves, combining marks, CJK, emoji, private use.
_HARD = (
    "⑵⒈①²³➊⓵٣߃፲"
    "\u0000\u0007\u001b\u007f\u0085"
    "\u200b\u200d\u202e\u2066\ufeff"
    "\ud800\udfff"
    "\u0301\u0336"
    "漢字かな한국"
    "😀👍🏽"
    "\ue000\U000f0000"
    "ﬁＡ１"
)


def random_text(rng):
    pieces = []
    for _ in range(rng.randint(1, 8)):
        roll = rng.random()
        if roll < 0.4:
            pieces.append(rng.choice(("Hello", "12", "3.14", "$5", "Dr.", "1,000", "7:30", "2nd", "the", "a")))
        elif roll < 0.8:
            pieces.append("".join(rng.choice(_HARD) for _ in range(rng.randint(1, 4))))
        else:
            pieces.append(chr(rng.randrange(0x20, 0x30000)))
    return " ".join(pieces) + rng.choice((". ", "", "! ", "\n\n"))


# -- the contract's vocabulary ---------------------------------------------------------------------

_TYPES = r"(a string|an integer|a number|a boolean)"
CONTRACT_MESSAGES = [
    re.compile(pattern)
    for pattern in (
        r"session\.config was not received before timeout",
        r"speech WebSocket idle timeout",
        r"buffered speech text exceeds \d+ characters",
        r"first WebSocket message must be session\.config",
        r"speech WebSocket client messages must be text frames",
        r"(session|text) WebSocket message exceeds \d+ bytes",
        r"speech WebSocket message is not valid JSON: .+",
        r"speech WebSocket messages must be JSON objects",
        r"unsupported speech WebSocket message type: .*",
        r"input\.text text must be a string",
        r"input must be at most \d+ characters",
        r"session\.config session must be an object",
        rf"[a-z_]+ must be {_TYPES}",
        r"Unknown voice '.*'\. Supported voices: .+",
        r"response_format must be one of: aac, alaw, flac, mp3, mulaw, opus, pcm, wav",
        r"sample_rate must be one of: 8000, 16000, 22050, 24000, 44100, 48000",
        r"speed must be between 0\.25 and 4\.0",
        r"stream_audio=true requires a streamable response_format \(pcm, mulaw, alaw, mp3, opus, aac\)",
        r"split_granularity must be one of: clause, sentence",
        r"timestamps must be one of: none, word",
        r"context_id must be 1 to 64 letters, digits, '\.', '_' or '-'",
        r"context '.*' is closed",
        r"too many open contexts \(max \d+\)",
        r"played_ms must be at least 0",
        r"(ref_audio|instructions) is not supported by engine '.+'",
        r"temperature must be between 0 and 2",
        r"top_p must be greater than 0 and at most 1",
        r"top_k must be -1 or between 1 and 2147483647",
        r"repetition_penalty must be greater than 0 and at most 2",
        r"max_new_tokens must be between 1 and 2147483647",
        r"seed must be between 0 and 18446744073709551615",
        r"speech synthesis failed",
        r"the engine produced no audio for this segment",
        r"The request queue is full\.",
        r"speech session terminated.*",
    )
]
CLASSES = {
    "BadRequestError": 400,
    "server_error": None,
    "rate_limit_error": 429,
    "authentication_error": 401,
    "permission_error": 403,
}
CONTRACT_CLOSES = {1000, 1006, 4001, 4008, 4009, 4013}  # 4011 is the contract's, but it means a server fault


def error_problem(event):
    """Why an `error` event is outside the contract, or None."""
    kind, code, message = event.get("error_type"), event.get("code"), event.get("message")
    if kind not in CLASSES:
        return f"error_type {kind!r}"
    if code != CLASSES[kind]:
        return f"code {code!r} with {kind}"
    if kind == "rate_limit_error":
        return None  # capacity refusals: the message is the server's (per-key limit, admission, memory budget)
    if not isinstance(message, str) or not any(pattern.fullmatch(message) for pattern in CONTRACT_MESSAGES):
        return f"message {message!r}"
    return None
