"""The synthesis pool at the process's exit, in processes of their own: each loads Hibari (a few
seconds), a subprocess's cost, so the module is in the live tier, not `make test-fast`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.live import PROJECT_ROOT

pytestmark = pytest.mark.live

EXIT_PROBE = """
import asyncio, time
from speech.engines.hibari import HibariEngine
from speech.stream.engine import SynthesisRequest

async def main():
    engine = HibariEngine(workers=1)
    text = " ".join(["A long sentence that keeps the model busy for a while, and then some more of it"] * 6) + "."
    stream = engine.stream(SynthesisRequest(text=text, voice=engine.capabilities.default_voice))
    while engine._pool.running == 0:
        await asyncio.sleep(0.001)
    time.sleep(0.005)  # inside the model's run
    print("exiting", flush=True)

asyncio.run(main())
"""


def test_the_process_exits_cleanly_while_a_synthesis_thread_is_in_a_models_run():
    """A daemon thread still in onnxruntime when the interpreter finalises aborts the process (exit -6,
    "terminate called without an active exception"): the pool waits for its running jobs at exit."""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", EXIT_PROBE], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout.strip()) == (0, "exiting"), done.stderr[-2000:]
