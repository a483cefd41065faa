"""Tokens and cost in Chromium against a live `manage.py serve` (issue 15.4): each turn's
line appears under its answer when the turn ends, the tab's totals in the header follow,
and a reload shows exactly the same; Settings shows the usage per user and model.

The model is the real Anthropic adapter talking to the fake provider server, whose
replies report input, output, cache read and cache write tokens. Screenshots at 1280 and
375 px, light and dark, go to test-artifacts/usage-*.png.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from harness.fakeprovider import Reply
from harness.login import session_for
from tests.live import (
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    send_message,
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
# Sonnet 4.5 per million tokens: $3 in, $15 out, $0.30 cache read, $3.75 cache write.
# One: 240 x 3 + 340 x 15 + 960 x 3.75 = 9,420 millionths of a dollar.
FIRST = ("First answer.", {"input": 240, "output": 340, "cache_read": 0, "cache_write": 960})
FIRST_LINE = "1.2k in · 340 out · 0% cached · $0.00942"
# Two: 40 x 3 + 120 x 15 + 960 x 0.3 + 200 x 3.75 = 2,958.
SECOND = ("Second answer.", {"input": 40, "output": 120, "cache_read": 960, "cache_write": 200})
SECOND_LINE = "1.2k in · 120 out · 80% cached · $0.00296"
TOTALS = "2.4k in · 460 out · 40% cached · $0.0124"

# Each usage line on the page: its id, the chunk it is in, its line, its counts, its class.
READ_USAGE = """
() => Array.from(document.querySelectorAll('.turn-usage')).map((el) => ({
  id: el.id,
  chunk: el.closest('.chunk').id,
  parent: el.parentElement.className,
  line: el.querySelector('summary').textContent,
  detail: el.querySelector('.usage-detail').textContent,
  last: el.parentElement.lastElementChild === el,
}))
"""


def usage_reply(text: str, tokens: dict[str, int]) -> Reply:
    """One answer whose stream reports these tokens (as Anthropic does: the input and the
    cache at the start, the output at the end)."""
    reply = anthropic_reply([("text", [text])], stop_reason="end_turn")
    for event in reply.events:
        if not isinstance(event, dict):
            continue
        if event.get("type") == "message_start":
            event["message"]["usage"] = {
                "input_tokens": tokens["input"],
                "output_tokens": 1,
                "cache_read_input_tokens": tokens["cache_read"],
                "cache_creation_input_tokens": tokens["cache_write"],
            }
        elif event.get("type") == "message_delta":
            event["usage"] = {"output_tokens": tokens["output"]}
    return reply


async def test_a_turns_tokens_and_cost_show_live_and_survive_a_reload(browser, serve, fake_server):
    fake_server.add(usage_reply(*FIRST), usage_reply(*SECOND))
    server = await serve(**anthropic_env(fake_server))
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)
    assert await page.locator("#tab-usage").text_content() == ""

    await send_message(page, "one")
    await page.wait_for_selector("#log .turn-usage")
    await turn_ended(tab.id)
    assert await page.locator("#tab-usage").text_content() == FIRST_LINE
    await send_message(page, "two")
    await page.wait_for_function("document.querySelectorAll('#log .turn-usage').length === 2")
    await page.wait_for_function(f"document.getElementById('tab-usage').textContent === {TOTALS!r}")
    await turn_ended(tab.id)

    shown = await page.evaluate(READ_USAGE)
    assert [u["line"] for u in shown] == [FIRST_LINE, SECOND_LINE]
    answers = await page.locator("#log > .chunk.t-text.a").evaluate_all(
        "(els) => els.map((el) => el.id)"
    )
    assert [u["chunk"] for u in shown] == answers, "each line is in its turn's answer"
    assert all(u["last"] for u in shown), "at the end of the answer, after its actions"
    assert "cache write 960" in shown[0]["detail"] and MODEL in shown[0]["detail"]
    header = await page.locator("#tab-usage").text_content()
    # Opened, a line shows the counts behind it.
    await page.locator(f"#{shown[1]['id']} > summary").click()
    assert await page.is_visible(f"#{shown[1]['id']} .usage-detail")

    phone = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, width=375, mobile=True
    )
    await synced(phone.page)
    await shots(page, phone.page, "usage-live")

    await page.reload()
    await synced(page)
    assert await page.evaluate(READ_USAGE) == shown
    assert await page.locator("#tab-usage").text_content() == header == TOTALS
    title = await page.locator("#tab-usage").get_attribute("title")
    assert title.startswith("This tab: input 280 (uncached) · cache read 960 · cache write 1,160")
    await page.locator(f"#{shown[0]['id']} > summary").click()
    await shots(page, phone.page, "usage-reloaded")
    # The totals are behind a small button beside the title (issue 31), which keeps its room;
    # opened, they show.
    title_box = await phone.page.locator("#tab-title").bounding_box()
    assert title_box["width"] > 100
    assert await phone.page.locator("#tab-usage .tu-panel").is_hidden()
    await phone.page.locator("#tab-usage summary").click()
    assert await phone.page.locator("#tab-usage .tu-panel").inner_text() == TOTALS

    # Settings: the usage per user and model.
    await page.goto(f"{server.url}/settings/models/#usage")
    row = page.locator("#usage tbody tr")
    assert await row.count() == 1
    cells = await row.locator("td").all_text_contents()
    assert cells == [f"owner {MODEL}", "$0.0124", "40%", "2", "280", "960", "1.2k", "460"]
    await phone.page.goto(f"{server.url}/settings/models/#usage")
    await phone.page.locator("#usage").scroll_into_view_if_needed()
    await page.locator("#usage").scroll_into_view_if_needed()
    await shots(page, phone.page, "usage-settings")
    live.assert_clean()
    phone.assert_clean()
