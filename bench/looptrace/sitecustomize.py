"""What held up the event loop of a server the benchmarks start (bench/handshake.py --trace).

On PYTHONPATH with SPEECH_BENCH_TRACE=<file>, a Python process records, and writes to <file>.<pid> as JSON
lines when it exits:
- each garbage collection: its generation, start and end (wall times), and for a full one whether it
  walks everything (the serving process's collector unfroze at the previous one: speech/server/collector.py);
- each keepalive ping daphne sends (its wall time);
- once daphne's loop runs, each time a timer of LATE_TICK_S on that loop fired more than LATE_TICK_S late
  (the loop was busy or the process was not scheduled for that long).
`events_between` reads them back. Nothing in the product imports this."""

import asyncio
import atexit
import gc
import json
import os
import sys
import time

LATE_TICK_S = 0.005

_path = os.environ.get("SPEECH_BENCH_TRACE")
_records = []

if _path:
    _collecting = [0.0]
    _unfreezes = [0]

    def _unfrozen():
        """Whether the collector unfroze since the last full collection (`gc.get_freeze_count` would walk
        every frozen object: too slow to ask at every collection)."""
        module = sys.modules.get("speech.web.collector") or sys.modules.get("speech.server.collector")
        unfreezes = getattr(getattr(module, "collector", None), "unfreezes", 0)
        walks, _unfreezes[0] = unfreezes > _unfreezes[0], unfreezes
        return walks

    def _collection(phase, info):
        if phase == "start":
            _collecting[0] = time.time()
        else:
            record = {"kind": "gc", "generation": info["generation"], "t0": _collecting[0], "t1": time.time()}
            if info["generation"] == 2:
                record["everything"] = _unfrozen()
            _records.append(record)

    def _tick(loop, due):
        now = time.time()
        if now - due > LATE_TICK_S:
            _records.append({"kind": "late", "t0": due, "t1": now})
        loop.call_later(LATE_TICK_S, _tick, loop, now + LATE_TICK_S)

    def _trace_daphne(loop):
        """daphne's loop is about to run: tick on it, and record the pings its protocol sends."""
        _tick(loop, time.time())
        protocol = sys.modules["daphne.ws_protocol"].WebSocketProtocol
        send_ping = protocol._sendAutoPing

        def _send_auto_ping(self):
            _records.append({"kind": "ping", "t0": time.time()})
            return send_ping(self)

        protocol._sendAutoPing = _send_auto_ping

    _set_event_loop = asyncio.set_event_loop

    def _set_and_trace(loop):
        """daphne's Server.run sets its Twisted reactor's loop as the current one just before running it."""
        _set_event_loop(loop)
        if loop is not None and loop is getattr(sys.modules.get("daphne.server"), "twisted_loop", None):
            _trace_daphne(loop)

    def _write():
        with open(f"{_path}.{os.getpid()}", "w") as out:
            for record in _records:
                out.write(json.dumps(record) + "\n")

    gc.callbacks.append(_collection)
    asyncio.set_event_loop = _set_and_trace
    atexit.register(_write)


def events_between(trace, since, until):
    """The records written at `trace` (any pid) that began between `since` and `until` (wall times)."""
    found = []
    for path in trace.parent.glob(trace.name + ".*"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if since <= record["t0"] <= until:
                found.append(record)
    return found
