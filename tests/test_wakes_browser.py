"""Wakes in Chromium: a wake made on the Wakes page fires a few seconds later through the
server's own scheduler, its turn shows the clock badge, and the page lists the run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import sync_to_async

from chat.models import WakeRun
from harness.login import session_for
from tests.live import make_tab, make_user, open_page, rows, shots_resized, turn_ended, until

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

# Far enough ahead that the form is submitted before it is due.
FIRES_IN = timedelta(seconds=4)


async def test_a_wake_made_on_the_page_fires_and_its_turn_shows_the_badge(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, title="Daily")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/wakes/", session=session, width=1280)
    page = live.page

    # A bad time zone first: said at its field, nothing made.
    await page.fill("#id_name", "hello wake")
    await page.select_option("#id_target", str(tab.pk))
    await page.fill("#id_prompt", "Say hello")
    await page.select_option("#id_kind", "once")
    due = (datetime.now(UTC) + FIRES_IN).replace(microsecond=0)
    await page.fill("#id_once_at", due.strftime("%Y-%m-%dT%H:%M:%S"))
    await page.fill("#id_timezone", "Mars/Olympus")
    await page.click("button:has-text('Add wake')")
    error = await page.text_content("#id_timezone_error")
    assert error.startswith("Unknown time zone 'Mars/Olympus'")
    await shots_resized(page, "wakes-form-error")

    due = (datetime.now(UTC) + FIRES_IN).replace(microsecond=0)
    await page.fill("#id_once_at", due.strftime("%Y-%m-%dT%H:%M:%S"))
    await page.fill("#id_timezone", "UTC")
    await page.click("button:has-text('Add wake')")
    await page.wait_for_selector(".messages >> text=Added the wake “hello wake”")

    async def submitted():
        return await WakeRun.objects.filter(status="submitted").afirst()

    run = await until(submitted, "the wake to fire")
    assert (run.tab_id, run.scheduled_for) == (tab.pk, due)
    await turn_ended(tab.pk)

    await page.goto(server.url + f"/t/{tab.pk}/")
    badge = page.locator("#log .wake-badge")
    await badge.wait_for()
    assert (await badge.text_content()).strip() == f"hello wake · {due:%Y-%m-%d %H:%M} UTC"
    logged = await sync_to_async(rows)(tab.pk)
    assert logged[0].data["text"] == "Say hello" and len(logged) >= 2
    await shots_resized(page, "wakes-badge")

    await page.goto(server.url + "/wakes/")
    await page.click(".wake-runs summary")
    assert await page.text_content(".wake-runs .badge") == "submitted"
    assert await page.get_attribute(".wake-runs a", "href") == f"/t/{tab.pk}/"
    assert await page.text_content(".wake-next") == "never"
    await shots_resized(page, "wakes-page")
    live.assert_clean()
