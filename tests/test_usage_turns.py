"""A turn's end tells its watchers the turn's tokens and cost and the tab's, read back from
the usage records as a page render reads them (chat.turn, chat.usage.turn_end)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from chat import render, usage
from chat.providers.base import Finish, TextDelta, Usage
from tests.engine import Watcher, make_tab, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SONNET = "anthropic/claude-sonnet-4-5"


async def run_one(tab, text: str) -> dict:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        return (await watcher.until_idle())["status"]


async def test_the_idle_status_carries_the_turns_usage_and_the_tabs(script):
    script(
        [TextDelta("one"), Finish(Usage(100, 20, 900, 50), "end_turn")],
        [TextDelta("two"), Finish(Usage(10, 5, 1_000, 0), "end_turn")],
    )
    async with running_worker():
        tab = await make_tab(SONNET)
        first = await run_one(tab, "a")
        second = await run_one(tab, "b")
    end = second["turn_end"]
    assert end["turn_id"] == second["turn_id"]
    assert end == await database_sync_to_async(usage.turn_end)(tab.pk, second["turn_id"])
    turn = usage.Totals.from_dict(end["turn"])
    assert turn.tokens == usage.Tokens(10, 5, 1_000, 0) and turn.steps == 1 and turn.priced
    tab_totals = usage.Totals.from_dict(end["tab"])
    assert tab_totals.tokens == usage.Tokens(110, 25, 1_900, 50) and tab_totals.steps == 2
    assert tab_totals.usd == turn.usd + usage.Totals.from_dict(first["turn_end"]["turn"]).usd
    # The page's status frame puts the line and the totals in.
    frame = render.fragment_status(second)
    assert f'id="usage-{second["turn_id"]}"' in frame and 'id="tab-usage"' in frame


async def test_a_running_status_carries_no_turn_end(script):
    script([TextDelta("one"), Finish(Usage(1, 1), "end_turn")])
    async with running_worker():
        tab = await make_tab(SONNET)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "a")
            await watcher.until_idle()
    statuses = [m["status"] for m in watcher.ops if m["op"] == "status"]
    assert all("turn_end" not in s for s in statuses if s["state"] != "idle")


async def test_a_turn_ends_even_when_its_usage_cannot_be_read(script, monkeypatch):
    def broken(*args):
        raise RuntimeError("database gone")

    monkeypatch.setattr(usage, "turn_end", broken)
    script([TextDelta("one"), Finish(Usage(1, 1), "end_turn")])
    async with running_worker():
        tab = await make_tab(SONNET)
        idle = await run_one(tab, "a")
    assert idle["state"] == "idle" and "turn_end" not in idle
