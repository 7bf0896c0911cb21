"""What the serving process's garbage collection and single-instance channel layer cost per open session
(speech/server/collector.py, speech/control/memory_layer.py): a full collection leaves the objects of
sessions that stay open frozen, so the next ones do not walk them again, while ended sessions' garbage is
still freed; and the in-memory layer's walk over every channel and group runs once a second, not on every
receive. Figures: bench/RESULTS.md, "Handshakes beside idle sessions"."""

from __future__ import annotations

import asyncio
import gc

import pytest

from speech.control import memory_layer
from speech.control.memory_layer import SpeechInMemoryChannelLayer
from speech.server import collector as collector_module
from speech.server.collector import Collector


class Node:
    """A session's objects in miniature: a cycle, as daphne's, Twisted's and autobahn's objects make."""

    def __init__(self):
        self.me = self


@pytest.fixture
def collector():
    """A Collector installed in this process, removed afterwards with everything it froze."""
    installed = Collector()
    installed.install()
    yield installed
    gc.callbacks.remove(installed._after_collection)
    gc.unfreeze()
    gc.collect()


def test_what_survives_a_full_collection_is_frozen_and_walked_no_more(collector):
    open_sessions = [Node() for _ in range(1000)]
    before = gc.get_freeze_count()
    gc.collect()
    assert collector.freezes == 1 and gc.get_freeze_count() >= before + len(open_sessions)
    assert len(gc.get_objects(generation=2)) < len(open_sessions)  # the next full collection walks none of them


def test_garbage_made_after_a_freeze_is_still_freed(collector):
    gc.collect()
    Node()  # a session that ended after the freeze: a cycle nothing refers to
    assert gc.collect() >= 1  # walked and freed


def test_sessions_that_end_after_being_frozen_are_freed_once_enough_have_ended(collector, monkeypatch):
    monkeypatch.setattr(collector_module, "UNFREEZE_AFTER_ENDED", 3)
    marks = [collector.opened() for _ in range(3)]
    held = [Node() for _ in range(3)]
    gc.collect()  # the three sessions are open: frozen
    assert collector.freezes == 1
    for mark in marks:
        collector.ended(mark)
    held.clear()  # their objects are garbage now, which the collector cannot see while they stay frozen
    assert collector.frozen_ended == 3
    gc.collect()  # enough have ended: unfrozen instead of frozen again
    assert collector.unfreezes == 1 and collector.frozen_ended == 0
    assert gc.collect() >= 3  # the next full collection frees them
    assert collector.freezes == 2  # and freezing resumes
    later = collector.opened()
    collector.ended(later)  # opened after the last freeze: not held back
    assert collector.frozen_ended == 0


async def test_the_in_memory_layer_walks_its_channels_and_groups_once_a_second(monkeypatch):
    layer = SpeechInMemoryChannelLayer(expiry=60)
    walks = []
    monkeypatch.setattr(memory_layer.InMemoryChannelLayer, "_clean_expired", lambda self: walks.append(1))
    now = [1000.0]
    monkeypatch.setattr(memory_layer.time, "monotonic", lambda: now[0])
    for index in range(50):
        await layer.group_add(f"speech.session.{index}", f"consumer.{index}")
        await layer.send(f"consumer.{index}", {"type": "hello"})
        await layer.receive(f"consumer.{index}")
        await layer.group_send(f"speech.session.{index}", {"type": "speech.cancel"})
    assert len(walks) == 1  # the stock layer walked on each of the 100 receives and group_sends
    now[0] += memory_layer.CLEAN_EVERY_S
    await layer.receive("consumer.0")
    assert len(walks) == 2


async def test_the_in_memory_layer_still_drops_expired_messages():
    layer = SpeechInMemoryChannelLayer(expiry=0.01)
    await layer.send("consumer.1", {"type": "stale"})
    await asyncio.sleep(0.02)
    layer._cleaned_at = float("-inf")  # a second has passed since the last walk
    await layer.send("consumer.1", {"type": "fresh"})
    assert (await layer.receive("consumer.1"))["type"] == "fresh"
