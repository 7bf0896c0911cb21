"""The playground follows the words (issue 42, item 4), in headless Chromium against a real daphne with
the Hibari engine: it asks for word timestamps and marks each word as the player plays it (by the
AudioContext's clock, not when its audio arrived); Stop tells the server how much was played
(`played_ms`, from the worklet's own count) and shows the server's account of what was heard and what
was not. The WebSocket frames are read from Chrome DevTools' network events, not from the page."""

import pytest

from tests.support.browser import chromium, needs_chromium, websocket_frames
from tests.support.live import serving, wait_for
from tests.support.playground import click, finished, js, open_page, set_text, utterance, utterance_field

pytestmark = [pytest.mark.live, pytest.mark.heavy, needs_chromium]
TWO_SENTENCES = "The quick brown fox jumps over the lazy dog. Then it runs into the forest."
LONG = " ".join(f"This is sentence number {n}, and it goes on for a little while." for n in range(1, 9))


@pytest.fixture(scope="module")
def server():
    with serving({"SPEECH_ENGINE": "hibari"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


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
    open_page(browser, server.http_url + "/")
    websocket_frames(browser)  # forget earlier frames
    set_text(browser, TWO_SENTENCES)
    click(browser, "speak")
    # Everything has arrived (the server sends faster than real time) and the first words are played.
    wait_for(lambda: (u := utterance(browser)) and u["closed"] is False and len(u["segments"]) == 2, "both segments")
    wait_for(lambda: (u := utterance(browser))["bytesReceived"] == u["bytesAnnounced"] > 0, "all the audio arrived")
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

    wait_for(lambda: finished(browser), "everything is played and the session ends", timeout=60)
    words = shown_words(browser)
    assert all(w["heard"] and not w["unheard"] for w in words)
    order = [tuple(map(int, key.split(":"))) for key in js(browser, "window.playground.highlights")]
    assert order == sorted(set(order)), order  # each word once, in the order of the text
    assert order[0] == (0, 0) and order[-1] == (1, 5)  # from the first word of the text to its last
    assert len(order) >= 0.8 * len(words)  # a display frame may miss a word shorter than itself
    sent = [frame for direction, frame in websocket_frames(browser) if direction == "sent"]
    assert sent[0]["session"]["timestamps"] == "word"
    assert [f["type"] for f in sent][-2:] == ["input.done", "input.done"]  # the context's, then the session's


def test_stop_sends_what_was_played_and_shows_what_was_heard(server, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url + "/")
    websocket_frames(browser)
    set_text(browser, LONG)
    click(browser, "speak")
    rate = 24000
    wait_for(lambda: js(browser, "window.playground.played") > 3 * rate, "three seconds have played", timeout=60)
    click(browser, "stop")
    wait_for(lambda: utterance_field(browser, "closed"), "the session ends after Stop")
    played = js(browser, "window.playground.played")  # the worklet's count: nothing was played after Stop
    assert played < utterance(browser)["bytesReceived"] // 2

    frames = websocket_frames(browser)
    [cancel] = [f for d, f in frames if d == "sent" and f["type"] == "input.cancel"]
    [cancelled] = [f for d, f in frames if d == "received" and f["type"] == "input.cancelled"]
    assert cancel == {"type": "input.cancel", "context_id": "speak", "played_ms": round(1000 * played / rate)}
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
    assert js(browser, "document.activeElement.id") == "speak"  # the focus went back to Speak
