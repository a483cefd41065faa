"""Every page in Chromium, light and dark, checked by axe-core: no serious or critical
violation (contrast, names, labels, landmarks, duplicate ids, ARIA).

axe-core comes from npm, pinned (`make npm-packages`, which `make test` runs). One server
and one browser context per theme for the whole module: the pages are visited one after
the other, each checked where it stands; the tab page holds a finished turn with thinking,
a tool call and its output, an error card, notices, and a second turn waiting for approval.

A failure lists every violation of every page at once: the page, the theme, the rule,
each element's selector and axe's summary of what is wrong with it (for contrast: the
two colours and the ratio).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from chat.models import ApiToken, PermissionRule, Tab, Wake
from chat.views.settings import SECTIONS
from harness.login import browser_cookie, session_for
from harness.servers import ROOT
from tests.live import (
    RECORDER,
    WAIT_SECONDS,
    make_tab,
    make_user,
    send_message,
    set_setting,
    shots_resized,
    synced,
    turn_ended,
)
from tests.ui_helpers import seed_every_type

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

AXE = ROOT / ".npm-packages" / "node_modules" / "axe-core" / "axe.min.js"
THEMES = ("light", "dark")
WIDE = {"width": 1280, "height": 900}
PHONE = {"width": 375, "height": 760}
# What fails the test; "moderate" and "minor" are printed as well, for whoever reads.
BLOCKING = ("serious", "critical")

# axe's violations, each node with its selector and axe's summary of what is wrong; and
# two checks axe leaves out or only marks "incomplete": an id given to two elements, and
# an id reference (aria-describedby, aria-labelledby, aria-controls, label for) to none.
RUN_AXE = """
async (within) => {
  const result = await axe.run(within || document, {resultTypes: ['violations']});
  const found = result.violations.map((v) => ({
    id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.map((n) => ({target: n.target.join(' '), summary: n.failureSummary || '',
                                html: n.html})),
  }));
  const root = within ? document.querySelector(within) : document;
  const node = (el, summary) => ({target: el.id ? '#' + el.id : el.tagName.toLowerCase(),
                                  summary, html: el.outerHTML.slice(0, 300)});
  const seen = new Map();
  root.querySelectorAll('[id]').forEach((el) => {
    seen.set(el.id, (seen.get(el.id) || 0) + 1);
  });
  const twice = [...seen].filter(([, n]) => n > 1).map(([id, n]) => node(
    root.querySelector('[id="' + CSS.escape(id) + '"]'), n + ' elements have the id ' + id));
  if (twice.length) found.push({id: 'duplicate-id (test)', impact: 'serious',
                                help: 'An id is given to one element only', nodes: twice});
  const dangling = [];
  const attrs = ['aria-describedby', 'aria-labelledby', 'aria-controls', 'for'];
  root.querySelectorAll(attrs.map((a) => '[' + a + ']').join(',')).forEach((el) => {
    attrs.forEach((a) => {
      if (a === 'for' && el.tagName !== 'LABEL') return;
      (el.getAttribute(a) || '').split(/\\s+/).filter(Boolean).forEach((ref) => {
        if (document.getElementById(ref)) return;
        dangling.push(node(el, a + ' names ' + ref + ', which is not on the page'));
      });
    });
  });
  if (dangling.length) found.push({id: 'idref-missing (test)', impact: 'serious',
                                   help: 'An id reference names an element on the page',
                                   nodes: dangling});
  return found;
}
"""


@dataclass(frozen=True)
class Violation:
    page: str
    theme: str
    id: str
    impact: str
    help: str
    nodes: list[dict[str, str]]

    def describe(self) -> str:
        lines = [f"{self.page} ({self.theme}): {self.id} [{self.impact}] {self.help}"]
        for node in self.nodes:
            summary = " ".join(node["summary"].split())
            lines.append(f"    {node['target']}: {summary}")
            lines.append(f"      {node['html'][:160]}")
        return "\n".join(lines)


def axe_source() -> str:
    if not AXE.is_file():
        pytest.fail(
            f"axe-core is not installed ({AXE} is missing): run `make npm-packages` "
            "(make test does; it needs npm)",
            pytrace=False,
        )
    return AXE.read_text()


async def themed_page(browser: Any, theme: str, errors: list[str]) -> Any:
    """A page whose system theme is `theme` (theme.js follows it: no choice is stored),
    without motion, so a sliding sidebar is checked where it ends; its script errors go
    to `errors`."""
    context = await browser.new_context(
        viewport=WIDE,
        color_scheme=theme,
        reduced_motion="reduce",
        bypass_csp=True,  # for the injected axe.min.js, which the pages' CSP refuses
    )
    await context.add_init_script(RECORDER)
    page = await context.new_page()
    page.set_default_timeout(WAIT_SECONDS * 1000)
    page.on("pageerror", lambda exc: errors.append(f"{theme}, {page.url}: {exc}"))
    return page


async def check(
    page: Any, source: str, name: str, theme: str, within: str | None = None
) -> list[Violation]:
    """The page as it stands (or only what the selector `within` matches: what changed
    since the last check), through axe; its theme checked first (a page without theme.js
    would be checked in the wrong colours)."""
    shown = await page.evaluate("() => document.documentElement.getAttribute('data-theme')")
    assert shown == theme, f"{name}: the page shows the {shown} theme, the system says {theme}"
    await page.add_script_tag(content=source)
    found = await page.evaluate(RUN_AXE, within)
    return [Violation(name, theme, **v) for v in found]


async def visit(page: Any, url: str, name: str, status: int = 200) -> None:
    response = await page.goto(url)
    assert response.status == status, f"{name}: {url} answered {response.status}"


async def finished_then_waiting(page: Any, tab_id: Any) -> None:
    """A turn of the offline demo that runs a command and ends (thinking, a tool call, its
    output, usage), then one waiting for approval of the same command."""
    await sync_to_async(set_setting)("approve_tools", False)
    await send_message(page, "please run `echo hi`")
    await turn_ended(tab_id)
    await sync_to_async(set_setting)("approve_tools", True)
    await send_message(page, "please run `echo hi` again")
    await page.wait_for_selector("#status[data-state=waiting]")


def furnish(user: Any, tab: Tab) -> None:
    """Something in every list: the tab's chunk of every type, a rule, a wake, a token."""
    seed_every_type(tab.id)
    PermissionRule.objects.create(user=user, action="ask", pattern="shell(git push *)")
    Wake.objects.create(
        owner=user,
        name="Morning report",
        tab=tab,
        prompt="Summarise what changed",
        kind="interval",
        interval_seconds=3600,
        next_run_at=timezone.now() + timedelta(hours=1),
    )
    ApiToken.issue(user, name="laptop")


async def tab_states(
    page: Any, source: str, theme: str, server: Any, tab_id: Any
) -> list[Violation]:
    """The tab page: as it loads, its menu open, search hits, and on a phone with its tab
    list folded away (inert), then open over the page."""
    found: list[Violation] = []
    await visit(page, f"{server.url}/t/{tab_id}/", "tab")
    await synced(page)
    if theme == THEMES[0]:
        await finished_then_waiting(page, tab_id)
        await shots_resized(page, "a11y-tab")
    await page.wait_for_selector("#approval:not([hidden])")
    found += await check(page, source, "tab (finished turn, error card, approval)", theme)
    await page.click("summary[title='Tab menu']")
    found += await check(page, source, "tab menu (open)", theme, within="details.menu")
    await page.keyboard.press("Escape")

    await page.keyboard.press("Control+k")
    await page.keyboard.type("echo")
    await page.wait_for_selector(".hit-link")
    found += await check(page, source, "search hits", theme)
    await page.keyboard.press("Escape")

    await page.set_viewport_size(PHONE)
    await page.wait_for_function("document.getElementById('sidebar').inert")
    found += await check(page, source, "tab on a phone", theme)
    await page.click(".main .nav-open")
    await page.wait_for_function("!document.getElementById('sidebar').inert")
    found += await check(page, source, "tab on a phone, tab list open", theme, "#sidebar")
    await page.set_viewport_size(WIDE)
    return found


async def test_every_page_has_no_serious_violation_in_light_and_dark(browser, serve):
    source = axe_source()
    server = await serve()
    errors: list[str] = []
    pages = {theme: await themed_page(browser, theme, errors) for theme in THEMES}
    found: list[Violation] = []

    # First run: no account yet, so the setup page is the one page there is.
    for theme, page in pages.items():
        await visit(page, server.url + "/setup/", "setup")
        found += await check(page, source, "setup", theme)

    user = await sync_to_async(make_user)()
    session = await sync_to_async(session_for)(user)
    for theme, page in pages.items():
        await visit(page, server.url + "/login/", "login")
        found += await check(page, source, "login", theme)
        await page.context.add_cookies([browser_cookie(session, server.url)])
        # Home without tabs (with one it opens the latest).
        await visit(page, server.url + "/", "home")
        found += await check(page, source, "home", theme)

    tab = await sync_to_async(make_tab)(user, title="Files in the workspace")
    await sync_to_async(furnish)(user, tab)
    for theme, page in pages.items():
        found += await tab_states(page, source, theme, server, tab.id)
        for path, name, status in (
            ("/t/new/", "new tab", 200),
            ("/settings/", "settings", 200),
            *((f"/settings/{key}/", f"settings: {key}", 200) for key in list(SECTIONS)[1:]),
            ("/account/rules/", "rules", 200),
            ("/wakes/", "wakes", 200),
            ("/account/tokens/", "API tokens", 200),
            ("/settings/profiles/new/", "profile", 200),
            ("/t/import/", "import", 200),
            (f"/t/{tab.id}/delete/", "delete confirm", 200),
            ("/no-such-page/", "404", 404),
        ):
            await visit(page, server.url + path, name, status)
            found += await check(page, source, name, theme)
            if name == "settings" and theme == THEMES[0]:
                await shots_resized(page, "a11y-settings")

    counts: dict[tuple[str, str], int] = {}
    for v in found:
        if v.impact in BLOCKING:
            counts[v.page, v.theme] = counts.get((v.page, v.theme), 0) + len(v.nodes)
    report = "\n".join(v.describe() for v in found)
    if found:
        print(report)
    blocking = [v for v in found if v.impact in BLOCKING]
    assert not blocking, (
        f"{sum(counts.values())} serious or critical axe-core violations (elements) "
        f"by page and theme: {counts}\n" + "\n".join(v.describe() for v in blocking)
    )
    assert errors == [], f"script errors: {errors}"
