"""Quiet by default in Chromium (issue 31): with a pointer, a message's icon row shows on
hover and when the keyboard reaches it (focus-within), and always on the last message; on
a touch phone it is always there; a text that leads into a tool call offers no Copy there.
A sub-agent's approval in the parent's bar posts to the sub-agent's own endpoint.

The page comes from a live server; its WebSocket is answered by Playwright with
chat.render's real frames (as in tests/test_render_browser.py)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from chat import render
from chat.models import Tab
from harness.login import browser_cookie, session_for
from tests.test_render_browser import FakeSocket
from tests.ui_helpers import block

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

WAIT_MS = 10_000


def make_tab() -> tuple[Tab, str]:
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    return Tab.objects.create(owner=user, model="offline/demo"), session_for(user)


async def open_tab(browser: Any, url: str, session: str, tab: Tab, **options: Any):
    context = await browser.new_context(bypass_csp=True, **options)
    await context.add_cookies([browser_cookie(session, url)])
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    socket = FakeSocket()
    await page.route_web_socket(re.compile(r"/ws/tabs/"), socket.handler)
    await page.goto(f"{url}/t/{tab.id}/")
    await socket.hello()
    return context, page, socket


ANSWER = "There is a README. Run it with\n\n```\nmake run && make test && make bench\n```"


def turn_frames(turn: uuid.UUID) -> list[str]:
    """A finished turn: the question, "Let me look." leading into a call, its result, the
    answer with a code block."""
    chunks = [
        block("text", {"text": "what is here?"}, role="user", turn_id=turn, seq=1),
        block("text", {"text": "Let me look."}, role="assistant", turn_id=turn, seq=2),
        block(
            "tool_call",
            {"call_id": "c1", "name": "list_files", "arguments": {"path": "."}},
            turn_id=turn,
            seq=3,
        ),
        block(
            "tool_result",
            {"call_id": "c1", "name": "list_files", "result": "README.md", "is_error": False},
            role="tool",
            turn_id=turn,
            seq=4,
        ),
        block("text", {"text": ANSWER}, role="assistant", turn_id=turn, seq=5),
    ]
    return [render.fragment_seal(c) for c in chunks] + [
        render.fragment_status({"state": "idle", "turn_id": str(turn)})
    ]


async def opacity(page: Any, selector: str) -> float:
    return float(await page.eval_on_selector(selector, "el => getComputedStyle(el).opacity"))


async def test_the_icon_row_shows_on_hover_and_focus_and_always_on_touch(browser, live_server):
    tab, session = await sync_to_async(make_tab)()
    turn = uuid.uuid4()
    wide, page, socket = await open_tab(
        browser, live_server.url, session, tab, viewport={"width": 1280, "height": 800}
    )
    socket.send(*turn_frames(turn))
    await page.wait_for_selector("#log > .chunk:last-child .act-copy")
    question = "#log > .chunk.user .acts"
    answer = "#log > .chunk:last-child > .acts"
    lead_in = "#log > .chunk.t-text.a:not(:last-child) > .acts"
    # Transparent once it is no longer the last message (a short fade).
    await page.wait_for_function(
        f"getComputedStyle(document.querySelector('{question}')).opacity === '0'"
    )
    assert await opacity(page, answer) == 1, "the last message's row is always there"
    assert (await page.eval_on_selector(lead_in, "el => el.offsetHeight")) == 0
    await page.hover("#log > .chunk.user")
    await page.wait_for_function(
        f"getComputedStyle(document.querySelector('{question}')).opacity === '1'"
    )
    await page.mouse.move(0, 0)
    # The keyboard reaches the row: the question's Copy takes the focus and shows.
    await page.focus(f"{question} .act-copy")
    await page.wait_for_function(
        f"getComputedStyle(document.querySelector('{question}')).opacity === '1'"
    )
    assert await page.eval_on_selector(
        f"{question} .act-copy", "el => el.matches(':focus') && el.getAttribute('title') !== ''"
    )
    # Each button's accessible name is its label.
    names = await page.eval_on_selector_all(
        f"{answer} .act", "els => els.map((b) => b.querySelector('.act-label').textContent)"
    )
    assert names[:1] == ["Copy"] and "Branch from here" in names
    await wide.close()

    phone, page, socket = await open_tab(
        browser,
        live_server.url,
        session,
        tab,
        viewport={"width": 375, "height": 740},
        is_mobile=True,
        has_touch=True,
    )
    socket.send(*turn_frames(turn))
    await page.wait_for_selector("#log > .chunk:last-child .act-copy")
    assert await page.is_visible(f"{question} .act-copy")
    assert await opacity(page, question) == 1
    assert await page.is_hidden(f"{lead_in} .act-copy"), "no Copy under a lead-in"
    # A code block's Copy sits above its code, not over the end of its first line.
    button, code = [
        await page.eval_on_selector(
            f"#log .code > {el}", "el => el.getBoundingClientRect().toJSON()"
        )
        for el in (".copy-code", "pre")
    ]
    assert button["bottom"] <= code["top"], (button, code)
    await phone.close()


async def test_a_sub_agents_approval_in_the_bar_posts_to_its_own_tab(browser, live_server):
    tab, session = await sync_to_async(make_tab)()
    context, page, socket = await open_tab(
        browser, live_server.url, session, tab, viewport={"width": 1280, "height": 800}
    )
    child = uuid.uuid4()
    socket.send(
        render.fragment_status(
            {
                "state": "running",
                "turn_id": str(uuid.uuid4()),
                "step": 2,
                "children": [
                    {
                        "tab": str(child),
                        "title": "Researcher",
                        "call_id": "agent-1",
                        "state": "waiting",
                        "approval": {
                            "call_id": "c9",
                            "name": "shell",
                            "arguments": {"command": "make"},
                        },
                    }
                ],
            }
        )
    )
    button = page.locator("#approval .child-approval button[name=approve]")
    await button.wait_for()
    async with page.expect_request(lambda r: r.method == "POST") as request:
        await button.click()
    posted = await request.value
    assert posted.url.endswith(f"/t/{child}/approve/")
    assert "approve=c9" in (posted.post_data or "")
    await context.close()


async def test_an_unknown_models_card_opens_the_model_picker(browser, live_server):
    """A configuration error's main action is its fix: "Choose another model" opens the
    tab's picker with its filter focused, and a click elsewhere closes it again."""
    tab, session = await sync_to_async(make_tab)()
    context, page, socket = await open_tab(
        browser, live_server.url, session, tab, viewport={"width": 1280, "height": 800}
    )
    turn = uuid.uuid4()
    data = {"message": "model: claude-nope", "status_code": 404, "fix": "model"}
    socket.send(
        render.fragment_seal(block("error", data, turn_id=turn, seq=1)),
        render.fragment_status({"state": "idle", "turn_id": str(turn)}),
    )
    await page.click("text=Choose another model")
    await page.wait_for_selector("#model-picker[open]")
    focused = await page.evaluate("document.activeElement && document.activeElement.id")
    assert focused == "model-filter"
    await page.click("#log")
    await page.wait_for_selector("#model-picker:not([open])", state="attached")
    await context.close()
