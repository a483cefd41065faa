"""The user channel in Chromium against a live `manage.py serve`: a wake fires into a new
tab whose turn needs approval (the fake provider asks for a shell call, no rule allows
it); an open Wakes page and another tab's page show the new tab in their sidebars with the
waiting mark, live, and notify (Notification is recorded by an init script: headless
Chromium shows none); not while the waiting tab's own page is in front; the notification
opens the tab; the mark goes when the turn ends.

Screenshots of the sidebar with a waiting tab: test-artifacts/ and /tmp/shots/sidebar/.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.models import Wake, WakeRun
from harness.login import session_for
from tests.live import (
    SHOTS,
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    screenshot,
    set_setting,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

MODEL = "anthropic/claude-sonnet-4-5"

# Every `new Notification` a page makes (title, body, tag, and the object, whose onclick
# the test calls: a headless browser shows no notification to click), and the page's
# visibility as the test sets it (headless pages are always visible).
NOTIFICATIONS = """
(() => {
  const d = window.__notify = {shown: [], objects: [], visible: true};
  const Real = window.Notification;
  function Fake(title, options) {
    d.shown.push({title, body: options && options.body, tag: options && options.tag});
    d.objects.push(this);
    this.close = () => {};
  }
  Object.defineProperty(Fake, 'permission', {get: () => Real.permission});
  Fake.requestPermission = (...args) => Real.requestPermission(...args);
  window.Notification = Fake;
  Object.defineProperty(Document.prototype, 'visibilityState',
    {get: () => d.visible ? 'visible' : 'hidden', configurable: true});
  Object.defineProperty(Document.prototype, 'hidden', {get: () => !d.visible, configurable: true});
})();
"""


# The content of the phone's tab-list button's mark ("none": no mark).
NAV_MARK = "getComputedStyle(document.querySelector('.nav-open'), '::after').content"


def shell_call(call_id: str) -> Any:
    return anthropic_reply(
        [("tool_use", (call_id, "shell", {"command": "echo report"}))], stop_reason="tool_use"
    )


async def shots(page: Any, name: str) -> None:
    """The sidebar at 1280 and 375 px (opened: on a phone it slides in), light and dark."""
    if not SHOTS:
        return
    await page.emulate_media(reduced_motion="reduce")
    for width in (1280, 375):
        await page.set_viewport_size({"width": width, "height": 700})
        if width < 760:
            for scheme in ("light", "dark"):
                await page.emulate_media(color_scheme=scheme)
                await screenshot(page, f"{name}-{width}-folded-{scheme}")
            await page.evaluate("document.getElementById('nav-toggle').checked = true")
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            await screenshot(page, f"{name}-{width}-{scheme}")
    await page.evaluate("document.getElementById('nav-toggle').checked = false")
    await page.set_viewport_size({"width": 1280, "height": 800})
    await page.emulate_media(color_scheme="light")


async def notes(page: Any) -> list[dict[str, Any]]:
    return await page.evaluate("window.__notify.shown")


async def test_a_wakes_new_tab_waiting_for_approval_shows_and_notifies_everywhere(
    browser, serve, fake_server
):
    fake_server.add(
        shell_call("toolu_1"),
        shell_call("toolu_2"),
        shell_call("toolu_3"),
        anthropic_reply([("text", ["Report done."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    await sync_to_async(set_setting)("approve_tools", True)
    user = await sync_to_async(make_user)()
    other = await sync_to_async(make_tab)(user, MODEL, title="Other work")
    await Wake.objects.acreate(
        owner=user,
        name="Nightly report",
        new_tab=True,
        model=MODEL,
        prompt="write the report",
        kind="interval",
        interval_seconds=86400,
        next_run_at=timezone.now() + timedelta(days=1),
    )
    session = await sync_to_async(session_for)(user)

    # Page A: the Wakes page, notifications on (asked from the click, granted).
    live = await open_page(browser, server, "/", session=session, width=1280)
    await live.context.add_init_script(NOTIFICATIONS)
    await live.context.grant_permissions(["notifications"], origin=server.url)
    wakes_page = live.page
    await wakes_page.goto(server.url + "/wakes/")
    await wakes_page.click("#notify-toggle")
    await wakes_page.wait_for_selector("#notify-toggle[aria-pressed=true]")
    await wakes_page.wait_for_function("window.__e2e.connects === 1")
    # Page B: another tab's page, in the same browser (it is the page in front now).
    tab_page = await live.context.new_page()
    tab_page.on("pageerror", lambda exc: live.errors.append(str(exc)))
    await tab_page.goto(f"{server.url}/t/{other.id}/")
    await synced(tab_page)

    # The wake fires from another browser's Wakes page ("Run now"): pages A and B stay.
    trigger = await open_page(browser, server, "/wakes/", session=session)
    await trigger.page.click("button:has-text('Run now')")
    await trigger.page.wait_for_selector(".messages")
    run = await WakeRun.objects.aget()
    new = run.tab_id
    assert new is not None and new != other.id

    # Both sidebars get the new tab, on top, marked waiting, without a reload.
    for page in (wakes_page, tab_page):
        link = page.locator(f"#tab-list > #tablink-{new}")
        await link.locator(".wait-mark").wait_for()
        assert await link.get_attribute("data-state") == "waiting"
        assert await link.get_attribute("data-tool") == "shell"
        assert await page.locator("#tab-list > .tab-link").first.get_attribute("id") == (
            f"tablink-{new}"
        )
        assert await link.locator(".tab-title").inner_text() == "Nightly report"
    # Both notify (the browser keeps one: the same tag), naming the tab and the tool.
    tag = f"dispatch-tab-{new}"
    expected = {"title": "Nightly report", "body": "Waiting for your approval: shell", "tag": tag}
    for page in (wakes_page, tab_page):
        await page.wait_for_function("window.__notify.shown.length === 1")
        assert await notes(page) == [expected]
    await shots(wakes_page, "sidebar-waiting")
    # On a phone, where the list is folded away, its button carries the mark.
    await wakes_page.set_viewport_size({"width": 375, "height": 700})
    assert await wakes_page.evaluate(NAV_MARK) == '""'
    await wakes_page.set_viewport_size({"width": 1280, "height": 800})

    # The waiting tab's own page comes to the front: its next wait notifies nobody.
    await tab_page.goto(f"{server.url}/t/{new}/")
    await synced(tab_page)
    await tab_page.wait_for_selector("#status[data-state=waiting]")
    await tab_page.click("#approval button[name=deny]")
    await wakes_page.wait_for_selector(f"#tablink-{new}[data-call=toolu_2]")
    await tab_page.wait_for_selector("#approval .tool-name")
    assert await notes(wakes_page) == [expected]
    assert await notes(tab_page) == []

    # It goes to the background: the next wait notifies from both pages again.
    await tab_page.evaluate(
        "window.__notify.visible = false; document.dispatchEvent(new Event('visibilitychange'))"
    )
    assert await wakes_page.evaluate("localStorage.getItem('dispatch-front')") is None
    await tab_page.click("#approval button[name=deny]")
    await wakes_page.wait_for_selector(f"#tablink-{new}[data-call=toolu_3]")
    assert await notes(wakes_page) == [expected, expected]
    await tab_page.wait_for_function("window.__notify.shown.length === 1")
    [own] = await notes(tab_page)
    # Its own status line's words: the tool and its command.
    assert (own["tag"], own["body"]) == (tag, "Waiting for your approval: shell echo report")

    # The notification opens the tab.
    await wakes_page.evaluate("window.__notify.objects[1].onclick()")
    await wakes_page.wait_for_url(f"{server.url}/t/{new}/")
    await synced(wakes_page)
    await tab_page.click("#approval button[name=deny]")
    await turn_ended(new)
    for page in (wakes_page, tab_page):
        await page.wait_for_selector(f"#tablink-{new}[data-state=idle]")
        assert await page.locator(f"#tablink-{new} .wait-mark").count() == 0
    await wakes_page.set_viewport_size({"width": 375, "height": 700})
    assert await wakes_page.evaluate(NAV_MARK) == "none"
    live.assert_clean()
    trigger.assert_clean()
