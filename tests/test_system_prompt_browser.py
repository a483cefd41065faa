"""A tab's own system prompt in Chromium: shown and editable in a new tab, gone from the
page with the first message, read-only in the tab menu after it."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat.models import Tab
from chat.preferences import DEFAULT_SYSTEM_PROMPT, new_tab
from harness.login import session_for
from tests.live import make_user, open_page, send_message, shots_resized, synced

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


async def test_a_new_tabs_prompt_is_edited_then_frozen_by_the_first_message(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(new_tab)(user, "offline/demo")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)

    editor = page.locator("#sysprompt-edit")
    await editor.locator("summary").click()
    assert await page.input_value("#sysprompt-text") == DEFAULT_SYSTEM_PROMPT
    await page.fill("#sysprompt-text", "You answer in one short sentence.")
    await shots_resized(page, "sysprompt-editing")
    await editor.locator("button", has_text="Save prompt").click()
    await page.wait_for_selector(".messages >> text=Saved this tab's system prompt.")
    assert (await sync_to_async(Tab.objects.get)(pk=tab.pk)).system_prompt == (
        "You answer in one short sentence."
    )
    # Saved, it opens by itself (it is no longer the default).
    await synced(page)
    assert await page.input_value("#sysprompt-text") == "You answer in one short sentence."

    await send_message(page, "hello")
    await page.wait_for_selector("#log .chunk.user")
    await page.wait_for_selector("#sysprompt-edit", state="hidden")
    await page.click("summary[title='Tab menu']")
    view = page.locator(".sysprompt-view")
    await view.locator("summary").click()
    assert await view.locator("pre").text_content() == "You answer in one short sentence."
    assert "Fixed once the first message is sent" in await view.text_content()
    await shots_resized(page, "sysprompt-frozen")
    live.assert_clean()
