"""Word timestamps, what was heard, and contexts through a real server (daphne, Hibari, real sockets).

One daphne for the module. Every session sets `seed`, so Hibari's audio and its word times are the
same each time: a pcm session at 24 kHz is the reference the others are compared with (times are
milliseconds of audio, whatever the format or rate).
"""

from __future__ import annotations

import asyncio

import pytest

from speech.stream.words import word_spans
from tests.support.live import (
    collect,
    configure,
    healthy_after_each,
    is_event,
    module_server,
    open_session,
    run_session,
    segments_of,
    send_json,
)

pytestmark = [pytest.mark.live]

SEED = 11
TEXT = "Dr. Smith paid $3.50 for 2 coffees at 7:30 a.m. on Main St. Then, quietly, she left!"
FORMATS = ("aac", "alaw", "flac", "mp3", "mulaw", "opus", "pcm", "wav")
STREAMABLE = ("pcm", "mulaw", "alaw")
# The event keys of the first protocol release, per event type: a client that uses no extension sees
# exactly these (input.cancelled adds what was heard; session.configured's limits add max_contexts).
FIRST_RELEASE_KEYS = {
    "session.configured": {
        "type", "session_id", "response_format", "stream_audio", "split_granularity", "sample_rate", "voice", "engine", "limits",
    },
    "audio.start": {"type", "id", "sentence_index", "sentence_text", "format", "sample_rate"},
    "audio.done": {"type", "id", "sentence_index", "total_bytes", "error", "cancelled"},
    "input.committed": {"type", "session_id", "segment_index", "segment_sentences", "total_sentences"},
    "session.done": {"type", "session_id", "total_sentences"},
}  # fmt: skip
HEARD_KEYS = {"played_ms", "played_ms_source", "spoken_text", "unspoken_text"}


server = module_server()
healthy = healthy_after_each()


async def timed_session(server, config, text=TEXT):
    """One session with word timestamps: (segments, the words of each segment in order), after
    checking that a segment's first audio.timestamps comes after its audio.start and before its first
    frame, and any later one (a segment sent in pieces) before the audio of the words it lists."""
    config = {"seed": SEED, "timestamps": "word", **config}
    result = await run_session(server.ws_url, config, [text])
    assert result.close_code == 1000, result.types()
    segments, problems = segments_of(result.items)
    assert problems == []
    words = {}
    sent_ms = {}  # audio sent of each segment so far, in ms (streamed raw formats: 1 or 2 bytes a sample)
    width = 2 if config.get("response_format", "pcm") == "pcm" else 1
    current = rate = None
    for item in result.items:
        if item.kind == "audio":
            sent_ms[current] = sent_ms.get(current, 0.0) + len(item.data) / width / rate * 1000
            continue
        event = item.data
        if event["type"] == "audio.start":
            current, rate = event["sentence_index"], event["sample_rate"]
        elif event["type"] == "audio.timestamps":
            assert event["sentence_index"] == current
            assert current in words or current not in sent_ms, "the first timestamps after audio"
            assert all(w["start_ms"] >= sent_ms.get(current, 0.0) - 1 for w in event["words"]), "a word's audio before its time"
            assert "estimated" not in event, "Hibari's times are its own"
            words.setdefault(current, []).extend(event["words"])
    return segments, [words.get(segment.index, []) for segment in segments]


def check_words(segment, words, duration_ms):
    text = segment.start["sentence_text"]
    assert [(w["char_start"], w["char_end"]) for w in words] == word_spans(text)
    assert all(text[w["char_start"] : w["char_end"]] == w["word"] for w in words)
    times = [t for w in words for t in (w["start_ms"], w["end_ms"])]
    assert times == sorted(times) and times[-1] <= duration_ms


_reference: dict[bool, tuple] = {}


async def reference(server, stream=False):
    """(segments, words) of the pcm session at 24 kHz, speed 1, non-streamed or streamed (cached). A
    streamed session gets its first segment in pieces (first words first): a streamed reference."""
    if stream not in _reference:
        segments, words = await timed_session(server, {"response_format": "pcm", "stream_audio": stream})
        for segment, segment_words in zip(segments, words, strict=True):
            check_words(segment, segment_words, len(segment.audio) / 2 / 24000 * 1000)
        _reference[stream] = (segments, words)
    return _reference[stream]


@pytest.mark.parametrize("fmt,stream", [(fmt, False) for fmt in FORMATS] + [(fmt, True) for fmt in STREAMABLE])
async def test_word_times_in_every_format_are_pcms(server, fmt, stream):
    ref_segments, ref_words = await reference(server, stream)
    segments, words = await timed_session(server, {"response_format": fmt, "stream_audio": stream})
    assert [s.start["sentence_text"] for s in segments] == [s.start["sentence_text"] for s in ref_segments]
    assert words == ref_words


@pytest.mark.parametrize("rate", [8000, 48000])
async def test_word_times_do_not_depend_on_the_sample_rate(server, rate):
    _, ref_words = await reference(server, stream=True)
    _, words = await timed_session(server, {"response_format": "pcm", "stream_audio": True, "sample_rate": rate})
    assert words == ref_words


@pytest.mark.parametrize("speed", [0.5, 2.0])
async def test_word_times_are_as_delivered_at_other_speeds(server, speed):
    _, ref_words = await reference(server, stream=True)
    segments, words = await timed_session(server, {"response_format": "pcm", "stream_audio": True, "speed": speed})
    for segment, segment_words, ref in zip(segments, words, ref_words, strict=True):
        check_words(segment, segment_words, len(segment.audio) / 2 / 24000 * 1000)
        for word, ref_word in zip(segment_words, ref, strict=True):
            assert abs(word["end_ms"] - ref_word["end_ms"] / speed) <= 1 + 1 / speed


async def test_a_first_release_session_sees_no_new_keys(server):
    """No extension asked for: every event has the first release's keys; only input.cancelled adds
    what was heard, and limits add max_contexts."""
    ws = await open_session(server.ws_url)
    try:
        configured = await configure(ws, {"response_format": "pcm", "stream_audio": True, "seed": SEED})
        assert set(configured) == FIRST_RELEASE_KEYS["session.configured"]
        assert configured["limits"]["max_contexts"] == 32
        await send_json(ws, {"type": "input.text", "text": "First sentence here. Second one"})
        await send_json(ws, {"type": "input.commit"})
        first = await collect(ws, until=is_event("audio.done"))
        await send_json(ws, {"type": "input.cancel"})
        cancelled = await collect(ws, until=is_event("input.cancelled"))
        assert (
            set(cancelled.events[-1]) == {"type", "session_id", "cancelled_sentences", "total_sentences", "origin"} | HEARD_KEYS
        )
        await send_json(ws, {"type": "input.text", "text": "After the cancel."})
        await send_json(ws, {"type": "input.done"})
        rest = await collect(ws)
    finally:
        await ws.close()
    for event in first.events + cancelled.events[:-1] + rest.events:
        assert set(event) == FIRST_RELEASE_KEYS[event["type"]], event


async def test_what_was_heard_with_and_without_played_ms(server):
    ws = await open_session(server.ws_url)
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True, "seed": SEED, "timestamps": "word"})
        await send_json(ws, {"type": "input.text", "text": TEXT})
        await send_json(ws, {"type": "input.commit"})
        first = await collect(ws, until=is_event("audio.done"))
        words = [w for e in first.of_type("audio.timestamps") for w in e["words"]]
        text = first.of_type("audio.start")[0]["sentence_text"]
        played = words[3]["end_ms"] + 1
        await send_json(ws, {"type": "input.cancel", "played_ms": played})
        told = (await collect(ws, until=is_event("input.cancelled"))).events[-1]
        assert told["played_ms_source"] == "client" and told["played_ms"] == played
        assert told["spoken_text"] == text[: words[3]["char_end"]]
        assert f"{told['spoken_text']} {told['unspoken_text']}".split() == TEXT.split()

        await send_json(ws, {"type": "input.text", "text": "A second utterance to estimate. "})
        await collect(ws, until=is_event("audio.done"))
        await send_json(ws, {"type": "input.cancel"})
        told = (await collect(ws, until=is_event("input.cancelled"))).events[-1]
        assert told["played_ms_source"] == "estimate"
        assert f"{told['spoken_text']} {told['unspoken_text']}".split() == "A second utterance to estimate.".split()
        await send_json(ws, {"type": "input.done"})
        end = await collect(ws)
        assert end.close_code == 1000
    finally:
        await ws.close()


async def test_contexts_interleaved_by_the_client_speak_in_turn(server):
    ws = await open_session(server.ws_url)
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True, "seed": SEED})
        for part_a, part_b in [("Turn A begins. ", "Turn B begins. "), ("Turn A ends. ", "Turn B ends. ")]:
            await send_json(ws, {"type": "input.text", "text": part_a, "context_id": "a"})
            await send_json(ws, {"type": "input.text", "text": part_b, "context_id": "b"})
        await send_json(ws, {"type": "input.done", "context_id": "b"})
        await send_json(ws, {"type": "input.done", "context_id": "a"})
        result = await collect(ws, until=lambda item: is_event("context.done")(item) and item.data["context_id"] == "b")
        segments, problems = segments_of(result.items)
        assert problems == []
        assert [(s.start["context_id"], s.start["sentence_text"]) for s in segments] == [
            ("a", "Turn A begins."),
            ("a", "Turn A ends."),
            ("b", "Turn B begins."),
            ("b", "Turn B ends."),
        ]
        assert [e for e in result.events if e["type"] == "context.done"] == [
            {"type": "context.done", "context_id": "a", "total_sentences": 2},
            {"type": "context.done", "context_id": "b", "total_sentences": 2},
        ]
        # Closed, then reused: refused, and the session goes on.
        await send_json(ws, {"type": "input.text", "text": "Again. ", "context_id": "a"})
        error = (await collect(ws, until=is_event("error"))).events[-1]
        assert error == {
            "type": "error",
            "message": "context 'a' is closed",
            "error_type": "BadRequestError",
            "param": "context_id",
            "code": 400,
        }
        await send_json(ws, {"type": "input.done"})
        assert (await collect(ws)).close_code == 1000
    finally:
        await ws.close()


async def test_cancelling_one_context_of_three_sends_nothing_of_it_after_input_cancelled(server):
    ws = await open_session(server.ws_url)
    try:
        await configure(ws, {"response_format": "pcm", "stream_audio": True, "seed": SEED})
        for name in ("one", "two", "three"):
            text = f"This is turn {name}, which has a long first sentence to speak for a while. And a second."
            await send_json(ws, {"type": "input.text", "text": text, "context_id": name})
            await send_json(ws, {"type": "input.done", "context_id": name})
        head = await collect(ws, until=lambda item: item.kind == "audio")  # turn one is speaking
        await send_json(ws, {"type": "input.cancel", "context_id": "one"})
        cut = await collect(ws, until=is_event("input.cancelled"))
        told = cut.events[-1]
        assert told["context_id"] == "one" and told["cancelled_sentences"] >= 1
        rest = await collect(ws, until=lambda item: is_event("context.done")(item) and item.data["context_id"] == "three")
        items = head.items + cut.items + rest.items
        segments, problems = segments_of(items)
        assert problems == []
        # Nothing of turn one after its input.cancelled: every frame after it belongs to another turn.
        after = items[len(head.items) + len(cut.items) :]
        owner = None
        for item in after:
            if item.kind == "event" and item.data["type"] == "audio.start":
                owner = item.data["context_id"]
            assert item.kind == "event" or owner in ("two", "three")
            assert item.kind == "audio" or item.data.get("context_id") != "one"
        others = [s for s in segments if s.start["context_id"] != "one"]
        assert [s.start["context_id"] for s in others] == ["two", "two", "three", "three"]
        assert all(s.done["cancelled"] is False and s.done["total_bytes"] == len(s.audio) for s in others)
        await send_json(ws, {"type": "input.done"})
        assert (await collect(ws)).close_code == 1000
    finally:
        await ws.close()


async def test_one_context_over_the_limit_is_refused(server):
    ws = await open_session(server.ws_url)
    try:
        configured = await configure(ws, {"response_format": "pcm", "stream_audio": True})
        limit = configured["limits"]["max_contexts"]
        for n in range(limit + 1):
            await send_json(ws, {"type": "input.text", "text": " ", "context_id": f"c{n}"})
        error = (await collect(ws, until=is_event("error"))).events[-1]
        assert error["message"] == f"too many open contexts (max {limit})" and error["param"] == "context_id"
        await send_json(ws, {"type": "input.cancel", "context_id": "c0"})
        await collect(ws, until=is_event("input.cancelled"))
        await send_json(ws, {"type": "input.text", "text": "Room again. ", "context_id": f"c{limit}"})
        await send_json(ws, {"type": "input.done"})
        result = await asyncio.wait_for(collect(ws), 60)
        assert result.close_code == 1000 and "error" not in result.types()
    finally:
        await ws.close()
