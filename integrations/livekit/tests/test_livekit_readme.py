"""The README's example without a room, run as written (the server's port aside) against a live daphne."""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_example_prints_timed_words_and_writes_the_speech(server, tmp_path):
    code = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    assert "ws://127.0.0.1:8000/v1/audio/speech/stream" in code
    (tmp_path / "example.py").write_text(code.replace("ws://127.0.0.1:8000/v1/audio/speech/stream", server.ws_url))
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line.split(maxsplit=2) for line in done.stdout.splitlines()]
    assert [re.sub(r"[^\w]", "", text).lower() for _, _, text in lines if re.search(r"\w", text)] == [
        "how", "can", "i", "help", "you", "today"
    ]  # fmt: skip
    starts = [float(start) for start, _, _ in lines]
    assert starts == sorted(starts)
    with wave.open(str(tmp_path / "agent.wav")) as audio:
        assert audio.getframerate() == 24000 and audio.getnframes() / 24000 > 2.0
