"""The page by keyboard alone, in Chromium against a live `manage.py serve`: on a narrow
screen the ☰ button is in the Tab order and opens the tab list with Enter or Space (saying
so in aria-expanded), the folded list is inert (none of its controls in the Tab order), the
focus goes into the list when it opens and back to ☰ when it closes (Escape, ✕, a tap
beside it); "/" opens search only from outside a text field, Ctrl+K and Cmd+K from
anywhere, on a wide screen and a narrow one. One server and one page for the module."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from harness.login import session_for
from tests.live import make_tab, make_user, open_page, screenshot, synced

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

PHONE = {"width": 375, "height": 760}
WIDE = {"width": 1280, "height": 800}
# More presses than the page has stops: the Tab order is walked round at least once.
TAB_PRESSES = 40

# Where the focus is: a short name for the assertion messages, and which region holds it.
FOCUS = """
() => {
  const inView = (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && r.left >= 0 && r.right <= window.innerWidth
      && r.top >= 0 && r.bottom <= window.innerHeight;
  };
  const el = document.activeElement;
  if (!el || el === document.body) return {name: 'body', region: 'none'};
  const label = el.getAttribute('aria-label') || el.id
    || (el.textContent || '').trim().slice(0, 30);
  const region = el.closest('#sidebar') ? 'sidebar' : el.closest('.main') ? 'main' : 'other';
  return {name: el.tagName.toLowerCase() + ' ' + label, region,
          menu: el.matches('.main [data-nav="open"]'),
          search: el.matches('input[type="search"], [role="searchbox"]'),
          value: el.value === undefined ? null : el.value, visible: inView(el)};
}
"""


async def focus(page: Any) -> dict[str, Any]:
    return await page.evaluate(FOCUS)


async def tab_order(page: Any) -> list[dict[str, Any]]:
    """Every stop Tab reaches from the top of the page, in order (repeats once round)."""
    await page.evaluate("() => document.activeElement && document.activeElement.blur()")
    stops = []
    for _ in range(TAB_PRESSES):
        await page.keyboard.press("Tab")
        stops.append(await focus(page))
    return stops


async def nav_state(page: Any) -> dict[str, Any]:
    return await page.evaluate(
        """() => ({
          expanded: document.querySelector('.main [data-nav="open"]').getAttribute('aria-expanded'),
          sidebarInert: document.getElementById('sidebar').inert,
          mainInert: document.querySelector('.main').inert,
          onScreen: document.getElementById('sidebar').getBoundingClientRect().left >= 0,
        })"""
    )


async def assert_folded(page: Any) -> None:
    state = await nav_state(page)
    assert state == {
        "expanded": "false",
        "sidebarInert": True,
        "mainInert": False,
        "onScreen": False,
    }, state


async def assert_open(page: Any) -> None:
    state = await nav_state(page)
    assert state == {
        "expanded": "true",
        "sidebarInert": False,
        "mainInert": True,
        "onScreen": True,
    }, state


async def the_menu_button_by_keyboard(page: Any) -> None:
    await assert_folded(page)
    stops = await tab_order(page)
    inside = [s["name"] for s in stops if s["region"] == "sidebar"]
    assert inside == [], f"the folded tab list's controls are in the Tab order: {inside}"
    menu = [i for i, s in enumerate(stops) if s.get("menu")]
    assert menu, f"Tab never reaches the ☰ button: {[s['name'] for s in stops]}"

    for key in ("Enter", "Space"):
        await page.focus('.main [data-nav="open"]')
        await screenshot(page, "keyboard-menu-button-focused")
        await page.keyboard.press(key)
        await assert_open(page)
        now = await focus(page)
        assert now["region"] == "sidebar", f"{key} opened the list, the focus is on {now}"
        assert now["name"].startswith("a "), f"not the current tab's link: {now}"
        await screenshot(page, f"keyboard-tab-list-open-{key.lower()}")
        # While open, the page behind it is out of reach.
        behind = [s["name"] for s in await tab_order(page) if s["region"] == "main"]
        assert behind == [], f"Tab reaches the page behind the open list: {behind}"
        await page.keyboard.press("Escape")
        await assert_folded(page)
        assert (await focus(page))["menu"], "Escape closed the list; the focus is not on ☰"

    # ✕ by keyboard, then a tap beside the list.
    await page.keyboard.press("Enter")
    await page.focus(".nav-close")
    await page.keyboard.press("Enter")
    await assert_folded(page)
    assert (await focus(page))["menu"], "✕ closed the list; the focus is not on ☰"
    await page.keyboard.press("Enter")
    await assert_open(page)
    await page.mouse.click(PHONE["width"] - 10, PHONE["height"] // 2)
    await assert_folded(page)
    assert (await focus(page))["menu"], "a tap beside closed the list; the focus is not on ☰"


async def the_search_keys(page: Any, *, narrow: bool) -> None:
    """Each shortcut lands in a visible, empty search box (whatever shows it: the sidebar's
    box, or a dialog), which then takes "/" as a character. The page is loaded again after
    each: what closes the search is the search's own business."""
    where = "narrow" if narrow else "wide"
    # "/" is a character in a text field (the composer, autofocused).
    await page.focus("#composer-text")
    await page.keyboard.press("/")
    assert await page.input_value("#composer-text") == "/", where
    assert (await focus(page))["name"] == "textarea composer-text", where
    await page.fill("#composer-text", "")

    # Ctrl+K and Cmd+K from the composer; "/" from a button (the tab menu's, or ☰).
    outside = '.main [data-nav="open"]' if narrow else "summary[title='Tab menu']"
    for start, keys in (
        ("#composer-text", "Control+k"),
        ("#composer-text", "Meta+k"),
        (outside, "/"),
    ):
        await page.focus(start)
        await page.keyboard.press(keys)
        now = await focus(page)
        assert now["search"], f"{where}: {keys} from {start} left the focus on {now['name']}"
        assert now["visible"], f"{where}: {keys} focused a search box out of sight"
        assert now["value"] == "", f"{where}: {keys} typed {now['value']!r} into the box"
        await page.keyboard.press("/")
        assert (await focus(page))["value"] == "/", f"{where}: '/' in the box is a character"
        await page.reload()
        await synced(page)


async def test_the_menu_and_search_by_keyboard_on_a_phone_and_a_wide_screen(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, title="Keys")
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, **PHONE)
    page = live.page
    await page.emulate_media(reduced_motion="reduce")  # the list is where it ends at once
    await synced(page)

    await the_menu_button_by_keyboard(page)
    await the_search_keys(page, narrow=True)

    await page.set_viewport_size(WIDE)
    await page.wait_for_function("!document.getElementById('sidebar').inert")
    assert await page.evaluate("document.querySelector('.main').inert") is False
    await the_search_keys(page, narrow=False)
    live.assert_clean()
