"""What a turn costs when nobody watches: no sidebar entry is read for an owner with no
page open (embedded mode, where the process knows)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from chat import sidebar
from chat.providers.base import Finish, TextDelta
from tests.engine import Watcher, make_tab, owner_workspace, running_worker, submit
from tests.test_socket import FRAME_TIMEOUT, open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


@pytest.fixture
def entries(monkeypatch) -> list[dict]:
    """The announcements whose sidebar entries were read."""
    read: list[dict] = []
    real = sidebar.with_entries

    def with_entries(message):
        read.append(message)
        return real(message)

    monkeypatch.setattr(sidebar, "with_entries", with_entries)
    return read


async def _turn(tab) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, "hi")
        await watcher.until_idle()


async def test_no_entry_is_read_when_no_page_of_the_owner_is_open(script, workspace, entries):
    script([TextDelta("a"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await _turn(tab)
    assert entries == []


async def test_an_open_page_of_the_owner_gets_the_entries(script, workspace, entries):
    script([TextDelta("a"), Finish()])
    async with running_worker():
        tab = await make_tab()
        other = await make_tab()
        owner = await database_sync_to_async(lambda: tab.owner)()
        page = await open_socket(other.pk, owner)
        await _turn(tab)
        # The idle entry reaches the page after the turn's own idle.
        while not (
            "idle" in (frame := await page.receive_from(FRAME_TIMEOUT)) and str(tab.pk) in frame
        ):
            pass
        await page.disconnect()
    assert [m["state"] for m in entries] == ["running", "idle"]
