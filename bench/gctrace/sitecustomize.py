"""The cyclic garbage collector's pauses in a server the benchmarks start (bench/handshake.py --gc-trace).

On PYTHONPATH with SPEECH_BENCH_GC_TRACE=<file>, every Python process started records each collection
(its generation, how long it stopped the world, the wall time it ended) and writes them to <file>.<pid>
as JSON lines when it exits; `collections_between` reads them back. Nothing in the product imports this."""

import atexit
import gc
import json
import os
import time

_path = os.environ.get("SPEECH_BENCH_GC_TRACE")
if _path:
    _records = []
    _started = [0.0]

    def _trace(phase, info):
        if phase == "start":
            _started[0] = time.perf_counter()
        else:
            _records.append((info["generation"], time.perf_counter() - _started[0], time.time(), info["collected"]))

    def _write():
        with open(f"{_path}.{os.getpid()}", "w") as out:
            for generation, seconds, at, collected in _records:
                out.write(json.dumps({"generation": generation, "s": seconds, "at": at, "collected": collected}) + "\n")

    gc.callbacks.append(_trace)
    atexit.register(_write)


def collections_between(trace, since, until):
    """The collections recorded at `trace` between `since` and `until` (wall times): {generation: [seconds]}."""
    pauses = {0: [], 1: [], 2: []}
    for path in trace.parent.glob(trace.name + ".*"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if since <= record["at"] <= until:
                pauses[record["generation"]].append(record["s"])
    return pauses
