"""The README's client, run as written (port aside) against a real server: the docs stay true."""

import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.support.live import PROJECT_ROOT, DaphneServer

pytestmark = pytest.mark.live


def readme_client_code():
    readme = (Path(PROJECT_ROOT) / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README shows no Python client"
    return blocks[0]


def test_readme_client_writes_speech_to_a_wav_file(tmp_path):
    code = readme_client_code()
    assert "ws://127.0.0.1:8000/v1/audio/speech/stream" in code
    with DaphneServer({"SPEECH_ENGINE": "hibari"}) as server:
        script = tmp_path / "client.py"
        script.write_text(code.replace("ws://127.0.0.1:8000", f"ws://127.0.0.1:{server.port}"))
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        server.assert_no_traceback()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "audio.start Hello there.",
        "audio.done ",
        "audio.start How are you today?",
        "audio.done ",
        "session.done ",
    ]
    with wave.open(str(tmp_path / "out.wav")) as out:
        assert (out.getnchannels(), out.getsampwidth(), out.getframerate()) == (1, 2, 24000)
        samples = np.frombuffer(out.readframes(out.getnframes()), "<i2").astype(np.float32) / 32768
    assert samples.size / 24000 > 1.0  # two sentences of speech
    assert np.sqrt(np.mean(samples**2)) > 0.02  # not silence
