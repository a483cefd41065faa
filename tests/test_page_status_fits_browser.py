"""The status line always fits (issue 31): at 1280 and 375 px, in every state a turn can be
in (running with its step and clock, waiting for approval, sub-agents running and asking,
the model silent a while, an unsandboxed shell), offline, and with an upload error beside
it, no element of the composer's row is cut: each one's scrollWidth is within its
clientWidth, and each stays inside the composer. The model and tokens are behind the status
line's details button, which stays open across status frames.

The page comes from a live server; its WebSocket is answered by Playwright with
chat.render's real frames (as in tests/test_render_browser.py).
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.utils.timezone import now

from chat import render
from chat.models import Tab
from harness.login import browser_cookie, session_for
from tests.test_render_browser import FakeSocket

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

WAIT_MS = 10_000
MODEL = "anthropic/claude-sonnet-4-5"

# Every element of the composer's row (the status line's parts among them) that is shown
# and cut: its content wider than its box, or its box out of the composer's.
CUT = """
() => {
  const composer = document.getElementById('composer').getBoundingClientRect();
  const row = document.querySelector('#composer .composer-row');
  return Array.from(row.querySelectorAll('*')).filter((el) => {
    if (el.closest('.status-pop') || el.closest('svg')) return false;
    const box = el.getBoundingClientRect();
    if (!box.width || getComputedStyle(el).visibility === 'hidden') return false;
    const cut = el.scrollWidth > el.clientWidth + 0.5 && getComputedStyle(el).display !== 'inline';
    const out = box.left < composer.left - 0.5 || box.right > composer.right + 0.5;
    return cut || out;
  }).map((el) => `${el.tagName.toLowerCase()}.${el.className} "${el.textContent.trim()}"`);
}
"""


def make_tab() -> tuple[Tab, str]:
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    return Tab.objects.create(owner=user, model=MODEL), session_for(user)


def status(state: str, turn: uuid.UUID, **more: Any) -> str:
    return render.fragment_status(
        {
            "state": state,
            "turn_id": str(turn),
            "step": 12,
            "model": MODEL,
            "started_at": (now() - timedelta(minutes=12)).isoformat(),
            "usage": {
                "input": 328_411,
                "output": 45_120,
                "cache_read": 310_000,
                "cache_write": 9_000,
            },
            "context": {"used": 150_000, "window": 200_000, "compact_at": 180_000, "cached": 0.4},
            **more,
        }
    )


def child(n: int, *, asking: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "tab": str(uuid.uuid4()),
        "title": f"Sub-agent number {n} with a long title",
        "call_id": f"agent-{n}",
        "state": "waiting" if asking else "running",
        "step": 3,
    }
    if asking:
        entry["approval"] = {
            "call_id": f"c{n}",
            "name": "shell",
            "arguments": {"command": "make test"},
        }
    return entry


async def cut(page: Any) -> list[str]:
    return await page.evaluate(CUT)


async def check_widths(page: Any, what: str) -> None:
    for width in (1280, 375):
        await page.set_viewport_size({"width": width, "height": 800})
        assert await cut(page) == [], f"{what} at {width} px"


async def test_the_status_line_fits_in_every_state_at_both_widths(browser, live_server):
    tab, session = await sync_to_async(make_tab)()
    context = await browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True)
    await context.add_cookies([browser_cookie(session, live_server.url)])
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    socket = FakeSocket()
    await page.route_web_socket(re.compile(r"/ws/tabs/"), socket.handler)
    await page.goto(f"{live_server.url}/t/{tab.id}/")
    await socket.hello()
    turn = uuid.uuid4()

    socket.send(status("idle", turn))
    await page.wait_for_selector("#status[data-state=idle]")
    await check_widths(page, "idle")

    socket.send(status("running", turn))
    await page.wait_for_selector("#status[data-state=running] .elapsed")
    assert await page.text_content("#status .state") == "Running"
    # The details are behind a button, and stay open across the frames that follow.
    assert await page.is_hidden("#status .status-pop")
    await page.click("#status .status-more > summary")
    assert "in 328.4k · out 45.1k · cache read 310k" in await page.inner_text("#status .status-pop")
    assert MODEL in await page.inner_text("#status .status-pop")
    socket.send(status("running", turn, step=13))
    await page.wait_for_function(
        "document.querySelector('#status .step').textContent === 'step 13'"
    )
    assert await page.is_visible("#status .status-pop")
    await page.keyboard.press("Escape")
    assert await page.is_hidden("#status .status-pop")
    assert await page.is_visible("[data-stop]"), "Escape closed the details, it did not stop"
    await check_widths(page, "running")

    socket.send(status("running", turn, waiting_since=(now() - timedelta(seconds=95)).isoformat()))
    await page.wait_for_selector("#status .waiting", state="attached")
    await check_widths(page, "waiting for the model")

    approval = {"call_id": "c0", "name": "shell", "arguments": {"command": "rm -rf build && make"}}
    socket.send(status("waiting", turn, approval=approval))
    await page.wait_for_selector("#status[data-state=waiting]")
    assert await page.text_content("#status .state") == "Waiting for approval"
    await check_widths(page, "waiting for approval")

    children = [child(1, asking=True), child(2, asking=True), child(3, asking=False)]
    socket.send(status("running", turn, children=children))
    await page.wait_for_selector("#status .child-status", state="attached")
    assert await page.text_content("#status .child-status") == "3 sub-agents · 2 ask approval"
    # Each sub-agent's approval is answered in the bar, on its own tab's endpoint.
    assert await page.locator("#approval .child-approval button[name=approve]").count() == 2
    await check_widths(page, "sub-agents")

    # An upload error beside it takes a line of its own.
    await page.route(
        re.compile(r"/attachments/$"),
        lambda route: route.fulfill(
            status=400, body="This kind of file cannot be attached here: application/x-msdownload"
        ),
    )
    await page.set_input_files(
        "#attach-input",
        files=[{"name": "setup.exe", "mimeType": "application/x-msdownload", "buffer": b"MZ"}],
    )
    await page.wait_for_selector("#composer-error:text('Not attached')")
    await check_widths(page, "an upload error")

    # Offline: the connection line stands in for the status line.
    await socket.ws.close(code=1012, reason="restart")
    await page.wait_for_selector("#conn[data-state=down]")
    await page.fill("#composer-text", "waiting for the connection")
    await page.press("#composer-text", "Enter")
    await page.wait_for_selector("#conn .conn-cancel:visible")
    await check_widths(page, "offline with a message waiting")
    assert errors == []
    await context.close()
