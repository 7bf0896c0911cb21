"""The test tiers (pytest.ini markers), checked at collection so that they cannot rot.

- in-process (no marker): `make test-fast`; fake engines, Channels' communicator, the Django test client.
- `live`: the module starts real servers (daphne through DaphneServer / serving() / module_server() /
  Instances, a private redis-server through RedisServer, nginx).
- `heavy`: Whisper listens to the audio, or a real browser drives the page; always `live` too.
- `deploy`: the production topology (tests/test_deploy.py); `live` too.

A module is judged by its code (strings and comments aside): one that names a server helper must carry
`live`, one that uses Whisper or the browser must carry `heavy`. `problems()` is what conftest.py runs on every module.
"""

from __future__ import annotations

import io
import re
import tokenize

# Names whose use means "this module starts a server" / "this module needs Whisper or a browser".
LIVE_NAMES = re.compile(r"\b(DaphneServer|RedisServer|serving|module_server|Instances)\b|\bNginx \([^)]*\) \. start\b")
HEAVY_NAMES = re.compile(r"\b(whisper|transcribe|assert_heard|load_whisper|chromium|needs_chromium)\b")


def code_of(source: str) -> str:
    """The source without its strings and comments (a docstring that mentions serving() starts nothing)."""
    skip = {tokenize.STRING, tokenize.COMMENT}
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return " ".join(token.string for token in tokens if token.type not in skip)


def problems(source: str, markers: set[str]) -> list[str]:
    """What is wrong with a test module of this source carrying these marker names (empty: nothing)."""
    found = []
    code = code_of(source)
    if LIVE_NAMES.search(code) and "live" not in markers:
        found.append("starts a server (DaphneServer, serving(), RedisServer, nginx...) without the `live` marker")
    if HEAVY_NAMES.search(code) and "heavy" not in markers:
        found.append("uses Whisper or a browser without the `heavy` marker")
    if ({"heavy", "deploy"} & markers) and "live" not in markers:
        found.append("is `heavy` or `deploy` without `live` (both start servers)")
    return found
