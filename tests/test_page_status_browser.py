"""The tab page's status line and its states in Chromium against a live `manage.py serve`
(issue 31): waiting for approval, running, after a turn with tool calls, an error card and
the search; at 1280 and 375 px no element of the status line is cut (its scrollWidth is
within its clientWidth).

With PAGE_SHOTS=<prefix> the states are also saved as PNGs in test-artifacts/ (and with
PAGE_SHOTS=readme the first run becomes docs/screenshot.png).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from harness.fakeprovider import Reply
from harness.login import session_for
from harness.servers import ROOT
from tests.live import (
    ARTIFACTS,
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    send_message,
    set_setting,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

MODEL = "anthropic/claude-sonnet-4-5"
PREFIX = os.environ.get("PAGE_SHOTS", "")
FOLDER = ARTIFACTS


async def shoot(page: Any, name: str) -> None:
    if not PREFIX:
        return
    FOLDER.mkdir(parents=True, exist_ok=True)
    for width in (1280, 375):
        await page.set_viewport_size({"width": width, "height": 800})
        await page.wait_for_function(
            "(document.querySelector('.sidebar')?.getAnimations().length ?? 0) === 0"
        )
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            await page.screenshot(
                path=str(FOLDER / f"{PREFIX}-{name}-{width}-{scheme}.png"), animations="disabled"
            )
    await page.set_viewport_size({"width": 1280, "height": 800})
    await page.emulate_media(color_scheme="light")


async def test_the_tab_page_states(browser, serve, fake_server):
    fake_server.add(
        anthropic_reply(
            [
                ("text", ["Let me list the files."]),
                ("tool_use", ("toolu_1", "list_files", {"path": "."})),
            ],
            stop_reason="tool_use",
        ),
        anthropic_reply(
            [("tool_use", ("toolu_2", "shell", {"command": "echo report"}))],
            stop_reason="tool_use",
        ),
        anthropic_reply(
            [("text", [f"word{i} " for i in range(40)])], stop_reason="end_turn", pause=0.4
        ),
        Reply.error(401, "authentication_error", "invalid x-api-key"),
    )
    server = await serve(**anthropic_env(fake_server))
    await sync_to_async(set_setting)("approve_tools", True)
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL, title="Files and a report")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)
    await send_message(page, "list the files and write a **report**")
    await page.wait_for_selector("#approval button[name=approve]")
    await shoot(page, "approval")
    await page.click("#approval button[name=approve]")
    await page.wait_for_selector("#log .chunk.open")
    await shoot(page, "running")
    await turn_ended(tab.id)
    await page.wait_for_selector("#status.state-idle")
    await shoot(page, "tools")

    other = await sync_to_async(make_tab)(user, MODEL, title="A failing key")
    await page.goto(f"{server.url}/t/{other.id}/")
    await synced(page)
    await send_message(page, "hello")
    await page.wait_for_selector("#log .t-error .card.error")
    await turn_ended(other.id)
    await shoot(page, "error")

    await page.fill("#search-q", "report")
    await page.wait_for_selector("#search-results .hits")
    await shoot(page, "search")
    if PREFIX:
        # On a phone the search is in the tab list, which slides in ("/" opens it).
        await page.set_viewport_size({"width": 375, "height": 800})
        await page.evaluate("document.getElementById('nav-toggle').checked = true")
        await page.wait_for_function(
            "(document.querySelector('.sidebar')?.getAnimations().length ?? 0) === 0"
        )
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            await page.screenshot(
                path=str(FOLDER / f"{PREFIX}-search-375-open-{scheme}.png"), animations="disabled"
            )


async def test_a_first_run_on_the_offline_demo_starts_with_a_click(browser, serve):
    """A new user's empty tab offers starter prompts; one click sends one, and on the new
    workspace's sample project the offline demo's suggestions work (no red error, no empty
    folder). With PAGE_SHOTS=<prefix> the result is also README's screenshot's candidate."""
    server = await serve(DISPATCH_SAMPLE_PROJECT="1")
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)
    await shoot(page, "empty")
    starters = page.locator("#starters .starter")
    assert await starters.all_text_contents() == [
        "list the files",
        "read README.md",
        "run `python3 hello.py`",
        "run `ls -la`",
    ]
    await starters.nth(0).click()
    await page.wait_for_selector("#starters", state="hidden")
    await turn_ended(tab.id)
    await page.wait_for_selector("#status.state-idle")
    results = page.locator("#log .t-tool-result")
    await results.first.wait_for()
    listing = await results.first.text_content()
    assert all(name in listing for name in ("README.md", "notes.md", "hello.py"))
    await send_message(page, "run `python3 hello.py`")
    # A command asks first (the default rules): approved in the bar over the composer.
    await page.click("#approval button[name=approve]")
    await turn_ended(tab.id)
    await page.wait_for_function("document.querySelectorAll('#log .t-tool-result').length === 2")
    await page.wait_for_selector("#status.state-idle")
    assert "Hello, world!" in await results.nth(1).text_content()
    assert await page.locator("#log .t-error").count() == 0
    await shoot(page, "first-run")
    if PREFIX == "readme":
        await page.emulate_media(color_scheme="light")
        await page.set_viewport_size({"width": 1280, "height": 800})
        await page.screenshot(path=str(ROOT / "docs" / "screenshot.png"), animations="disabled")
    live.assert_clean()
