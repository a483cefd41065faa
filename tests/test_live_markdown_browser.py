"""Live Markdown in Chromium, on a live serve with the fake Anthropic server streaming at a
model's pace: the heading and the code block of an answer render while it streams, and its
seal replaces the live rendering without moving anything the reader looks at."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chat.models import Chunk
from harness.fakeprovider import Pause
from harness.login import session_for
from tests.live import (
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    rows,
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

LAST = "That is all: the seal changes nothing you can see."
ANSWER = (
    "## Live Markdown\n\n"
    "This answer streams as **Markdown**: a heading, a list, `code` and a table.\n\n"
    "- the stable part is rendered once\n"
    "- the tail is rendered again as it grows\n"
    "- a fence shows its lines as they come\n\n"
    "```python\n"
    "def tail_cost(n, factor=16):\n"
    '    """At most `factor` renderings of each character."""\n'
    "    return factor * n\n"
    "```\n\n"
    "| part | rendered |\n|------|---------:|\n| stable | once |\n| tail | as it grows |\n\n"
    "> A quote, to show one.\n\n"
    + "".join(
        f"Paragraph {n} is here to make the answer taller than the window, so that the "
        f"reader can scroll up and look at the middle of it while it ends.\n\n"
        for n in range(1, 9)
    )
    + LAST
)
# The text arrives in pieces of this many characters, one every PIECE_PAUSE seconds (about
# a fast model's pace); then the stream holds the finished text open for HOLD_SECONDS, so
# the test sees it whole before the seal, however slow the machine.
PIECE = 12
PIECE_PAUSE = 0.02
HOLD_SECONDS = 8.0

# The blocks of the live body (its boxless stable and tail wrappers flattened, the text
# anchor left out) or of the sealed .md: tag, text, and where each is on the screen.
BLOCKS = """
(chunkId) => {
  const chunk = document.getElementById('chunk-' + chunkId);
  const live = chunk.querySelector('.md.live-md');
  const md = live || chunk.querySelector(':scope > .md');
  const blocks = live
    ? [...live.querySelectorAll(':scope > .stable > *, :scope > .tail > *')].filter(
        (el) => !el.classList.contains('raw'))
    : [...md.children];
  const raw = live && live.querySelector('.raw');
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.top, r.height]; };
  return {
    open: chunk.classList.contains('open'),
    appended: raw ? raw.textContent : '',
    scroll: (document.scrollingElement || document.documentElement).scrollTop,
    md: box(md),
    blocks: blocks.map((el) => [el.tagName, el.textContent, ...box(el)]),
  };
}
"""


def reply() -> Any:
    pieces = [ANSWER[i : i + PIECE] for i in range(0, len(ANSWER), PIECE)]
    stream = anthropic_reply([("text", pieces)], stop_reason="end_turn", pause=PIECE_PAUSE)
    stop = next(i for i, e in enumerate(stream.events) if _is(e, "content_block_stop"))
    stream.events.insert(stop, Pause(HOLD_SECONDS))
    return stream


def _is(event: Any, kind: str) -> bool:
    return isinstance(event, dict) and event.get("type") == kind


async def test_an_answer_renders_as_it_streams_and_its_seal_moves_nothing(
    browser, serve, fake_server
):
    fake_server.add(reply())
    server = await serve(**anthropic_env(fake_server))
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, "anthropic/claude-sonnet-4-5")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)
    await send_message(page, "Show me live Markdown.")

    # Rendered while the chunk is open: the heading, then the code block (highlighted
    # once its fence closed, as the seal will have it).
    heading = await page.wait_for_selector("#log .chunk.open .md.live-md h2")
    assert await heading.text_content() == "Live Markdown"
    code = await page.wait_for_selector("#log .chunk.open .md.live-md pre code .k")
    assert await code.text_content() == "def"
    chunk_id = (await page.get_attribute("#log .chunk.open", "id")).removeprefix("chunk-")
    assert "## Live" not in await page.text_content(f"#chunk-{chunk_id}")
    # A phone opening the tab now gets the open chunk from the snapshot, rendered alike.
    phone = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, width=375, mobile=True
    )
    await phone.page.wait_for_selector("#log .chunk.open .md.live-md pre code .k")
    await shots(page, phone.page, "live-markdown-streaming")

    # The whole text, still open (its last words may be as they came, appended unrendered:
    # plain text renders as itself).
    await page.wait_for_function(
        """(last) => { const b = document.querySelector('#log .chunk.open .md.live-md');
        return b && b.textContent.includes(last); }""",
        arg=LAST,
    )
    # The reader scrolls up to the code block, away from the end: the log stops following.
    await page.evaluate(
        "(id) => document.querySelector('#chunk-' + id + ' pre').scrollIntoView()", chunk_id
    )
    before = await page.evaluate(BLOCKS, chunk_id)
    assert before["open"] and before["scroll"] > 0

    await page.wait_for_selector(f"#chunk-{chunk_id}:not(.open)")
    after = await page.evaluate(BLOCKS, chunk_id)
    assert not after["open"]
    # The same blocks, with the same text, at the same places and heights; the page did
    # not scroll.
    assert [b[:2] for b in after["blocks"]] == [b[:2] for b in before["blocks"]]
    assert after == {**before, "open": False, "appended": ""}
    assert [tag for tag, *_ in before["blocks"]].count("DIV") == 1  # the code block

    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    [_, text] = await sync_to_async(rows)(tab.id)
    assert isinstance(text, Chunk) and text.data["text"] == ANSWER
    await phone.page.wait_for_selector(f"#chunk-{chunk_id}:not(.open)")
    await shots(page, phone.page, "live-markdown-sealed")
    live.assert_clean()
    phone.assert_clean()
