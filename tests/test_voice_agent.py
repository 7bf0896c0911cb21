"""Word timestamps, what was heard on a cancel, and contexts (docs/protocol.md, voice-agent
extensions), on SpeechSession with the test-double engine. The live tests with Hibari are
tests/test_voice_agent_live.py."""

from __future__ import annotations

import pytest

from speech.engines.fake import FakeEngine
from speech.stream.signal import ControlSignal
from speech.stream.words import word_spans

from .conftest import CHUNK_BYTES, RATE, limits

pytestmark = pytest.mark.asyncio


def words_of(text):
    return [text[a:b] for a, b in word_spans(text)]


async def segment(s):
    """The next segment's items: audio.start, any audio.timestamps, binary frames, audio.done."""
    start = await s.t.event("audio.start")
    items = [("json", start)]
    while True:
        item = await s.t.next()
        items.append(item)
        if item[0] == "json" and item[1]["type"] == "audio.done":
            return items


def check_timestamps(items, width=2):
    """The segment's audio.timestamps precede all of its audio, cover every word of sentence_text
    once in order, and stay inside its audio. Returns the words."""
    start, done = items[0][1], items[-1][1]
    kinds = [kind if kind == "bytes" else value["type"] for kind, value in items]
    assert kinds[1] == "audio.timestamps", kinds
    assert "audio.timestamps" not in kinds[kinds.index("bytes") :], kinds
    words = [w for kind, value in items if kind == "json" and value["type"] == "audio.timestamps" for w in value["words"]]
    text = start["sentence_text"]
    assert [w["word"] for w in words] == words_of(text)
    assert all(text[w["char_start"] : w["char_end"]] == w["word"] for w in words)
    times = [t for w in words for t in (w["start_ms"], w["end_ms"])]
    assert times == sorted(times)
    duration_ms = done["total_bytes"] / width / start["sample_rate"] * 1000
    assert times[-1] <= duration_ms
    for kind, value in items:
        if kind == "json" and value["type"] == "audio.timestamps":
            assert value["id"] == start["id"] and value["sentence_index"] == start["sentence_index"]
            assert "estimated" not in value
    return words


# -- timestamps ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream_audio,fmt", [(True, "pcm"), (False, "pcm"), (False, "wav")])
async def test_timestamps_come_before_the_audio_they_describe(speech, stream_audio, fmt):
    s = await speech(FakeEngine(chunks=4), stream_audio=stream_audio, response_format=fmt, timestamps="word")
    await s.text("Hello there, Dr. Smith: it costs $3.50 today! ")
    items = await segment(s)
    if fmt == "pcm":
        check_timestamps(items)
    else:
        assert [k for k, _ in items] == ["json", "json", "bytes", "json"]
        assert items[1][1]["type"] == "audio.timestamps"
    await s.finish()


@pytest.mark.parametrize("speed", [0.5, 2.0])
async def test_timestamps_are_times_as_delivered_after_the_stretch(speech, speed):
    """The engine speaks at 1.0 only, so the pipeline stretches: the words' times scale with it."""
    engine = FakeEngine(chunks=6, speed_range=(1.0, 1.0))
    s = await speech(engine, stream_audio=True, timestamps="word", speed=speed)
    text = "One two three four five six seven."
    await s.text(text + " ")
    words = check_timestamps(await segment(s))
    unstretched = engine.alignment(text).words
    assert [w["end_ms"] for w in words] == [int(w.end_s / speed * 1000) for w in unstretched]
    await s.finish()


async def test_no_timestamps_unless_asked(speech):
    s = await speech(FakeEngine(chunks=2), stream_audio=True)
    await s.text("Hello there. ")
    items = await segment(s)
    assert [value["type"] for kind, value in items if kind == "json"] == ["audio.start", "audio.done"]
    assert all("context_id" not in value for kind, value in items if kind == "json")
    await s.finish()


async def test_a_bad_timestamps_value_is_refused_at_the_handshake(speech):
    s = await speech(configure=False)
    await s.send({"type": "session.config", "timestamps": "phoneme"})
    assert await s.t.event("error") == {
        "type": "error",
        "message": "timestamps must be one of: none, word",
        "error_type": "BadRequestError",
        "param": "timestamps",
        "code": 400,
    }
    await s.t.closed(4008)


# -- what was heard --------------------------------------------------------------------------------


async def test_a_cancel_with_played_ms_reports_the_words_heard(speech):
    """The usual barge-in: every frame was sent long ago, the listener is still playing them."""
    s = await speech(FakeEngine(chunks=8), stream_audio=True, timestamps="word")
    await s.text("Alpha bravo charlie delta echo foxtrot golf hotel. Second sentence here. Buffered")
    first = await segment(s)
    await segment(s)
    words = [v for k, v in first if k == "json" and v["type"] == "audio.timestamps"][0]["words"]
    played = words[2]["end_ms"] + (words[3]["end_ms"] - words[2]["end_ms"]) / 2  # inside "delta"
    await s.send({"type": "input.cancel", "played_ms": played})
    cancelled = await s.t.event("input.cancelled", cancelled_sentences=0)
    assert cancelled["played_ms"] == round(played, 1) and cancelled["played_ms_source"] == "client"
    assert cancelled["spoken_text"] == "Alpha bravo charlie"
    assert cancelled["unspoken_text"] == "delta echo foxtrot golf hotel. Second sentence here. Buffered"
    # A new utterance begins after the cancel: what was heard of the next one starts from zero.
    await s.text("Fresh start. ")
    await segment(s)
    await s.send({"type": "input.cancel", "played_ms": 0})
    cancelled = await s.t.event("input.cancelled")
    assert (cancelled["spoken_text"], cancelled["unspoken_text"]) == ("", "Fresh start.")
    await s.finish()


async def test_a_cancel_without_played_ms_uses_the_servers_estimate(speech):
    engine = FakeEngine(chunks=4, hold=True)
    s = await speech(engine, stream_audio=True)
    await s.text("One two three four. ")
    await s.t.event("audio.start")
    sent = len(await s.t.binary()) + len(await s.t.binary())
    await s.send({"type": "input.cancel"})
    await s.t.event("audio.done", cancelled=True)
    cancelled = await s.t.event("input.cancelled")
    assert cancelled["played_ms_source"] == "estimate"
    assert 0 <= cancelled["played_ms"] <= sent / 2 / RATE * 1000
    assert cancelled["spoken_text"] + cancelled["unspoken_text"] != ""
    assert f"{cancelled['spoken_text']} {cancelled['unspoken_text']}".split() == "One two three four.".split()
    await s.finish()


async def test_played_ms_past_everything_sent_counts_as_everything_sent(speech):
    s = await speech(FakeEngine(chunks=2), stream_audio=True)
    await s.text("Hello there. ")
    await segment(s)
    await s.send({"type": "input.cancel", "played_ms": 10**9})
    cancelled = await s.t.event("input.cancelled", cancelled_sentences=0)
    assert cancelled["played_ms"] == round(2 * CHUNK_BYTES / 2 / RATE * 1000, 1)
    assert (cancelled["spoken_text"], cancelled["unspoken_text"]) == ("Hello there.", "")
    await s.finish()


@pytest.mark.parametrize("played_ms,message", [("5", "played_ms must be a number"), (-1, "played_ms must be at least 0")])
async def test_a_bad_played_ms_is_a_recoverable_error(speech, played_ms, message):
    s = await speech()
    await s.send({"type": "input.cancel", "played_ms": played_ms})
    error = await s.t.event("error")
    assert error == {"type": "error", "message": message, "error_type": "BadRequestError", "param": "played_ms", "code": 400}
    await s.barrier()
    await s.finish()


# -- contexts --------------------------------------------------------------------------------------


async def speaking(speech, turns):
    """A session on a held FakeEngine (three chunks a segment) given `turns` ((context_id, text), in
    order), once the first turn has sent two frames: (session, engine, bytes sent)."""
    engine = FakeEngine(chunks=3, hold=True)
    s = await speech(engine, stream_audio=True)
    for context_id, text in turns:
        await s.send({"type": "input.text", "text": text, "context_id": context_id})
    await s.t.event("audio.start", context_id=turns[0][0])
    sent = len(await s.t.binary()) + len(await s.t.binary())
    return s, engine, sent


async def test_contexts_speak_one_after_another_and_carry_their_id(speech):
    engine = FakeEngine(chunks=2)
    s = await speech(engine, stream_audio=True, timestamps="word")
    await s.send({"type": "input.text", "text": "First turn. ", "context_id": "a"})
    await s.send({"type": "input.text", "text": "Second turn. ", "context_id": "b"})
    first = await segment(s)
    assert all(value["context_id"] == "a" for kind, value in first if kind == "json")
    await s.barrier()  # b waits: a is open and may get more text
    await s.send({"type": "input.text", "text": "More of the first. ", "context_id": "a"})
    await s.send({"type": "input.done", "context_id": "a"})
    more = await segment(s)
    assert more[0][1]["sentence_text"] == "More of the first." and more[0][1]["context_id"] == "a"
    assert await s.t.event("context.done") == {"type": "context.done", "context_id": "a", "total_sentences": 2}
    second = await segment(s)
    assert second[0][1]["context_id"] == "b" and second[0][1]["sentence_index"] == 2
    await s.send({"type": "input.done"})
    assert await s.t.event("context.done") == {"type": "context.done", "context_id": "b", "total_sentences": 1}
    done = await s.t.event("session.done")
    assert done == {"type": "session.done", "session_id": s.configured["session_id"], "total_sentences": 3}
    await s.t.closed(1000)
    await s.finish()


async def test_cancelling_one_context_leaves_the_others(speech):
    turns = [("one", "Turn one speaks. "), ("two", "Turn two waits. "), ("three", "Turn three waits. ")]
    s, engine, _ = await speaking(speech, turns)
    await s.send({"type": "input.cancel", "context_id": "two"})
    cancelled = await s.t.event("input.cancelled", context_id="two", cancelled_sentences=1, total_sentences=0)
    assert cancelled["spoken_text"] == "" and cancelled["unspoken_text"] == "Turn two waits."
    await s.send({"type": "input.text", "text": "Too late. ", "context_id": "two"})
    assert await s.t.event("error") == {
        "type": "error",
        "message": "context 'two' is closed",
        "error_type": "BadRequestError",
        "param": "context_id",
        "code": 400,
    }
    await s.send({"type": "input.done", "context_id": "one"})
    engine.allow(10)
    rest = await s.t.until("context.done")
    assert [v["context_id"] for k, v in rest if k == "json"] == ["one", "one"]
    three = await segment(s)
    assert three[0][1]["context_id"] == "three"
    await s.finish()


async def test_cancelling_the_speaking_context_stops_it_and_the_next_speaks(speech):
    s, engine, sent = await speaking(speech, [("now", "Interrupted turn. And more of it. "), ("next", "Queued turn. ")])
    await s.send({"type": "input.cancel", "context_id": "now"})
    assert (await s.t.event("audio.done"))["total_bytes"] == sent
    cancelled = await s.t.event("input.cancelled", context_id="now", cancelled_sentences=2)
    assert cancelled["unspoken_text"].endswith("And more of it.")
    # Nothing of "now" after its input.cancelled: the next frames are the queued turn's.
    engine.allow(10)
    start = await s.t.event("audio.start")
    assert start["context_id"] == "next" and start["sentence_text"] == "Queued turn."
    await s.finish()


async def test_a_cancel_without_context_id_stops_every_context(speech):
    s, _, _ = await speaking(speech, [("x", "Speaking now. "), ("y", "Waiting. ")])
    await s.send({"type": "input.cancel"})
    await s.t.event("audio.done", cancelled=True)
    cancelled = await s.t.event("input.cancelled", cancelled_sentences=2, context_id="x")
    assert cancelled["unspoken_text"]
    for context_id in ("x", "y"):
        await s.send({"type": "input.text", "text": "Again. ", "context_id": context_id})
        assert (await s.t.event("error"))["message"] == f"context '{context_id}' is closed"
    await s.send({"type": "input.text", "text": "Default goes on. "})
    assert "context_id" not in await s.t.event("audio.start")
    await s.finish()


async def test_a_cancel_after_context_done_still_says_what_was_heard(speech):
    """A listener still playing a turn whose audio was all sent cuts it after context.done."""
    s = await speech(FakeEngine(chunks=4), stream_audio=True, timestamps="word")
    await s.send({"type": "input.text", "text": "Played in full. Cut here please. ", "context_id": "t1"})
    await s.send({"type": "input.done", "context_id": "t1"})
    first = await segment(s)
    second = await segment(s)
    await s.t.event("context.done", context_id="t1")
    first_ms = first[-1][1]["total_bytes"] / 2 / RATE * 1000
    words = [v for k, v in second if k == "json" and v["type"] == "audio.timestamps"][0]["words"]
    await s.send({"type": "input.cancel", "context_id": "t1", "played_ms": first_ms + words[1]["end_ms"]})
    cancelled = await s.t.event("input.cancelled", context_id="t1", cancelled_sentences=0)
    assert (cancelled["spoken_text"], cancelled["unspoken_text"]) == ("Played in full. Cut here", "please.")
    await s.finish()


async def test_open_contexts_are_limited(speech):
    s = await speech(FakeEngine(hold=True), limits(max_contexts=2), stream_audio=True)
    assert s.configured["limits"]["max_contexts"] == 2
    await s.send({"type": "input.text", "text": "One. ", "context_id": "c1"})
    await s.send({"type": "input.text", "text": "Two. ", "context_id": "c2"})
    await s.send({"type": "input.text", "text": "Three. ", "context_id": "c3"})
    errors = [v for k, v in await s.t.until("error") if k == "json" and v["type"] == "error"]
    assert errors == [
        {
            "type": "error",
            "message": "too many open contexts (max 2)",
            "error_type": "BadRequestError",
            "param": "context_id",
            "code": 400,
        }
    ]
    await s.send({"type": "input.cancel", "context_id": "c2"})  # closing one makes room
    await s.t.until("input.cancelled")
    await s.send({"type": "input.text", "text": "Three. ", "context_id": "c3"})
    await s.barrier()
    await s.finish()


@pytest.mark.parametrize("context_id", ["", "x" * 65, "has space", "slash/es", 7])
async def test_a_bad_context_id_is_refused(speech, context_id):
    s = await speech()
    await s.send({"type": "input.text", "text": "Hi. ", "context_id": context_id})
    event = await s.t.event("error")
    assert event["param"] == "context_id"
    assert event["message"] == (
        "context_id must be a string"
        if not isinstance(context_id, str)
        else "context_id must be 1 to 64 letters, digits, '.', '_' or '-'"
    )
    await s.barrier()
    await s.finish()


async def test_input_commit_in_a_context_reports_that_contexts_count(speech):
    s = await speech(FakeEngine(hold=True), stream_audio=True)
    await s.send({"type": "input.text", "text": "Zero. ", "context_id": "a"})
    await s.send({"type": "input.text", "text": "Partial", "context_id": "b"})
    await s.send({"type": "input.commit", "context_id": "b"})
    committed = [v for k, v in await s.t.until("input.committed") if k == "json"][-1]
    assert committed == {
        "type": "input.committed",
        "session_id": s.configured["session_id"],
        "context_id": "b",
        "segment_index": 0,
        "segment_sentences": 1,
        "total_sentences": 1,
    }
    await s.finish()


async def test_input_done_for_an_unknown_context_answers_at_once(speech):
    s = await speech()
    await s.send({"type": "input.done", "context_id": "never-used"})
    assert await s.t.event() == {"type": "context.done", "context_id": "never-used", "total_sentences": 0}
    await s.send({"type": "input.text", "text": "Hi. ", "context_id": "never-used"})
    assert (await s.t.event("error"))["message"] == "context 'never-used' is closed"
    await s.finish()


async def test_a_control_plane_cancel_estimates_what_was_heard_of_the_speaking_context(speech):
    """A REST or admin cancel (speech.cancel on the channel layer) has no client figure: the estimate,
    about the context that was speaking."""
    s = await speech(FakeEngine(chunks=4), stream_audio=True)
    await s.send({"type": "input.text", "text": "The speaking turn. ", "context_id": "live"})
    await segment(s)
    await s.session.handle_signal(ControlSignal(type="speech.cancel", session_id=s.configured["session_id"]))
    cancelled = await s.t.event("input.cancelled", origin="server", context_id="live")
    assert cancelled["played_ms_source"] == "estimate"
    assert 0 <= cancelled["played_ms"] <= 4 * CHUNK_BYTES / 2 / RATE * 1000
    assert f"{cancelled['spoken_text']} {cancelled['unspoken_text']}".split() == "The speaking turn.".split()
    await s.finish()
