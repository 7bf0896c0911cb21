"""The registry sweep's rules (speech/control/sweep.py), in process: which instances' rows it marks lost,
judged by their heartbeats in Redis (a stand-in answering MGET here; tests/test_registry_truth.py runs the
real thing), and what it does at an instance's start and without Redis."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from speech.control import registry, sweep
from speech.control.sweep import Sweeper
from speech.models import SessionRecord

pytestmark = pytest.mark.django_db(transaction=True)


class Beats:
    """What Redis holds: instance -> heartbeat timestamp (absent: missing)."""

    prefix = "speech"

    def __init__(self, beats):
        self.beats = beats

    def heartbeat_key(self, instance):
        return instance

    def connection(self, index):
        return self

    async def mget(self, keys):
        return [None if self.beats.get(key) is None else repr(self.beats[key]).encode() for key in keys]


def row(instance, started_at=None):
    record = SessionRecord.objects.create(
        session_id=f"speech_ws_{instance}_{time.monotonic_ns()}", instance=instance, voice="v", engine="e"
    )
    if started_at is not None:
        SessionRecord.objects.filter(pk=record.pk).update(started_at=started_at)
    return record.pk


def statuses():
    return {record.instance: record.status for record in SessionRecord.objects.all()}


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sweep.time, "monotonic", lambda: now[0])
    return now


async def test_instances_whose_heartbeat_is_stale_are_lost_and_missing_ones_only_after_the_grace(monkeypatch, clock):
    beats = Beats({"alive": time.time(), "gone": time.time() - sweep.STALE_S - 1})
    monkeypatch.setattr(sweep, "redis_layer", lambda: beats)
    for instance in ("alive", "gone", "unknown"):
        await sync_to_async(row)(instance)
    sweeper = Sweeper(timezone.now())
    assert await sweeper.sweep() == 1
    assert await sync_to_async(statuses)() == {"alive": "active", "gone": "failed", "unknown": "active"}
    clock[0] += sweep.MISSING_GRACE_S - 1
    assert await sweeper.sweep() == 0  # missing: Redis may have lost it; a live instance beats again soon
    clock[0] += 1
    assert await sweeper.sweep() == 1
    assert (await sync_to_async(statuses)())["unknown"] == "failed"


async def test_a_heartbeat_that_comes_back_restarts_the_grace(monkeypatch, clock):
    beats = Beats({})
    monkeypatch.setattr(sweep, "redis_layer", lambda: beats)
    await sync_to_async(row)("flaky")
    sweeper = Sweeper(timezone.now())
    await sweeper.sweep()
    clock[0] += sweep.MISSING_GRACE_S - 1
    beats.beats["flaky"] = time.time()
    await sweeper.sweep()
    del beats.beats["flaky"]
    clock[0] += 2
    assert await sweeper.sweep() == 0


async def test_at_start_an_earlier_process_of_this_instance_is_lost_and_without_redis_every_other(monkeypatch):
    monkeypatch.setattr(sweep, "redis_layer", lambda: None)
    started = timezone.now()
    own = registry.instance_id()
    await sync_to_async(row)(own, started - timezone.timedelta(minutes=1))  # the process before this one
    await sync_to_async(row)("elsewhere")
    sweeper = Sweeper(started)
    assert await sweeper.sweep() == 0  # without Redis, only at the start
    assert await sweeper.sweep(at_start=True) == 2
    assert await sync_to_async(statuses)() == {own: "failed", "elsewhere": "failed"}
    await sync_to_async(row)(own)  # this process's own session
    assert await sweeper.sweep(at_start=True) == 0
