"""The sidebar search in Chromium against a live `manage.py serve`: the keys that reach the
box, the hits with their highlighted snippets, a hit opening its tab at an old chunk (a
window the page's real WebSocket must leave alone), Esc, and a query with no words."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from chat import log, search
from chat.models import Tab
from chat.stream import Block
from harness.login import session_for
from tests.live import make_user, open_page, screenshot, synced

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

# Far more chunks than a page (200 by default), so the hit's window is detached from the
# live end and the socket would replace it if the page's hello said the wrong thing.
CHUNKS = 600
NEEDLE_SEQ = 50
NEEDLE = "zanzibar"
NEEDLE_TEXT = f"The night ferry to {NEEDLE} leaves at eleven."
NO_WORDS = "The search has no letters or digits to look for."

# An element against the viewport the reader sees: does any of it show?
IN_VIEW = """
(el) => {
  const r = el.getBoundingClientRect();
  return r.bottom > 0 && r.right > 0 && r.top < window.innerHeight && r.left < window.innerWidth;
}
"""

# The chunk of this id as the page has it now, or null: read at once, never waited for.
CHUNK_NOW = f"""
(id) => {{
  const el = document.getElementById('chunk-' + id);
  return el && {{seq: el.getAttribute('data-seq'), classes: Array.from(el.classList),
                 inView: ({IN_VIEW})(el)}};
}}
"""


@pytest.fixture(autouse=True)
def _empty_index(transactional_db):
    # Django's flush between transactional tests leaves the index's plain tables as they
    # were, and a new user may get an old one's id: old rows would show as hits.
    with connection.cursor() as cursor:
        search.clear(cursor)


def long_tab(user: Any) -> Tab:
    """CHUNKS chunks in user/assistant pairs; only the chunk at NEEDLE_SEQ says NEEDLE."""
    tab = Tab.objects.create(owner=user, title="Travel notes", model="offline/demo")
    blocks: list[Block] = []
    turn = uuid.uuid4()
    for seq in range(1, CHUNKS + 1):
        if seq % 2:
            turn = uuid.uuid4()
            role, text = "user", f"Question {seq}: what about the harbour?"
        else:
            role, text = "assistant", f"Answer {seq}: the harbour is quiet today."
        if seq == NEEDLE_SEQ:
            text = NEEDLE_TEXT
        blocks.append(Block(uuid.uuid4(), turn, 1, role, "text", {"text": text}))
    log.append(tab.pk, blocks)
    tab.refresh_from_db()
    return tab


def record_hellos(page: Any) -> list[dict[str, Any]]:
    """The hello of every socket the page opens, as the server receives it."""
    hellos: list[dict[str, Any]] = []

    def on_socket(ws: Any) -> None:
        def on_frame(payload: Any) -> None:
            if isinstance(payload, str) and '"hello"' in payload:
                hellos.append(json.loads(payload))

        ws.on("framesent", on_frame)

    page.on("websocket", on_socket)
    return hellos


async def focused_id(page: Any) -> str:
    return await page.evaluate("() => document.activeElement ? document.activeElement.id : ''")


async def test_a_hit_in_an_old_chunk_opens_the_tab_there_and_the_socket_keeps_it(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(long_tab)(user)
    session = await sync_to_async(session_for)(user)
    needle = await sync_to_async(log.tail)(tab.pk, after=NEEDLE_SEQ - 1, limit=1)
    latest = await sync_to_async(log.tail)(tab.pk, after=CHUNKS - 1)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    hellos = record_hellos(page)
    await synced(page)

    # Ctrl+K reaches the box from anywhere, even the (autofocused) composer.
    assert await focused_id(page) == "composer-text"
    await page.keyboard.press("Control+k")
    assert await focused_id(page) == "search-q"

    # "/" is a character where one is being typed, and the search key elsewhere.
    await page.click("#composer-text")
    await page.keyboard.press("/")
    assert await page.input_value("#composer-text") == "/"
    assert await focused_id(page) == "composer-text"
    await page.fill("#composer-text", "")
    await page.eval_on_selector("#composer-text", "el => el.blur()")
    await page.keyboard.press("/")
    assert await focused_id(page) == "search-q"
    assert await page.input_value("#search-q") == "", "the '/' that focused the box was typed"

    await page.keyboard.type(NEEDLE)
    hit = page.locator("#search-results .hit-link")
    await hit.wait_for()
    assert await hit.count() == 1
    assert await hit.locator(".hit-title").text_content() == "Travel notes"
    assert await hit.locator(".hit-meta").text_content() == "just now"
    assert await hit.locator(".hit-snippet mark").all_text_contents() == [NEEDLE]
    assert NEEDLE_TEXT in await hit.locator(".hit-snippet").text_content()
    assert await hit.get_attribute("href") == f"/t/{tab.id}/?seq={NEEDLE_SEQ}"
    await screenshot(page, "search-results-1280")

    await hit.click()
    await page.wait_for_url(f"{server.url}/t/{tab.id}/?seq={NEEDLE_SEQ}")
    await page.wait_for_load_state()
    shown = await page.evaluate(CHUNK_NOW, str(needle[0].id))
    assert shown is not None, "the hit's chunk is not on the page"
    assert shown["seq"] == str(NEEDLE_SEQ)
    assert "hit" in shown["classes"]
    assert shown["inView"], "the hit's chunk is not scrolled into view"
    assert await page.locator("#log .chunk.hit").count() == 1

    # The socket has connected, said hello and caught the page up (the status frame ends
    # the catch-up): the window is still the hit's, not the latest page.
    await synced(page)
    assert hellos[-1]["last_seq"] == CHUNKS, f"the window's hello: {hellos[-1]}"
    shown = await page.evaluate(CHUNK_NOW, str(needle[0].id))
    assert shown is not None, "the socket replaced the hit's window"
    assert "hit" in shown["classes"]
    assert shown["inView"], "the catch-up scrolled away from the hit"
    assert await page.locator(f"#chunk-{latest[0].id}").count() == 0
    assert await page.locator(f'#log [data-seq="{CHUNKS}"]').count() == 0
    newer = page.locator("#newer a")
    assert await newer.is_visible()
    assert await newer.get_attribute("href") == f"/t/{tab.id}/"

    # Esc empties the box and the results and leaves the box.
    await page.keyboard.press("Control+k")
    await page.keyboard.type(NEEDLE)
    await page.locator("#search-results .hit-link").wait_for()
    await page.keyboard.press("Escape")
    assert await page.input_value("#search-q") == ""
    assert await page.inner_html("#search-results") == ""
    assert await page.locator("#search-results").is_hidden()
    assert await focused_id(page) != "search-q"
    live.assert_clean()


async def test_a_query_of_punctuation_says_why_in_the_sidebar_on_a_phone(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(long_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, width=375, height=740, mobile=True
    )
    page = live.page
    await synced(page)
    box = page.locator("#search-q")
    assert not await box.evaluate(IN_VIEW), "the tab list is closed on a phone"

    # Ctrl+K slides the tab list in to show the box (a keyboard on a tablet).
    await page.keyboard.press("Control+k")
    assert await focused_id(page) == "search-q"
    await page.wait_for_function(
        "() => document.querySelector('.sidebar').getBoundingClientRect().left >= 0"
    )
    assert await box.evaluate(IN_VIEW)
    await page.keyboard.type(NEEDLE)
    hit = page.locator("#search-results .hit-link")
    await hit.wait_for()
    assert await hit.is_visible()
    assert await hit.locator(".hit-snippet mark").all_text_contents() == [NEEDLE]
    await screenshot(page, "search-results-375")

    await page.fill("#search-q", "")
    await page.keyboard.type("?! -- ...")
    reason = page.locator("#search-results .search-msg[role=alert]")
    await reason.wait_for()
    assert await reason.text_content() == NO_WORDS
    assert await hit.count() == 0
    assert page.url == f"{server.url}/t/{tab.id}/"
    assert await page.locator("#log .chunk").count() > 0, "the tab page was replaced"

    # Enter sends the same query through htmx: the same reason, in place.
    async with page.expect_response(lambda r: "/search/" in r.url) as response:
        await page.keyboard.press("Enter")
    assert (await response.value).status == 422
    await reason.wait_for()
    assert await reason.text_content() == NO_WORDS
    assert page.url == f"{server.url}/t/{tab.id}/"
    live.assert_clean()
