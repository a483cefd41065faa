"""Profiles in Chromium: staff add one on the Settings page, then a tab is made from it in
a working directory through New tab → options…; the tab's prompt view shows the profile's
prompt and the working directory's AGENTS.md. Screenshots at 1280/375 px, light and dark."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat.models import Profile, Tab
from harness.login import session_for
from tests.live import make_user, open_page, shots_resized

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


async def test_a_profile_is_added_in_settings_and_a_tab_made_from_it(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    (serve.workspace_of(user) / "site").mkdir()
    (serve.workspace_of(user) / "site" / "AGENTS.md").write_text("Build with `make site`.\n")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/settings/profiles/new/", session=session, width=1280)
    page = live.page
    await page.fill("#id_name", "reviewer")
    await page.fill("#id_model", "offline/demo")
    await page.fill("#id_tools", "list_files\nmcp__nowhere__*")
    await page.fill("#id_system_prompt", "You review; you never write.")
    await page.click("button:has-text('Save the profile')")
    await page.wait_for_selector("#id_tools_error")
    assert "No such tool: mcp__nowhere__*." in await page.text_content("#id_tools_error")
    await shots_resized(page, "profile-refused")
    await page.fill("#id_tools", "list_files\nread_file")
    await page.fill("#id_rules_text", "allow read_file")
    await page.click("button:has-text('Save the profile')")
    await page.wait_for_selector("#profiles >> text=reviewer")
    await page.locator("#profiles").scroll_into_view_if_needed()
    await shots_resized(page, "profiles-settings")

    await page.click(".new-tab-options")
    await page.select_option("#id_profile", label="reviewer")
    await page.fill("#id_workdir", "../elsewhere")
    await page.click("button:has-text('Create the tab')")
    await page.wait_for_selector("#id_workdir_error")
    assert "leaves the workspace" in await page.text_content("#id_workdir_error")
    await page.fill("#id_workdir", "site")
    await shots_resized(page, "new-tab-options")
    await page.click("button:has-text('Create the tab')")
    await page.wait_for_url("**/t/*/")
    tab = await sync_to_async(Tab.objects.select_related("profile").get)()
    assert (tab.profile.name, tab.workdir, tab.tool_allow) == (
        "reviewer",
        "site",
        ["list_files", "read_file"],
    )
    # Not the default prompt: the editor opens by itself.
    await page.wait_for_selector("#sysprompt-edit details[open]")
    prompt = await page.input_value("#sysprompt-text")
    assert prompt == (
        "You review; you never write.\n\n# Instructions from site/AGENTS.md in the workspace"
        "\n\nBuild with `make site`."
    )
    await shots_resized(page, "profile-tab-prompt")
    assert await sync_to_async(Profile.objects.count)() == 1
    live.assert_clean()
