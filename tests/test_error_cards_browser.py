"""Error cards in Chromium against a live `manage.py serve` (issue 15.3): a 401 from the
provider shows what happened and where the key comes from (the Anthropic key saved in
Settings, since the server's environment has none); the key is replaced on the Settings
page, and the card's Retry asks again, with the new key, in a new branch that gets the
answer.

The model is the real Anthropic adapter talking to the fake provider server
(harness/fakeprovider.py). Screenshots of the card at 1280 and 375 px, light and dark, go
to the test's temporary directory.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from harness.fakeprovider import Reply
from harness.login import session_for
from tests.live import (
    SHOTS,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    screenshot,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

MODEL = "anthropic/claude-sonnet-4-5"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}
OLD_KEY = "sk-ant-revoked-0001"
NEW_KEY = "sk-ant-working-0002"
CARD = "#log .t-error .card.error"


async def save_key(page: Any, server_url: str, key: str) -> None:
    """Save the Anthropic key on the Settings page, as a staff user does."""
    await page.goto(f"{server_url}/settings/")
    form = page.locator("#provider-anthropic form.key-form")
    await form.locator("input[name=key]").fill(key)
    async with page.expect_navigation():
        await form.locator("button:text('Save key')").click()
    assert await page.locator(f"text=Saved the anthropic key (…{key[-4:]})").count() == 1


async def shoot(pages: list[tuple[Any, str]], directory: Any, name: str) -> None:
    if not SHOTS:
        return
    for page, width in pages:
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            await page.locator(CARD).scroll_into_view_if_needed()
            await screenshot(page, f"{name}-{width}-{scheme}", folder=directory)
        await page.emulate_media(color_scheme="light")


async def test_a_401_card_says_where_the_key_is_and_retry_works_once_it_is_fixed(
    browser, serve, fake_server, tmp_path
):
    fake_server.add(
        Reply.error(401, "authentication_error", "invalid x-api-key"),
        anthropic_reply([("text", ["Hello, with the new key."])], stop_reason="end_turn"),
    )
    # No ANTHROPIC_API_KEY: the key comes from Settings (harness.servers scrubs the
    # variable from the server's environment).
    server = await serve(ANTHROPIC_BASE_URL=fake_server.url, DISPATCH_MODEL=MODEL)
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, MODEL)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/", session=session, **DESKTOP)
    page = live.page
    await save_key(page, server.url, OLD_KEY)

    await page.goto(f"{server.url}/t/{tab.id}/")
    await synced(page)
    await page.fill("#composer-text", "hi")
    await page.press("#composer-text", "Enter")
    card = page.locator(CARD)
    await card.wait_for()
    await turn_ended(tab.id)
    # Each saved key was tested first (GET …/models): the turns' requests are the POSTs.
    posts = [r for r in fake_server.requests if r.method == "POST"]
    assert posts[0].headers["authorization"] == f"Bearer {OLD_KEY}"

    # What happened, the provider's words, what to do, where it was sent; and Retry.
    assert await card.locator(".err-summary").text_content() == (
        "Anthropic did not accept the API key"
    )
    assert await card.locator(".status-code").text_content() == "401"
    assert "invalid x-api-key" in await card.locator(".err-msg").text_content()
    hint = card.locator(".err-hint")
    assert await hint.text_content() == (
        "The key is the Anthropic key saved in Settings → API keys: save a valid one "
        "there, then Retry."
    )
    assert await card.locator(".err-url code").text_content() == fake_server.url
    retry = card.locator(".act-retry")
    assert await retry.is_visible()
    page_text = await page.locator("#log").text_content()
    assert OLD_KEY not in page_text and "ANTHROPIC_API_KEY" not in page_text

    phone = await open_page(browser, server, f"/t/{tab.id}/", session=session, mobile=True, **PHONE)
    await synced(phone.page)
    await phone.page.locator(CARD).wait_for()
    assert await phone.page.locator(f"{CARD} .act-retry").is_visible()
    shots = tmp_path / "screens"
    shots.mkdir()
    print(f"screenshots: {shots}")
    await shoot([(page, "1280"), (phone.page, "375")], shots, "error-401")

    # The key is fixed in Settings; Retry, on the tab's page, asks again with it.
    await save_key(page, server.url, NEW_KEY)
    await page.goto(f"{server.url}/t/{tab.id}/")
    await synced(page)
    before = page.url
    await page.locator(CARD).locator(".act-retry").click()
    await page.wait_for_url(lambda url: url != before and "/t/" in url)
    await synced(page)
    await page.wait_for_selector("#log .t-text.a:has-text('Hello, with the new key.')")
    branch = page.url.rstrip("/").rsplit("/", 1)[1]
    await turn_ended(branch)
    posts = [r for r in fake_server.requests if r.method == "POST"]
    assert len(posts) == 2
    assert posts[1].headers["authorization"] == f"Bearer {NEW_KEY}"
    assert not await page.locator(CARD).count(), "the error is not copied to the branch"
    live.assert_clean()
    phone.assert_clean()
