"""The integrations' tests run inside the real frameworks (this virtualenv) against a live daphne
started with the server's own virtualenv: tests/support/live.py's DaphneServer, given that venv's
python. SPEECH_SERVER_VENV names another server virtualenv (default: the repository's .venv);
SPEECH_SERVER_URL runs them against a server that is already running instead (its WebSocket URL,
with SPEECH_IDLE_TIMEOUT_S=2)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.live: standard library and websockets only

from tests.support.live import DaphneServer  # noqa: E402

SERVER_PYTHON = Path(os.environ.get("SPEECH_SERVER_VENV", REPO / ".venv")) / "bin" / "python"
# Short enough that a test outlives it: only keep-alives hold an idle session open.
IDLE_TIMEOUT_S = 2


@dataclass(frozen=True)
class Running:
    ws_url: str


@pytest.fixture(scope="session")
def server():
    if os.environ.get("SPEECH_SERVER_URL"):
        yield Running(os.environ["SPEECH_SERVER_URL"])
        return
    with DaphneServer(
        {"SPEECH_ENGINE": "hibari", "SPEECH_IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S)}, python=str(SERVER_PYTHON)
    ) as srv:
        yield srv
    srv.assert_no_traceback()
    srv.cleanup()
