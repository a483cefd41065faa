"""The lease as the log's fence (chat.log.fence): a runner stalled past its heartbeat,
whose turn another worker recovered meanwhile, writes, takes, makes and runs nothing
more; what it tried stays for the resumed turn."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import log, rules, stream, turns, worker
from chat.models import QueuedMessage, RunningTurn, Tab
from chat.providers.base import Finish, TextDelta
from chat.turn import lease, loop, state
from tests import test_subagents as base
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.test_subagents import call, delegate

tabs = base.tabs
workspace = base.workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _make_dead_and_recover(tab_id) -> list:
    RunningTurn.objects.filter(tab_id=tab_id).update(
        worker="elsewhere:1:gone", heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    return lease.recover_stale()


@pytest.mark.parametrize("tool", ["agent", "write_file"])
async def test_a_recovered_runner_does_not_run_a_call_its_recovery_answered(
    tabs, workspace, monkeypatch, tool
):
    """The runner stalls between sealing a call and running it (here: in rules.decide); a
    recovery closes the turn, answering the call 'Not run to completion'. The runner that
    wakes runs nothing: no file written, and no sub-agent made, which would run and spend
    with nobody waiting for it."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 3600)
    made = (
        delegate("c1", "work")
        if tool == "agent"
        else call("c1", "write_file", path="after.txt", content="hi")
    )
    tabs.script("go", [made, Finish(stop_reason="tool_use")], [TextDelta("done"), Finish()])
    child_provider = tabs.script("work", [TextDelta("the orphan ran"), Finish()])
    entered, go = threading.Event(), threading.Event()
    real_decide = rules.decide

    def stalled_decide(*args, **kwargs):
        if args[1] == tool and not go.is_set():
            entered.set()
            go.wait(10)
        return real_decide(*args, **kwargs)

    monkeypatch.setattr(rules, "decide", stalled_decide)
    tab = await make_tab()
    async with running_worker():
        await submit(tab, "go")
        while not entered.is_set():
            await asyncio.sleep(0.02)
        runner = worker.RUNNING[tab.pk]
        assert await database_sync_to_async(_make_dead_and_recover)(tab.pk) == [tab.pk]
        go.set()
        deadline = time.monotonic() + 10
        while worker.RUNNING.get(tab.pk) is runner and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a child made now would be taken by this worker
    assert runner.lease_lost
    rows = await chunks(tab.pk)
    answered = [r.data for r in rows if r.type == "tool_result"]
    assert answered and answered[0]["result"].startswith("Not run to completion")
    assert not (workspace / "after.txt").exists(), "the call ran after its recovery answered it"
    orphans = [t async for t in Tab.objects.filter(parent_tab=tab.pk)]
    assert orphans == [] and child_provider.requests == [], "a sub-agent made after the recovery"


async def test_a_runner_that_lost_its_lease_in_abort_does_not_report_the_tab_idle(
    script, monkeypatch
):
    """A failure outside the steps (TurnConfig.load here) after a recovery took the lease:
    abort() finds out through LeaseLost (its _take_queued / _end_with_crash) and says
    nothing more: no `idle` for its own turn over the tab the recovered turn now runs."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 3600)
    gate = asyncio.Event()
    script([TextDelta("second runner"), gate, Finish()])
    real_load = state.TurnConfig.load
    first: dict = {}

    def load(tab):
        if not first:
            first["turn"] = str(RunningTurn.objects.get(tab_id=tab.pk).turn_id)
            assert _make_dead_and_recover(tab.pk) == [tab.pk]
            raise RuntimeError("settings unreadable")
        return real_load(tab)

    monkeypatch.setattr(state.TurnConfig, "load", staticmethod(load))
    tab = await make_tab()
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "go")
        await watcher.until(lambda m: m["op"] in ("open", "delta"))  # the new runner streams
        with pytest.raises(TimeoutError):
            await watcher.until(lambda m: False, timeout=1.5)
        gate.set()
    stale_idle = [
        m
        for m in watcher.ops
        if m["op"] == "status"
        and m["status"]["state"] == "idle"
        and m["status"].get("turn_id") == first["turn"]
    ]
    assert stale_idle == [], "the runner that lost its lease published idle for its turn"


async def test_taking_only_rerun_rows_is_fenced_too():
    """Rerun rows alone append nothing, and are still only the lease holder's to take: a
    runner whose lease was recovered leaves the recovery's rerun to the resumed turn."""
    tab = await make_tab()

    def setup():
        RunningTurn.objects.create(
            tab_id=tab.pk, turn_id=uuid.uuid4(), worker="w:1:x", heartbeat_at=timezone.now()
        )
        return QueuedMessage.objects.create(tab_id=tab.pk, rerun=True).pk

    rerun = await database_sync_to_async(setup)()

    async def publish(op):
        pass

    stale = loop.TurnRunner(tab.pk, uuid.uuid4(), publish)
    with pytest.raises(log.LeaseLost):
        await database_sync_to_async(stale.messages.take_queued_sync)()
    assert await QueuedMessage.objects.filter(pk=rerun).aexists(), (
        "a runner without the lease deleted the rerun row"
    )


async def test_taking_a_compaction_is_fenced_too():
    """A stalled runner recovered at its turn's start does not take the /compact request
    (it would ask for the summary, have its append refused, and the request be gone)."""
    tab = await make_tab()

    def setup():
        log.append(
            tab.pk,
            [
                stream.Block(uuid.uuid4(), None, 0, "user", "text", {"text": "hi"}),
            ],
        )
        turns.compact(Tab.objects.get(pk=tab.pk))
        RunningTurn.objects.create(
            tab_id=tab.pk, turn_id=uuid.uuid4(), worker="w:1:x", heartbeat_at=timezone.now()
        )

    await database_sync_to_async(setup)()

    async def publish(op):
        pass

    stale = loop.TurnRunner(tab.pk, uuid.uuid4(), publish)
    with pytest.raises(log.LeaseLost):
        await database_sync_to_async(stale.messages.take_compaction_sync)()
    assert await QueuedMessage.objects.filter(tab_id=tab.pk, compact=True).aexists(), (
        "a runner without the lease took the compaction request"
    )


async def test_messages_a_stale_runner_tries_to_take_stay_queued():
    """LeaseLost inside _take_queued_sync rolls back the whole transaction: the messages
    stay queued for the turn that holds the lease, and the stale runner stops."""
    tab = await make_tab()

    def setup():
        RunningTurn.objects.create(
            tab_id=tab.pk, turn_id=uuid.uuid4(), worker="w:1:x", heartbeat_at=timezone.now()
        )
        return turns.submit(Tab.objects.get(pk=tab.pk), "hello").pk

    pk = await database_sync_to_async(setup)()

    async def publish(op):
        pass

    stale = loop.TurnRunner(tab.pk, uuid.uuid4(), publish)
    with pytest.raises(log.LeaseLost):
        await stale.messages.take_queued()
    assert stale.lease_lost and stale.cancelled.is_set() and stale.stopping
    assert await QueuedMessage.objects.filter(pk=pk).aexists()
    assert await chunks(tab.pk) == []
