"""Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, for the tests
that need a real browser: the admin's voice player and the playground."""

import contextlib
import json
import shutil

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="Debian's chromium and chromium-driver are installed by make test"
)

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
)


@contextlib.contextmanager
def chromium(profile_dir, *, window=(1280, 1000), flags=()):
    """A Chrome WebDriver on a fresh profile; the browser console is readable with get_log("browser"),
    and the DevTools network events (WebSocket frames included) with get_log("performance"): see
    `websocket_frames`. `flags`: more command-line switches (e.g. --host-resolver-rules to reach this
    machine by a host name)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags, f"--user-data-dir={profile_dir}", f"--window-size={window[0]},{window[1]}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def websocket_frames(driver):
    """The WebSocket text frames the page sent and received since the last call, in order, as
    ("sent" | "received", parsed JSON), read from Chrome DevTools' Network events (not the page)."""
    frames = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        direction = {"Network.webSocketFrameSent": "sent", "Network.webSocketFrameReceived": "received"}
        if message["method"] in direction and message["params"]["response"]["opcode"] == 1:  # text frames
            frames.append((direction[message["method"]], json.loads(message["params"]["response"]["payloadData"])))
    return frames
