"""Versions in place in Chromium against a live server and the offline demo model: an
answer regenerated twice is "3 / 3" of one conversation, the switcher (from the keyboard)
moves between the versions in place, an edited message is "2 / 2" under the message, and
the sidebar keeps one entry throughout. Screenshots with DISPATCH_TEST_SHOTS=1."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async

from harness.login import session_for
from tests.live import make_tab, make_user, open_page, send_message, shots, synced, turn_ended

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

ENTRIES = "#tab-list > .tab-link"


def tab_of(page) -> uuid.UUID:
    return uuid.UUID(page.url.rstrip("/").split("/")[-1])


async def one_entry(page, tab_id: uuid.UUID | None = None) -> None:
    """The sidebar holds one entry (the conversation's), opening `tab_id` when given."""
    await page.wait_for_function(
        "([sel, tab]) => { const e = document.querySelectorAll(sel);"
        " return e.length === 1 && (!tab || e[0].dataset.tab === tab); }",
        arg=[ENTRIES, str(tab_id) if tab_id else ""],
    )


async def count_of(page) -> str:
    return (await page.locator("#log > .versions .ver-count > [aria-hidden]").inner_text()).strip()


async def test_regenerate_edit_and_the_switcher_keep_one_conversation(serve, browser):
    server = serve.start()
    user = await sync_to_async(make_user)()
    session = await sync_to_async(session_for)(user)
    tab = await sync_to_async(make_tab)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)
    # A tab never sent to has no entry; the first message gives it one (the user channel).
    assert await page.locator(ENTRIES).count() == 0
    await send_message(page, "hello, what can you do?")
    await turn_ended(tab.id)
    await one_entry(page, tab.id)

    # Regenerate twice: each opens the new version, "2 / 2" then "3 / 3", one entry.
    versions = [tab.id]
    for n in (2, 3):
        async with page.expect_navigation():
            await page.locator("#log .act-regenerate:visible").last.click()
        await synced(page)
        versions.append(tab_of(page))
        await turn_ended(versions[-1])
        assert await count_of(page) == f"{n} / {n}"
        await one_entry(page)
    assert len(set(versions)) == 3
    await page.reload()
    await synced(page)
    await one_entry(page, versions[-1])
    # Under the answer, after the last chunk of its turn.
    assert await page.locator("#log > .chunk.a + .versions").count() == 1
    phone = await open_page(
        browser, server, f"/t/{versions[-1]}/", session=session, width=375, mobile=True
    )
    await synced(phone.page)
    await shots(page, phone.page, "versions-regenerated")

    # The switcher from the keyboard: focus "‹" and press Enter: version 2, in place.
    previous = page.locator("#log > .versions a[rel=prev]")
    assert await previous.get_attribute("aria-label") == "Previous version (2 of 3)"
    await previous.focus()
    async with page.expect_navigation():
        await page.keyboard.press("Enter")
    await synced(page)
    assert tab_of(page) == versions[1]
    assert await count_of(page) == "2 / 3"
    await one_entry(page)
    async with page.expect_navigation():
        await page.locator("#log > .versions a[rel=prev]").click()
    assert tab_of(page) == versions[0] and await count_of(page) == "1 / 3"
    await synced(page)

    # Edit the question: a new version under the message, its text in the composer.
    async with page.expect_navigation():
        await page.locator("#log .chunk.user .act-edit").first.click()
    await synced(page)
    edited = tab_of(page)
    assert await page.input_value("#composer-text") == "hello, what can you do?"
    await send_message(page, "hello again, what can you do?")
    await turn_ended(edited)
    await page.reload()
    await synced(page)
    assert await page.locator("#log > .chunk.user + .versions.at-user").count() == 1
    assert await count_of(page) == "2 / 2"
    await one_entry(page, edited)
    await shots(page, phone.page, "versions-edited")
    live.assert_clean()
    phone.assert_clean()
