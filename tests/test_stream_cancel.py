"""The provider's stream is consumed in the runner's own task (chat.turn.step): no producer
task or queue between the SDK and the reducer, and Stop interrupts only the wait for the
next event, leaving the task fit for the next turn."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from chat import log, turns
from chat.models import RunningTurn
from chat.providers.base import Finish, TextDelta
from chat.providers.replay import ScriptedProvider
from chat.turn import outbox
from tests.engine import (
    Watcher,
    chunks,
    kinds,
    make_tab,
    owner_workspace,
    running_worker,
    submit,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


class TaskRecordingProvider(ScriptedProvider):
    """Notes the task its stream runs in, at every event."""

    def __init__(self, *steps) -> None:
        super().__init__(list(steps))
        self.tasks: set[asyncio.Task | None] = set()

    async def stream(self, request):
        async for event in super().stream(request):
            self.tasks.add(asyncio.current_task())
            yield event


async def test_the_provider_is_read_in_the_task_that_applies_its_ops(
    script,
    workspace,
    monkeypatch,
):
    provider = TaskRecordingProvider([TextDelta("a"), TextDelta("b"), Finish()])
    script(models={"scripted/test": provider})
    appliers: set[asyncio.Task | None] = set()
    real_apply = outbox.Outbox.apply

    async def apply(self, ops):
        appliers.add(asyncio.current_task())
        await real_apply(self, ops)

    monkeypatch.setattr(outbox.Outbox, "apply", apply)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "hi")
            await watcher.until_idle()
    assert len(provider.tasks) == 1
    assert provider.tasks == appliers


async def test_a_stop_while_the_model_is_silent_ends_the_turn_and_the_next_turn_runs(
    script,
    workspace,
):
    """Stop cancels the runner's task where it waits for the provider; the cancel is taken
    back there (TurnCancelled instead), so the same runner goes on to the next turn."""
    silent = asyncio.Event()
    provider = script([TextDelta("Half"), silent], [TextDelta("Whole."), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "first")
            await watcher.until(lambda m: m["op"] == "delta")
            assert await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
            await submit(tab, "second")
            await watcher.until(lambda m: m["op"] == "seal" and m["block"]["type"] == "text")
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/text",
        "system/system",
        "user/text",
        "assistant/text",
    ]
    assert rows[2].data["kind"] == "cancelled"
    assert [rows[1].data["text"], rows[4].data["text"]] == ["Half", "Whole."]
    assert provider.outcomes == ["closed", "done"]
    assert not await RunningTurn.objects.aexists()


async def test_a_block_sealed_before_its_first_checkpoint_clears_none(
    script, workspace, monkeypatch
):
    """The seal of a block never checkpointed writes no checkpoint clearing (a fixed cost
    of every short turn); one checkpointed is cleared with its seal."""
    clears: list[bool] = []
    real_append = log.append

    def append(tab_id, blocks, *, clear_checkpoint=False, **kwargs):
        clears.extend(clear_checkpoint for b in blocks if b.role == "assistant")
        return real_append(tab_id, blocks, clear_checkpoint=clear_checkpoint, **kwargs)

    monkeypatch.setattr(log, "append", append)
    # The second step's text pauses past the checkpoint's idle debounce (250 ms).
    script([TextDelta("quick"), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "one")
            await watcher.until_idle()
    script([TextDelta("slow "), TextDelta("answer"), Finish()], delay=0.4)
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "two")
        await watcher.until_idle()
    assert clears == [False, True]
