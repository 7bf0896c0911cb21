"""Headless Chromium (Debian's chromium and chromium-driver) driven by Selenium, for the tests
that need a real browser: the admin's voice player and the playground."""

import contextlib
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
    """A Chrome WebDriver on a fresh profile; the browser console is readable with get_log("browser").
    `flags`: more command-line switches (e.g. --host-resolver-rules to reach this machine by a host name)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, *flags, f"--user-data-dir={profile_dir}", f"--window-size={window[0]},{window[1]}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
