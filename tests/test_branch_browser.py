"""Branches in Chromium against a live `manage.py serve` (issue 14): an error retried in
one click, the answer regenerated from the keyboard, a message edited in a new branch's
composer, and a turn cut by a server kill continued on the next server; the parent then
shows its versions ("‹ 1 / 3 ›", issue 31), and copy works with and without
navigator.clipboard.

The model is the real Anthropic adapter talking to the fake provider server
(harness/fakeprovider.py), one scripted reply per request. Screenshots of each state,
at 1280 and 375 px, light and dark, go to the test's temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chat import log
from chat.models import QueuedMessage, Tab
from harness.fakeprovider import Reply
from harness.login import session_for
from tests.live import (
    SHOTS,
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
    until,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

MODEL = "anthropic/claude-sonnet-4-5"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}
# The reply cut by the kill: long enough (pieces x pause) that the kill lands in it.
SLOW_PIECES = 60
SLOW_PAUSE = 0.3
ANSWER_ONE = "Answer one, with `code`:\n\n```python\nprint('hi')\n```"
FIRST = "first *question*"

# Runs before the page's scripts on the phone: a page on plain http to a LAN address has
# no navigator.clipboard (secure contexts only); every copy the page makes is recorded.
NO_CLIPBOARD = """
Object.defineProperty(Navigator.prototype, 'clipboard', {get() { return undefined; }});
window.__copied = [];
document.addEventListener('copy', () => {
  const t = document.activeElement;
  window.__copied.push(t && 'value' in t ? t.value.slice(t.selectionStart, t.selectionEnd)
                                        : String(getSelection()));
}, true);
"""


def text_reply(text: str, *, pause: float = 0.0, pieces: list[str] | None = None) -> Reply:
    return anthropic_reply([("text", pieces or [text])], stop_reason="end_turn", pause=pause)


class Looks:
    """Screenshots of one state at 1280 px and 375 px (a touch phone), light and dark."""

    def __init__(self, directory: Path, phone: Any) -> None:
        self.dir = directory
        self.dir.mkdir(exist_ok=True)
        self.phone = phone

    async def __call__(
        self, page: Any, name: str, *, phone_path: str, phone_click: str | None = None
    ) -> None:
        if not SHOTS:
            return
        await self.phone.goto(page.url.split("/t/")[0] + phone_path)
        await synced(self.phone)
        if phone_click is not None:
            await self.phone.click(phone_click)
        await shots(page, self.phone, name)


async def new_tab_after(page: Any, click: Any) -> str:
    """Do `click`, wait for the page to go to another tab (HX-Redirect); its id."""
    before = page.url
    await click()
    await page.wait_for_url(lambda url: url != before and "/t/" in url)
    await synced(page)
    return page.url.rstrip("/").rsplit("/", 1)[1]


async def idle(page: Any, tab_id: str) -> None:
    await turn_ended(tab_id)
    await page.wait_for_selector("#status[data-state=idle]")


async def test_retry_regenerate_edit_and_continue_after_a_server_kill(
    browser, serve, fake_server, tmp_path
):
    fake_server.add(
        text_reply(ANSWER_ONE),
        Reply.error(400, "invalid_request_error", "The model refused this request."),
        text_reply("Answer two, retried."),
        text_reply("Answer two, regenerated."),
        text_reply("Answer one, edited."),
        text_reply("", pause=SLOW_PAUSE, pieces=[f"Slow part {i}. " for i in range(SLOW_PIECES)]),
        text_reply("Continued where it stopped."),
    )
    env = anthropic_env(fake_server)
    server = await serve(**env)
    user = await sync_to_async(make_user)()
    parent = await sync_to_async(make_tab)(user, MODEL)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{parent.id}/", session=session, **DESKTOP)
    page = live.page
    await live.context.grant_permissions(["clipboard-read", "clipboard-write"])
    phone = await open_page(browser, server, "/", session=session, mobile=True, **PHONE)
    await phone.context.add_init_script(NO_CLIPBOARD)
    looks = Looks(tmp_path / "screens", phone.page)
    print(f"screenshots: {looks.dir}")
    await synced(page)

    # An answer, then an error: the card offers Retry (and Continue).
    await send_message(page, FIRST)
    await page.wait_for_selector("#log .t-text.a:not(.open) .act-branch")
    await idle(page, parent.id)
    await send_message(page, "second question")
    error = await page.wait_for_selector("#log .t-error .card.error")
    await idle(page, parent.id)
    assert "The model refused this request." in await error.text_content()
    assert await page.is_visible("#log .t-error .act-retry")
    assert await page.is_visible("#log .t-error .act-continue")
    await looks(page, "error", phone_path=f"/t/{parent.id}/")

    # Retry: one click, a new tab that asks again and gets the answer.
    retried = await new_tab_after(page, lambda: page.click("#log .t-error .act-retry"))
    await page.wait_for_selector("#log .t-text.a:has-text('Answer two, retried.')")
    await idle(page, retried)
    branch = await sync_to_async(Tab.objects.get)(pk=retried)
    notice = page.locator("#log .kind-forked .sys-text")
    said = await notice.text_content()
    assert said == f"Branched from “{branch.title}” to try again after an error."
    href = f"/t/{parent.id}/?seq={branch.fork_seq}"
    assert await notice.locator("a").get_attribute("href") == href
    assert not await page.is_visible("#log .t-error"), "the error is not copied"

    # Regenerate from the keyboard: the last answer's button, focused, Enter.
    # (The last chunk: the version switcher may follow it, issue 31.)
    regenerate = page.locator("#log > .chunk").last.locator(".act-regenerate")
    await regenerate.wait_for(state="visible")
    assert await page.locator(".act-regenerate:visible").count() == 1
    await regenerate.focus()
    regenerated = await new_tab_after(page, lambda: page.keyboard.press("Enter"))
    await page.wait_for_selector("#log .t-text.a:has-text('Answer two, regenerated.')")
    await idle(page, regenerated)
    await looks(page, "regenerated", phone_path=f"/t/{regenerated}/")

    # Copy, where navigator.clipboard exists (a secure context): the message's markdown.
    await page.click("#log > .chunk.user >> nth=0 >> .act-copy")
    await page.wait_for_selector("#log > .chunk.user >> nth=0 >> .act-copy:has-text('Copied')")
    assert await page.evaluate("navigator.clipboard.readText()") == FIRST

    # Edit the first message: a branch before it, its text in the composer, caret at the end.
    edited = await new_tab_after(
        page, lambda: page.click("#log > .chunk.user >> nth=0 >> .act-edit")
    )
    composer = page.locator("#composer-text")
    assert await composer.input_value() == FIRST
    assert await page.evaluate(
        "document.activeElement.id === 'composer-text' && "
        "document.activeElement.selectionStart === document.activeElement.value.length"
    )
    await looks(page, "edit", phone_path=f"/t/{edited}/")
    await page.keyboard.type(" (edited)")
    async with page.expect_response(lambda r: r.url.endswith("/send/")):
        await page.keyboard.press("Enter")
    await page.wait_for_selector("#log .t-text.a:has-text('Answer one, edited.')")
    await idle(page, edited)
    assert await composer.input_value() == ""
    shown = await page.locator("#log > .chunk.user .md").all_text_contents()
    assert [s.strip() for s in shown] == ["first question (edited)"]
    assert (await sync_to_async(Tab.objects.get)(pk=edited)).draft == ""

    # A slow answer, cut by killing the server once some of it is checkpointed.
    await send_message(page, "write slowly")
    await page.wait_for_selector("#log .t-text.open:has-text('Slow part 2.')")

    async def checkpointed() -> bool:
        block = await sync_to_async(log.checkpointed)(edited)
        return bool(block and block.text)

    await until(checkpointed, "a checkpoint of the slow answer")
    await sync_to_async(server.kill)()
    server = await serve(**env)
    await page.goto(f"{server.url}/t/{edited}/")
    await synced(page)
    interrupted = page.locator("#log .kind-interrupted")
    await interrupted.wait_for()
    await idle(page, edited)
    assert await interrupted.locator(".act-continue").is_visible()
    await looks(page, "interrupted", phone_path=f"/t/{edited}/")

    # Continue: the same tab, a message saying what stopped, and the answer.
    async with page.expect_response(lambda r: r.url.endswith("/continue/")) as response:
        await page.click("#log .kind-interrupted .act-continue")
    assert (await response.value).status == 200
    await page.wait_for_selector("#log .t-text.a:has-text('Continued where it stopped.')")
    await idle(page, edited)
    assert page.url == f"{server.url}/t/{edited}/"
    said = await page.locator("#log > .chunk.user .md").last.text_content()
    assert said.startswith("The server restarted in the middle of your previous reply.")
    assert "Slow part" in said
    assert not await interrupted.locator(".act-continue").is_visible()
    log_rows = await sync_to_async(rows)(edited)
    assert log_rows[-1].data["text"] == "Continued where it stopped."
    assert not await sync_to_async(QueuedMessage.objects.exists)()

    # Retry, Regenerate and Edit made versions of one conversation (issue 31): the parent
    # shows "‹ 1 / 2 ›" under its first message (the edit) and "‹ 1 / 3 ›" under the
    # failed answer (the retry, and the retry regenerated); the sidebar has one entry.
    await page.goto(f"{server.url}/t/{parent.id}/")
    await synced(page)
    counts = page.locator("#log > .versions .ver-count > [aria-hidden]")
    assert [c.strip() for c in await counts.all_text_contents()] == ["1 / 2", "1 / 3"]
    assert await page.locator("#tab-list > .tab-link").count() == 1
    assert await page.evaluate(
        "document.querySelector('#log > .versions:last-child').previousElementSibling"
        ".classList.contains('t-error')"
    )
    await looks(page, "parent", phone_path=f"/t/{parent.id}/")
    await page.locator("#log > .versions:last-child a[rel=next]").click()
    await page.wait_for_url(f"**/t/{retried}/")
    await synced(page)
    # Its answer is "2 / 3"; its first message, the parent's, "1 / 2" (the edit is next).
    nexts = page.locator("#log > .versions a[rel=next]")
    assert [await a.get_attribute("href") for a in await nexts.all()] == [
        f"/t/{edited}/",
        f"/t/{regenerated}/",
    ]
    # The branch's menu names its parent; versions are not listed there as branches.
    await page.click(".tab-head details.menu > summary")
    menu = page.locator(".tab-head .menu-panel")
    assert await menu.locator(f"a[href='/t/{parent.id}/?seq={branch.fork_seq}']").is_visible()
    assert await menu.locator(".fork-list").count() == 0
    await looks(
        page,
        "menu",
        phone_path=f"/t/{retried}/",
        phone_click=".tab-head details.menu > summary",
    )

    # Copy without navigator.clipboard (plain http to a LAN address), on a phone: a code
    # block and a message, through the textarea fallback.
    phone_page = phone.page
    await phone_page.goto(f"{server.url}/t/{regenerated}/")
    await synced(phone_page)
    assert await phone_page.evaluate("navigator.clipboard === undefined")
    await phone_page.click("#log .copy-code >> nth=0")
    await phone_page.click("#log > .chunk.user >> nth=0 >> .act-copy")
    await phone_page.wait_for_selector("#log .copy-code.copied")
    assert await phone_page.evaluate("window.__copied") == ["print('hi')\n", FIRST]
    live.assert_clean()
    phone.assert_clean()
