"""What changes during a turn is said at its end (the idle-tab notice skips a tab whose turn
runs): the settings, and the tab's own model."""

from __future__ import annotations

import asyncio

import pytest

from chat.models import Setting, Tab
from chat.providers.base import Finish, TextDelta
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


@pytest.fixture
def release() -> asyncio.Event:
    """Holds the turn after its first delta until the change is made."""
    return asyncio.Event()


async def _turn_changing(tab, release: asyncio.Event, change) -> list:
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "go")
        await watcher.until(lambda m: m["op"] == "open")
        await change()
        release.set()
        await watcher.until_idle()
    return await chunks(tab.pk)


async def test_a_setting_changed_during_a_one_step_turn_is_said_at_its_end(
    script, workspace, release
):
    script([TextDelta("Working."), release, TextDelta(" Done."), Finish()])
    tab = await make_tab(approve_tools=False)

    async def change():
        await Setting.objects.aupdate_or_create(key="approve_tools", defaults={"value": True})

    rows = await _turn_changing(tab, release, change)
    assert kinds(rows)[-1] == "system/system"
    assert rows[-1].data == {"kind": "config-reload", "text": "Settings changed: tool approval on."}


async def test_the_tabs_model_changed_during_a_turn_is_said_at_its_end(script, workspace, release):
    script([TextDelta("Working."), release, TextDelta(" Done."), Finish()])
    tab = await make_tab()
    old = tab.model

    async def change():
        await Tab.objects.filter(pk=tab.pk).aupdate(model="offline/other")

    rows = await _turn_changing(tab, release, change)
    assert rows[-1].data == {
        "kind": "config-reload",
        "text": f"Settings changed: model {old} → offline/other.",
    }
