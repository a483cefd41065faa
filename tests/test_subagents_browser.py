"""Sub-agents in Chromium against a live `manage.py serve`: a turn's `agent` call spawns a
child tab; while the child streams (slowly), the agent call's card links to it and shows
its state and step, live; then the result card links to it and the parent answers. A
child's approval shows in the parent's approval bar and is answered there. The Anthropic
adapter talks to the fake provider (replies in request order: parent, child, parent)."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async

from chat.models import Tab
from harness.login import session_for
from tests.live import (
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    rows,
    screenshot,
    send_message,
    set_setting,
    shots_resized,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

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
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)

    await send_message(page, "survey the workspace with a sub-agent")
    card = page.locator("#log .child-live")
    await card.locator(".child-state", has_text="running").wait_for(state="visible")
    child = await sync_to_async(child_of)(tab.id, "toolu_1")
    assert await card.locator("a.child-tab").get_attribute("href") == f"/t/{child}/"
    assert await card.locator("a.child-tab").inner_text() == "Survey"
    # The step follows the child live: it moves on without a reload.
    await card.locator(".child-step", has_text="step 1").wait_for()
    assert await page.locator("#status .child-status").inner_text() == "sub-agent running"
    await shots_resized(page, "subagent-running")

    link = page.locator("#log .child-link")
    await link.wait_for(state="visible")
    assert await link.get_attribute("href") == f"/t/{child}/"
    await page.locator("#log", has_text="The child says it is empty.").wait_for()
    await turn_ended(tab.id)
    assert not await card.is_visible()
    assert await page.locator("#status .child-status").count() == 0
    await screenshot(page, "subagent-done-1280")
    log = await sync_to_async(rows)(tab.id)
    result = next(c for c in log if c.type == "tool_result")
    assert result.data["result"].startswith("The workspace is empty.\n\n")

    await link.click()
    await page.wait_for_url(f"**/t/{child}/")
    await page.locator("#subagent-of a").wait_for(state="attached")
    assert await page.locator("#subagent-of a").get_attribute("href") == f"/t/{tab.id}/"
    live.assert_clean()


async def test_a_childs_approval_is_answered_in_the_parent_tab(browser, serve, fake_server):
    fake_server.add(
        anthropic_reply(
            [
                (
                    "tool_use",
                    ("toolu_1", "agent", {"description": "Writer", "prompt": "write it"}),
                ),
            ],
            stop_reason="tool_use",
        ),
        anthropic_reply(
            [("tool_use", ("toolu_w", "write_file", {"path": "x.txt", "content": "hi"}))],
            stop_reason="tool_use",
        ),
        anthropic_reply([("text", ["Wrote x.txt."])], stop_reason="end_turn"),
        anthropic_reply([("text", ["The child wrote it."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    await sync_to_async(set_setting)("approve_tools", True)
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)

    await send_message(page, "have a sub-agent write x.txt")
    await page.locator("#approval .child-approval").wait_for(state="visible")
    child = await sync_to_async(child_of)(tab.id, "toolu_1")
    asks = page.locator(f'#approval .child-approval[data-child="{child}"]')
    assert await asks.count() == 1
    assert await asks.locator(".child-who a").get_attribute("href") == f"/t/{child}/"
    what = await asks.locator(".approval-what").inner_text()
    assert what == "Sub-agent Writer: write_file x.txt"
    card = page.locator("#log .child-live")
    await card.locator(".child-state", has_text="waiting for approval").wait_for()
    assert "asks to run write_file" in await card.inner_text()
    assert await page.locator("#status .child-status").inner_text() == "sub-agent asks approval"
    await shots_resized(page, "subagent-approval")
    # A page opened while the child waits learns of it from the parent's runner.
    await page.reload()
    await synced(page)
    await asks.wait_for(state="visible")
    await card.locator(".child-state", has_text="waiting for approval").wait_for()

    await asks.locator("button[name=approve]").click()
    await page.locator("#log", has_text="The child wrote it.").wait_for()
    await turn_ended(tab.id)
    assert await page.locator("#approval").is_hidden()
    child_log = await sync_to_async(rows)(child)
    result = next(c for c in child_log if c.type == "tool_result")
    assert result.data["is_error"] is False
    parent_result = next(c for c in await sync_to_async(rows)(tab.id) if c.type == "tool_result")
    assert parent_result.data["result"].startswith("Wrote x.txt.\n\n")
    live.assert_clean()


def child_of(parent_id: uuid.UUID, call_id: str) -> uuid.UUID:
    """The child tab that call of the parent made (found, however its id is derived)."""
    return Tab.objects.get(parent_tab_id=parent_id, parent_call_id=call_id).pk
