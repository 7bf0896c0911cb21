"""The LiveKit Agents plugin's TTS, driven as LiveKit drives it (stream(): push_text / flush /
end_input; synthesize(); aclose() on an interruption), through LiveKit's own SynthesizeStream,
AudioEmitter and ChunkedStream, against a live daphne with the Hibari engine."""

from __future__ import annotations

import asyncio
import re

import pytest
from livekit.agents import utils
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.plugins import speechserver

SENTENCES = ["Hello there, my friend.", "The weather is lovely today, so we should go outside."]
LONG = (
    "Once upon a time there was a little robot who liked to count the stars in the sky. "
    "Every night it climbed the tallest hill in the valley and counted until the sun came up. "
    "One morning it found a star that had fallen into the river."
)
WAIT_S = 60.0  # hang guard


def tokens(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


def words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


@pytest.fixture
async def tts(server):
    async with utils.http_context.open():
        engine = speechserver.TTS(url=server.ws_url)
        yield engine
        await engine.aclose()


async def collect(stream):
    frames, timed = [], []
    async with asyncio.timeout(WAIT_S):
        async for event in stream:
            frames.append(event.frame)
            timed += event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
    return frames, timed


def check_audio_and_words(frames, timed, text, rate=24000):
    assert frames and {(f.sample_rate, f.num_channels) for f in frames} == {(rate, 1)}
    duration = sum(f.samples_per_channel for f in frames) / rate
    assert duration > 1.0
    assert "".join(timed).split() == text.split()  # the words with their spaces and punctuation
    timed_words = [t for t in timed if re.search(r"\w", t)]
    assert len(timed_words) == len(words(text))  # one timed string a word, not one for the whole text
    starts = [t.start_time for t in timed]
    assert starts == sorted(starts) and all(t.end_time >= t.start_time for t in timed)
    assert timed[-1].end_time <= duration + 1e-6


async def test_stream_of_tokens_flushed_then_ended_is_audio_with_timed_words(tts):
    stream = tts.stream()
    for token in tokens(" ".join(SENTENCES)):
        stream.push_text(token)
    stream.flush()  # LiveKit's end of a segment: input.commit, the rest is spoken without waiting
    stream.end_input()
    frames, timed = await collect(stream)
    await stream.aclose()
    check_audio_and_words(frames, timed, " ".join(SENTENCES))
    first_sentence = len(words(SENTENCES[0]))
    second_starts = [t.start_time for t in timed if re.search(r"\w", t)][first_sentence:]
    assert min(second_starts) >= max(t.end_time for t in timed[:first_sentence])  # shifted past sentence one


async def test_synthesize_is_one_shot_with_timed_words(tts):
    frames, timed = await collect(tts.synthesize(SENTENCES[1]))
    check_audio_and_words(frames, timed, SENTENCES[1])


async def test_an_interruption_cancels_the_context_and_the_next_stream_reuses_the_session(tts):
    cancelled: dict[str, dict] = {}
    seen = asyncio.Event()

    @tts.on("context_cancelled")
    def on_cancelled(event):
        cancelled[event["context_id"]] = event
        seen.set()

    first = tts.stream()
    for token in tokens(LONG):  # the language model is still talking: the context stays open
        first.push_text(token)
    heard = 0.0
    async with asyncio.timeout(WAIT_S):
        async for event in first:
            heard += event.frame.duration
            if heard >= 1.0:
                break
    await first.aclose()  # what LiveKit does to the speech of an interrupted turn
    async with asyncio.timeout(WAIT_S):
        while first.context_id not in cancelled:
            seen.clear()
            await seen.wait()
    event = cancelled[first.context_id]
    assert event["played_ms_source"] == "estimate" and event["unspoken_text"].strip()
    assert words(event["spoken_text"] + " " + event["unspoken_text"]) == words(LONG)

    second_text = "Sure, let me check that for you."
    second = tts.stream()
    second.push_text(second_text)
    second.end_input()
    frames, timed = await collect(second)
    await second.aclose()
    assert second.session_id == first.session_id  # the same socket, nothing of the first turn on it
    check_audio_and_words(frames, timed, second_text)
