"""The README's minimal bot, run as written (the server's port aside) against a live daphne."""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def first_python_block() -> str:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]


def test_the_minimal_bot_writes_its_speech_and_prints_each_word(server, tmp_path):
    code = first_python_block()
    assert "ws://127.0.0.1:8000/v1/audio/speech/stream" in code
    (tmp_path / "bot.py").write_text(code.replace("ws://127.0.0.1:8000/v1/audio/speech/stream", server.ws_url))
    done = subprocess.run([sys.executable, "bot.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    said = re.findall(r"[\w']+", done.stdout.lower())
    assert said == "hello there i am a bot speaking through your own server".split()
    assert len(done.stdout.split("\n")) > 10  # one line a word: timed words, not a sentence at once
    with wave.open(str(tmp_path / "bot.wav")) as audio:
        assert audio.getframerate() == 24000 and audio.getnframes() / 24000 > 2.0
