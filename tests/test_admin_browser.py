"""The admin in a real browser (headless Chromium driven by Selenium) against a real daphne:
log in, see the voice list with its columns, and play a reference through the player."""

import wave

import numpy as np
import pytest

from tests.support.browser import chromium, needs_chromium
from tests.support.live import DaphneServer

pytestmark = [pytest.mark.live, pytest.mark.heavy, needs_chromium]
PASSWORD = "a-long-test-password-1"
SECONDS = 2.0

SETUP = """
from django.contrib.auth import get_user_model
from speech import voices
get_user_model().objects.create_superuser("admin", "admin@example.com", {password!r})
with open({path!r}, "rb") as f:
    voices.create_voice(name="Alice", consent="Recorded with consent.", data=f.read(), filename="alice.wav",
                        content_type="audio/wav", transcript="A test tone.")
"""


def tone_wav(path, seconds=SECONDS, rate=16000):
    t = np.arange(int(rate * seconds)) / rate
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    sample = tmp_path_factory.mktemp("sample") / "alice.wav"
    tone_wav(sample)
    with DaphneServer({"SPEECH_ENGINE": "fake", "MEDIA_ROOT": str(media)}) as srv:
        srv.manage("shell", "-c", SETUP.format(password=PASSWORD, path=str(sample)))
        yield srv
        srv.assert_no_traceback()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def test_admin_lists_voices_and_plays_a_reference(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server.http_url}/admin/login/?next=/admin/speech/voice/")
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 20).until(ready.presence_of_element_located((By.ID, "result_list")))
    browser.save_screenshot(str(tmp_path / "voices.png"))

    headers = [th.text.strip().lower() for th in browser.find_elements(By.CSS_SELECTOR, "#result_list thead th")]
    assert any("duration" in h for h in headers) and any("sample rate" in h for h in headers)
    assert any("created at" in h for h in headers)
    row = browser.find_element(By.CSS_SELECTOR, "#result_list tbody tr")
    assert "Alice" in row.text and "2.0" in row.text and "16000" in row.text

    # The player: the browser loads the reference through the admin's audio view and plays it.
    player = row.find_element(By.TAG_NAME, "audio")
    played = browser.execute_async_script(
        """
        const [audio, done] = arguments;
        audio.addEventListener("error", () => done({error: String(audio.error && audio.error.code)}));
        audio.addEventListener("playing", () => done({duration: audio.duration, time: audio.currentTime}));
        audio.muted = true;
        audio.play().catch((e) => done({error: String(e)}));
    """,
        player,
    )
    assert "error" not in played, played
    assert played["duration"] == pytest.approx(SECONDS, abs=0.05)
