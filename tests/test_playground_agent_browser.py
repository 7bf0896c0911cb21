"""The playground as a voice agent's player, in headless Chromium against a real daphne with the Hibari
engine. Issue 42, item 4: it asks for word timestamps and marks each word as the player plays it (by
the AudioContext's clock, not when its audio arrived); Stop tells the server how much was played
(`played_ms`, from the worklet's own count) and shows the server's account of what was heard and what
was not. Issue 43, item 4: it plays streamed opus, mp3 and aac, cut into codec packets (an Ogg page
parser for opus) and decoded by WebCodecs' AudioDecoder into the worklet. The WebSocket frames are
read from Chrome DevTools' network events, not from the page."""

import asyncio
import math

import numpy as np
import pytest

from tests.support import playground as page
from tests.support.browser import needs_chromium, websocket_frames
from tests.support.live import run_session, segments_of, serving, wait_for
from tests.support.playground import TWO_SENTENCES, browser_fixture, server_fixture  # noqa: F401 (fixtures)
from tests.support.speech_check import assert_heard

pytestmark = [pytest.mark.live, pytest.mark.heavy, needs_chromium]
LONG = " ".join(f"This is sentence number {n}, and it goes on for a little while." for n in range(1, 9))
# format -> (the page's AudioContext rate, samples of a codec frame there): docs/protocol.md
STREAMS = {"opus": (48000, 960), "mp3": (24000, 576), "aac": (24000, 1024)}


WORDS = """return [...document.querySelectorAll("#words .word")].map((w) => ({
    text: w.textContent, start: Number(w.dataset.start), end: Number(w.dataset.end),
    heard: w.classList.contains("heard"), current: w.classList.contains("current"),
    unheard: w.classList.contains("unheard"), ariaCurrent: w.getAttribute("aria-current")}));"""


def shown_words(browser):
    return browser.execute_script(WORDS)


def frozen(browser):
    """The page's state with its AudioContext suspended (the playback position stands still), read
    after two displayed frames: (the position in ms, the words as shown)."""
    return browser.execute_async_script(
        """
        const done = arguments[0];
        window.playground.audioContext.suspend().then(() => {
            requestAnimationFrame(() => requestAnimationFrame(() => done(window.playground.heardMs)));
        });
    """
    ), shown_words(browser)


def test_words_are_marked_in_order_as_the_player_plays_them(server, browser):
    page.open_page(browser, server.http_url + "/")
    websocket_frames(browser)  # forget earlier frames
    page.set_text(browser, TWO_SENTENCES)
    page.click(browser, "speak")
    # Everything has arrived (the server sends faster than real time) and the first words are played.
    wait_for(lambda: (u := page.utterance(browser)) and u["closed"] is False and len(u["segments"]) == 2, "both segments")
    wait_for(lambda: (u := page.utterance(browser))["bytesReceived"] == u["bytesAnnounced"] > 0, "all the audio arrived")
    wait_for(lambda: any(w["heard"] for w in shown_words(browser)), "a word was heard")
    at_ms, words = frozen(browser)
    assert [w["text"] for w in words] == TWO_SENTENCES.replace(".", "").split()
    # The marks follow the playback position, not the arrival of the audio (all of it is here).
    assert all(w["heard"] == (w["end"] <= at_ms) for w in words), (at_ms, words)
    assert not words[-1]["heard"]
    current = [w for w in words if w["current"]]
    assert all(w["start"] <= at_ms < w["end"] and w["ariaCurrent"] == "true" for w in current)
    assert len(current) <= 1
    browser.execute_script("window.playground.audioContext.resume();")

    wait_for(lambda: page.finished(browser), "everything is played and the session ends", timeout=60)
    words = shown_words(browser)
    assert all(w["heard"] and not w["unheard"] for w in words)
    order = [tuple(map(int, key.split(":"))) for key in page.js(browser, "window.playground.highlights")]
    assert order == sorted(set(order)), order  # each word once, in the order of the text
    # Exactly the words a displayed position fell in were marked current (a word shorter than the
    # gap between two display frames is never current: it goes straight to heard).
    shown = page.js(browser, "window.playground.shown")
    keys = [(segment, n) for segment in (0, 1) for n in range(len(TWO_SENTENCES.split(".")[segment].split()))]
    hit = [key for key, w in zip(keys, words, strict=True) if any(w["start"] <= ms < w["end"] for ms in shown)]
    assert order == hit, (order, hit)
    assert len(order) > 1, shown  # the display followed the player from word to word
    sent = [frame for direction, frame in websocket_frames(browser) if direction == "sent"]
    assert sent[0]["session"]["timestamps"] == "word"
    assert [f["type"] for f in sent][-2:] == ["input.done", "input.done"]  # the context's, then the session's


def test_stop_sends_what_was_played_and_shows_what_was_heard(server, browser):
    from selenium.webdriver.common.by import By

    page.open_page(browser, server.http_url + "/")
    websocket_frames(browser)
    page.set_text(browser, LONG)
    page.click(browser, "speak")
    rate = 24000
    wait_for(lambda: page.js(browser, "window.playground.played") > 3 * rate, "three seconds have played", timeout=60)
    page.click(browser, "stop")
    wait_for(lambda: page.utterance_field(browser, "closed"), "the session ends after Stop")
    played = page.js(browser, "window.playground.played")  # the worklet's count: nothing was played after Stop
    assert played < page.utterance(browser)["bytesReceived"] // 2

    frames = websocket_frames(browser)
    [cancel] = [f for d, f in frames if d == "sent" and f["type"] == "input.cancel"]
    [cancelled] = [f for d, f in frames if d == "received" and f["type"] == "input.cancelled"]
    assert cancel == {"type": "input.cancel", "context_id": "speak", "played_ms": math.floor(1000 * played / rate + 0.5)}
    assert cancelled["played_ms_source"] == "client" and cancelled["played_ms"] == cancel["played_ms"]
    assert cancelled["spoken_text"] and cancelled["unspoken_text"]
    assert LONG.startswith(cancelled["spoken_text"])

    box = browser.find_element(By.ID, "heard")
    assert box.is_displayed() and box.get_attribute("role") == "status"
    assert "Heard:" in box.text and "Not heard:" in box.text
    assert browser.find_element(By.ID, "spoken").text == cancelled["spoken_text"]
    assert browser.find_element(By.ID, "unspoken").text == cancelled["unspoken_text"]
    # The words on screen agree: those heard, then those struck through (of the segments that began).
    words = shown_words(browser)
    heard = [w["text"] for w in words if w["heard"]]
    assert cancelled["spoken_text"].replace(",", "").replace(".", "").split() == heard
    assert all(w["unheard"] != w["heard"] for w in words) and words[-1]["unheard"]
    assert page.js(browser, "document.activeElement.id") == "speak"  # the focus went back to Speak


# -- streamed compressed audio ----------------------------------------------------------------------


def speak(browser, server, fmt, text):
    page.open_page(browser, server.http_url + "/")
    browser.execute_script("document.getElementById('format').value = arguments[0];", fmt)
    websocket_frames(browser)  # forget earlier frames
    page.set_text(browser, text)
    page.click(browser, "speak")


def pcm_segments(server, rate):
    """Samples of each segment of TWO_SENTENCES as raw pcm at `rate` (the same engine, no codec)."""
    result = asyncio.run(run_session(server.ws_url, {"response_format": "pcm", "sample_rate": rate}, [TWO_SENTENCES]))
    segments, problems = segments_of(result.items)
    assert problems == []
    return [len(segment.audio) // 2 for segment in segments]


@pytest.mark.parametrize("fmt", list(STREAMS))
def test_a_streamed_compressed_session_is_decoded_and_played(server, browser, whisper, fmt):
    rate, frame = STREAMS[fmt]
    speak(browser, server, fmt, TWO_SENTENCES)
    wait_for(lambda: page.finished(browser) and page.js(browser, "window.playground.played") > 0, "everything is played", 60)
    u = page.utterance(browser)
    assert u["bytesReceived"] == u["bytesAnnounced"] > 0 and page.js(browser, "window.playground.rate") == rate
    config = next(f for d, f in websocket_frames(browser) if d == "sent" and f["type"] == "session.config")
    assert config["session"]["response_format"] == fmt and config["session"]["stream_audio"] is True
    # Every packet was decoded to the samples its header announced, and all were played.
    decoded = [s["samples"] for s in u["segments"]]
    assert page.js(browser, "window.playground.played") == page.js(browser, "window.playground.received") == sum(decoded)
    # Each segment is its own samples and less than one codec frame of padding: nothing lost, no gap.
    for got, want in zip(decoded, pcm_segments(server, rate), strict=True):
        assert 0 <= got - want < frame, (decoded, want)
    samples, wav_rate = page.heard(browser)
    assert wav_rate == rate and samples.size == sum(decoded)
    assert float(np.sqrt(np.mean(samples**2))) > 0.02
    assert_heard(whisper, samples, rate, TWO_SENTENCES)
    assert page.js(browser, "document.querySelectorAll('#words .word.heard').length") == len(TWO_SENTENCES.split())


def test_stop_during_streamed_opus_reports_what_was_played(server, browser):
    from selenium.webdriver.common.by import By

    rate, frame = STREAMS["opus"]
    speak(browser, server, "opus", LONG)
    wait_for(lambda: page.js(browser, "window.playground.played") > 3 * rate, "three seconds have played", timeout=60)
    page.click(browser, "stop")
    wait_for(lambda: page.utterance_field(browser, "closed"), "the session ends after Stop")
    played = page.js(browser, "window.playground.played")
    frames = websocket_frames(browser)
    [cancel] = [f for d, f in frames if d == "sent" and f["type"] == "input.cancel"]
    [cancelled] = [f for d, f in frames if d == "received" and f["type"] == "input.cancelled"]
    # The decoded samples played, less half a codec frame of padding for each segment played through.
    segments_before = sum(1 for s in page.utterance(browser)["segments"] if s["start"] + s["samples"] <= played)
    padding_ms = 1000 * segments_before * frame / 2 / rate
    assert -0.5 <= 1000 * played / rate - cancel["played_ms"] <= padding_ms + 0.5  # played_ms is rounded
    assert cancelled["played_ms_source"] == "client" and cancelled["played_ms"] == cancel["played_ms"]
    assert cancelled["spoken_text"] and cancelled["unspoken_text"]
    assert browser.find_element(By.ID, "spoken").text == cancelled["spoken_text"]
    assert browser.find_element(By.ID, "unspoken").text == cancelled["unspoken_text"]


def test_without_webcodecs_the_compressed_formats_say_why_they_cannot_be_chosen(server, browser):
    script = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "delete window.AudioDecoder;"})
    try:
        page.open_page(browser, server.http_url + "/")
        options = browser.execute_script(
            "return [...document.querySelectorAll('#format option')].map((o) => [o.value, o.disabled, o.textContent]);"
        )
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": script["identifier"]})
    for value, disabled, label in options:
        assert disabled == (value in STREAMS), options
        assert ("no WebCodecs decoder" in label) == (value in STREAMS)
    assert page.js(browser, "document.getElementById('format').value") == "pcm"  # raw formats still play


# -- the session open while the page plays ----------------------------------------------------------


@pytest.fixture(scope="module")
def short_idle():
    """A server whose idle timeout (1 s) is shorter than the audio the page holds after context.done."""
    with serving({"SPEECH_ENGINE": "hibari", "SPEECH_IDLE_TIMEOUT_S": "1"}) as srv:
        yield srv


def test_the_session_stays_open_while_the_page_plays_and_ends_after(short_idle, browser):
    page.open_page(browser, short_idle.http_url + "/")
    websocket_frames(browser)
    page.set_text(browser, TWO_SENTENCES)  # 4 s of audio, 1 s idle timeout
    page.click(browser, "speak")
    wait_for(lambda: page.finished(browser), "everything is played and the session ends", timeout=60)
    frames = websocket_frames(browser)
    done = next(i for i, (d, f) in enumerate(frames) if d == "received" and f["type"] == "context.done")
    assert any(f["type"] == "session.keepalive" for d, f in frames[done:] if d == "sent")
    assert [f["type"] for d, f in frames if d == "received"][-1] == "session.done"  # ended by the page, not idle
    assert page.js(browser, "window.playground.played") == page.js(browser, "window.playground.received") > 0


def test_a_player_that_stalls_ends_the_session(short_idle, browser):
    page.open_page(browser, short_idle.http_url + "/")
    websocket_frames(browser)
    page.set_text(browser, LONG)
    page.click(browser, "speak")
    wait_for(lambda: page.js(browser, "window.playground.played") > 0, "the page plays")
    browser.execute_script("window.playground.audioContext.suspend();")  # the output stalls
    wait_for(lambda: page.utterance_field(browser, "closed"), "the session ends", timeout=60)
    frames = websocket_frames(browser)
    done = next(i for i, (d, f) in enumerate(frames) if d == "received" and f["type"] == "context.done")
    *kept, last = [f for d, f in frames[done:] if d == "sent"]
    assert last == {"type": "input.done"} and all(f["type"] == "session.keepalive" for f in kept)  # the page ended it
    received = [f["type"] for d, f in frames if d == "received"]
    assert received[-1] == "session.done" and "error" not in received
    assert page.js(browser, "window.playground.played") < page.js(browser, "window.playground.received")
