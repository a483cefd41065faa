"""The lease's liveness: the recovery scan never takes a live turn, and does take dead ones."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import agent, turns
from chat.models import RunningTurn
from chat.providers.base import Finish, TextDelta
from chat.providers.replay import ScriptedProvider
from tests.engine import Watcher, chunks, kinds, make_tab, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# A child that has exited shows as a zombie within milliseconds; this bounds the wait.
ZOMBIE_WAIT_SECONDS = 10.0


@pytest.fixture
def answer(monkeypatch):
    provider = ScriptedProvider([[TextDelta("The answer."), Finish()]])

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(agent, "provider_for", provider_for)
    return provider


def lease(tab, worker: str) -> RunningTurn:
    return RunningTurn.objects.create(
        tab_id=tab.pk, turn_id=uuid.uuid4(), worker=worker, heartbeat_at=timezone.now()
    )


async def test_a_recovery_scan_between_acquire_and_the_runner_start_leaves_the_turn_alone(
    answer, monkeypatch
):
    """The scan runs right after the lease commits, before the runner exists: the turn
    is not taken for a dead one, and a second start in that gap gets no second lease."""
    real_acquire = turns.acquire
    seen: dict[str, object] = {}

    def acquire_then_scan(tab_id, worker):
        turn_id = real_acquire(tab_id, worker)
        if turn_id is not None and "recovered" not in seen:
            seen["recovered"] = turns.recover_stale()
            seen["second"] = real_acquire(tab_id, turns.worker_id("another-channel"))
        return turn_id

    monkeypatch.setattr(turns, "acquire", acquire_then_scan)
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
    running = await database_sync_to_async(lease)(tab, turns.worker_id("x"))
    assert turns.is_dead(running)
    turns.claim(tab.pk)
    turns.claim(tab.pk)
    try:
        assert not turns.is_dead(running)
        turns.unclaim(tab.pk)
        assert not turns.is_dead(running)  # a second claim still holds it
    finally:
        turns.unclaim(tab.pk)
    assert turns.is_dead(running)


async def test_a_zombie_worker_counts_as_dead():
    tab = await make_tab()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + ZOMBIE_WAIT_SECONDS
        while _state(child.pid) != "Z":
            assert time.monotonic() < deadline, "the child never became a zombie"
            time.sleep(0.01)
        worker = f"{socket.gethostname()}:{child.pid}:x"
        running = await database_sync_to_async(lease)(tab, worker)
        assert turns.is_dead(running)
    finally:
        child.wait()


async def test_a_live_worker_of_this_host_and_one_elsewhere_are_alive():
    tab = await make_tab()
    parent = await database_sync_to_async(lease)(tab, f"{socket.gethostname()}:{os.getppid()}:x")
    assert not turns.is_dead(parent)
    parent.worker = "another-host:1:x"
    assert not turns.is_dead(parent)
    parent.heartbeat_at = timezone.now() - timezone.timedelta(seconds=turns.LEASE_STALE_SECONDS + 1)
    assert turns.is_dead(parent)


async def test_the_claim_is_dropped_after_the_turn(answer):
    tab = await make_tab()
    async with running_worker():
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "hello")
            await watcher.until_idle()
        # The runner's task ends just after its idle status went out.
        deadline = time.monotonic() + ZOMBIE_WAIT_SECONDS
        while turns._claims[tab.pk]:
            assert time.monotonic() < deadline, "the claim outlived the turn"
            await asyncio.sleep(0.01)
    assert tab.pk not in turns._claims


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
