"""The playground explains itself (issue 45, item 4), in headless Chromium against a real daphne with
the Hibari engine: on plain HTTP at a host name that is not localhost (no secure context, so no
AudioWorklet) it says why it cannot play and what to do; an exception during Speak is shown in words;
text with nothing to say gets a message instead of a session; text longer than one frame goes in
several frames; and it works by keyboard, checked in the browser's accessibility tree (Chrome DevTools
Protocol). Chromium reaches the host name through `--host-resolver-rules`, never DNS."""

import pytest

from tests.support.browser import chromium, needs_chromium
from tests.support.live import serving, wait_for

pytestmark = [pytest.mark.live, pytest.mark.heavy, needs_chromium]

HOST = "speech.test"
SENTENCE = "This sentence is here to make the text long, and it is spoken one after another. "


@pytest.fixture(scope="module")
def server():
    with serving({"SPEECH_ENGINE": "hibari", "DJANGO_ALLOWED_HOSTS": f"{HOST},127.0.0.1,localhost"}) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    flags = (f"--host-resolver-rules=MAP {HOST} 127.0.0.1",)
    with chromium(tmp_path_factory.mktemp("chromium-profile"), flags=flags) as driver:
        yield driver


def js(browser, expression):
    return browser.execute_script(f"return {expression};")


def element(browser, element_id):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, element_id)


def open_page(browser, url, *, ready=True):
    browser.get(url)
    wait_for(lambda: js(browser, "document.getElementById('voice').options.length") > 0, "the voices are listed")
    if ready:
        wait_for(lambda: element(browser, "speak").is_enabled(), "the page is ready to speak")


def set_text(browser, text):
    browser.execute_script("document.getElementById('text').value = arguments[0];", text)


def error_text(browser):
    box = element(browser, "error")
    wait_for(box.is_displayed, "an error is shown")
    return box.text


def console_errors(browser):
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def focused(browser):
    """(role, name) of the focused node in Chromium's accessibility tree: the page's own node
    (RootWebArea) when nothing in it has the focus."""
    browser.execute_cdp_cmd("Accessibility.enable", {})
    nodes = browser.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
    found = [
        (node["role"]["value"], node.get("name", {}).get("value"))
        for node in nodes
        if any(p["name"] == "focused" and p["value"]["value"] for p in node.get("properties", []))
    ]
    inside = [role_name for role_name in found if role_name[0] != "RootWebArea"]
    return (inside or found or [None])[-1]


def ax_nodes(browser, role):
    browser.execute_cdp_cmd("Accessibility.enable", {})
    nodes = browser.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
    return [node.get("name", {}).get("value") for node in nodes if node.get("role", {}).get("value") == role]


def test_on_plain_http_at_a_host_name_the_page_says_why_it_cannot_play(server, browser):
    open_page(browser, f"http://{HOST}:{server.port}/", ready=False)
    assert js(browser, "window.isSecureContext") is False
    said = error_text(browser)
    assert "cannot play audio here" in said and "HTTPS" in said and "localhost" in said
    assert f"{HOST}:{server.port}" in said
    assert not element(browser, "speak").is_enabled()
    assert element(browser, "status").text == "Cannot play on this page."
    # The page's own scripts raise nothing; Chromium's one complaint is that it ignores Django's
    # Cross-Origin-Opener-Policy header on an origin that is not trustworthy (plain HTTP).
    assert [e for e in console_errors(browser) if "Cross-Origin-Opener-Policy" not in e["message"]] == []
    # Even when Speak is forced on, what the browser refuses is said in words, not thrown away.
    browser.execute_script("document.getElementById('speak').disabled = false;")
    element(browser, "speak").click()
    wait_for(lambda: "Speak failed in this page" in element(browser, "error").text, "the failure is shown")
    assert "no AudioWorklet" in element(browser, "error").text
    assert js(browser, "window.playground.utterance") is None  # no session was opened


def test_an_exception_during_speak_is_shown_in_words(server, browser):
    open_page(browser, server.http_url + "/")
    browser.execute_script("AudioWorkletNode.prototype.connect = () => { throw new TypeError('the output is gone'); };")
    set_text(browser, "Hello there.")
    element(browser, "speak").click()
    assert error_text(browser) == "Speak failed in this page: the output is gone. Reload the page to try again."
    wait_for(lambda: element(browser, "speak").is_enabled(), "Speak is available again")
    assert js(browser, "window.playground.utterance") is None


@pytest.mark.parametrize("text", ["", "   \n ", "... !!! --"])
def test_text_with_nothing_to_speak_gets_a_message_and_no_session(server, browser, text):
    open_page(browser, server.http_url + "/")
    set_text(browser, text)
    element(browser, "speak").click()
    assert error_text(browser) == "There is nothing to speak: type some words (the text has no letter or digit)."
    assert js(browser, "window.playground.utterance") is None
    assert js(browser, "document.activeElement.id") == "text"


def test_text_longer_than_one_frame_is_sent_in_several_frames(server, browser):
    open_page(browser, server.http_url + "/")
    text = SENTENCE * 1700  # about 140,000 bytes: more than one frame of 131072
    set_text(browser, text)
    element(browser, "speak").click()
    wait_for(lambda: js(browser, "window.playground.played") > 0, "the page plays", 60)
    u = js(browser, "window.playground.utterance")
    assert u["framesSent"] == 2 and not element(browser, "error").is_displayed()
    element(browser, "stop").click()
    wait_for(lambda: js(browser, "window.playground.utterance.closed"), "the session ends after Stop", 60)
    assert not element(browser, "error").is_displayed()


def test_by_keyboard_focus_goes_to_stop_and_back_to_speak_in_the_accessibility_tree(server, browser):
    from selenium.webdriver.common.keys import Keys

    open_page(browser, server.http_url + "/")
    assert "Text to speak" in ax_nodes(browser, "textbox")  # the main text box has a label
    set_text(browser, SENTENCE * 20)
    browser.execute_script("document.getElementById('speak').focus();")
    assert focused(browser) == ("button", "Speak")
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for(lambda: focused(browser) == ("button", "Stop"), "the focus moves to Stop")
    wait_for(lambda: js(browser, "window.playground.played") > 0, "the page plays", 60)
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for(lambda: focused(browser) == ("button", "Speak"), "the focus comes back to Speak", 60)
    assert js(browser, "document.activeElement.id") == "speak"
    assert not element(browser, "stop").is_enabled()
