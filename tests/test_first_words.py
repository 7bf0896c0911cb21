"""First words first (speech/engines/hibari_pieces.py): a segment the listener waits for comes in pieces.

With the real Hibari engine: the vocoder run frame by frame makes the samples one call makes; a
first sentence rendered in pieces is as long as rendered whole, with the same word times and
loudness, and no step where its pieces join; the first piece reaches the client, over a session or
a streamed REST response, while the rest is held back in the engine. With the FakeEngine: a session
asks for first words only while its listener has no audio in hand, a streamed REST response for its
first segment.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from speech.engines.fake import FakeEngine
from speech.engines.hibari import HibariEngine
from speech.engines.hibari_pieces import CONTEXT_STEPS, FIRST_STEPS, Pieces
from speech.engines.hibari_vocoder import Vocoder
from speech.stream.config import SessionConfig
from speech.stream.engine import Alignment
from speech.stream.render import render_segment, start_segment

from .support.engine_items import speak

RATE = 24000
SENTENCE = "The quick brown fox jumps over the lazy dog while the farmer watches from the porch."
HOP = 300


def render(engine, text, **fields):
    """The segment's audio chunks (float32) and its word timings."""
    items = [item for item, _ in speak(engine, text, options={"seed": 3}, timestamps=True, **fields)]
    chunks = [item for item in items if not isinstance(item, Alignment)]
    words = [word for item in items if isinstance(item, Alignment) for word in item.words]
    return chunks, words


def test_the_vocoder_in_pieces_makes_the_samples_of_one_call(hibari):
    from hibari import dsp

    tts = hibari._models[hibari.capabilities.default_voice]
    ids = tts.ids(tts.phonemize(SENTENCE)[0])
    out = [o[0] for o in tts.sess.run(None, {"ids": np.asarray([ids]), "speed": np.asarray([1.0], np.float32)})[:6]]
    out[2] = np.full_like(out[2], -50.0)  # no noise: the rest is deterministic
    # And with its free-phase part at one level throughout: sound from the first sample to the last,
    # where the model's silence would hide the overlap-add's tapered ends.
    loud = [*out[:3], np.full_like(out[3], -4.0), *out[4:]]
    for params in (out, loud):
        whole = dsp.synth(*params, np.random.default_rng(0))
        for cut in (3, 40, 47):
            vocoder = Vocoder(np.random.default_rng(0))
            head = vocoder.push([o[..., :cut] for o in params[:5]] + [params[5][: cut + 2]], final=False)
            tail = vocoder.push([o[..., cut:] for o in params[:5]] + [params[5][cut:]], final=True)
            assert head.size == (cut - 2) * HOP  # what is final so far: the overlap-add's open hops held back
            assert np.allclose(np.concatenate((head, tail)), whole, atol=1e-6)


def test_a_first_sentence_in_pieces_joins_without_gap_or_step(hibari):
    whole, whole_words = render(hibari, SENTENCE)
    pieces, words = render(hibari, SENTENCE, first_words=True)
    assert len(whole) == 1 and len(pieces) == 2
    joined = np.concatenate(pieces)
    assert joined.size == whole[0].size  # no gap: the same length as rendered whole
    assert words == whole_words  # the same words at the same times
    loudness = [20 * np.log10(np.sqrt(np.mean(np.square(x[np.abs(x) > 0.01])))) for x in (joined, whole[0])]
    assert abs(loudness[0] - loudness[1]) < 1.5
    # No step at the join: the sample step there is within the signal's own steps around it, and the
    # spectrum changes there as it does in the sentence rendered whole (speech changes fast at places).
    join = pieces[0].size
    steps = np.abs(np.diff(joined[join - 240 : join + 240]))
    assert abs(joined[join] - joined[join - 1]) <= np.max(steps)
    excess = flux(joined) - flux(whole[0])
    at = join // HOP
    assert np.max(excess[at - 2 : at + 2]) <= max(0.25, np.percentile(np.abs(excess), 95))


def test_between_its_pieces_a_part_keeps_only_what_its_rest_needs(hibari):
    """From the first piece to the rest a part waits behind other sessions' first pieces (many at once
    under a burst): it keeps its features and the frames to blend, not the first window's outputs."""
    tts = hibari._models[hibari.capabilities.default_voice]
    pieces = Pieces(tts.front, tts.back, tts.ids(tts.phonemize(SENTENCE)[0]), 1.0, np.random.default_rng(0))
    assert pieces.split
    pieces.first()
    features = sum(f.nbytes for f in pieces._features)
    window = sum(o.nbytes for o in pieces._window(0, FIRST_STEPS + CONTEXT_STEPS))
    # The frames to blend are a tenth of the window's (BLEND_FRAMES of its steps' frames); the vocoder's state a few hops.
    assert held_bytes(pieces) - features <= window // 8


def held_bytes(obj):
    """Bytes of the numpy buffers an object's attributes keep alive, its members' too: a view keeps
    its base's whole buffer."""
    buffers, seen, todo = {}, set(), [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            while isinstance(item.base, np.ndarray):
                item = item.base
            buffers[id(item)] = item.nbytes
        elif isinstance(item, list | tuple):
            todo += item
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            todo += [value for name, value in vars(item).items() if name not in ("_back", "_dsp", "_rng")]
    return sum(buffers.values())


def flux(samples, hop=HOP):
    """Spectral flux: the RMS change of the log spectrum from one frame of `hop` samples to the next."""
    frames = samples[: samples.size // hop * hop].reshape(-1, hop) * np.hanning(hop)
    spectra = np.log(np.abs(np.fft.rfft(frames, axis=1)) + 1e-4)
    return np.sqrt(np.mean(np.square(np.diff(spectra, axis=0)), axis=1))


class HeldHibari(HibariEngine):
    """Hibari whose rest of a first sentence waits for `release` (on its synthesis thread)."""

    def __init__(self):
        super().__init__(workers=1)
        self.entered, self.release = threading.Event(), threading.Event()
        self.first_samples = 0

    def _first_piece(self, tts, plan, request, rng):
        result = super()._first_piece(tts, plan, request, rng)
        self.first_samples = result[0].size
        return result

    def _rest(self, plan, request, rest):
        self.entered.set()
        self.release.wait(10)
        return super()._rest(plan, request, rest)


async def test_the_first_piece_reaches_the_client_while_the_rest_is_held(speech):
    engine = HeldHibari()
    try:
        await engine.warm_up()
        s = await speech(engine, stream_audio=True)
        await s.text(SENTENCE)
        await s.send({"type": "input.commit"})
        assert await asyncio.to_thread(engine.entered.wait, 10), "the sentence was rendered whole"
        await s.t.event("input.committed")
        start = await s.t.event("audio.start", sentence_text=SENTENCE)
        received = 0
        while received < engine.first_samples * 2:  # 16-bit pcm
            received += len(await s.t.binary())
        assert received == engine.first_samples * 2
        assert not engine.release.is_set()  # all of the first piece is out, the rest still held
        engine.release.set()
        await s.send({"type": "input.done"})
        items = await s.t.until_closed()
        rest = sum(len(value) for kind, value in items if kind == "bytes")
        (done,) = [value for kind, value in items if kind == "json" and value["type"] == "audio.done"]
        assert rest > 0 and done["id"] == start["id"] and done["total_bytes"] == received + rest
        assert [value["type"] for kind, value in items if kind == "json"].count("audio.start") == 0  # one segment
    finally:
        engine.release.set()
        await engine.aclose()


async def test_a_streamed_rest_response_sends_its_first_piece_while_the_rest_is_held(monkeypatch):
    """`POST /v1/audio/speech` with `stream`: the response's first bytes are the first piece's, sent
    while the engine still holds the rest of the sentence."""
    from django.test import AsyncClient

    import speech.runtime

    engine = HeldHibari()
    monkeypatch.setattr(speech.runtime, "_engine", engine)
    try:
        await engine.warm_up()
        body = {"input": SENTENCE, "response_format": "pcm", "stream": True}
        response = await AsyncClient().post("/v1/audio/speech", body, content_type="application/json")
        assert response.status_code == 200 and response.streaming
        chunks = aiter(response.streaming_content)
        received = 0
        while received < engine.first_samples * 2:  # 16-bit pcm
            received += len(await asyncio.wait_for(anext(chunks), 10))
        assert received == engine.first_samples * 2
        following = asyncio.ensure_future(anext(chunks))
        assert await asyncio.to_thread(engine.entered.wait, 10), "the sentence was rendered whole"
        assert not following.done()  # all of the first piece is out, the rest still held
        engine.release.set()
        rest = len(await asyncio.wait_for(following, 10)) + sum([len(chunk) async for chunk in chunks])
        whole = await AsyncClient().post("/v1/audio/speech", {**body, "stream": False}, content_type="application/json")
        assert rest > 0 and abs(received + rest - len(whole.content)) <= 4  # as long as the sentence whole
    finally:
        engine.release.set()
        await engine.aclose()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({"stream": True}, [True, False]), ({"stream_format": "audio"}, [True, False]), ({}, [False, False])],
    ids=["stream", "stream_format", "file"],
)
async def test_a_streamed_rest_response_asks_for_its_first_segment_in_pieces(process_engine, fields, expected):
    """Its client waits with no audio in hand for the first segment only; a file gains nothing."""
    from django.test import AsyncClient

    body = {"input": "One. Two.", "response_format": "pcm", **fields}
    response = await AsyncClient().post("/v1/audio/speech", body, content_type="application/json")
    assert response.status_code == 200
    if response.streaming:
        assert sum([len(chunk) async for chunk in response.streaming_content]) > 0
    assert [request.first_words for request in process_engine.requests] == expected


@pytest.mark.parametrize("stream_audio", [True, False])
async def test_first_words_are_asked_for_while_the_listener_has_no_audio(speech, stream_audio):
    engine = FakeEngine(chunks=2)
    s = await speech(engine, stream_audio=stream_audio)
    await s.text("One. Two. Three.")
    await s.send({"type": "input.commit"})
    await s.t.until("input.committed")
    for _ in range(3):
        await s.t.until("audio.done")
    await s.text("Four.")  # a new utterance: delivery ran dry before it
    await s.send({"type": "input.done"})
    items = await s.t.until_closed()
    assert [value["type"] for kind, value in items if kind == "json"].count("audio.done") == 1
    # Streamed, the first segment of each utterance; the others start while audio of theirs flows. A
    # segment sent as one file gains nothing from pieces.
    expected = [True, False, False, True] if stream_audio else [False] * 4
    assert [request.first_words for request in engine.requests] == expected


@pytest.mark.parametrize(("speed", "rate"), [(4.0, 24000), (0.5, 48000), (1.0, 16000)])
def test_pieces_through_speed_and_rate_join_as_the_whole_segment(hibari, speed, rate):
    """The pieces through the segment's transforms (time-stretch, resampling): as long as the segment
    rendered whole and transformed, and the spectrum at the join changes as the whole's does there,
    within the two renders' differences elsewhere."""
    config = SessionConfig(voice=hibari.capabilities.default_voice, sample_rate=rate, speed=speed, options={"seed": 3})

    async def run(first_words):
        stream = start_segment(hibari, config, SENTENCE, first_words=first_words)
        sizes = []  # the engine's chunks as they reach the transforms
        chunks = [chunk async for chunk in render_segment(hibari, config, SENTENCE, stream=_sizes(stream, sizes))]
        return np.concatenate(chunks).astype(np.float32), sizes

    (whole, whole_sizes), (joined, sizes) = asyncio.run(run(False)), asyncio.run(run(True))
    assert len(whole_sizes) == 1 and len(sizes) == 2
    assert abs(joined.size - whole.size) <= 2
    hop = rate * HOP // RATE  # the flux's 12.5 ms frames at this rate
    at = round(sizes[0] / speed * rate / RATE) // hop
    excess = flux(joined[: whole.size], hop) - flux(whole[: joined.size], hop)
    # Time-stretched in two chunks, the stretch aligns its windows a little otherwise than in one: the
    # renders differ here and there by a frame's shift. A gap or a click at the join would stand out.
    elsewhere = np.concatenate((excess[: at - 4], excess[at + 4 :]))
    assert np.max(excess[at - 2 : at + 2]) <= max(0.25, np.max(np.abs(elsewhere)))


async def _sizes(stream, sizes):
    async for chunk in stream:
        if not isinstance(chunk, Alignment):
            sizes.append(chunk.size)
        yield chunk
