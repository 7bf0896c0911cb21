"""The playground page (`/`) in headless Chromium against a real daphne with the Hibari engine:
it loads clean, plays what the server sends through its AudioWorklet, stops at once, speaks word
by word before the text is complete, shows server errors and goes on; with keys required, the
token flows work and the key is kept nowhere. The README's screenshot is taken here."""

import re

import numpy as np
import pytest

from tests.support.browser import needs_chromium
from tests.support.live import PROJECT_ROOT, serving, wait_for
from tests.support.playground import (  # noqa: F401 (the fixtures server and browser)
    TWO_SENTENCES,
    browser_fixture,
    click,
    console_errors,
    finished,
    heard,
    js,
    open_page,
    server_fixture,
    set_text,
    speak_enabled,
    utterance,
    utterance_field,
)
from tests.support.speech_check import assert_heard

pytestmark = [pytest.mark.live, pytest.mark.heavy, needs_chromium]
SCREENSHOT = PROJECT_ROOT / "docs" / "playground.png"
LONG = " ".join(f"This is sentence number {n}, and it goes on for a little while." for n in range(1, 13))
PASSWORD = "a-long-test-password-1"


def test_page_loads_with_no_console_errors(server, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url + "/")
    voices = [o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#voice option")]
    assert "heart" in voices
    sources = [
        e.get_attribute("src") or e.get_attribute("href")
        for e in browser.find_elements(By.CSS_SELECTOR, "script[src], link[href]")
    ]
    assert sources and all(s.startswith(server.http_url + "/static/") for s in sources), sources  # no CDN
    assert console_errors(browser) == []


def test_speak_plays_what_the_server_sent(server, browser, whisper):
    open_page(browser, server.http_url + "/")
    set_text(browser, TWO_SENTENCES)
    click(browser, "speak")
    wait_for(lambda: js(browser, "window.playground.played") > 0, "the worklet plays audio")
    wait_for(lambda: finished(browser), "everything received is played", timeout=60)
    u = utterance(browser)
    assert u["bytesReceived"] == u["bytesAnnounced"] > 0  # every byte the server says it sent arrived
    assert js(browser, "window.playground.played") == u["bytesReceived"] // 2  # and was played, 16-bit mono
    assert [s["end"] for s in u["segments"]] == ["done", "done"]
    assert all(s["ttfa"] is not None and s["ttfa"] >= 0 for s in u["segments"])
    samples, rate = heard(browser)
    assert rate == 24000 and samples.size == u["bytesReceived"] // 2
    assert_heard(whisper, samples, rate, TWO_SENTENCES)
    SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))
    assert console_errors(browser) == []


def test_mulaw_at_its_own_rate_plays_every_sample(server, browser):
    open_page(browser, server.http_url + "/")
    browser.execute_script("document.getElementById('format').value = 'mulaw';")
    speak_and_wait(browser, "Telephone quality.")
    u = utterance(browser)
    assert js(browser, "window.playground.rate") == 8000
    assert js(browser, "window.playground.played") == u["bytesReceived"] == u["bytesAnnounced"]  # a byte a sample
    samples, _ = heard(browser)
    assert float(np.sqrt(np.mean(samples**2))) > 0.02


def stop_and_check_silence(browser):
    """Stop: the worklet's queue is empty at once, the page says so, and nothing more is played."""
    from selenium.webdriver.common.by import By

    click(browser, "stop")
    wait_for(lambda: js(browser, "window.playground.buffered") == 0, "Stop empties the worklet's queue")
    played = js(browser, "window.playground.played")
    status = browser.find_element(By.ID, "status")
    wait_for(lambda: re.fullmatch(r"Stopped: silent \d+ ms after Stop\.", status.text), "the page says it is silent")
    wait_for(lambda: utterance_field(browser, "closed"), "the session ends")
    assert js(browser, "window.playground.played") == played  # nothing more was played after Stop
    assert js(browser, "window.playground.buffered") == 0
    u = utterance(browser)
    assert played < u["bytesReceived"] // 2  # audio had arrived that was never played
    return u


def test_stop_silences_at_once_and_the_next_speak_works(server, browser):
    # The whole text: the server may have sent all of it already (it sends as fast as the page
    # reads); Stop must still silence what is buffered.
    open_page(browser, server.http_url + "/")
    set_text(browser, LONG)
    click(browser, "speak")
    wait_for(lambda: js(browser, "window.playground.played") > 24000 // 2, "half a second has played")
    stop_and_check_silence(browser)

    # Word by word, the session is still open: Stop also cancels it on the server and stops sending.
    set_text(browser, LONG, mode="words", pace=100)
    click(browser, "speak")
    wait_for(lambda: js(browser, "window.playground.played") > 24000 // 2, "half a second has played")
    u = stop_and_check_silence(browser)
    assert u["cancelledSentences"] is not None  # the server answered input.cancel with input.cancelled
    assert u["wordsSent"] < u["wordsTotal"]

    set_text(browser, "And now something else.")
    click(browser, "speak")
    wait_for(lambda: finished(browser) and js(browser, "window.playground.played") > 0, "the next Speak plays")
    assert [s["end"] for s in utterance(browser)["segments"]] == ["done"]
    assert console_errors(browser) == []


def test_word_by_word_speaks_before_the_text_is_complete(server, browser):
    open_page(browser, server.http_url + "/")
    set_text(browser, "Hello there. " + LONG, mode="words", pace=150)
    click(browser, "speak")
    wait_for(lambda: utterance_field(browser, "wordsAtFirstAudio") is not None, "audio arrives", timeout=60)
    u = utterance(browser)
    assert 2 <= u["wordsAtFirstAudio"] < u["wordsTotal"]
    wait_for(lambda: js(browser, "window.playground.played") > 0, "and is played")
    click(browser, "stop")
    wait_for(lambda: utterance_field(browser, "closed"), "the session ends after Stop")


def test_a_server_error_is_shown_and_the_page_keeps_working(server, browser):
    from selenium.webdriver.common.by import By

    open_page(browser, server.http_url + "/")
    set_text(browser, "x" * 5000 + " Then this.")  # one segment over the 4096-character limit
    click(browser, "speak")
    box = browser.find_element(By.ID, "error")
    wait_for(lambda: box.is_displayed(), "the error is shown")
    assert "refused" in box.text and "at most 4096 characters" in box.text
    wait_for(lambda: utterance_field(browser, "closed"), "the session still ends normally")

    set_text(browser, "Still working.")
    click(browser, "speak")
    wait_for(lambda: finished(browser) and js(browser, "window.playground.played") > 0, "the next Speak plays")
    assert not box.is_displayed()


# -- keys required -----------------------------------------------------------------------------

SETUP = """
from django.contrib.auth import get_user_model
from speech.models import ApiKey
get_user_model().objects.create_superuser("admin", "admin@example.com", {password!r})
print(ApiKey.issue("browser")[1])
"""
USED_TOKENS = "from speech.models import AccessToken; print(AccessToken.objects.filter(used_at__isnull=False).count())"


def manage_shell(srv, code):
    return srv.manage("shell", "-c", code).strip().splitlines()[-1]  # after the banner of shell's automatic imports


@pytest.fixture(scope="module")
def keyed():
    with serving({"SPEECH_ENGINE": "fake", "SPEECH_REQUIRE_API_KEY": "true"}) as srv:
        srv.key = manage_shell(srv, SETUP.format(password=PASSWORD))
        yield srv


def speak_and_wait(browser, text="Hello there."):
    set_text(browser, text)
    click(browser, "speak")
    wait_for(lambda: finished(browser) and js(browser, "window.playground.played") > 0, "the page plays")


def test_with_keys_required_the_key_buys_tokens_and_is_kept_nowhere(keyed, browser):
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(keyed.http_url + "/")
    form, error = browser.find_element(By.ID, "key-form"), browser.find_element(By.ID, "error")
    wait_for(lambda: form.is_displayed(), "the page asks for a key")
    browser.find_element(By.ID, "key").send_keys("tts_00000000.wrong")
    click(browser, "key-submit")
    wait_for(lambda: error.is_displayed(), "a wrong key is refused in words")
    assert "did not accept the API key" in error.text

    browser.find_element(By.ID, "key").send_keys(keyed.key)
    click(browser, "key-submit")
    wait_for(lambda: browser.find_element(By.ID, "speak").is_enabled(), "the key is accepted")
    assert not form.is_displayed()
    before = int(manage_shell(keyed, USED_TOKENS))
    speak_and_wait(browser)
    speak_and_wait(browser)  # a new token for each session; the key is asked for once
    assert int(manage_shell(keyed, USED_TOKENS)) == before + 2

    stored = js(browser, "JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])")
    cookies = " ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())
    assert keyed.key not in stored and keyed.key not in cookies and keyed.key not in browser.current_url
    assert js(browser, "document.getElementById('key').value") == ""
    assert console_errors(browser) == [] or all("401" in e["message"] for e in console_errors(browser))


def test_with_keys_required_a_staff_user_needs_no_key(keyed, browser):
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(f"{keyed.http_url}/admin/login/?next=/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: speak_enabled(browser), "the page is ready without a key")
    assert not browser.find_element(By.ID, "key-form").is_displayed()
    speak_and_wait(browser)
    browser.delete_all_cookies()
    browser.get(keyed.http_url + "/")
    wait_for(lambda: browser.find_element(By.ID, "key-form").is_displayed(), "logged out, a key is needed again")
