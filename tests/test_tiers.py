"""The tier check of conftest.py (tests/support/tiers.py) refuses what it should, and the tiers hold."""

from __future__ import annotations

import ast

import pytest

from tests.support import tiers
from tests.support.live import PROJECT_ROOT


@pytest.mark.parametrize(
    "source",
    [
        "with DaphneServer(env) as server:",
        "with serving({'SPEECH_ENGINE': 'hibari'}) as srv:",
        "server = module_server()",
        'a = Instances("prefix-", env).server("A")',
        "redis_server = RedisServer().start()",
        "nginx = Nginx(upstreams).start()",
    ],
)
def test_a_module_that_starts_a_server_needs_live(source):
    assert tiers.problems(source, set()) != []
    assert tiers.problems(source, {"live"}) == []


@pytest.mark.parametrize(
    "source", ["def test_x(server, whisper):", "assert_heard(audio, text)", "with chromium(tmp) as browser:"]
)
def test_whisper_or_a_browser_needs_heavy(source):
    assert tiers.problems(source, {"live"}) != []
    assert tiers.problems(source, {"live", "heavy"}) == []


@pytest.mark.parametrize("markers", [{"heavy"}, {"deploy"}])
def test_heavy_and_deploy_are_live_too(markers):
    assert tiers.problems("x = 1", markers) != []
    assert tiers.problems("x = 1", markers | {"live"}) == []


def test_in_process_code_needs_no_marker():
    # Only checking an nginx configuration (nginx -t) starts nothing.
    assert tiers.problems("nginx = Nginx(upstreams).configure()\ncode, said = nginx.test_config()", set()) == []


def test_no_test_module_is_imported_by_another():
    """Shared code lives in tests/support/ (or conftest.py); a test module imported as a library would run
    its module-level set-up twice and hide what it shares."""
    for path in sorted((PROJECT_ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + ([alias.name for alias in node.names] if node.module is None else [])
            else:
                continue
            assert not any("test_" in name for name in names), f"{path.name}:{node.lineno} imports {names}"
    for path in sorted((PROJECT_ROOT / "bench").glob("*.py")):
        assert "tests.test_" not in path.read_text(), path.name
