"""Sub-agents in Chromium against a live `manage.py serve`: a turn's `agent` call spawns a
child tab; while the child streams (slowly), the parent's status line links to it and shows
its state and step; then the result card links to it and the parent answers. The Anthropic
adapter talks to the fake provider (replies in request order: parent, child, parent)."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async

from harness.login import session_for
from tests.live import (
    ARTIFACTS,
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    rows,
    send_message,
    set_setting,
    synced,
    turn_ended,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MODEL = "anthropic/claude-sonnet-4-5"
# Seconds before each piece of the child's answer: long enough to see it running.
CHILD_PAUSE = 1.0


async def test_a_turn_spawns_a_child_whose_status_and_result_the_parent_shows(
    browser, serve, fake_server
):
    fake_server.add(
        anthropic_reply(
            [
                ("text", ["Delegating."]),
                (
                    "tool_use",
                    ("toolu_1", "agent", {"description": "Survey", "prompt": "survey it"}),
                ),
            ],
            stop_reason="tool_use",
        ),
        anthropic_reply(
            [("text", ["The workspace ", "is ", "empty."])],
            stop_reason="end_turn",
            pause=CHILD_PAUSE,
        ),
        anthropic_reply([("text", ["The child says it is empty."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    await sync_to_async(set_setting)("approve_tools", False)
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    child = uuid.uuid5(tab.id, "toolu_1")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)

    await send_message(page, "survey the workspace with a sub-agent")
    running = page.locator(f'#status .child-status[data-child="{child}"]')
    await running.wait_for(state="visible")
    assert await running.locator("a").get_attribute("href") == f"/t/{child}/"
    assert "Survey" in await running.inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "subagent-running-1280.png"))

    link = page.locator("#log .child-link")
    await link.wait_for(state="visible")
    assert await link.get_attribute("href") == f"/t/{child}/"
    await page.locator("#log", has_text="The child says it is empty.").wait_for()
    await turn_ended(tab.id)
    assert await running.count() == 0
    await page.screenshot(path=str(ARTIFACTS / "subagent-done-1280.png"))
    log = await sync_to_async(rows)(tab.id)
    result = next(c for c in log if c.type == "tool_result")
    assert result.data["result"].startswith("The workspace is empty.\n\n")

    await link.click()
    await page.wait_for_url(f"**/t/{child}/")
    await page.locator("#subagent-of a").wait_for(state="attached")
    assert await page.locator("#subagent-of a").get_attribute("href") == f"/t/{tab.id}/"
