"""The session core (speech/stream/) stays free of Django and Channels, so it can be driven and
reused without a configured project; and only speech/server/ reaches into daphne, Twisted, autobahn
and zope, so speech/web/ is Django and Channels alone."""

import ast
import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
STREAM = PROJECT_ROOT / "speech" / "stream"
FORBIDDEN = ("django", "channels", "channels_redis", "daphne")


def imports_of(path, packages):
    """(line, module) for every absolute import in the module at path of one of `packages`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules = [node.module]
        else:
            continue
        found += [(node.lineno, m) for m in modules if m.split(".")[0] in packages]
    return found


def web_imports(path):
    """(line, module) for every import of a forbidden package in the module at path."""
    return imports_of(path, FORBIDDEN)


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


SERVER_ONLY = ("twisted", "autobahn", "zope", "daphne")


def server_only_imports_elsewhere(root):
    """{module: hits} for the modules of the project at `root`, outside speech/server/, that import
    daphne, Twisted, autobahn or zope."""
    server = root / "speech" / "server"
    modules = [*(root / "speech").rglob("*.py"), *(root / "ttsproject").rglob("*.py"), root / "manage.py"]
    hits = {str(m.relative_to(root)): imports_of(m, SERVER_ONLY) for m in modules if m.exists() and server not in m.parents}
    return {name: found for name, found in hits.items() if found}


def test_only_the_server_package_imports_daphne_twisted_autobahn_or_zope():
    assert (PROJECT_ROOT / "speech" / "web" / "consumers.py").exists()
    assert imports_of(PROJECT_ROOT / "speech" / "server" / "websocket.py", SERVER_ONLY) != []
    assert server_only_imports_elsewhere(PROJECT_ROOT) == {}


def test_the_check_sees_a_twisted_import_planted_in_web(tmp_path):
    for folder in ("speech/web", "speech/server", "ttsproject"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "manage.py").write_text("import os\n")
    (tmp_path / "speech" / "server" / "websocket.py").write_text("from autobahn.exception import Disconnected\n")
    (tmp_path / "speech" / "web" / "consumers.py").write_text(
        "from ..server.connection import SCOPE_KEY\n\ndef f():\n    from twisted.internet import reactor\n"
    )
    (tmp_path / "ttsproject" / "asgi.py").write_text("import zope.interface\n")
    assert server_only_imports_elsewhere(tmp_path) == {
        "speech/web/consumers.py": [(4, "twisted.internet")],
        "ttsproject/asgi.py": [(1, "zope.interface")],
    }


def project_imports(path):
    """The speech packages the module at path imports, relative imports resolved (speech/<package>/...)."""
    package = path.parent.relative_to(PROJECT_ROOT).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            names = [*base, *(node.module or "").split(".")] if node.module else [*base, node.names[0].name]
        elif isinstance(node, ast.ImportFrom):
            names = (node.module or "").split(".")
        elif isinstance(node, ast.Import):
            names = node.names[0].name.split(".")
        else:
            continue
        if names[0] == "speech" and len(names) > 1:
            found.add(names[1])
    return found


def test_the_server_package_imports_nothing_of_web_or_control():
    """speech/web/ uses speech/server/ (the connection, the budget): never the other way round."""
    modules = sorted((PROJECT_ROOT / "speech" / "server").rglob("*.py"))
    assert "web" in project_imports(PROJECT_ROOT / "speech" / "management" / "commands" / "serve.py")  # absolute
    assert "server" in project_imports(PROJECT_ROOT / "speech" / "web" / "consumers.py")  # relative
    offenders = {str(m.relative_to(PROJECT_ROOT)): project_imports(m) & {"web", "control"} for m in modules}
    assert {name: found for name, found in offenders.items() if found} == {}
