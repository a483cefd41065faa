"""Attachments in Chromium (issue 17): a screenshot pasted into the composer uploads into
the tray, goes with a message that has no text, reaches the model as an image block, and
shows under the message as a thumbnail, again after a reload.

The model is the real Anthropic adapter talking to the fake provider server, which keeps
each request's raw body. Screenshots at 1280 and 375 px, light and dark, of the tray and
of the sent message go to test-artifacts/attachments-*.png.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from harness.login import session_for
from tests.anthropic_wire import Body
from tests.attachment_files import image, pdf
from tests.live import (
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
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
PDF = {
    "name": "error-log.pdf",
    "mimeType": "application/pdf",
    "buffer": pdf(["Traceback (most recent call last):", "KeyError: 'id'"]),
}

# A file put on a paste's clipboard (what the browser hands the page when the reader
# pastes a screenshot or a copied file), pasted into the composer: `svg`, an SVG's text,
# else a screenshot-like PNG drawn on a canvas.
PASTE = """
async (svg) => {
  const data = new DataTransfer();
  const text = document.getElementById('composer-text');
  const paste = {clipboardData: data, bubbles: true, cancelable: true};
  text.focus();
  if (svg) {
    data.items.add(new File([svg], 'logo.svg', {type: 'image/svg+xml'}));
    text.dispatchEvent(new ClipboardEvent('paste', paste));
    return;
  }
  const canvas = document.createElement('canvas');
  canvas.width = 640;
  canvas.height = 400;
  const g = canvas.getContext('2d');
  g.fillStyle = '#f4f4f4'; g.fillRect(0, 0, 640, 400);
  g.fillStyle = '#2b2d42'; g.fillRect(0, 0, 640, 36);
  g.fillStyle = '#d90429'; g.fillRect(24, 70, 420, 26);
  g.fillStyle = '#8d99ae';
  for (let y = 120; y < 380; y += 28) g.fillRect(24, y, 200 + (y * 7) % 360, 14);
  const blob = await new Promise((done) => canvas.toBlob(done, 'image/png'));
  data.items.add(new File([blob], 'image.png', {type: 'image/png'}));
  text.dispatchEvent(new ClipboardEvent('paste', paste));
}
"""


# An <img>'s natural width once it has loaded (0: it did not load).
LOADED = """
(img) => img.complete && img.naturalWidth ? img.naturalWidth : new Promise((done) => {
  img.onload = () => done(img.naturalWidth);
  img.onerror = () => done(0);
})
"""


async def paste_screenshot(page: Any) -> None:
    count = await page.locator("#attach-tray .att").count()
    async with page.expect_response(lambda r: r.url.endswith("/attachments/")) as response:
        await page.evaluate(PASTE, "")
    assert (await response.value).status == 200
    await page.wait_for_function(
        f"document.querySelectorAll('#attach-tray .att input').length === {count + 1}"
    )


async def pick_pdf(page: Any) -> None:
    """The attach button, and the PDF chosen in the file dialog it opens."""
    async with page.expect_file_chooser() as chooser:
        await page.click("#attach-btn")
    async with page.expect_response(lambda r: r.url.endswith("/attachments/")):
        await (await chooser.value).set_files([PDF])
    await page.wait_for_selector("#attach-tray .att:not(.uploading) .file-icon")


async def test_a_pasted_screenshot_is_sent_to_the_model_and_shown_under_the_message(
    browser, serve, fake_server
):
    fake_server.add(
        anthropic_reply([("text", ["A red error bar."])], stop_reason="end_turn"),
        anthropic_reply([("text", ["The same bar."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    phone = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, width=375, mobile=True
    )
    page = live.page
    await synced(page)
    await synced(phone.page)

    # A screenshot pasted, a PDF picked with the attach button, and a question.
    await paste_screenshot(page)
    await pick_pdf(page)
    # A file the server refuses: its reason on the error line, nothing in the tray.
    async with page.expect_response(lambda r: r.url.endswith("/attachments/")) as refused:
        await page.evaluate(PASTE, '<svg xmlns="http://www.w3.org/2000/svg"/>')
    assert (await refused.value).status == 400
    error = page.locator("#composer-error")
    await error.filter(has_text="Not attached: ").wait_for()
    assert "SVG" in await error.text_content()
    assert await page.locator("#attach-tray .att").count() == 2
    values = await page.locator("#attach-tray input[name='attachment']").evaluate_all(
        "(els) => els.map((el) => el.value)"
    )
    assert [v.partition(":")[2] for v in values] == ["image.png", "error-log.pdf"]
    sha256 = values[0].partition(":")[0]
    assert await page.locator("#attach-tray .att-thumb").evaluate(LOADED) > 0
    await page.fill("#composer-text", "What is wrong here?")
    await paste_screenshot(phone.page)
    await shots(page, phone.page, "attachments-tray")

    await send(page, "#composer-text", "Enter")
    await page.wait_for_selector("#log .chunk.user .atts .att-file")
    assert await page.locator("#attach-tray .att").count() == 0
    await turn_ended(tab.id)
    first = json.loads(fake_server.requests[0].body)["messages"][0]
    kinds = [part["type"] for part in first["content"]]
    assert kinds[-1] == "text" and sorted(kinds[:-1]) == ["document", "image"]
    [image] = [part for part in first["content"] if part["type"] == "image"]
    assert image["source"]["type"] == "base64"
    assert image["source"]["media_type"] == "image/png"
    # The model got the stored blob itself.
    assert hashlib.sha256(base64.b64decode(image["source"]["data"])).hexdigest() == sha256

    # The same screenshot again, alone: no text needed, and the first message's bytes in
    # the next request are the same (the prompt cache's prefix).
    # A file removed before the send is not sent.
    await paste_screenshot(page)
    await pick_pdf(page)
    await page.click("#attach-tray .att:nth-child(2) .att-remove")
    assert await page.locator("#attach-tray .att").count() == 1
    assert await page.input_value("#composer-text") == ""
    await send(page, "#composer .send", "click")
    await page.wait_for_function("document.querySelectorAll('#log .chunk.user').length === 2")
    await turn_ended(tab.id)
    one, two = (Body.of(request.body) for request in fake_server.requests)
    end = one.block_ends[2]
    assert two.text[:end] == one.text[:end] and two.tail == one.tail
    assert [block["type"] for block in two.blocks[3:]] == ["text", "image"]

    await page.reload()
    await synced(page)
    thumbs = page.locator(f"#log .chunk.user .atts a[href='/blob/{sha256}/'] img")
    assert await thumbs.count() == 2
    assert await thumbs.first.evaluate(LOADED) > 0
    html = await page.content()
    assert image["source"]["data"][200:300] not in html
    assert ";base64," not in html
    await phone.page.reload()
    await synced(phone.page)
    await shots(page, phone.page, "attachments-sent")
    live.assert_clean()
    phone.assert_clean()


async def send(page: Any, selector: str, how: str) -> None:
    async with page.expect_response(lambda r: r.url.endswith("/send/")) as response:
        if how == "click":
            await page.click(selector)
        else:
            await page.press(selector, how)
    assert (await response.value).status == 200


async def test_a_tools_image_shows_in_its_card_as_it_arrives_and_opens_full_size(
    browser, serve, fake_server
):
    """The model reads a PNG of the workspace while two pages watch: the result lands in
    the call's card with the image's thumbnail, which links to the full image in a new
    tab; after a reload too."""
    fake_server.add(
        anthropic_reply(
            [("tool_use", ("toolu_1", "read_file", {"path": "chart.png"}))], stop_reason="tool_use"
        ),
        anthropic_reply([("text", ["A chart with a white box."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    (serve.workspace_of(user) / "chart.png").write_bytes(image("PNG", (900, 500)))
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    phone = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, width=375, mobile=True
    )
    page = live.page
    await synced(page)
    await synced(phone.page)
    await page.fill("#composer-text", "What does chart.png show?")
    await send(page, "#composer-text", "Enter")
    thumb = "#log .t-tool-call .slot .t-tool-result .atts a.att-img img"
    for watching in (page, phone.page):
        await watching.wait_for_selector(thumb)
        assert await watching.locator(thumb).evaluate(LOADED) > 0
    await turn_ended(tab.id)
    link = page.locator("#log .t-tool-result .atts a.att-img")
    assert await link.get_attribute("target") == "_blank"
    href = await link.get_attribute("href")
    assert href.startswith("/blob/") and href.endswith("/")
    full = await page.request.get(f"{server.url}{href}")
    assert (full.status, full.headers["content-type"]) == (200, "image/png")
    await page.locator(thumb).scroll_into_view_if_needed()
    await phone.page.locator(thumb).scroll_into_view_if_needed()
    await shots(page, phone.page, "attachments-tool-result")
    await page.reload()
    await synced(page)
    assert await page.locator(thumb).evaluate(LOADED) > 0
    live.assert_clean()
    phone.assert_clean()
