"""Wakes in turns: the worker's scheduler fires a due wake, an unattended turn waits for
approval or (approval policy "deny") is told no, and schedule_wake always asks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import bus, turns
from chat.models import PermissionRule, Wake, WakeRun
from chat.providers.base import Finish, TextDelta, ToolCallEvent
from tests.engine import Watcher, chunks, make_tab, owner_workspace, running_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


def call(call_id: str, name: str, **arguments) -> ToolCallEvent:
    return ToolCallEvent(call_id, name, arguments)


HOURLY = {"name": "again", "prompt": "p", "interval_seconds": 3600}


def waiting(m) -> bool:
    return m["op"] == "status" and m["status"]["state"] == "waiting"


@database_sync_to_async
def due_wake(tab, **fields) -> Wake:
    values = {
        "owner_id": tab.owner_id,
        "name": "nightly",
        "tab": tab,
        "prompt": "write the report",
        "kind": "interval",
        "interval_seconds": 3600,
        "next_run_at": timezone.now() - timedelta(seconds=1),
    }
    values.update(fields)
    wake = Wake.objects.create(**values)
    bus.wakes_changed()
    return wake


async def test_the_workers_scheduler_fires_a_due_wake_into_a_turn(script, workspace):
    script([TextDelta("report written"), Finish()])
    tab = await make_tab()
    async with running_worker(), Watcher(tab.pk) as watcher:
        wake = await due_wake(tab)
        await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert rows[0].data["text"] == "write the report"
    assert rows[0].data["origin"]["wake_id"] == wake.pk
    assert rows[1].data["text"] == "report written"
    run = await WakeRun.objects.aget(wake=wake)
    assert (run.status, run.tab_id) == ("submitted", tab.pk)


async def test_an_unattended_turn_waits_for_approval(script, workspace):
    script(
        [call("w", "write_file", path="r.txt", content="r"), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    tab = await make_tab(approve_tools=True)
    async with running_worker(), Watcher(tab.pk) as watcher:
        await due_wake(tab)
        status = await watcher.until(waiting)
        assert status["status"]["approval"]["name"] == "write_file"
        await database_sync_to_async(turns.approve)(tab.pk, "w", True)
        await watcher.until_idle()
    assert (workspace / "r.txt").read_text() == "r"


async def test_a_deny_wakes_turn_is_not_approved_and_goes_on(script, workspace):
    script(
        [
            call("w", "write_file", path="r.txt", content="r"),
            call("l", "list_files"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("could not write"), Finish()],
    )
    tab = await make_tab(approve_tools=True)
    async with running_worker(), Watcher(tab.pk) as watcher:
        await due_wake(tab, approval="deny")
        await watcher.until_idle()
    rows = await chunks(tab.pk)
    results = {r.data["call_id"]: r.data for r in rows if r.type == "tool_result"}
    assert results["w"]["result"] == "Not approved: unattended wake turn."
    assert results["w"]["is_error"] is True
    assert results["l"]["is_error"] is False  # needs no approval: runs
    assert not (workspace / "r.txt").exists()
    assert rows[-1].data["text"] == "could not write"


async def test_a_user_message_in_the_turn_makes_it_attended(script, workspace):
    """The user wrote too (queued before the turn took the wake's message): they are
    there, so the call waits for them instead of being refused."""
    script(
        [call("w", "write_file", path="r.txt", content="r"), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    tab = await make_tab(approve_tools=True)
    await database_sync_to_async(turns._enqueue)(tab, "me too")
    async with running_worker(), Watcher(tab.pk) as watcher:
        await due_wake(tab, approval="deny")
        await watcher.until(waiting)
        await database_sync_to_async(turns.approve)(tab.pk, "w", True)
        await watcher.until_idle()
    assert (workspace / "r.txt").exists()


async def test_schedule_wake_asks_even_when_a_rule_allows_it(script, workspace):
    script(
        [
            ToolCallEvent(
                "s", "schedule_wake", {"name": "again", "prompt": "p", "interval_seconds": 3600}
            ),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("scheduled"), Finish()],
    )
    tab = await make_tab(approve_tools=False)
    await PermissionRule.objects.acreate(user_id=tab.owner_id, action="allow", pattern="*")
    async with running_worker(), Watcher(tab.pk) as watcher:
        await database_sync_to_async(turns.submit)(tab, "remind me hourly")
        status = await watcher.until(waiting)
        assert status["status"]["approval"]["name"] == "schedule_wake"
        assert not await Wake.objects.aexists()
        await database_sync_to_async(turns.approve)(tab.pk, "s", True)
        await watcher.until_idle()
    wake = await Wake.objects.aget()
    assert (wake.created_by, wake.tab_id, wake.interval_seconds) == ("agent", tab.pk, 3600)
    assert wake.expires_at is not None


async def test_a_wake_turn_cannot_schedule_wakes_under_deny(script, workspace):
    script(
        [
            ToolCallEvent(
                "s", "schedule_wake", {"name": "again", "prompt": "p", "interval_seconds": 3600}
            ),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("ok"), Finish()],
    )
    tab = await make_tab(approve_tools=True)
    async with running_worker(), Watcher(tab.pk) as watcher:
        wake = await due_wake(tab, approval="deny")
        await watcher.until_idle()
    assert await Wake.objects.acount() == 1 and (await Wake.objects.aget()).pk == wake.pk
