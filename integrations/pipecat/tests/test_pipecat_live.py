"""SpeechServerTTSService inside a real Pipecat pipeline (tests/harness.py: Pipecat's output
transport playing in real time, its assistant context aggregator) against a live daphne with the
Hibari engine: audio at the advertised rate, one word frame per word, in order and placed on the
audio's timeline by the server's word timestamps; an interruption mid-sentence cancels the turn's
context with played_ms, nothing of it reaches the transport after, the context keeps the words that
were played, which are the server's spoken_text; the next turn works on the same socket; an idle
socket is kept open by keep-alives."""

from __future__ import annotations

import asyncio
import re

import pytest
from harness import Bot
from pipecat.frames.frames import InterruptionFrame, TTSAudioRawFrame, TTSStartedFrame, TTSTextFrame

SENTENCES = ["Hello there, my friend.", "The weather is lovely today, so we should go outside."]
LONG = (
    "Once upon a time there was a little robot who liked to count the stars in the sky. "
    "Every night it climbed the tallest hill in the valley and counted until the sun came up. "
    "One morning it found a star that had fallen into the river."
)


def tokens(text: str) -> list[str]:
    """Text as a language model streams it: words with their spaces."""
    return re.findall(r"\S+\s*", text)


def words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


@pytest.fixture
async def bot(server):
    async with Bot(server.ws_url) as running:
        yield running


@pytest.mark.parametrize("rate", [24000, 16000])
async def test_a_turn_is_audio_at_the_advertised_rate_with_a_word_frame_per_word_in_order(server, rate):
    async with Bot(server.ws_url, sample_rate=rate) as bot:
        await bot.say(tokens(" ".join(SENTENCES)))
        context_id = await bot.into.wait_for(bot.first_audio_context())
        await bot.played.wait_for(bot.turn_done(context_id))
    audio = bot.into.of(TTSAudioRawFrame, context_id)
    assert audio and {(s.frame.sample_rate, s.frame.num_channels) for s in audio} == {(rate, 1)}
    assert sum(len(s.frame.audio) for s in audio) / (2 * rate) > 2.0
    said = bot.words(context_id)
    assert words(" ".join(f.text for f in said)) == words(" ".join(SENTENCES))
    assert len(said) == len(words(" ".join(SENTENCES))), [f.text for f in said]  # one frame a word: timed, not forced
    pts = [f.pts for f in said]
    assert pts == sorted(pts) and len(set(pts)) == len(pts)


async def test_word_frames_sit_on_the_audio_timeline_the_server_gave(bot):
    """Each word frame's time, from the turn's first word, is the server's word end in the turn's
    audio: the second sentence's words are shifted by the first sentence's audio."""
    await bot.say(tokens(" ".join(SENTENCES)))
    context_id = await bot.into.wait_for(bot.first_audio_context())
    await bot.played.wait_for(bot.turn_done(context_id))
    expected, offset_s = [], 0.0
    for start in bot.tts.segments[context_id]:
        expected += [offset_s + w["end_ms"] / 1000 for w in start["words"]]
        offset_s += start["audio_bytes"] / (2 * 24000)
    pts = [f.pts for f in bot.words(context_id)]
    assert len(pts) == len(expected)
    got = [(p - pts[0]) / 1e9 for p in pts]
    assert got == pytest.approx([e - expected[0] for e in expected], abs=1e-3)
    assert expected[-1] <= offset_s  # the last word ends within the turn's audio


async def test_interruption_mid_sentence_keeps_what_was_heard_and_the_next_turn_follows_on_the_socket(bot):
    await bot.say(tokens(LONG))
    context_id = await bot.into.wait_for(bot.first_audio_context())
    heard = await bot.played.wait_for(lambda seen: len(bot.words(context_id)) >= 5 and bot.words(context_id))
    await bot.interrupt()
    cancelled = await bot.wait_cancelled(context_id)

    # nothing of the interrupted turn reaches the transport after the interruption did
    passed = next(i for i, s in enumerate(bot.into.seen) if isinstance(s.frame, InterruptionFrame))
    stale = [s for s in bot.into.seen[passed:] if isinstance(s.frame, TTSAudioRawFrame) and s.frame.context_id == context_id]
    assert stale == []
    # the context holds the words played before the interruption, which the server says were spoken
    spoken = words(" ".join(f.text for f in bot.words(context_id)))
    assert spoken[: len(heard)] == words(" ".join(f.text for f in heard)) and len(spoken) < len(words(LONG))
    [turn] = await bot.wait_turns(1)
    assert turn.interrupted and words(turn.content) == spoken
    assert [words(m) for m in bot.assistant_messages()] == [spoken]
    assert cancelled["played_ms_source"] == "client" and cancelled["played_ms"] > 0
    assert words(cancelled["spoken_text"]) == spoken, (cancelled["played_ms"], [(f.text, f.pts) for f in bot.words(context_id)])
    assert words(cancelled["spoken_text"] + " " + cancelled["unspoken_text"]) == words(LONG)

    # the next turn, at once, on the same socket
    second = "Sure, let me check that for you."
    began = bot.now()
    await bot.say(tokens(second))
    next_id = await bot.into.wait_for(bot.first_audio_context(after=began))
    await bot.played.wait_for(bot.turn_done(next_id))
    assert next_id != context_id and bot.connected == 1
    assert words(" ".join(f.text for f in bot.words(next_id))) == words(second)
    [_, turn] = await bot.wait_turns(2)
    assert not turn.interrupted and words(turn.content) == words(second)
    assert [words(m) for m in bot.assistant_messages()] == [spoken, words(second)]


async def test_an_idle_socket_is_kept_open_by_keepalives(server):
    async with Bot(server.ws_url) as bot:  # keep-alives every third of the announced idle timeout
        session = bot.tts.session_id
        await asyncio.sleep(3)  # longer than the server's idle timeout (2 s, conftest.py)
        await bot.say(tokens(SENTENCES[0]))
        context_id = await bot.into.wait_for(bot.first_audio_context())
        await bot.played.wait_for(bot.turn_done(context_id))
    assert (bot.tts.session_id, bot.connected) == (session, 1)
    assert bot.into.of(TTSStartedFrame) and bot.words(context_id)
    assert all(isinstance(f, TTSTextFrame) for f in bot.words(context_id))
