"""The reduced soak (bench/soak.py --minutes 5) for tests/test_soak.py, in a subprocess that starts when the
test run begins (tests/conftest.py), so that its five minutes pass beside the rest of the suite instead of
after it: `make test` stays within its budget. Run alone, the test simply waits for it."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
from pathlib import Path

from .live import PROJECT_ROOT, PYTHON

MINUTES = 5
WAIT_S = MINUTES * 60 + 600  # hang guard: the servers' start and stop, and a machine that is busy

_run: dict = {}


def start():
    """Start the soak once; later calls do nothing."""
    if _run:
        return
    workdir = Path(tempfile.mkdtemp(prefix="soak-test-"))
    log = open(workdir / "soak.log", "wb")  # noqa: SIM115 -- closed by result() or stop()
    command = [PYTHON, "bench/soak.py", "--minutes", str(MINUTES), "--no-write", "--json", str(workdir / "counts.json")]
    _run.update(
        proc=subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT),
        log=log,
        workdir=workdir,
    )


def result():
    """Wait for the soak: (its counts, its output)."""
    start()
    code = _run["proc"].wait(WAIT_S)
    _run["log"].close()
    output = (_run["workdir"] / "soak.log").read_text(errors="replace")
    counts_file = _run["workdir"] / "counts.json"
    assert code == 0 and counts_file.exists(), f"the soak failed (exit status {code}):\n{output[-6000:]}"
    return json.loads(counts_file.read_text()), output


def stop():
    """The run ends without the test having waited for it (deselected, interrupted): stop it as Ctrl-C does,
    so that it stops its servers."""
    proc = _run.get("proc")
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if _run:
        _run["log"].close()
