"""The playground page driven in headless Chromium: the helpers its browser tests share (the page's
own test hook is `window.playground`, speech/static/speech/playground/app.js)."""

import base64
import io

import pytest

from tests.support.browser import chromium
from tests.support.live import serving, wait_for

TWO_SENTENCES = "The quick brown fox jumps over the lazy dog. Then it runs into the forest."


# The fixtures `server` (a daphne with Hibari) and `browser`, one each per test module that imports
# server_fixture and browser_fixture.
@pytest.fixture(scope="module", name="server")
def server_fixture():
    with serving({"SPEECH_ENGINE": "hibari"}) as srv:
        yield srv


@pytest.fixture(scope="module", name="browser")
def browser_fixture(tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def js(browser, expression):
    return browser.execute_script(f"return {expression};")


def speak_enabled(browser):
    """Whether the page's Speak button is enabled; False while no page with it is shown: a click that
    navigates (the admin login's submit) returns before the next page is there."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return browser.find_element(By.ID, "speak").is_enabled()
    except (NoSuchElementException, StaleElementReferenceException):
        return False


def open_page(browser, url):
    from selenium.webdriver.common.by import By

    browser.get(url)
    wait_for(lambda: browser.find_element(By.ID, "speak").is_enabled(), "the page is ready to speak")


def set_text(browser, text, mode="whole", pace=120):
    browser.execute_script(
        """
        const [text, mode, pace] = arguments;
        document.getElementById("text").value = text;
        document.getElementById("mode").value = mode;
        document.getElementById("pace").value = pace;
    """,
        text,
        mode,
        pace,
    )


def click(browser, element_id):
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, element_id).click()


def utterance(browser):
    return js(browser, "window.playground.utterance")


def utterance_field(browser, name):
    """A field of the current utterance, or None while the page has not started one yet (right
    after a click)."""
    u = utterance(browser)
    return None if u is None else u[name]


def finished(browser):
    """The session has closed and the worklet has played everything it was given."""
    u = utterance(browser)
    return (
        u
        and u["closed"]
        and js(browser, "window.playground.buffered") == 0
        and js(browser, "window.playground.played") == js(browser, "window.playground.received")
    )


def console_errors(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def heard(browser):
    """The page's "download" WAV, decoded: (samples as float, rate)."""
    import soundfile

    data = browser.execute_async_script("""
        const done = arguments[0];
        window.playground.heardWav().arrayBuffer().then((buffer) => {
            let text = "";
            new Uint8Array(buffer).forEach((b) => { text += String.fromCharCode(b); });
            done(btoa(text));
        });
    """)
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(data)), dtype="float32")
    return samples, rate
