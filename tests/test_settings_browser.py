"""Settings, the model picker, a new token's Copy and the in-page confirmation in Chromium
(tests/live.py): each user-visible point of Settings' rework, at 1280 and 375 px.
Screenshots (DISPATCH_TEST_SHOTS=1) in test-artifacts/settings-*."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat.models import ApiKey, ApiToken, Setting, Tab
from harness.fakeprovider import Reply
from harness.login import session_for, session_for_new_user
from tests.live import make_tab, make_user, open_page, screenshot, shots_resized

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

SECTIONS = ["Connections", "Models", "Tools and MCP", "Rules", "Profiles", "Appearance", "Advanced"]


def _superuser():
    user = make_user()
    user.is_superuser = True
    user.save()
    return user


@pytest.mark.parametrize("scripts", [True, False], ids=["js", "no-js"])
@pytest.mark.parametrize("width", [1280, 375])
async def test_every_section_is_reached_from_the_sections_nav(browser, serve, width, scripts):
    """The nav lists the sections, Connections first, and each link opens its section
    (marked current) with or without JavaScript, on a laptop and a phone."""
    server = await serve()
    session = await sync_to_async(session_for)(await sync_to_async(_superuser)())
    live = await open_page(
        browser, server, "/settings/", session=session, width=width, mobile=width < 500
    )
    page = live.page
    if not scripts:
        context = await browser.new_context(
            viewport={"width": width, "height": 800}, java_script_enabled=False
        )
        await context.add_cookies(await live.context.cookies())
        page = await context.new_page()
        await page.goto(server.url + "/settings/")
    nav = page.locator("nav.section-nav")
    assert await nav.locator("a").all_text_contents() == SECTIONS
    assert await nav.locator("a[aria-current=page]").text_content() == "Connections"
    assert await page.locator("#provider-anthropic").count() == 1
    headings = {
        "Models": "#defaults",
        "Tools and MCP": "#mcp",
        "Rules": "#permission-rules",
        "Profiles": "#profiles",
        "Appearance": "#appearance",
        "Advanced": "#paging",
        "Connections": "#provider-openai",
    }
    for label, landmark in headings.items():
        link = page.locator(f"nav.section-nav a:text-is('{label}')")
        assert await link.is_visible()
        await link.click()
        await page.wait_for_selector(f"nav.section-nav a[aria-current=page]:text-is('{label}')")
        assert await page.locator(landmark).is_visible()
        assert await page.evaluate("document.documentElement.scrollWidth") <= width
    # "Page size" and "DOM window" are in Advanced, not at the top of Settings.
    await page.goto(server.url + "/settings/")
    assert await page.locator("#id_page_size").count() == 0
    await page.goto(server.url + "/settings/advanced/")
    assert await page.locator("#id_page_size").is_visible()
    assert await page.locator("a:text('Dispatch admin')").get_attribute("href") == "/admin/"
    if scripts and width == 1280:
        await page.goto(server.url + "/settings/")
        await shots_resized(page, "settings-connections", height=900)
    live.assert_clean()


async def test_the_test_button_says_what_happened_and_saves_nothing(
    browser, serve, fake_server_factory
):
    """Test with a typed key: the endpoint's answer in words (rejected, then ok), the key
    kept in its field and nothing stored; Save then tests again and says so."""
    fake = fake_server_factory()
    # No DISPATCH_MODEL: the default model is automatic, which a key would have moved.
    server = await serve(ANTHROPIC_BASE_URL=fake.url, DISPATCH_MODEL="")
    session = await sync_to_async(session_for)(await sync_to_async(_superuser)())
    live = await open_page(browser, server, "/settings/", session=session, width=1280)
    page = live.page
    card = page.locator("#provider-anthropic")
    fake.add_models(Reply.error(401, "authentication_error", "invalid x-api-key"))
    await card.locator("form.key-form input[name=key]").fill("sk-ant-wrong-0001")
    await card.locator("button:text('Test')").click()
    result = page.locator("#key-test-anthropic")
    await result.wait_for()
    assert " ".join((await result.text_content()).split()) == (
        f"rejected {fake.url} rejected the key: invalid x-api-key"
    )
    assert await card.locator("form.key-form input[name=key]").input_value() == "sk-ant-wrong-0001"
    assert await sync_to_async(ApiKey.objects.count)() == 0
    await screenshot(page, "settings-key-test-rejected")

    await card.locator("form.key-form input[name=key]").fill("sk-ant-right-0002")
    await card.locator("button:text('Test')").click()
    await page.wait_for_selector("#key-test-anthropic.ok")
    assert "The key works at" in await page.locator("#key-test-anthropic").text_content()
    assert await sync_to_async(ApiKey.objects.count)() == 0

    await page.locator("#provider-anthropic button:text('Save key')").click()
    await page.wait_for_selector(".messages")
    messages = await page.locator(".messages").text_content()
    assert "Saved the anthropic key (…0002)" in messages
    assert f"Tested: The key works at {fake.url} (1 model listed)." in messages
    assert "New tabs and wakes still use offline/demo" in messages
    assert await page.locator("#provider-anthropic .badge.ok").text_content() == "ready"
    assert [(r.method, r.path.split("?")[0]) for r in fake.requests] == [("GET", "/v1/models")] * 3
    assert await sync_to_async(stored_setting)("default_model") == "offline/demo"
    await screenshot(page, "settings-key-saved")

    # Changing the default is a choice of its own, offered beside the key.
    async with page.expect_navigation():
        await page.click("button:text('Use anthropic/claude-sonnet-4-5 for new tabs and wakes')")
    assert "New tabs and wakes now use anthropic/claude-sonnet-4-5." in (
        await page.locator(".messages").text_content()
    )
    assert await sync_to_async(stored_setting)("default_model") == "anthropic/claude-sonnet-4-5"
    live.assert_clean()


def stored_setting(key: str):
    return Setting.objects.get(key=key).value


async def test_the_picker_lists_runnable_models_first_and_disables_the_rest(browser, serve):
    """Without an Anthropic key its models are disabled under an "add a key" link to
    Connections; with an OpenAI key its models are ready, found by typing and chosen by Enter."""
    server = await serve(OPENAI_API_KEY="sk-openai-for-tests-1234")
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    picker = page.locator("details.model-picker")
    await picker.locator("summary").click()
    search = picker.locator("input[type=search]")
    await search.wait_for()
    assert await page.evaluate("document.activeElement.id") == "model-filter"
    groups = await picker.locator(".picker-group").all_text_contents()
    assert groups[0] == "Ready to use"
    assert " ".join(groups[1].split()) == "Anthropic: no key add a key"
    ready = picker.locator("ul[aria-labelledby=picker-ready] button")
    assert await ready.first.get_attribute("value") == "openai/gpt-4.1"
    sonnet = picker.locator("button:has-text('anthropic/claude-sonnet-4-5')")
    assert await sonnet.is_disabled()
    await search.fill("sonnet")
    assert await picker.locator("ul[aria-labelledby=picker-ready]").is_hidden()
    assert await sonnet.is_visible()
    await shots_resized(page, "settings-picker-filtered", height=700)
    await search.fill("mini 4.1")
    assert await ready.filter(has_text="GPT-4.1 mini").is_visible()
    async with page.expect_navigation():
        await search.press("Enter")
    await sync_to_async(tab.refresh_from_db)()
    assert tab.model == "openai/gpt-4.1-mini"

    await picker.locator("summary").click()
    await picker.locator("#picker-anthropic a:text('add a key')").click()
    await page.wait_for_url(f"{server.url}/settings/#provider-anthropic")
    assert await page.locator("#provider-anthropic").is_visible()
    live.assert_clean()


async def test_a_new_token_is_copied_by_its_button(browser, serve):
    """The token shown once has a Copy button that puts exactly the token on the clipboard."""
    server = await serve()
    session = await sync_to_async(session_for_new_user)("dana")
    live = await open_page(browser, server, "/account/tokens/", session=session, width=1280)
    page = live.page
    await live.context.grant_permissions(["clipboard-read", "clipboard-write"])
    await page.fill("#token-name", "laptop")
    await page.click("button:text('Create token')")
    token = (await page.text_content("#new-token")).strip()
    copy = page.locator("button[data-copy-from=new-token]")
    await copy.click()
    await page.wait_for_selector("button[data-copy-from=new-token].copied")
    assert await page.evaluate("navigator.clipboard.readText()") == token
    await shots_resized(page, "settings-token-copied")
    assert await sync_to_async(ApiToken.objects.count)() == 1
    live.assert_clean()


async def test_a_confirmation_is_asked_in_the_page(browser, serve):
    """Deleting a stored key asks in an in-page dialog whose button names the action:
    Escape and Cancel keep the key, the button deletes it; no browser pop-up opens."""
    server = await serve()
    user = await sync_to_async(_superuser)()

    def stored() -> None:
        row = ApiKey(provider="openai")
        row.set_key("sk-openai-1234567890", endpoint="https://api.openai.com/v1")
        row.save()

    await sync_to_async(stored)()
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/settings/", session=session, width=375, mobile=True)
    page = live.page
    delete = page.locator("#provider-openai button:text('Delete')")
    dialog = page.locator("dialog#confirm-dialog")
    await delete.click()
    await dialog.locator("#confirm-ok").wait_for()
    assert (
        await dialog.locator("#confirm-text").text_content() == "Delete the OpenAI-compatible key?"
    )
    assert await dialog.locator("#confirm-ok").text_content() == "Delete the key"
    await shots_resized(page, "settings-confirm")
    await page.keyboard.press("Escape")
    await dialog.wait_for(state="hidden")
    assert await page.evaluate("document.activeElement.textContent") == "Delete"
    await delete.click()
    await dialog.locator("button:text('Cancel')").click()
    await dialog.wait_for(state="hidden")
    assert await sync_to_async(ApiKey.objects.count)() == 1
    await delete.click()
    async with page.expect_navigation():
        await dialog.locator("#confirm-ok").click()
    assert "Deleted the openai key" in await page.locator(".messages").text_content()
    assert await sync_to_async(ApiKey.objects.count)() == 0
    assert await sync_to_async(Tab.objects.count)() == 0
    live.assert_clean()
