"""The stress tier of `make test` (bench/stress.py runs the same scenarios at full size): a real
daphne with Hibari on 2 workers, hostile frames, abrupt disconnects, the handshake memory budget,
the overload burst, and the text and options that used to break the engine."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from speech.engines.text import for_engine, for_number_reader
from speech.server.budget import FRAME_COST_FACTOR, OVER_BUDGET_MESSAGE, Budget
from speech.stream.engine import EngineError
from speech.threads import SYNTHESIS_NICE
from tests.support.live import open_session, run_session, send_json, serving, wait_for
from tests.support.stress import ProcWatch, active_sessions, disconnects, frame_header, fuzz, raw_upgrade, tracebacks
from tests.support.stress_load import large_config, large_configs, overload_burst, probe_first_audio

pytestmark = pytest.mark.live

MIB = 1024 * 1024
CONFIG_BYTES = 16 * MIB - 64
ALLOCATOR_SLACK = 8 * MIB  # RSS beyond what the memory budget reserves (test_concurrent_large_configs_...)


@pytest.fixture(scope="module")
def server():
    with serving({"SPEECH_ENGINE": "hibari", "SPEECH_ENGINE_WORKERS": "2", "SPEECH_REQUIRE_API_KEY": "false"}) as srv:
        srv.watch = ProcWatch(srv.proc.pid)
        yield srv


def idle(server):
    wait_for(lambda: active_sessions(server) == 0, "every session ended", timeout=120)


# -- hostile frames and clients ------------------------------------------------------------------------


def test_fuzz_frames_get_only_contract_answers(server):
    before = tracebacks(server)
    tally = asyncio.run(fuzz(server.ws_url, random.Random(1515), 1000))
    assert tally.frames >= 1000
    assert tally.problems == []
    assert tracebacks(server) == before, server.stderr_text()[-4000:]
    idle(server)
    assert asyncio.run(probe_first_audio(server.ws_url)) > 0  # still serving


def test_abrupt_disconnects_leave_nothing_running(server):
    watch = server.watch
    asyncio.run(disconnects(server, random.Random(7), 30))  # the pools reach their working size
    idle(server)
    baseline = wait_for(lambda: _steady(watch), "descriptors and threads steady")
    tally = asyncio.run(disconnects(server, random.Random(8), 100))
    assert tally.sessions == 100 and tally.problems == []
    idle(server)
    wait_for(lambda: watch.fds() <= baseline["fds"], f"descriptors back to {baseline['fds']}")
    # Threads come only from fixed pools, which start their threads lazily: the event loop's, the
    # engine's 2 workers, their 2 spares and the starter of both (speech/engines/abandoning.py), asyncio's
    # default executor (min(32, CPUs + 4)) and Channels' database thread; a retired worker ends with
    # its step. A thread left behind per session would pass that ceiling many times over.
    ceiling = 1 + 2 + 2 + 1 + min(32, (os.cpu_count() or 1) + 4) + 1
    wait_for(lambda: watch.threads() <= ceiling, f"threads back to at most {ceiling}")
    assert "Traceback" not in server.stderr_text()


def synthesis_threads(pid):
    """The threads of process `pid` at the synthesis threads' niceness (speech/engines/pool.py)."""
    nice = os.getpriority(os.PRIO_PROCESS, pid) + SYNTHESIS_NICE
    found = []
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        if tid != pid and int(fields[16]) == min(19, nice):
            found.append(tid)
    return found


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="only where a thread's cores can be read")
def test_the_servers_synthesis_threads_each_run_on_a_core_of_their_own(server):
    """With SPEECH_ENGINE_WORKERS as many as the cores the server may use, each synthesis thread of
    the real process is pinned to its own core and its event loop keeps them all; with another number,
    none is pinned."""

    async def sessions_at_once():
        text = ["First one here. And a second one."]
        return await asyncio.gather(*(run_session(server.ws_url, {"stream_audio": True}, text) for _ in range(3)))

    # The pool starts its second thread when two jobs overlap: sessions at once until it has (bounded).
    # Its spares (speech/engines/abandoning.py) hold no core of their own until they take a retired thread's.
    cores = os.sched_getaffinity(server.proc.pid)
    for _ in range(5):
        assert all(result.types().count("audio.done") == 2 for result in asyncio.run(sessions_at_once()))
        placed = [os.sched_getaffinity(tid) for tid in synthesis_threads(server.proc.pid)]
        pinned = [one for one in placed if one != cores]
        if len(pinned) == 2 or (len(cores) != 2 and len(placed) >= 2):
            break
    if len(cores) == 2:
        assert len(pinned) == 2 and pinned[0] != pinned[1] and all(len(one) == 1 and one <= cores for one in pinned), placed
        assert len(placed) <= 4, placed  # two in service, two spares
    else:
        assert len(placed) >= 2 and all(one == cores for one in placed), placed


def _steady(watch):
    first = watch.snapshot()
    return first if watch.snapshot() == first else None


# -- the handshake memory budget -------------------------------------------------------------------------


async def read_frame(reader):
    """One server frame (unmasked): (opcode, payload)."""
    head = await asyncio.wait_for(reader.readexactly(2), 30)
    length = head[1] & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    elif length == 127:
        length = int.from_bytes(await reader.readexactly(8), "big")
    return head[0] & 0x0F, await reader.readexactly(length)


async def _over_budget_reply(server):
    """Two connections announce a 16 MiB frame and send only its start: the default budget takes
    one (3 x 16 MiB of 64 MiB), so whichever header the server reads second is refused at once,
    before its payload. Returns that connection's two frames; both clients then vanish mid-frame."""
    connections = [await raw_upgrade(server.host, server.port) for _ in range(2)]
    for _reader, writer in connections:
        writer.write(frame_header(CONFIG_BYTES) + b'{"type":"session.config","padding":"')
        await writer.drain()

    async def reply(reader):
        return [await read_frame(reader), await read_frame(reader)]

    waits = [asyncio.create_task(reply(reader)) for reader, _writer in connections]
    done, pending = await asyncio.wait(waits, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for _reader, writer in connections:  # gone in the middle of their frames: reservations must be released
        writer.transport.abort()
    assert len(done) == 1, "no connection was refused"
    return done.pop().result()


def test_large_frame_over_budget_is_refused_at_its_header(server):
    idle(server)
    (opcode, payload), (close_opcode, close_payload) = asyncio.run(_over_budget_reply(server))
    assert opcode == 0x1
    assert json.loads(payload) == {"type": "error", "message": OVER_BUDGET_MESSAGE, "error_type": "rate_limit_error", "code": 429}
    assert close_opcode == 0x8 and int.from_bytes(close_payload[:2], "big") == 4013
    idle(server)
    # Both reservations were released (the aborted holder's too): a full-size config goes through.
    result = asyncio.run(run_session(server.ws_url, {"padding": "x" * (CONFIG_BYTES - 200)}, ["Hello. "]))
    assert result.close_code == 1000


def test_concurrent_large_configs_stay_within_the_budget(server):
    idle(server)
    watch = server.watch
    before = watch.rss()
    with watch.peak_rss() as peak:
        tally = asyncio.run(large_configs(server.ws_url, 12, CONFIG_BYTES))
    assert tally.problems == []
    assert tally.configured >= 1 and tally.refused >= 1
    assert tally.configured + tally.refused == 12
    assert set(tally.closes) <= {1000, 4013}
    # The budget (64 MiB) bounds what the admitted frames cost. RSS also counts what the allocator does
    # around them: a trim after the last large frame (speech/memory.py) hands back pages that the next
    # config takes again, and the heap fragments. Measured: 48-56 MiB on a fresh server, 64-65 MiB in
    # full runs (bench/stress.py's large configs: +62 to +64 MiB on the code of 2026-12-03 too). A second
    # config admitted beside the first would add another ~48 MiB.
    assert peak["peak"] - before <= 64 * MIB + ALLOCATOR_SLACK, f"RSS rose {(peak['peak'] - before) / MIB:.0f} MiB"


def test_budget_reservations_release_when_dropped():
    budget = Budget(100)
    held = budget.try_reserve(60)
    assert budget.try_reserve(50) is None
    held.shrink(20)
    second = budget.try_reserve(50)
    assert budget.used == 70
    del held
    assert budget.used == 50
    second.release()
    second.release()
    assert budget.used == 0 and budget.peak == 70


async def test_trims_after_frees_are_coalesced_and_run_off_the_loop(monkeypatch):
    from speech import memory

    loop_thread = threading.get_ident()
    trims = []
    monkeypatch.setattr(memory, "trim", lambda: trims.append(threading.get_ident()))
    for _ in range(5):
        memory.release_free_memory()
    deadline = asyncio.get_running_loop().time() + 10
    while not trims and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert len(trims) == 1 and trims[0] != loop_thread


def test_a_trim_remembers_what_was_resident_after_it():
    from speech import memory

    memory.trim()
    after = memory._rss_after_trim
    assert after is not None and abs(memory.resident_bytes() - after) < 16 * MIB
    status = Path("/proc/self/status").read_text()
    vm_rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) * 1024
    assert abs(memory.resident_bytes() - vm_rss) < 16 * MIB


def test_a_quiet_server_trims_only_when_it_grew_since_the_last_trim(monkeypatch):
    from speech import memory

    asked = []
    monkeypatch.setattr(memory, "release_free_memory", lambda: asked.append(True))
    monkeypatch.setattr(memory, "resident_bytes", lambda: 300 * MIB)
    monkeypatch.setattr(memory, "_rss_after_trim", None)
    memory.release_after_growth()
    assert len(asked) == 1  # never trimmed
    monkeypatch.setattr(memory, "_rss_after_trim", 300 * MIB - memory.QUIET_TRIM_GROWTH_BYTES)
    memory.release_after_growth()
    assert len(asked) == 1  # a working set that the next sessions use again stays mapped
    monkeypatch.setattr(memory, "_rss_after_trim", 300 * MIB - memory.QUIET_TRIM_GROWTH_BYTES - 1)
    memory.release_after_growth()
    assert len(asked) == 2  # a burst goes back


def test_the_quiet_trim_waits_until_no_websocket_opened_in_between(monkeypatch):
    from speech import memory
    from speech.server import launcher as module

    later = []
    monkeypatch.setattr(module.reactor, "callLater", lambda delay, fn, *args: later.append((delay, fn, args)))
    trims = []
    monkeypatch.setattr(memory, "release_after_growth", lambda: trims.append(True))
    server = module.SpeechServer.__new__(module.SpeechServer)
    first, second = object(), object()  # two WebSocket protocols
    server.connections = {first: {}, second: {}}
    server._marks, server._sockets, server.opened = {}, {first, second}, 2
    server.protocol_disconnected(first)
    assert later == []  # one is still open
    server.protocol_disconnected(second)
    assert [(delay, args) for delay, _, args in later] == [(memory.QUIET_TRIM_AFTER_S, (2,))]
    server.opened = 3  # a connection came and went before the delay ran out: its own delay decides
    later[0][1](*later[0][2])
    assert trims == []
    server._quiet(3)
    assert trims == [True]
    server._sockets = {first}
    server._quiet(3)
    assert trims == [True]


def test_the_engine_watch_trims_once_the_engine_has_had_nothing_to_do(monkeypatch):
    """Sessions that stay open (readers that stopped reading) do not keep a burst's memory: once the engine
    has had no job for QUIET_TRIM_AFTER_S, the watch asks for the trim, once for each such quiet."""
    from types import SimpleNamespace

    from speech import memory
    from speech.server import launcher as module

    clock, work, trims = [0.0], {"submitted": 5, "pending": 0}, []
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(module.jobs, "submitted", lambda: work["submitted"])
    monkeypatch.setattr(module.jobs, "pending", lambda: work["pending"])
    monkeypatch.setattr(memory, "release_after_growth", lambda: trims.append(clock[0]))
    server = module.SpeechServer.__new__(module.SpeechServer)
    server._engine_seen = None

    def watch_at(*times):
        for at in times:
            clock[0] = at
            server._watch_engine()

    quiet = memory.QUIET_TRIM_AFTER_S
    watch_at(0.0, quiet - 1)
    work["submitted"] = 6  # a job came and went between two looks
    watch_at(quiet, 2 * quiet - 1)
    assert trims == []
    watch_at(2 * quiet, 2 * quiet + 1, 2 * quiet + 2)
    assert trims == [2 * quiet]  # once for this quiet
    work["pending"] = 1  # a job runs
    watch_at(2 * quiet + 3)
    work["pending"] = 0
    watch_at(3 * quiet + 2)
    assert trims == [2 * quiet]
    watch_at(3 * quiet + 3)
    assert trims == [2 * quiet, 3 * quiet + 3]


def test_the_server_starts_its_engine_watch_when_the_reactor_runs(monkeypatch):
    from twisted.internet.task import LoopingCall

    from speech.server import launcher as module

    scheduled = []
    run_until_serving(monkeypatch, lambda: None, scheduled)
    watches = [(fn.__self__, args) for fn, *args in scheduled if isinstance(getattr(fn, "__self__", None), LoopingCall)]
    assert len(watches) == 1
    ((call, args),) = watches
    assert call.f.__func__ is module.SpeechServer._watch_engine
    assert args == [module.ENGINE_WATCH_S, False]  # every ENGINE_WATCH_S, the first look after one


def run_until_serving(monkeypatch, probe, scheduled=None):
    """SpeechServer.run() up to where daphne would start serving: `probe()` then, and what it returned.
    What run() set up in this process (the garbage collector's policy, the switch interval) is undone.
    `scheduled` gets what run() left for the reactor to call once it runs (callWhenRunning's arguments)."""
    import gc
    import sys

    from daphne.server import Server

    from speech.server import launcher as module
    from speech.server.collector import Collector
    from speech.web.lifecycle import ServingLifecycle

    installed = Collector()
    monkeypatch.setattr(module, "collector", installed)
    scheduled = [] if scheduled is None else scheduled  # the lifecycle's start and the engine watch: not run
    monkeypatch.setattr(module.reactor, "callWhenRunning", lambda *args: scheduled.append(args))
    served = []
    monkeypatch.setattr(Server, "run", lambda self: served.append(probe()))
    default = sys.getswitchinterval()
    try:
        server = module.SpeechServer.__new__(module.SpeechServer)
        server.lifecycle = ServingLifecycle()  # its start is left to callWhenRunning, a no-op here
        server.run()
    finally:
        sys.setswitchinterval(default)
        gc.callbacks.remove(installed._after_collection)
        gc.unfreeze()
    assert len(served) == 1
    return served[0]


def test_the_objects_of_the_started_application_are_left_out_of_garbage_collections(monkeypatch):
    """A full collection walks every tracked object with the event loop stopped (40-60 ms for the
    ~110,000 the application holds after its start): the server freezes them before it serves."""
    import gc

    assert run_until_serving(monkeypatch, gc.get_freeze_count) > 10_000


def test_the_event_loop_waits_at_most_half_a_millisecond_for_the_gil(monkeypatch):
    """A synthesis thread in Python (G2P) or the registry's writer holds the GIL for up to the switch
    interval while the event loop waits for it: the server shortens it from Python's 5 ms."""
    import sys

    assert run_until_serving(monkeypatch, sys.getswitchinterval) == 0.0005


def test_default_budget_takes_one_largest_config():
    assert FRAME_COST_FACTOR * 16 * MIB <= 64 * MIB < 2 * FRAME_COST_FACTOR * 16 * MIB
    assert len(large_config(CONFIG_BYTES).encode()) == CONFIG_BYTES


# -- overload ------------------------------------------------------------------------------------------------


def test_overload_burst_loses_no_accepted_sentence(server):
    idle(server)
    tally = asyncio.run(overload_burst(server.ws_url, 20, 10))
    assert tally.problems == []
    assert tally.lost == 0, f"{tally.lost} of {tally.accepted} accepted sentences lost: {dict(tally.errors)}"
    # Refusals only at the handshake: every error is a capacity refusal before session.configured.
    assert sum(tally.errors.values()) == tally.refused
    assert tally.accepted + 10 * tally.refused == 200


# -- engine input -------------------------------------------------------------------------------------------

# Every character str.isdigit() takes but int() does not (Hibari's number reading broke on them).
NOT_INT_DIGITS = [chr(c) for c in range(0x110000) if chr(c).isdigit() and not chr(c).isdecimal()]


@pytest.fixture(scope="module")
def hibari():
    from speech.engines.hibari import load_voice

    tts = load_voice("heart")
    tts.phonemize("Warm up.")
    return tts


@pytest.mark.parametrize("template", ["{c}", "On {c} May.", "1{c}", "{c}st", "$1{c}", "{c}.5", "{c}:30 pm", "{c},000"])
def test_hibari_reads_every_digit_after_normalising(hibari, template):
    texts = [template.format(c=char) for char in NOT_INT_DIGITS]
    assert [
        (text, _failure(hibari, for_number_reader(text))) for text in texts if _failure(hibari, for_number_reader(text))
    ] == []


def test_hibari_itself_breaks_on_such_a_digit(hibari):
    """The case the normaliser is for: if Hibari ever reads `⑵` itself, this says so."""
    assert "invalid literal for int()" in _failure(hibari, "⑵")


def _failure(tts, text):
    try:
        for phonemes in tts.phonemize(text):
            tts.ids(phonemes)
    except Exception as exc:  # what Hibari raises is what the test reports
        return f"{type(exc).__name__}: {exc}"
    return ""


def test_hibari_reads_characters_of_every_category(hibari):
    rng = random.Random(15)
    by_category = {}
    for code in range(0x110000):
        by_category.setdefault(unicodedata.category(chr(code)), []).append(chr(code))
    failures = []
    for category, chars in sorted(by_category.items()):
        for char in rng.sample(chars, min(len(chars), 60)):
            for text in (char, f"It costs {char}5.", f"12{char}3", char * 3):
                if problem := _failure(hibari, for_number_reader(text)):
                    failures.append((category, text, problem))
    assert failures == []


@pytest.mark.parametrize(
    "text,expected",
    [
        ("⑵ and ⒈", "(2) and 1."),
        ("x\u200by\u202e", "xy"),
        ("٣ items", "3 items"),
        ("\ud800a", "a"),
        ("\x00\x07ok\n", "  ok\n"),
        ("ﬁne ＡＢＣ", "fine ABC"),
        ("➊⓵", "11"),
        ("a\tb", "a b"),
        ("plain text", "plain text"),
    ],
)
def test_normaliser(text, expected):
    assert for_number_reader(text) == expected


def test_every_engine_gets_text_without_controls_or_invisible_characters():
    assert for_engine("١٢ \u200d\ue000\x1b[0m") == "١٢  [0m"  # other scripts' digits stay for engines that read them


def test_segment_hibari_still_fails_is_one_log_line_and_the_contract_error(caplog):
    from speech.engines.hibari import HibariEngine

    engine = HibariEngine(workers=1)

    def breaks():
        int("⑵")

    async def run():
        try:
            with pytest.raises(EngineError) as failure:
                await engine._result(engine._pool.run(breaks))
        finally:
            await engine.aclose()
        return failure.value

    with caplog.at_level(logging.WARNING, logger="speech.engines.hibari"):
        error = asyncio.run(run())
    assert error.event() == {"type": "error", "message": "speech synthesis failed", "error_type": "server_error"}
    [record] = caplog.records
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert "invalid literal for int()" in record.getMessage()


def test_hibari_queues_a_segments_first_job_when_its_stream_is_asked_for_and_closing_it_drops_the_job():
    """speech/stream/pipeline.py asks for the stream in the step that queues the text: the job must be in
    the pool's queue then, not when the stream is first iterated; a stream closed unread leaves no work."""
    from speech.engines.hibari import HibariEngine
    from speech.stream.engine import SynthesisRequest

    engine = HibariEngine(workers=1)

    async def run():
        gate, release = threading.Event(), threading.Event()

        def hold():
            gate.set()
            release.wait(5)

        busy = asyncio.create_task(engine._pool.run(hold))  # the only thread is taken
        assert await asyncio.to_thread(gate.wait, 5)
        stream = engine.stream(SynthesisRequest("Never heard.", engine.capabilities.default_voice))
        queued = engine._pool.depth
        await stream.aclose()
        dropped = engine._pool.depth
        release.set()
        await asyncio.wait_for(busy, 5)
        heard = [chunk async for chunk in engine.stream(SynthesisRequest("Heard.", engine.capabilities.default_voice))]
        return queued, dropped, heard

    try:
        queued, dropped, heard = asyncio.run(run())
    finally:
        asyncio.run(engine.aclose())
    assert (queued, dropped) == (1, 0)
    assert heard and all(chunk.size for chunk in heard)  # a stream read to its end speaks


def test_a_hibari_stream_read_to_its_end_keeps_no_audio_alive():
    """A session holds each queued segment's stream (speech/stream/pipeline.py) for as long as the segment
    waits to be sent; the stream must not keep its first job's result, the sentence's audio, alive (it
    doubled what 50 stalled readers held: bench/throughput.py)."""
    import gc
    import weakref

    from speech.engines.hibari import HibariEngine
    from speech.stream.engine import SynthesisRequest

    engine = HibariEngine(workers=1)

    async def run():
        stream = engine.stream(SynthesisRequest("Kept no longer than needed.", engine.capabilities.default_voice))
        chunks = [chunk async for chunk in stream]
        refs = [weakref.ref(chunk) for chunk in chunks]
        del chunks
        gc.collect()
        return stream, refs  # the stream itself is still held, as a queued segment's is

    try:
        stream, refs = asyncio.run(run())  # the stream stays held through the assertion below
    finally:
        asyncio.run(engine.aclose())
    assert refs and all(ref() is None for ref in refs)


def test_hibari_runs_its_models_without_arena_or_memory_pattern():
    """What keeps a synthesis thread's memory bounded and the same from run to run (speech/engines/hibari.py:
    `_session`; the figures are bench/throughput.py's stalled readers): onnxruntime's CPU arena would keep
    the largest buffers for ever, its memory pattern takes each call's tensors as one block of megabytes
    whose place in the thread's heap decides how far the heap grows."""
    from speech.engines.hibari import HibariEngine

    engine = HibariEngine(workers=1)
    try:
        sessions = [s for tts in engine._models.values() for s in (tts.sess, tts.front, tts.back, tts.g2p._oov.sess)]
        assert sessions
        for session in sessions:
            options = session.get_session_options()
            assert not options.enable_cpu_mem_arena and not options.enable_mem_pattern
    finally:
        asyncio.run(engine.aclose())


def test_hibari_sessions_keep_none_of_the_serialised_models_they_are_built_from():
    """A voice's acoustic model with its durations and its two halves are serialised to build their
    sessions (speech/engines/hibari.py `load_voice`): 15.1 MiB together, for nothing once the sessions
    exist. onnxruntime's Python session keeps bytes it is given for its whole life."""
    import gc
    import tracemalloc

    import onnx.utils  # noqa: F401  (imported before tracing: the modules are not what is measured)
    import onnxruntime  # noqa: F401
    from hibari.voices import voice_path

    from speech.engines.hibari import _session
    from speech.engines.hibari_align import model_with_durations
    from speech.engines.hibari_pieces import split_model

    path = voice_path("heart", download_missing=False)
    tracemalloc.start()
    try:
        sessions = [_session(model_with_durations(path)), *(_session(model) for model in split_model(path))]
        gc.collect()
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(session.get_outputs() for session in sessions)
    assert kept < 1 << 20


def test_hibari_reads_no_entropy_on_the_event_loop(monkeypatch):
    """An unseeded segment's random generator is made in the synthesis thread: reading the OS's entropy is
    a system call that hands the GIL over, and the event loop would then wait for it on its way to the
    first audio."""
    import random

    from speech.engines.hibari import HibariEngine
    from speech.stream.engine import SynthesisRequest

    engine = HibariEngine(workers=1)
    reads = []
    urandom = random._urandom  # what secrets.randbits, and so numpy's unseeded default_rng, reads

    def recorded(n):
        reads.append(threading.get_ident())
        return urandom(n)

    monkeypatch.setattr(random, "_urandom", recorded)

    async def run():
        loop_thread = threading.get_ident()
        try:
            chunks = [chunk async for chunk in engine.stream(SynthesisRequest("Hello there.", engine.capabilities.default_voice))]
        finally:
            await engine.aclose()
        return loop_thread, chunks

    loop_thread, chunks = asyncio.run(run())
    assert chunks and chunks[0].size
    assert reads and loop_thread not in reads


def test_hibari_quantises_on_its_synthesis_threads_when_asked(monkeypatch):
    """`SynthesisRequest.pcm16`: 16-bit chunks, the same seed's float32 chunks quantised, and quantised in
    the pool's jobs, never on the event loop (where it took an eighth of the loop's CPU: base.py)."""
    from speech.audio import signal
    from speech.engines.hibari import HibariEngine
    from speech.stream.engine import SynthesisRequest

    engine = HibariEngine(workers=1)
    quantised_on = []
    quantise = signal.quantise

    def recorded(samples):
        quantised_on.append(threading.get_ident())
        return quantise(samples)

    monkeypatch.setattr(signal, "quantise", recorded)
    text = "Two sentences in one segment. The second one is its own job."

    async def run():
        loop_thread = threading.get_ident()
        voice = engine.capabilities.default_voice
        try:
            chunks = {
                pcm16: [chunk async for chunk in engine.stream(SynthesisRequest(text, voice, options={"seed": 5}, pcm16=pcm16))]
                for pcm16 in (False, True)
            }
        finally:
            await engine.aclose()
        return loop_thread, chunks

    loop_thread, chunks = asyncio.run(run())
    floats, ints = chunks[False], chunks[True]
    assert len(floats) == len(ints) == 2
    assert all(chunk.dtype == np.float32 for chunk in floats)
    assert all(chunk.dtype == np.dtype("<i2") for chunk in ints)
    assert all(np.array_equal(i, quantise(f)) for f, i in zip(floats, ints, strict=True))
    assert len(quantised_on) == 2 and loop_thread not in quantised_on


HARD_TEXTS = [
    "Chapter ⑵ costs ⒈5 dollars. ",
    "Zero\u200bwidth and \u202ebidi marks. ",
    "٣ apples and ² squared. ",
    "Bell \x07 and escape \x1b characters. ",
    "Ｆｕｌｌ width ﬁne text. ",
    "➊ and ⓵ are one. ",
]


def test_hard_text_speaks_in_a_live_session(server):
    before = tracebacks(server)
    result = asyncio.run(run_session(server.ws_url, {"stream_audio": True}, HARD_TEXTS))
    assert result.close_code == 1000
    done = result.of_type("audio.done")
    assert len(done) == len(HARD_TEXTS)
    assert all(not event["error"] and event["total_bytes"] > 0 for event in done)
    assert tracebacks(server) == before


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("seed", -1, "seed must be between 0 and 18446744073709551615"),
        ("seed", 2**64, "seed must be between 0 and 18446744073709551615"),
        ("temperature", -0.5, "temperature must be between 0 and 2"),
        ("top_p", 0, "top_p must be greater than 0 and at most 1"),
        ("top_k", 0, "top_k must be -1 or between 1 and 2147483647"),
        ("repetition_penalty", 0, "repetition_penalty must be greater than 0 and at most 2"),
        ("max_new_tokens", 0, "max_new_tokens must be between 1 and 2147483647"),
    ],
)
def test_options_an_engine_cannot_use_are_refused_at_the_handshake(server, field, value, message):
    async def handshake():
        ws = await open_session(server.ws_url)
        try:
            await send_json(ws, {"type": "session.config", "session": {field: value}})
            reply = json.loads(await ws.recv())
            await ws.wait_closed()
            return reply, ws.close_code
        finally:
            await ws.close()

    reply, code = asyncio.run(handshake())
    assert reply == {"type": "error", "message": message, "error_type": "BadRequestError", "param": field, "code": 400}
    assert code == 4008


def test_options_at_their_limits_are_accepted(server):
    config = {
        "seed": 2**64 - 1,
        "temperature": 2,
        "top_p": 1,
        "top_k": -1,
        "repetition_penalty": 2,
        "max_new_tokens": 2**31 - 1,
        "stream_audio": True,
    }
    result = asyncio.run(run_session(server.ws_url, config, ["Fine. "]))
    assert result.close_code == 1000 and not result.of_type("error")
