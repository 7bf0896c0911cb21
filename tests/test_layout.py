"""Imports go one way: the session core (speech/stream/) talks to the world through the ports it defines
(Transport, the engine, the Meter) and imports nothing of the adapters or of the frameworks, every
module imports only from its own layer or the layers below it, and no import circle spans two parts of
the layer table. Only speech/server/ reaches into daphne, Twisted, autobahn and zope (so speech/web/
is Django and Channels alone), and speech/server/ uses nothing of speech/web/ or speech/control/.
Every rule is checked on the code and has a companion test showing that the checker sees a planted
violation.

The import graph holds every import of a module, at its top, inside functions and under
`if TYPE_CHECKING:` alike: a type-only import still ties the two modules together for a reader.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("speech", "ttsproject")
SCRIPTS = ("manage",)  # modules at the project's root
CORE = "speech.stream"
SERVER = "speech.server"
SERVER_ONLY = ("twisted", "autobahn", "zope", "daphne")  # only speech.server imports these
SERVER_NEVER = ("speech.web", "speech.control")  # what speech.server never imports
EXACT = ("speech",)  # entries of the layer table that name one module, not a package

# What the core never imports: the adapters and the Django app of this project, and the frameworks.
CORE_FORBIDDEN = (
    "speech.web",
    "speech.server",
    "speech.control",
    "speech.metrics",
    "speech.models",
    "speech.admin",
    "speech.runtime",
    "speech.conf",
    "speech.voices",
    "django",
    "channels",
    "channels_redis",
    "daphne",
    "twisted",
    "autobahn",
    "zope",
    "prometheus_client",
)

# The layers, lowest first. A module belongs to the entry that is the longest prefix of its name, and
# may import modules of its own layer or of lower ones. The audio chain and a few plain helpers sit
# below the core, which encodes audio with them; the engines implement the core's engine port; the
# adapters (settings, metrics, the control plane over Redis and the database's models, the daphne
# extension, the HTTP and WebSocket endpoints) wire them to the world; the Django app's entry points
# (admin, views, the Channels consumer, the project) sit on top.
LAYERS = (
    ("libraries", ("speech.audio", "speech.threads", "speech.logcontext", "speech.memory", "speech.client")),
    ("core", ("speech", CORE)),  # "speech": the package's own __init__ only (EXACT)
    ("engines", ("speech.engines",)),
    (
        "adapters",
        (
            "speech.conf",
            "speech.runtime",
            "speech.metrics",
            "speech.voices",
            "speech.models",
            "speech.security",
            "speech.control",
            "speech.server",
            "speech.web",
        ),
    ),
    (
        "app",
        (
            "speech.apps",
            "speech.checks",
            "speech.admin",
            "speech.management",
            "speech.migrations",
            "speech.web.views",
            "speech.web.consumers",
            "speech.web.routing",
            "ttsproject",
            "manage",
        ),
    ),
)


# -- the import graph --------------------------------------------------------------------------------------
def module_names(root: Path) -> dict[str, Path]:
    """Every module of the project's packages under `root`: dotted name -> file."""
    found = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    for script in SCRIPTS:
        if (root / f"{script}.py").exists():
            found[script] = root / f"{script}.py"
    return found


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of everything `module` imports, relative imports resolved; `from a import b`
    names `a.b` (a module, or a name in `a`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")[: len(module.split(".")) - (0 if is_package else 1)]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project's modules it imports (a name is cut back to the module that holds it)."""
    edges = {}
    for module, path in modules.items():
        targets = set()
        for _, name in imports(path.read_text(), module, path.name == "__init__.py"):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        edges[module] = targets
    return edges


def part(module: str) -> tuple[int, str] | None:
    """(layer index, table entry) of a module: the entry that is the longest prefix of its name."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (module.startswith(prefix + ".") and prefix not in EXACT)
            if inside and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    return best


# -- the rules ---------------------------------------------------------------------------------------------
def core_violations(modules: dict[str, Path]) -> dict[str, list[tuple[int, str]]]:
    """Core module -> (line, name) of each import of something the core must not import."""
    found = {}
    for module, path in modules.items():
        if module == CORE or module.startswith(CORE + "."):
            hits = [
                (line, name)
                for line, name in imports(path.read_text(), module, path.name == "__init__.py")
                if any(name == bad or name.startswith(bad + ".") for bad in CORE_FORBIDDEN)
            ]
            if hits:
                found[module] = hits
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def server_only_violations(modules: dict[str, Path]) -> dict[str, list[tuple[int, str]]]:
    """Module outside speech.server -> (line, name) of each import of daphne, Twisted, autobahn or zope."""
    found = {}
    for module, path in modules.items():
        if not within(module, SERVER):
            hits = [
                (line, name)
                for line, name in imports(path.read_text(), module, path.name == "__init__.py")
                if name.split(".")[0] in SERVER_ONLY
            ]
            if hits:
                found[module] = hits
    return found


def server_reaching_up(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import by speech.server of speech.web or speech.control."""
    return sorted(
        (a, b) for a, targets in edges.items() if within(a, SERVER) for b in targets if any(within(b, p) for p in SERVER_NEVER)
    )


def unplaced(edges: dict[str, set[str]]) -> list[str]:
    return sorted(module for module in edges if part(module) is None)


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a module of a higher layer."""
    return sorted((a, b) for a, targets in edges.items() for b in targets if part(b)[0] > part(a)[0])  # type: ignore[index]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected components, Tarjan's) whose modules fall in more than one
    entry of the layer table: a circle inside one package is that package's business."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len({part(m) for m in component}) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


# -- the project keeps them ----------------------------------------------------------------------------------
MODULES = module_names(PROJECT_ROOT)
EDGES = graph(MODULES)


def test_the_graph_holds_the_project():
    assert {"speech.stream.session", "speech.stream.engine", "speech.web.consumers", "ttsproject.asgi"} <= set(EDGES)
    assert "speech.stream.engine" in EDGES["speech.stream.pipeline"]  # a relative import, resolved
    assert "speech.stream.pipeline" in EDGES["speech.stream.session"]


def test_the_core_imports_no_adapter_and_no_framework():
    assert core_violations(MODULES) == {}


def test_every_module_has_a_layer():
    assert unplaced(EDGES) == []


def test_only_the_server_package_imports_daphne_twisted_autobahn_or_zope():
    assert server_only_violations({m: MODULES[m] for m in ("speech.server.websocket",)}) == {}  # its own
    assert any(name.split(".")[0] == "autobahn" for _, name in imports(MODULES["speech.server.websocket"].read_text(), "x"))
    assert server_only_violations(MODULES) == {}


def test_the_server_package_imports_nothing_of_web_or_control():
    """speech/web/ uses speech/server/ (the connection, the budget): never the other way round."""
    assert "speech.server.connection" in EDGES["speech.web.consumers"]
    assert server_reaching_up(EDGES) == []


def test_imports_only_go_down_the_layers():
    assert upward(EDGES) == []


def test_no_import_circle_spans_two_parts():
    assert circles(EDGES) == []


def test_the_session_core_loads_without_django_or_the_server():
    """Importing the session (and through it the pipeline, the engine port and the audio chain) loads
    not one module of Django, Channels, daphne, Twisted, autobahn or Prometheus."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    frameworks = ("django", "channels", "daphne", "twisted", "autobahn", "prometheus_client")
    probe = (
        "import sys, speech.stream.session, speech.stream.oneshot; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {frameworks!r}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- and the checks see a planted violation -------------------------------------------------------------------
def plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_names(tmp_path)


def test_the_check_sees_a_django_import(tmp_path):
    modules = plant(
        tmp_path,
        {"speech/stream/bad.py": "import os\nfrom django.conf import settings\n\ndef f():\n    import channels.layers\n"},
    )
    assert core_violations(modules) == {"speech.stream.bad": [(2, "django.conf.settings"), (5, "channels.layers")]}


def test_the_check_sees_the_core_reach_an_adapter_relatively_and_for_types_only(tmp_path):
    source = "from typing import TYPE_CHECKING\nfrom .. import metrics\nif TYPE_CHECKING:\n    from ..web.consumers import C\n"
    modules = plant(tmp_path, {"speech/stream/bad.py": source, "speech/stream/__init__.py": "from ..server import x\n"})
    assert core_violations(modules) == {
        "speech.stream.bad": [(2, "speech.metrics"), (4, "speech.web.consumers.C")],
        "speech.stream": [(1, "speech.server.x")],
    }


def test_the_check_sees_an_import_up_the_layers(tmp_path):
    modules = plant(
        tmp_path,
        {
            "speech/engines/bad.py": "def f():\n    from ..web import api\n",
            "speech/web/api.py": "from ..stream import session\n",
            "speech/stream/session.py": "",
        },
    )
    assert upward(graph(modules)) == [("speech.engines.bad", "speech.web.api")]


def test_the_check_sees_a_module_outside_the_table(tmp_path):
    modules = plant(tmp_path, {"speech/elsewhere.py": "", "speech/stream/session.py": ""})
    assert unplaced(graph(modules)) == ["speech.elsewhere"]


def test_the_check_sees_a_circle_across_parts_not_one_inside_a_package(tmp_path):
    modules = plant(
        tmp_path,
        {
            "speech/stream/session.py": "from .pipeline import Pipeline\n",
            "speech/stream/pipeline.py": "from .session import Transport\n",  # inside the core: allowed
            "speech/web/api.py": "from .auth import key\n",
            "speech/web/auth.py": "from ..metrics import refused\n",
            "speech/metrics.py": "from .web import api\n",  # web -> metrics -> web: two parts
        },
    )
    assert circles(graph(modules)) == [["speech.metrics", "speech.web.api", "speech.web.auth"]]


def test_the_check_sees_a_twisted_import_planted_in_web(tmp_path):
    modules = plant(
        tmp_path,
        {
            "manage.py": "import os\n",
            "speech/server/websocket.py": "from autobahn.exception import Disconnected\n",
            "speech/web/consumers.py": "from ..server import connection\ndef f():\n    from twisted.internet import reactor\n",
            "ttsproject/asgi.py": "import zope.interface\n",
        },
    )
    assert server_only_violations(modules) == {
        "speech.web.consumers": [(3, "twisted.internet.reactor")],
        "ttsproject.asgi": [(1, "zope.interface")],
    }


def test_the_check_sees_the_server_reach_into_web(tmp_path):
    modules = plant(
        tmp_path,
        {
            "speech/server/websocket.py": "from ..web import consumers\nfrom . import budget\n",
            "speech/server/budget.py": "def f():\n    from speech.control.signals import send\n",
            "speech/web/consumers.py": "",
            "speech/control/signals.py": "",
        },
    )
    assert server_reaching_up(graph(modules)) == [
        ("speech.server.budget", "speech.control.signals"),
        ("speech.server.websocket", "speech.web.consumers"),
    ]
