"""The keys `input.cancelled` gained with what was heard (docs/protocol.md, "What was heard")."""

HEARD_KEYS = ("played_ms", "played_ms_source", "spoken_text", "unspoken_text")


def without_heard(event):
    """`event` without the heard keys, after checking they are there and of their types: the first
    release's `input.cancelled`, for tests of what it already said."""
    assert isinstance(event["played_ms"], (int, float)) and event["played_ms"] >= 0, event
    assert event["played_ms_source"] in ("client", "estimate"), event
    assert isinstance(event["spoken_text"], str) and isinstance(event["unspoken_text"], str), event
    return {key: value for key, value in event.items() if key not in HEARD_KEYS}
