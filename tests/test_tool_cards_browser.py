"""Tool cards in Chromium against a live `manage.py serve` (issue 15.5): a shell call that
prints nothing yet shows a spinner and a ticking clock (on the page that saw it start and on
one loaded while it runs); once its 400 lines are in, the card says so, opens to full height
and to its plain-text view.

The model is the real Anthropic adapter talking to the fake provider server; the command
runs for real, in the sandbox, and prints nothing until the test opens its gate (a file in
the workspace), so "before any output" is a state the test holds, not a race it wins.
Screenshots of each state at 1280 and 375 px, light and dark, go to test-artifacts/.
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import sync_to_async

from chat.render import size
from chat.stream import Kind
from chat.tools.shell import OUTPUT_HEAD
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
    shots,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

MODEL = "anthropic/claude-sonnet-4-5"
GATE = "gate"
# Silent until the gate opens (polling it, as `sleep` would pass the time), then 400 lines.
COMMAND = f"while [ ! -e {GATE} ]; do sleep 0.05; done; seq -f 'line %03g' 400"
OUTPUT = "".join(f"line {n:03d}\n" for n in range(1, 401))
RUNNING = "#log .t-tool-call.running"
RESULT = "#log .t-tool-call .t-tool-result.has-result"


async def test_a_silent_command_shows_it_runs_then_its_output_counted_expanded_and_whole(
    browser, serve, fake_server
):
    fake_server.add(
        anthropic_reply(
            [("text", ["Counting."]), ("tool_use", ("toolu_1", "shell", {"command": COMMAND}))],
            stop_reason="tool_use",
        ),
        anthropic_reply([("text", ["Done: 400 lines."])], stop_reason="end_turn"),
        anthropic_reply(
            [("tool_use", ("toolu_2", "shell", {"command": "seq 1 100000"}))],
            stop_reason="tool_use",
        ),
        anthropic_reply([("text", ["Cut."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    await sync_to_async(set_setting)("approve_tools", False)
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    phone = await open_page(browser, server, "/", session=session, width=375, mobile=True)
    await synced(page)

    # Running, silent: the spinner and a clock that ticks, over an empty output.
    await send_message(page, "count to 400")
    run = page.locator(f"{RUNNING} .tool-run")
    await run.wait_for(state="visible")
    assert await page.locator(f"{RUNNING} .spinner").is_visible()
    clock = page.locator(f"{RUNNING} .tool-clock")
    await page.wait_for_function(
        f"() => /^0:0[1-9]$/.test(document.querySelector('{RUNNING} .tool-clock').textContent)"
    )
    assert "elapsed" in (await clock.get_attribute("class")).split()
    silent = page.locator(f"{RUNNING} .slot .t-tool-result.open .term.live")
    assert await silent.text_content() == ""
    assert await page.locator(f"{RUNNING} .out-bar").count() == 0

    # A page loaded while it runs shows the same, from the server's markup.
    await phone.page.goto(f"{server.url}/t/{tab.id}/")
    await synced(phone.page)
    await phone.page.locator(f"{RUNNING} .tool-run").wait_for(state="visible")
    assert re.fullmatch(r"\d+:\d\d", await phone.page.text_content(f"{RUNNING} .tool-clock"))
    await shots(page, phone.page, "tool-running")

    # The gate opens: 400 lines, counted; the spinner goes.
    (serve.workspace_of(user) / GATE).touch()
    count = page.locator(f"{RESULT} .out-count")
    await count.wait_for()
    assert await count.text_content() == "400 lines · 3,600 bytes"
    assert await page.locator("#log .t-tool-call.running").count() == 0
    assert not await page.locator("#log .tool-run").first.is_visible()
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    [result] = [c for c in await sync_to_async(rows)(tab.id) if c.type == Kind.TOOL_RESULT]
    assert result.data["shell_output"] == OUTPUT

    # Full height: the box stops scrolling and shows every line.
    box = page.locator(f"{RESULT} > .term")
    before = await box.evaluate("el => [el.clientHeight, el.scrollHeight]")
    assert before[0] < before[1], "400 lines scroll inside their box"
    await phone.page.reload()
    await synced(phone.page)
    await shots(page, phone.page, "tool-output")
    await page.locator(f"{RESULT} .out-expand").click()
    assert await page.locator(f"{RESULT} .out-expand-box").is_checked()
    after = await box.evaluate("el => [el.clientHeight, el.scrollHeight]")
    assert after[0] == after[1] == before[1], "full height: the whole output, no inner scroll"
    await phone.page.locator(f"{RESULT} .out-expand").click()
    for target in (page, phone.page):
        # The expanded box's end, where a box that still scrolled would cut it.
        await target.locator(f"{RESULT} > .sent").evaluate(
            "el => el.scrollIntoView({block: 'center'})"
        )
    await shots(page, phone.page, "tool-expanded")
    await page.locator(f"{RESULT} .out-expand").click()
    assert await box.evaluate("el => el.clientHeight") == before[0]

    # The full view: the whole output as plain text, in a new tab.
    async with live.context.expect_page() as opened:
        await page.click(f"{RESULT} .out-full")
    view = await opened.value
    await view.wait_for_load_state()
    assert view.url == f"{server.url}/t/{tab.id}/chunk/{result.seq}/output/"
    assert await view.evaluate("document.contentType") == "text/plain"
    assert await view.evaluate("document.body.textContent") == OUTPUT
    response = await live.context.request.get(view.url)
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    assert response.headers["x-content-type-options"] == "nosniff"
    await view.set_viewport_size({"width": 1280, "height": 800})
    await screenshot(view, "tool-full-view-1280")
    await view.close()

    # Past the shell's cap: the card says how much of the output was cut.
    await send_message(page, "count to 100000")
    note = page.locator("#log .t-tool-call >> nth=1 >> .cut-note")
    await note.wait_for()
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    cut = [c for c in await sync_to_async(rows)(tab.id) if c.type == Kind.TOOL_RESULT][-1].data
    assert cut["truncated_bytes"] > 0 and cut["truncated_lines"] > 0
    assert await note.text_content() == (
        f"{size(cut['truncated_bytes'])} ({cut['truncated_lines']:,} lines) cut from the "
        f"middle of the output: the model got its first and last {OUTPUT_HEAD // 1024} KiB."
    )
    await note.evaluate("el => el.scrollIntoView({block: 'center'})")
    await phone.page.reload()
    await synced(phone.page)
    await phone.page.locator("#log .cut-note").evaluate(
        "el => el.scrollIntoView({block: 'center'})"
    )
    await shots(page, phone.page, "tool-cut")
    live.assert_clean()
    phone.assert_clean()
