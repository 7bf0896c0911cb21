"""The session core (speech/stream/) stays free of Django and Channels, so it can be driven and
reused without a configured project."""

import ast
import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STREAM = PROJECT_ROOT / "speech" / "stream"
FORBIDDEN = ("django", "channels", "channels_redis", "daphne")


def web_imports(path):
    """(line, module) for every import of a forbidden package in the module at path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module]
        else:
            continue
        found += [(node.lineno, m) for m in modules if m.split(".")[0] in FORBIDDEN]
    return found


def test_the_stream_core_imports_no_django_or_channels():
    modules = sorted(STREAM.rglob("*.py"))
    assert {m.name for m in modules} >= {"protocol.py", "session.py", "pipeline.py", "segmenter.py", "errors.py"}
    offenders = {str(m.relative_to(PROJECT_ROOT)): web_imports(m) for m in modules}
    assert {name: hits for name, hits in offenders.items() if hits} == {}


def test_the_check_sees_a_django_import(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("import os\nfrom django.conf import settings\n\ndef f():\n    import channels.layers\n")
    assert web_imports(module) == [(2, "django.conf"), (5, "channels.layers")]


def test_the_session_core_loads_without_django_settings():
    """Importing the session (and through it the pipeline, the engine interface and the audio chain)
    loads no Django settings: not one module of Django is imported."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    probe = (
        "import sys, speech.stream.session, speech.stream.oneshot; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'channels')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
