"""The lease's liveness: the recovery scan never takes a live turn, and does take dead ones."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from chat import worker
from chat.models import QueuedMessage, RunningTurn
from chat.providers.base import Finish, TextDelta
from chat.providers.replay import ScriptedProvider
from chat.turn import lease, loop, step
from tests.engine import Watcher, chunks, kinds, make_tab, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# A child that has exited shows as a zombie within milliseconds; this bounds the wait.
ZOMBIE_WAIT_SECONDS = 10.0


@pytest.fixture
def answer(monkeypatch):
    provider = ScriptedProvider([[TextDelta("The answer."), Finish()]])

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    return provider


def lease_row(tab, worker: str) -> RunningTurn:
    return RunningTurn.objects.create(
        tab_id=tab.pk, turn_id=uuid.uuid4(), worker=worker, heartbeat_at=timezone.now()
    )


async def test_a_recovery_scan_between_acquire_and_the_runner_start_leaves_the_turn_alone(
    answer, monkeypatch
):
    """The scan runs right after the lease commits, before the runner exists: the turn
    is not taken for a dead one, and a second start in that gap gets no second lease."""
    real_acquire = lease.acquire
    seen: dict[str, object] = {}

    def acquire_then_scan(tab_id, worker):
        turn_id = real_acquire(tab_id, worker)
        if turn_id is not None and "recovered" not in seen:
            seen["recovered"] = lease.recover_stale()
            seen["second"] = real_acquire(tab_id, lease.worker_id("another-channel"))
        return turn_id

    monkeypatch.setattr(lease, "acquire", acquire_then_scan)
    tab = await make_tab()
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "hello")
        await watcher.until_idle()
    assert seen == {"recovered": [], "second": None}
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text"]
    assert rows[1].data["text"] == "The answer."
    assert not await RunningTurn.objects.aexists()


async def test_a_lease_of_this_process_is_alive_only_while_claimed():
    """Same pid, no claim: a previous process with this pid (a restarted container)."""
    tab = await make_tab()
    running = await database_sync_to_async(lease_row)(tab, lease.worker_id("x"))
    assert lease.is_dead(running)
    lease.claim(tab.pk)
    lease.claim(tab.pk)
    try:
        assert not lease.is_dead(running)
        lease.unclaim(tab.pk)
        assert not lease.is_dead(running)  # a second claim still holds it
    finally:
        lease.unclaim(tab.pk)
    assert lease.is_dead(running)


async def test_a_claimed_lease_of_this_process_is_alive_however_late_its_heartbeat():
    """A machine so loaded that this process's heartbeat lags past the stale limit: its own
    recovery scan must not take the turn from its live runner (it did, under a loaded CI
    run: "lease ... was lost; stopping this runner")."""
    tab = await make_tab()
    running = await database_sync_to_async(lease_row)(tab, lease.worker_id("x"))
    running.heartbeat_at = timezone.now() - timezone.timedelta(
        seconds=lease.LEASE_STALE_SECONDS * 10
    )
    lease.claim(tab.pk)
    try:
        assert not lease.is_dead(running)
        # A runner wedged for minutes does not hold its tab until a restart.
        running.heartbeat_at = timezone.now() - timezone.timedelta(
            seconds=lease.OWN_LEASE_STUCK_SECONDS + 1
        )
        assert lease.is_dead(running)
    finally:
        lease.unclaim(tab.pk)
    assert lease.is_dead(running)


async def test_a_zombie_worker_counts_as_dead():
    tab = await make_tab()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + ZOMBIE_WAIT_SECONDS
        while _state(child.pid) != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        worker = f"{lease.HOST_ID}:{child.pid}:x"
        running = await database_sync_to_async(lease_row)(tab, worker)
        assert lease.is_dead(running)
    finally:
        child.wait()


async def test_a_live_worker_of_this_host_and_one_elsewhere_are_alive():
    tab = await make_tab()
    parent = await database_sync_to_async(lease_row)(tab, f"{lease.HOST_ID}:{os.getppid()}:x")
    assert not lease.is_dead(parent)
    parent.worker = "another-host:1:x"
    assert not lease.is_dead(parent)
    parent.heartbeat_at = timezone.now() - timezone.timedelta(seconds=lease.LEASE_STALE_SECONDS + 1)
    assert lease.is_dead(parent)


async def test_the_claim_is_dropped_after_the_turn(answer):
    tab = await make_tab()
    async with running_worker():
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "hello")
            await watcher.until_idle()
        # The runner's task ends just after its idle status went out.
        deadline = time.monotonic() + ZOMBIE_WAIT_SECONDS
        while lease._claims[tab.pk]:
            assert time.monotonic() < deadline, "the claim outlived the turn"
            await asyncio.sleep(0.01)
    assert tab.pk not in lease._claims


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


async def test_a_heartbeat_right_after_the_lease_passes_to_the_next_turn_finds_it(monkeypatch):
    """A message queued mid-turn chains the next turn on the same lease; a heartbeat
    landing between that switch and the runner's own start must not call it lost."""
    gate = asyncio.Event()
    provider = ScriptedProvider([[TextDelta("one"), gate, Finish()], [TextDelta("two"), Finish()]])

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    real = loop.TurnRunner._release_or_continue
    beats: list[tuple[str, str]] = []

    def release_then_beat(runner):
        next_turn = real(runner)
        if next_turn is not None:
            beats.append(runner._beat())
        return next_turn

    monkeypatch.setattr(loop.TurnRunner, "_release_or_continue", release_then_beat)
    tab = await make_tab()
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "first")
        await watcher.until(lambda m: m["op"] in ("open", "delta"))
        await submit(tab, "second")
        gate.set()
        await watcher.until_idle()
        await watcher.until_idle()
    assert beats == [("ok", "")]
    rows = await chunks(tab.pk)
    assert [c.data["text"] for c in rows] == ["first", "one", "second", "two"]
    assert not await RunningTurn.objects.aexists()


async def test_a_worker_stopped_while_it_takes_a_lease_hands_the_lease_back(monkeypatch):
    """The lease commits on the database thread after the stop: it is handed back, the
    message stays queued for the next start, and nothing calls the turn interrupted."""
    real_acquire = lease.acquire
    entered = threading.Event()
    leave = threading.Event()

    def slow_acquire(tab_id, worker):
        entered.set()
        leave.wait(ZOMBIE_WAIT_SECONDS)
        return real_acquire(tab_id, worker)

    monkeypatch.setattr(lease, "acquire", slow_acquire)
    tab = await make_tab()
    async with running_worker() as workers:
        await submit(tab, "hello")
        assert await asyncio.to_thread(entered.wait, ZOMBIE_WAIT_SECONDS)
        for worker in workers:
            worker.cancel()
        await asyncio.sleep(0)
        leave.set()
        await asyncio.gather(*workers, return_exceptions=True)
    assert not await RunningTurn.objects.aexists()
    assert await QueuedMessage.objects.filter(tab=tab).acount() == 1
    assert await chunks(tab.pk) == []
    assert tab.pk not in lease._claims


async def test_a_runner_that_cannot_join_its_control_group_gives_the_lease_up(answer, monkeypatch):
    layer = get_channel_layer()
    real_group_add = layer.group_add

    tried = asyncio.Event()

    async def failing_group_add(group, channel):
        if group.startswith("tabctl."):
            tried.set()
            raise ConnectionError("the channel layer is down")
        return await real_group_add(group, channel)

    monkeypatch.setattr(layer, "group_add", failing_group_add)
    tab = await make_tab()
    async with running_worker():
        await submit(tab, "hello")
        await asyncio.wait_for(tried.wait(), ZOMBIE_WAIT_SECONDS)
        deadline = time.monotonic() + ZOMBIE_WAIT_SECONDS
        while not await _lease_given_up(tab):
            assert time.monotonic() < deadline, "the lease was kept"
            await asyncio.sleep(0.01)
    assert await QueuedMessage.objects.filter(tab=tab).acount() == 1
    assert tab.pk not in lease._claims
    assert tab.pk not in worker.RUNNING


async def _lease_given_up(tab) -> bool:
    return tab.pk not in lease._claims and not await RunningTurn.objects.aexists()


async def test_a_stop_that_comes_while_a_turn_joins_its_control_group_still_drains_it(monkeypatch):
    """Joining the control group is a Redis round trip: a stop landing then must still
    mark the new runner draining, or it would run the next queued turn instead of
    handing it to a worker that stays."""

    class Layer:
        async def group_add(self, group, channel):
            worker._stop_accepting()

        async def group_discard(self, group, channel):
            pass

    async def run(self):
        return None

    monkeypatch.setattr(worker, "accepting_turns", True)
    monkeypatch.setattr(loop.TurnRunner, "run", run)
    consumer = worker.TurnWorker()
    consumer.channel_layer, consumer.channel_name = Layer(), "worker-channel"
    consumer.tasks, consumer.runners = set(), set()
    tab_id = uuid.uuid4()
    lease.claim(tab_id)
    assert await consumer._start(tab_id, uuid.uuid4(), False)
    runner = worker.RUNNING[tab_id]
    assert runner.draining
    await asyncio.gather(*consumer.tasks)
    assert tab_id not in worker.RUNNING and tab_id not in lease._claims


@pytest.mark.parametrize(
    ("why", "text"),
    [("", "Stopped by the user."), ("its parent was stopped", "Stopped: its parent was stopped.")],
)
async def test_a_stop_the_heartbeat_finds_first_keeps_its_reason(script, monkeypatch, why, text):
    """The Stop is in the lease row before its control message arrives (here the message
    is never sent): the heartbeat stops the turn with the same words the message carries —
    a sub-agent stopped by its parent must not say it was stopped by the user."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.05)
    gate = asyncio.Event()
    script([TextDelta("working"), gate, Finish()])
    tab = await make_tab()
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "go")
        await watcher.until(lambda m: m["op"] in ("open", "delta"))
        assert await database_sync_to_async(lease.request_cancel)(tab.pk, why=why)
        await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert rows[-1].data == {"kind": "cancelled", "text": text}


async def test_a_runner_whose_lease_was_taken_since_its_heartbeat_writes_nothing_more(
    script, monkeypatch
):
    """A stalled runner (its heartbeat far off) is recovered by another worker, then
    wakes and seals its block: the seal is refused under the tab lock, so the log ends
    with the recovery's notice, the runner stops, and the lease stays the recovery's
    business (here: released, nothing left to run)."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 3600)
    gate = asyncio.Event()
    script([TextDelta("one"), gate, TextDelta(" two"), Finish()])
    tab = await make_tab()
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "go")
        await watcher.until(lambda m: m["op"] in ("open", "delta"))
        runner = worker.RUNNING[tab.pk]
        await RunningTurn.objects.filter(tab_id=tab.pk).aupdate(
            worker="elsewhere:1:gone", heartbeat_at=timezone.now() - timezone.timedelta(minutes=5)
        )
        assert await database_sync_to_async(lease.recover_stale)() == [tab.pk]
        recovered = kinds(await chunks(tab.pk))
        gate.set()
        while tab.pk in worker.RUNNING:
            await asyncio.sleep(0.05)
    assert runner.lease_lost
    rows = await chunks(tab.pk)
    assert kinds(rows) == recovered
    assert recovered[-1] == "system/system" and rows[-1].data["kind"] == "interrupted"
    assert not any("two" in str(row.data.get("text", "")) for row in rows)
    assert not await RunningTurn.objects.filter(tab_id=tab.pk).aexists()


async def test_the_first_stop_recorded_keeps_its_reason():
    """A user's Stop, then a parent's: the heartbeat reports the first, as the runner keeps
    the first (TurnRunner.cancel); a Stop with no turn running records nothing."""
    tab = await make_tab()
    assert not await database_sync_to_async(lease.request_cancel)(tab.pk, why="late")
    await database_sync_to_async(lease_row)(tab, "w:1:x")
    assert await database_sync_to_async(lease.request_cancel)(tab.pk)
    assert await database_sync_to_async(lease.request_cancel)(tab.pk, why="its parent was stopped")
    row = await RunningTurn.objects.aget(tab_id=tab.pk)
    assert (row.cancel_requested, row.cancel_why) == (True, "")
    assert await database_sync_to_async(lease.beat)(tab.pk, row.turn_id) == ("cancel", "")
