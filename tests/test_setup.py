"""Set-up that explains itself (issue 45, item 6): `make run` checks the Python version before it
installs anything and names the fix; uvloop is installed only where it has wheels and the server
runs without it; the README lists the system packages `make test` installs. In-process: `make` and
pip are asked, no server starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def make(*args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    done = subprocess.run(["make", "-s", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def python_310(tmp_path):
    """This machine's Python, claiming to be 3.10 (Ubuntu 22.04's python3) to whatever asks it."""
    fake = tmp_path / "python3.10"
    pretend = "import sys; sys.version_info = (3, 10, 12, 'final', 0); exec(sys.argv[1])"
    fake.write_text(
        f"#!/bin/sh\n"
        f'if [ "$1" = --version ]; then echo "Python 3.10.12"; exit 0; fi\n'
        f'if [ "$1" = -c ]; then exec {sys.executable} -c "{pretend}" "$2"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("goal", ["run", "test"])
def test_make_stops_at_an_old_python_before_installing_and_names_the_fix(tmp_path, goal):
    venv = tmp_path / "venv"
    code, said = make(goal, f"PYTHON={python_310(tmp_path)}", f"VENV={venv}")
    assert code != 0
    assert "is Python 3.10.12; this project needs Python 3.11 or newer" in said
    assert f"make {goal} PYTHON=python3.11" in said
    assert not venv.exists()  # nothing was created or installed


def test_make_names_the_fix_when_the_python_is_missing(tmp_path):
    code, said = make("run", "PYTHON=python3.99", f"VENV={tmp_path / 'venv'}")
    assert code != 0 and "python3.99 is not installed" in said and "make run PYTHON=python3.11" in said


def test_a_good_python_passes_the_check(tmp_path):
    assert make("check-python", f"PYTHON={sys.executable}", f"VENV={tmp_path / 'venv'}") == (0, "")


def test_uvloop_is_required_only_where_it_has_wheels():
    from packaging.markers import Marker
    from packaging.requirements import Requirement

    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    (uvloop,) = [Requirement(line) for line in lines if line.startswith("uvloop")]
    assert isinstance(uvloop.marker, Marker)
    assert not uvloop.marker.evaluate({"sys_platform": "win32"})
    assert uvloop.marker.evaluate({"sys_platform": "linux"}) and uvloop.marker.evaluate({"sys_platform": "darwin"})


def test_without_uvloop_the_loop_stays_asyncios(tmp_path):
    (tmp_path / "uvloop.py").write_text("raise ImportError('no wheel for this platform')\n")
    probe = (
        "import asyncio; from speech.server import eventloop; eventloop.install(); "
        "print(type(asyncio.new_event_loop()).__module__)"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "asyncio.unix_events", done.stderr


def test_the_readme_lists_the_system_packages_make_test_installs():
    packages = re.search(r"^SYSTEM_TEST_PACKAGES := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"^System packages[^:]*:(.*?)\n\n", readme, re.M | re.S)
    assert listed, "the README has a 'System packages' line"
    assert [p for p in packages if f"`{p}`" not in listed.group(1)] == []
