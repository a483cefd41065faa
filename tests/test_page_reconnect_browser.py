"""After a reconnect the Send button says what it does again (issue 31): its tooltip
"Not connected: the message will wait…" is only for the time the page is cut off."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from harness.login import session_for
from tests.live import make_tab, make_user, open_page, synced

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


async def test_the_send_buttons_tooltip_is_its_own_again_after_a_reconnect(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)
    send = page.locator("#composer .send")
    own = await send.get_attribute("title")
    assert own == "Send (Enter)"

    await sync_to_async(server.kill)()
    await page.wait_for_selector("#conn[data-state=down]")
    assert "Not connected" in (await send.get_attribute("title"))

    await serve(port=server.port)
    await page.wait_for_selector("#conn", state="hidden")
    await page.wait_for_selector("#status:visible")
    assert await send.get_attribute("title") == own
    live.assert_clean()
