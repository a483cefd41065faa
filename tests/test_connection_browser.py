"""The page's connection state, jump to the latest, theme and notifications, in Chromium
on a live `manage.py serve` (issue 15).

- A server killed under an open page: the page says it is disconnected and for how
  long (never "Idle"), a message sent meanwhile waits in the composer, visibly, with
  Send disabled; on the restarted server (same port, same database) the status line is
  the server's again and the message is sent exactly once.
- Close codes the ws extension does not retry (a resync, a clean close) reconnect; a
  refused socket says to reload and a send is refused with that reason; a send that
  cannot reach the server, or that the server fails, says so and keeps the text.
- Scrolled up, a "jump to the latest" button; "new below" once something streams in.
- The theme switch: remembered across reloads, applied before anything is painted.
- Notifications: asked for from a click only, shown when a turn waits for approval or
  ends while the page is hidden, never while it is visible.

Screenshots go to test-artifacts/ (1280 and 375 px, light and dark).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from chat import log
from chat.models import Chunk, QueuedMessage
from chat.stream import Block
from harness.login import session_for
from tests.live import (
    make_tab,
    make_user,
    open_page,
    screenshot,
    shots_resized,
    synced,
    turn_ended,
    until,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

DESKTOP = {"width": 1280, "height": 800}
# app.css's colours of the page's background (--bg), light and dark.
LIGHT_BG = "rgb(246, 246, 243)"
DARK_BG = "rgb(21, 22, 25)"

# Every `new Notification` the page makes, and every permission request with whether a
# user gesture was active; the page's visibility as the test sets it (headless pages
# are always visible).
NOTIFICATIONS = """
(() => {
  const d = window.__notify = {shown: [], asked: [], visible: true};
  const Real = window.Notification;
  function Fake(title, options) {
    d.shown.push({title, body: options && options.body, tag: options && options.tag});
    this.close = () => {};
  }
  Object.defineProperty(Fake, 'permission', {get: () => Real.permission});
  Fake.requestPermission = (...args) => {
    d.asked.push(navigator.userActivation.isActive);
    return Real.requestPermission(...args);
  };
  window.Notification = Fake;
  Object.defineProperty(Document.prototype, 'visibilityState',
    {get: () => d.visible ? 'visible' : 'hidden', configurable: true});
  Object.defineProperty(Document.prototype, 'hidden', {get: () => !d.visible, configurable: true});
})();
"""

# The theme as the page had it when <body> was parsed (before any deferred script) and at
# its first animation frame (right before its first paint).
FIRST_PAINT = """
(() => {
  const d = window.__paint = {atBody: null, firstFrame: null};
  new MutationObserver((records, observer) => {
    if (!document.body) return;
    d.atBody = document.documentElement.getAttribute('data-theme');
    observer.disconnect();
  }).observe(document, {childList: true, subtree: true});
  requestAnimationFrame(() => {
    d.firstFrame = {
      theme: document.documentElement.getAttribute('data-theme'),
      bg: getComputedStyle(document.body || document.documentElement).backgroundColor,
    };
  });
})();
"""


def user_texts(tab_id: uuid.UUID) -> list[str]:
    return [
        c.data.get("text")
        for c in Chunk.objects.filter(tab_id=tab_id, role="user", type="text").order_by("seq")
    ]


async def setup(browser: Any, server: Any, **page_args: Any) -> tuple[Any, Any, Any]:
    """A user, a tab on the offline model, and its page, connected."""
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, **{**DESKTOP, **page_args}
    )
    await synced(live.page)
    return tab, live, session


async def answered(page: Any, tab_id: uuid.UUID, messages: int) -> None:
    """The turn of the tab's `messages`-th message has ended, and the page shows it ended
    (not the idle status from before that turn started)."""

    async def in_log() -> bool:
        return len(await sync_to_async(user_texts)(tab_id)) >= messages

    await until(in_log, f"message {messages} in the log")
    await turn_ended(tab_id)
    await page.wait_for_function(
        f"document.querySelectorAll('#log .chunk.user').length === {messages}"
        " && !document.querySelector('#log .chunk.open')"
        " && document.querySelector('#status').dataset.state === 'idle'"
    )


async def conn_text(page: Any) -> str:
    return (await page.text_content("#conn .conn-text")) or ""


@pytest.mark.parametrize("stop", ["kill", "terminate"])
async def test_a_dropped_connection_shows_and_the_draft_is_sent_once_when_it_is_back(
    browser, serve, stop
):
    """Killed (a crash) or stopped (a restart): the page sees the same abnormal close."""
    server = await serve()
    tab, live, _ = await setup(browser, server)
    page = live.page
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.url.endswith("/send/") else None)
    assert await page.is_hidden("#conn")
    assert await page.text_content("#status .state") == "Idle"

    await sync_to_async(getattr(server, stop))()
    await page.wait_for_selector("#conn[data-state=down]")
    # The status line is hidden: it would say "Idle", which nobody knows now.
    assert await page.is_hidden("#status")
    assert re.fullmatch(r"Disconnected — reconnecting \(\d+ s\)", await conn_text(page))
    # How long: the count goes up while it stays down.
    await page.wait_for_function(
        "parseInt(document.querySelector('#conn .conn-text').textContent"
        ".match(/\\((\\d+) s\\)/)[1]) >= 2"
    )
    send = page.locator("#composer .send")
    assert await send.is_enabled()
    assert "Not connected" in (await send.get_attribute("title"))

    # Enter while down: the message waits in the composer, visibly; nothing is posted.
    await page.fill("#composer-text", "sent while the server was down")
    await page.press("#composer-text", "Enter")
    await page.wait_for_selector("#conn .conn-cancel:visible")
    assert await send.is_disabled()
    assert await send.get_attribute("title") == "Will send when reconnected"
    assert "will send when reconnected" in await conn_text(page)
    assert await page.input_value("#composer-text") == "sent while the server was down"
    # Pressed again, nothing more is queued or sent.
    await page.press("#composer-text", "Enter")
    assert posts == []
    await shots_resized(page, "connection-down-queued")

    server = await serve(port=server.port)
    await page.wait_for_selector("#conn", state="hidden")
    await page.wait_for_selector("#status:visible")
    await answered(page, tab.id, 1)
    assert await page.is_visible("#status")
    assert await page.text_content("#status .state") == "Idle"
    assert await sync_to_async(user_texts)(tab.id) == ["sent while the server was down"]
    assert not await sync_to_async(QueuedMessage.objects.filter(tab_id=tab.id).exists)()
    assert len(posts) == 1
    assert await page.input_value("#composer-text") == ""
    assert await send.is_enabled()
    assert await page.locator("#log .chunk.user").count() == 1
    live.assert_clean()


async def test_a_message_waiting_for_the_connection_can_be_taken_back(browser, serve):
    server = await serve()
    tab, live, _ = await setup(browser, server)
    page = live.page
    await sync_to_async(server.kill)()
    await page.wait_for_selector("#conn[data-state=down]")
    await page.fill("#composer-text", "never mind")
    await page.click("#composer .send")
    await page.click("#conn .conn-cancel")
    assert await page.locator("#composer .send").is_enabled()
    assert "will send" not in await conn_text(page)

    await serve(port=server.port)
    await page.wait_for_selector("#conn", state="hidden")
    await page.wait_for_selector("#status:visible")
    # Caught up and nothing sent: the text is still the reader's.
    assert await page.input_value("#composer-text") == "never mind"
    assert await sync_to_async(user_texts)(tab.id) == []
    live.assert_clean()


async def test_closes_htmx_would_not_retry_reconnect_and_a_refusal_says_reload(browser, serve):
    """Closes the ws extension would not retry reconnect; 4403 says reload."""
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/", session=session, **DESKTOP)
    page = live.page
    sockets: list[Any] = []

    def route(ws: Any) -> None:
        ws.connect_to_server()
        sockets.append(ws)

    await page.route_web_socket(re.compile(r".*/ws/tabs/"), route)
    await page.goto(f"{server.url}/t/{tab.id}/")
    await synced(page)

    async def connects() -> int:
        return await page.evaluate("window.__e2e.connects")

    # Counts the times the disconnection notice shows.
    await page.evaluate(
        """() => {
      const conn = document.getElementById('conn');
      window.__shown = 0;
      new MutationObserver(() => { if (!conn.hidden) window.__shown += 1; })
        .observe(conn, {attributes: true, attributeFilter: ['hidden']});
    }"""
    )
    # The server asks for a resync: back at once, caught up with a new hello, no notice.
    await sockets[-1].close(code=4409, reason="resync")
    await page.wait_for_function("window.__e2e.connects === 2 && window.__e2e.synced")
    assert await page.evaluate("window.__shown") == 0
    # A clean close (1000, which htmx does not retry): shown, and back after a short wait.
    await sockets[-1].close(code=1000, reason="bye")
    await page.wait_for_function("window.__e2e.connects === 3 && window.__e2e.synced")
    await page.wait_for_selector("#conn", state="hidden")
    assert await page.evaluate("window.__shown") == 1
    assert len(sockets) == 3

    # Refused (signed out, the tab deleted): reload is the way back; a send says so.
    await sockets[-1].close(code=4403, reason="forbidden")
    await page.wait_for_selector("#conn[data-state=gone] .conn-reload:visible")
    assert "signed out, or this tab was deleted" in await conn_text(page)
    assert await page.locator("#composer .send").is_disabled()
    await page.fill("#composer-text", "kept")
    await page.press("#composer-text", "Enter")
    assert "reload the page first" in await page.text_content("#composer-error")
    assert await page.input_value("#composer-text") == "kept"
    assert len(sockets) == 3
    assert await connects() == 3
    await shots_resized(page, "connection-refused")
    # Reloaded: connected again, the text still there.
    await page.click("#conn .conn-reload")
    await page.wait_for_function("window.__e2e.connects === 1 && window.__e2e.synced")
    assert await page.input_value("#composer-text") == "kept"
    await page.wait_for_selector("#conn", state="hidden")


async def test_a_send_that_fails_says_so_and_keeps_the_text(browser, serve):
    server = await serve()
    tab, live, _ = await setup(browser, server)
    page = live.page

    await page.route("**/send/", lambda route: route.abort("connectionrefused"))
    await page.fill("#composer-text", "first try")
    await page.press("#composer-text", "Enter")
    await page.wait_for_selector("#composer-error:has-text('No answer from the server')")
    assert "your message may not have been sent" in await page.text_content("#composer-error")
    assert await page.input_value("#composer-text") == "first try"

    await page.unroute("**/send/")
    await page.route("**/send/", lambda route: route.fulfill(status=502, body="Bad gateway"))
    await page.press("#composer-text", "Enter")
    await page.wait_for_selector("#composer-error:has-text('HTTP 502')")
    assert await page.input_value("#composer-text") == "first try"
    assert await sync_to_async(user_texts)(tab.id) == []

    # Sent for real, the error line clears and the composer empties.
    await page.unroute("**/send/")
    await page.press("#composer-text", "Enter")
    await page.wait_for_function("document.querySelector('#composer-text').value === ''")
    assert await page.text_content("#composer-error") == ""
    await answered(page, tab.id, 1)
    assert await sync_to_async(user_texts)(tab.id) == ["first try"]
    live.assert_clean()


async def test_a_draft_survives_a_reload(browser, serve):
    server = await serve()
    tab, live, _ = await setup(browser, server)
    page = live.page
    await page.fill("#composer-text", "half a thought")
    await page.reload()
    await synced(page)
    assert await page.input_value("#composer-text") == "half a thought"
    await page.press("#composer-text", "Enter")
    await answered(page, tab.id, 1)
    await page.reload()
    await synced(page)
    assert await page.input_value("#composer-text") == ""
    live.assert_clean()


def seed_turns(tab_id: uuid.UUID, turns: int) -> None:
    paragraph = "A line of an earlier answer, long enough to take some room on the page. " * 4
    blocks = []
    for n in range(turns):
        turn = uuid.uuid4()
        blocks.append(Block(uuid.uuid4(), turn, 0, "user", "text", {"text": f"question {n}"}))
        blocks.append(
            Block(uuid.uuid4(), turn, 0, "assistant", "text", {"text": f"{paragraph}\n\n{n}"})
        )
    log.append(tab_id, blocks)


async def test_jump_to_the_latest_and_new_below(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    await sync_to_async(seed_turns)(tab.id, 12)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, **DESKTOP)
    page = live.page
    await synced(page)
    jump = page.locator("#jump")
    # At the bottom (where a page starts): no button.
    assert await jump.is_hidden()

    await page.evaluate("window.scrollTo(0, 0)")
    await jump.wait_for(state="visible")
    assert await page.locator("#jump .jump-new").is_hidden()
    await shots_resized(page, "jump-scrolled-up")

    # A message from another window: its answer streams in below the reader.
    other = await open_page(browser, server, f"/t/{tab.id}/", session=session, **DESKTOP)
    await synced(other.page)
    await other.page.fill("#composer-text", "from the other window")
    await other.page.press("#composer-text", "Enter")
    await page.wait_for_selector("#jump.has-new .jump-new:visible")
    assert await page.evaluate("window.scrollY") == 0
    await shots_resized(page, "jump-new-below")

    await jump.click()
    await jump.wait_for(state="hidden")
    assert await page.evaluate(
        "(() => { const s = document.scrollingElement;"
        " return s.scrollHeight - s.scrollTop - s.clientHeight <= 48; })()"
    )
    await answered(page, tab.id, 13)
    # Followed to the end of the answer: the reader is still at the bottom, no button.
    assert await jump.is_hidden()
    live.assert_clean()
    other.assert_clean()


async def test_the_theme_switch_is_remembered_and_applied_before_the_first_paint(browser, serve):
    server = await serve()
    tab, live, _ = await setup(browser, server)
    page = live.page
    await live.context.add_init_script(FIRST_PAINT)
    root = "document.documentElement"

    # By default the system's (light here, then dark: the system's change event is async).
    assert await page.evaluate(f"{root}.dataset.theme") == "light"
    await page.emulate_media(color_scheme="dark")
    await page.wait_for_selector("html[data-theme=dark]", state="attached")
    await page.emulate_media(color_scheme="light")
    await page.wait_for_selector("html[data-theme=light]", state="attached")
    assert await page.evaluate("getComputedStyle(document.body).backgroundColor") == LIGHT_BG
    assert await page.get_attribute("[data-theme-set=auto]", "aria-pressed") == "true"

    await page.click("[data-theme-set=dark]")
    assert await page.evaluate(f"{root}.dataset.theme") == "dark"
    assert await page.evaluate("getComputedStyle(document.body).backgroundColor") == DARK_BG
    assert await page.get_attribute("[data-theme-set=dark]", "aria-pressed") == "true"
    await screenshot(page, "theme-dark-chosen-1280")

    # Reloaded on a light system: dark from before the body is parsed, and at first paint.
    await page.reload()
    await synced(page)
    paint = await page.evaluate("window.__paint")
    assert paint == {"atBody": "dark", "firstFrame": {"theme": "dark", "bg": DARK_BG}}
    # Another page of the site, too.
    await page.goto(f"{server.url}/")
    assert (await page.evaluate("window.__paint"))["firstFrame"]["bg"] == DARK_BG

    # Light chosen on a dark system stays light; Auto follows the system again.
    await page.goto(f"{server.url}/t/{tab.id}/")
    await synced(page)
    await page.emulate_media(color_scheme="dark")
    await page.click("[data-theme-set=light]")
    await page.reload()
    await synced(page)
    assert (await page.evaluate("window.__paint"))["firstFrame"]["bg"] == LIGHT_BG
    await page.click("[data-theme-set=auto]")
    await page.wait_for_selector("html[data-theme=dark]", state="attached")
    assert await page.evaluate("localStorage.getItem('theme')") is None
    live.assert_clean()


async def test_notifications_after_a_click_only_and_only_while_hidden(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/", session=session, **DESKTOP)
    page = live.page
    await live.context.add_init_script(NOTIFICATIONS)
    await page.goto(f"{server.url}/t/{tab.id}/")
    await synced(page)

    async def notes() -> dict[str, Any]:
        return await page.evaluate("window.__notify")

    toggle = page.locator("#notify-toggle")
    assert await toggle.text_content() == "Notify me"
    # Not asked on load; a turn ending in a hidden page notifies nobody who did not ask.
    await page.evaluate("window.__notify.visible = false")
    await page.fill("#composer-text", "hello")
    await page.press("#composer-text", "Enter")
    await answered(page, tab.id, 1)
    assert (await notes())["shown"] == []
    assert (await notes())["asked"] == []

    # Asked from the click; headless Chromium says no, and the switch says so.
    await toggle.click()
    await page.wait_for_selector("#notify-toggle:has-text('Notifications blocked')")
    assert (await notes())["asked"] == [True]
    assert await toggle.get_attribute("aria-pressed") == "false"
    # Allowed in the browser's site settings: the switch sees it, and a click turns it on.
    await live.context.grant_permissions(["notifications"], origin=server.url)
    await page.wait_for_selector("#notify-toggle:has-text('Notify me')")
    await toggle.click()
    await page.wait_for_selector("#notify-toggle[aria-pressed=true]")
    assert await toggle.text_content() == "Notifications on"
    assert (await notes())["asked"] == [True]

    # Visible: a turn's end is on the screen already.
    await page.evaluate("window.__notify.visible = true")
    await page.fill("#composer-text", "hello again")
    await page.press("#composer-text", "Enter")
    await answered(page, tab.id, 2)
    assert (await notes())["shown"] == []

    # Hidden: a call waiting for approval, then the end of the turn.
    await page.evaluate("window.__notify.visible = false")
    await page.fill("#composer-text", "please run `echo hi`")
    await page.press("#composer-text", "Enter")
    await page.wait_for_selector("#status[data-state=waiting]")
    await page.wait_for_function("window.__notify.shown.length === 1")
    [waiting] = (await notes())["shown"]
    assert waiting["title"] == await page.text_content("#tab-title")
    assert waiting["body"].startswith("Waiting for your approval: shell")
    await page.click("#approval button[name=deny]")
    await answered(page, tab.id, 3)
    await page.wait_for_function("window.__notify.shown.length === 2")
    assert (await notes())["shown"][1]["body"] == "The answer is ready."
    # Stopped: the notice that closed the turn says how.
    await page.fill("#composer-text", "tell me a long story")
    await page.press("#composer-text", "Enter")
    await page.click("[data-stop]")
    await answered(page, tab.id, 4)
    await page.wait_for_function("window.__notify.shown.length === 3")
    notice = await page.text_content("#log > .chunk.t-system:last-child .sys-text")
    assert (await notes())["shown"][2]["body"] == f"The turn ended: {notice.strip()}"

    # Switched off, and remembered so across a reload.
    await page.evaluate("window.__notify.visible = true")
    await toggle.click()
    await page.reload()
    await synced(page)
    assert await page.get_attribute("#notify-toggle", "aria-pressed") == "false"
    assert (await notes())["asked"] == []
    live.assert_clean()
