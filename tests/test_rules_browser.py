"""Permission rules in Chromium: "always allow" on the approval card adds the tab's rule,
the log says so and which rule allowed the next call; the tab menu lists the rule; the
rules page refuses a bad pattern with its reason."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat.models import PermissionRule, Tab
from harness.login import session_for
from tests.live import (
    make_tab,
    make_user,
    open_page,
    rows,
    send_message,
    set_setting,
    shots_resized,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


async def test_always_allow_then_the_rule_decides_and_the_pages_show_the_rules(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    await sync_to_async(set_setting)("approve_tools", True)
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    page = live.page
    await synced(page)

    await send_message(page, "please run `echo hi`")
    await page.wait_for_selector("#status[data-state=waiting]")
    always = page.locator("#approval .always")
    assert await always.text_content() == "Always allow shell(echo hi) in this tab all my tabs"
    await shots_resized(page, "rules-approval")
    await page.click("#approval button[name=always_tab]")
    added = page.locator("#log .kind-rule .sys-text")
    await added.first.wait_for()
    assert (
        await added.first.inner_html()
        == "Rule added for this tab: allow <code>shell(echo hi)</code>"
    )
    await turn_ended(tab.id)

    await send_message(page, "please run `echo hi` again")
    await page.wait_for_selector("#log .kind-rule >> nth=1")
    await turn_ended(tab.id)
    assert await added.nth(1).text_content() == "Allowed by rule shell(echo hi) (this tab)"
    logged = await sync_to_async(rows)(tab.id)
    assert [r.data.get("kind") for r in logged if r.type == "system"] == ["rule", "rule"]
    assert (await sync_to_async(Tab.objects.get)(pk=tab.pk)).rules == [
        {"action": "allow", "pattern": "shell(echo hi)"}
    ]
    await shots_resized(page, "rules-log")

    # The menu is the page's, as it was loaded: a reload lists the rule added since.
    await page.reload()
    await synced(page)
    await page.click("summary[title='Tab menu']")
    await page.click("#tab-rules summary")
    assert "allow shell(echo hi)" in await page.text_content("#tab-rules .tab-rules")
    await shots_resized(page, "rules-tab-menu")

    await page.goto(server.url + "/account/rules/")
    await page.select_option("#rule-action", "deny")
    await page.fill("#rule-pattern", "shell(git status")
    await page.click("button:has-text('Add rule')")
    error = await page.text_content("#rule-error")
    assert error == "`shell(git status` opens a parenthesis it does not close."
    await shots_resized(page, "rules-page-error")
    await page.fill("#rule-pattern", "shell(rm *)")
    await page.click("button:has-text('Add rule')")
    await page.wait_for_selector("#rule-list >> text=shell(rm *)")
    assert await sync_to_async(PermissionRule.objects.filter(user=user, action="deny").count)() == 1
    await shots_resized(page, "rules-page")
    live.assert_clean()
