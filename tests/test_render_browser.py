"""The live fragments applied by htmx and static/chat/app.js in a real Chromium.

The page comes from a live server; the WebSocket is the one boundary replaced:
Playwright answers it, and the frames it sends are chat.render's real output.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.utils.timezone import now

from chat import follow, log, render
from chat.models import QueuedMessage, RunningTurn, Tab, set_setting
from chat.stream import Block
from harness.login import browser_cookie, session_for
from tests.ui_helpers import block

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

# Generous for a loaded CI machine; a passing test never waits this long.
WAIT_SECONDS = 10.0


async def until(predicate: Callable[[], Any], what: str) -> Any:
    """Poll a Python-side condition (frames the fake socket received)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_SECONDS
    while loop.time() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class FakeSocket:
    """The server side of the page's WebSocket, one connection after another."""

    def __init__(self) -> None:
        self.routes: list[Any] = []
        self.received: list[list[str]] = []

    def handler(self, ws) -> None:
        self.routes.append(ws)
        messages: list[str] = []
        self.received.append(messages)
        ws.on_message(lambda message: messages.append(message))

    @property
    def ws(self):
        return self.routes[-1]

    async def hello(self, connection: int = 0) -> dict[str, Any]:
        import json

        messages = await until(
            lambda: len(self.received) > connection and self.received[connection],
            f"hello on connection {connection}",
        )
        return json.loads(messages[0])

    def send(self, *frames: str) -> None:
        for frame in frames:
            self.ws.send(frame)


def _make_tab(chunks: int = 0, *, page_size: int | None = None, dom_window: int | None = None):
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    tab = Tab.objects.create(owner=user, model="offline/demo")
    turn = uuid.uuid4()
    blocks = [block("text", {"text": f"message {i}"}, turn_id=turn) for i in range(chunks)]
    log.append(tab.id, blocks)
    if page_size is not None:
        set_setting("page_size", page_size)
    if dom_window is not None:
        set_setting("dom_window", dom_window)
    return tab, turn, blocks, session_for(user)


async def open_tab(browser, live_server, session: str, tab: Tab, *, height: int = 800):
    # Playwright's wait_for_function uses eval, which the page's CSP refuses.
    context = await browser.new_context(viewport={"width": 1000, "height": height}, bypass_csp=True)
    await context.add_cookies([browser_cookie(session, live_server.url)])
    page = await context.new_page()
    page.set_default_timeout(WAIT_SECONDS * 1000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    socket = FakeSocket()
    await page.route_web_socket(re.compile(r"/ws/tabs/"), socket.handler)
    await page.goto(f"{live_server.url}/t/{tab.id}/")
    return page, socket, errors


async def chunk_ids(page) -> list[str]:
    return await page.eval_on_selector_all("#log .chunk", "els => els.map(e => e.id)")


# What app.css draws from the classes and elements the server sent (no script sets them).


async def drawn_partial(page, chunk: Block) -> bool:
    """Shown as the rest of a bubble whose start is not on the page."""
    content = await page.eval_on_selector(
        f"#chunk-{chunk.id}", "el => getComputedStyle(el, '::before').content"
    )
    return content == '"… earlier in this turn"'


async def joins_the_bubble_above(page, chunk: Block) -> bool:
    width = await page.eval_on_selector(
        f"#chunk-{chunk.id}", "el => getComputedStyle(el).borderTopWidth"
    )
    return width == "0px"


async def dot_lit(page) -> bool:
    """The current tab's "a turn is running" dot in the sidebar."""
    colour = await page.eval_on_selector(
        ".tab-link.current .run-dot", "el => getComputedStyle(el).backgroundColor"
    )
    return colour != "rgba(0, 0, 0, 0)"


async def test_it_says_what_it_holds_on_every_connect(browser, live_server):
    """Hello reports the last sealed seq, then on reconnect the open chunk and its length in
    code points (an emoji is one, a CR survives the HTML parser)."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(3)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    assert await socket.hello() == {"type": "hello", "last_seq": 3, "open_id": "", "open_len": 0}

    # Thinking: a plain body (an open text chunk is live Markdown, sent whole on a reconnect).
    open_block = block("thinking", {"text": "ab👋"}, turn_id=turn)
    socket.send(render.fragment_open(open_block), render.fragment_delta(open_block.id, "c\r\nd"))
    await page.wait_for_function(
        f"document.getElementById('body-{open_block.id}').textContent.endsWith('d')"
    )
    # 1012 (service restart) is one of the codes after which the ws extension reconnects.
    await socket.ws.close(code=1012, reason="restart")
    hello = await socket.hello(connection=1)
    assert hello == {
        "type": "hello",
        "last_seq": 3,
        "open_id": str(open_block.id),
        "open_len": len("ab👋c\r\nd"),
    }
    assert errors == []


async def test_it_replaces_in_place_and_never_duplicates(browser, live_server):
    """A seal replaces its open element where it stands; a chunk sent twice is there once."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(1)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    streamed = block("text", {"text": "so"}, turn_id=turn)
    later = block("system", {"kind": "notice", "text": "later"}, role="system", turn_id=turn, seq=3)
    socket.send(render.fragment_open(streamed), render.fragment_seal(later))
    sealed = block("text", {"text": "**sealed**"}, turn_id=turn, seq=2)
    sealed.id = streamed.id
    socket.send(
        render.fragment_seal(sealed), render.fragment_seal(sealed), render.fragment_chunks([sealed])
    )
    await page.wait_for_selector(f"#chunk-{sealed.id}:not(.open) strong")
    assert await chunk_ids(page) == [
        f"chunk-{blocks[0].id}",
        f"chunk-{sealed.id}",
        f"chunk-{later.id}",
    ]
    assert await page.get_attribute(f"#chunk-{sealed.id}", "data-seq") == "2"
    assert await page.query_selector(f"#body-{sealed.id}") is None
    assert errors == []


async def test_it_streams_results_into_their_cards(browser, live_server):
    """Live output opens in its call's card and its result seals there; a result whose card
    is not on the page still shows, in the log."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(0)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    call = block(
        "tool_call",
        {"call_id": "c1", "name": "shell", "arguments": {"command": "ls"}},
        turn_id=turn,
        seq=1,
    )
    live = block(
        "tool_result",
        {"call_id": "c1", "name": "shell", "shell_output": ""},
        role="tool",
        turn_id=turn,
    )
    socket.send(
        render.fragment_seal(call),
        render.fragment_open(live),
        render.fragment_delta(live.id, "a.txt\n"),
    )
    slot = f"#chunk-{call.id} .slot"
    await page.wait_for_function(
        f"document.querySelector('{slot} #body-{live.id}')?.textContent === 'a.txt\\n'"
    )
    done = block(
        "tool_result",
        {
            "call_id": "c1",
            "name": "shell",
            "result": "exit 0",
            "is_error": False,
            "shell_output": "a.txt\n",
        },
        role="tool",
        turn_id=turn,
        seq=2,
    )
    done.id = live.id
    stray = block(
        "tool_result",
        {"call_id": "gone", "name": "ls", "result": "x", "is_error": False},
        role="tool",
        turn_id=turn,
        seq=3,
    )
    socket.send(render.fragment_seal(done), render.fragment_seal(stray))
    await page.wait_for_selector(f"#log > #chunk-{stray.id}")
    assert await page.eval_on_selector_all(f"{slot} > .chunk", "els => els.map(e => e.id)") == [
        f"chunk-{live.id}"
    ]
    assert await page.get_attribute(f"#chunk-{live.id}", "data-seq") == "2"
    assert errors == []


async def test_it_shows_queue_status_and_approval(browser, live_server):
    """Queued messages come and go by id; a waiting turn gets Stop and Approve/Deny, and
    Approve posts the call's id."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(0)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    call = block(
        "tool_call",
        {"call_id": "c7", "name": "shell", "arguments": {"command": "make"}},
        turn_id=turn,
        seq=1,
    )
    socket.send(render.fragment_queued(41, "next <b>please</b>"), render.fragment_seal(call))
    await page.wait_for_selector("#queued-41")
    assert await page.text_content("#queued-41 .plain") == "next <b>please</b>"
    socket.send(
        render.fragment_taken([41]),
        render.fragment_status(
            {
                "state": "waiting",
                "turn_id": str(turn),
                "step": 1,
                "usage": {"cache_read": 2048},
                "approval": {"call_id": "c7", "name": "shell", "arguments": {"command": "make"}},
            }
        ),
    )
    # The card's buttons are filled in, and the bar over the composer is the one that asks.
    await page.wait_for_selector(
        f"#chunk-{call.id} .approve button[name=approve]", state="attached"
    )
    assert await page.query_selector("#queued-41") is None
    assert await page.is_visible("#approval")
    assert await page.is_visible("#composer-actions [data-stop]")
    assert "cache read 2k" in await page.text_content("#status")
    async with page.expect_response(lambda r: r.url.endswith("/approve/")) as response:
        await page.click("#approval button[name=approve]")
    assert (await response.value).status == 204
    socket.send(render.fragment_status({"state": "running", "turn_id": str(turn), "step": 1}))
    await page.wait_for_selector("#approval[hidden]", state="attached")
    # Nothing waits for approval any more: the card no longer asks (app.css reads #approval).
    assert await page.is_hidden(f"#chunk-{call.id} .approve button[name=approve]")
    assert errors == []


async def test_the_page_shows_the_state_the_fragments_carry(browser, live_server):
    """With no script fixing up the page: the empty tab's hint goes with the first queued
    message and stays gone; a turn's live chunks form one bubble under the user's message
    and the next turn starts its own; the current tab's dot follows the status line."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(0)
    # Titled: an untitled tab never sent to has no sidebar entry (issue 31), so no dot.
    await sync_to_async(Tab.objects.filter(pk=tab.pk).update)(title="Empty")
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    assert await page.is_visible("#empty-hint")
    assert not await dot_lit(page)

    socket.send(render.fragment_queued(1, "hello"))
    await page.wait_for_selector("#queued-1")
    assert await page.is_hidden("#empty-hint")
    user = block("text", {"text": "hello"}, role="user", turn_id=turn, step=0, seq=1)
    thinking = block("thinking", {"text": "hm"}, turn_id=turn)
    socket.send(
        render.fragment_status({"state": "running", "turn_id": str(turn), "step": 1}),
        render.fragment_seal(user),
        render.fragment_taken([1]),
        render.fragment_open(thinking),
    )
    await page.wait_for_selector(f"#chunk-{thinking.id}")
    assert await page.query_selector("#queued-1") is None
    assert await page.is_hidden("#empty-hint")
    assert await dot_lit(page)
    thinking.seq = 2
    text = block("text", {"text": "hi"}, turn_id=turn, seq=3)
    socket.send(render.fragment_seal(thinking), render.fragment_seal(text))
    await page.wait_for_selector(f"#chunk-{text.id}")
    assert not await joins_the_bubble_above(page, thinking)
    assert await joins_the_bubble_above(page, text)

    nxt = uuid.uuid4()
    again = block("text", {"text": "more"}, role="user", turn_id=nxt, step=0, seq=4)
    answer = block("text", {"text": "sure"}, turn_id=nxt, seq=5)
    socket.send(
        render.fragment_status({"state": "idle", "turn_id": str(turn)}),
        render.fragment_seal(again),
        render.fragment_seal(answer),
    )
    await page.wait_for_selector(f"#chunk-{answer.id}")
    assert not await joins_the_bubble_above(page, answer)
    assert not await dot_lit(page)
    assert errors == []


async def test_the_current_tabs_dot_goes_out_when_its_turn_ends(browser, live_server):
    """A page loaded mid-turn lights the current tab's dot (the sidebar's render); the idle
    status the socket sends puts it out, with no script touching the sidebar."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(1)
    await RunningTurn.objects.acreate(tab=tab, turn_id=turn, worker="w", heartbeat_at=now())
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    assert await dot_lit(page)
    await RunningTurn.objects.filter(tab=tab).adelete()
    socket.send(render.fragment_status({"state": "idle", "turn_id": str(turn)}))
    await page.wait_for_selector("#status[data-state=idle]")
    assert not await dot_lit(page)
    assert errors == []


async def test_it_keeps_a_bounded_dom_but_never_drops_the_running_turn(browser, live_server):
    """Past the DOM window the oldest chunks go and 'load older' points before what is left
    (the first bubble left now shows as partial); chunks of the running turn stay whatever
    their number."""
    make = sync_to_async(_make_tab)
    tab, old_turn, blocks, session = await make(20, page_size=20, dom_window=20)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    assert await page.query_selector("#older") is None
    assert not await drawn_partial(page, blocks[0])
    running = uuid.uuid4()
    socket.send(render.fragment_status({"state": "running", "turn_id": str(running), "step": 1}))
    # A turn opens with the user's message.
    new = [block("text", {"text": "go"}, role="user", turn_id=running, seq=21)]
    new += [block("text", {"text": f"n{i}"}, turn_id=running, seq=22 + i) for i in range(24)]
    socket.send(*(render.fragment_seal(b) for b in new[:5]))
    await page.wait_for_selector(f"#chunk-{new[4].id}")
    ids = await chunk_ids(page)
    assert len(ids) == 20 and ids[0] == f"chunk-{blocks[5].id}"
    older = await page.get_attribute("#older", "hx-get")
    assert older == f"/t/{tab.id}/older/?before=6"
    assert await drawn_partial(page, blocks[5])
    assert await joins_the_bubble_above(page, blocks[6])
    socket.send(*(render.fragment_seal(b) for b in new[5:]))
    await page.wait_for_selector(f"#chunk-{new[-1].id}")
    assert await chunk_ids(page) == [f"chunk-{b.id}" for b in new]
    assert await page.get_attribute("#older", "hx-get") == f"/t/{tab.id}/older/?before=21"
    # The running turn's answer is one bubble under its user message, not a partial one.
    assert not await drawn_partial(page, new[1]) and not await joins_the_bubble_above(page, new[1])
    assert all([await joins_the_bubble_above(page, b) for b in new[2:]])
    assert errors == []


async def test_it_loads_older_pages_without_moving_the_view(browser, live_server):
    """Scrolling to the top loads the page before, the reader's place stays put, and new
    chunks do not pull a reader who scrolled up back to the bottom."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(60, page_size=20)
    page, socket, errors = await open_tab(browser, live_server, session, tab, height=500)
    await socket.hello()
    first = f"#chunk-{blocks[40].id}"
    assert await drawn_partial(page, blocks[40])
    assert await page.evaluate("window.scrollY") > 0
    await page.evaluate("window.scrollTo(0, 0)")
    top_before = await page.evaluate(
        f"document.querySelector('{first}').getBoundingClientRect().top"
    )
    await page.wait_for_selector(f"#chunk-{blocks[20].id}", state="attached")
    top_after = await page.evaluate(
        f"document.querySelector('{first}').getBoundingClientRect().top"
    )
    assert abs(top_after - top_before) <= 2
    assert await page.get_attribute("#older", "hx-get") == f"/t/{tab.id}/older/?before=21"
    # The page began mid-turn; with the page before loaded above, that bubble simply goes on.
    assert await drawn_partial(page, blocks[20])
    assert not await drawn_partial(page, blocks[40])
    assert await joins_the_bubble_above(page, blocks[40])

    scroll = await page.evaluate("window.scrollY")
    extra = block("text", {"text": "new"}, turn_id=turn, seq=61)
    socket.send(render.fragment_seal(extra))
    await page.wait_for_selector(f"#chunk-{extra.id}")
    assert await page.evaluate("window.scrollY") == scroll

    await page.evaluate("window.scrollTo(0, document.scrollingElement.scrollHeight)")
    last = block("text", {"text": "newest " * 80}, turn_id=turn, seq=62)
    socket.send(render.fragment_seal(last))
    await page.wait_for_selector(f"#chunk-{last.id}")
    assert (
        await page.evaluate(
            "(() => { const s = document.scrollingElement;"
            " return s.scrollHeight - s.scrollTop - s.clientHeight; })()"
        )
        <= 2
    )
    assert errors == []


async def test_an_older_page_takes_back_the_results_of_its_calls(browser, live_server):
    """A page that begins with a result whose call is on the page before: loading that
    page puts the result in its card, where it shows once, and the view does not move."""

    def make():
        tab, turn, blocks, session = _make_tab(19, page_size=20)
        call = block("tool_call", {"call_id": "c1", "name": "ls", "arguments": {}}, turn_id=turn)
        result = block(
            "tool_result",
            {"call_id": "c1", "name": "ls", "result": "a.txt", "is_error": False},
            role="tool",
            turn_id=turn,
        )
        rest = [block("text", {"text": "line\n" * 3}, turn_id=turn) for _ in range(19)]
        log.append(tab.id, [call, result, *rest])
        return tab, call, result, rest, session

    tab, call, result, rest, session = await sync_to_async(make)()
    page, socket, errors = await open_tab(browser, live_server, session, tab, height=500)
    await socket.hello()
    assert await chunk_ids(page) == [f"chunk-{result.id}", *(f"chunk-{b.id}" for b in rest)]
    first = f"#chunk-{rest[0].id}"
    await page.evaluate("window.scrollTo(0, 0)")
    top_before = await page.evaluate(
        f"document.querySelector('{first}').getBoundingClientRect().top"
    )
    await page.wait_for_selector(f"#chunk-{call.id} .slot > #chunk-{result.id}", state="attached")
    assert await page.locator(f"#chunk-{result.id}").count() == 1
    assert await page.locator(f"#chunk-{result.id} .result-head").count() == 0
    top_after = await page.evaluate(
        f"document.querySelector('{first}').getBoundingClientRect().top"
    )
    assert abs(top_after - top_before) <= 2
    assert errors == []


async def test_it_sends_on_enter_and_stops_on_escape(browser, live_server):
    """Enter sends (Shift+Enter is a new line) and clears the composer; Esc presses Stop."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(0)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    await page.click("#composer-text")
    await page.keyboard.type("first line")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("second")
    async with page.expect_response(lambda r: r.url.endswith("/send/")) as response:
        await page.keyboard.press("Enter")
    assert (await response.value).status == 200
    await page.wait_for_function("document.getElementById('composer-text').value === ''")
    texts = await sync_to_async(
        lambda: list(QueuedMessage.objects.values_list("text", flat=True))
    )()
    assert texts == ["first line\nsecond"]
    assert await page.text_content("#tab-title") == "first line"

    await page.keyboard.press("Enter")  # empty: the browser's own "required" check stops it
    socket.send(render.fragment_status({"state": "running", "turn_id": str(turn), "step": 1}))
    await page.wait_for_selector("#composer-actions [data-stop]")
    async with page.expect_response(lambda r: r.url.endswith("/stop/")) as response:
        await page.keyboard.press("Escape")
    assert (await response.value).status == 204
    assert await sync_to_async(QueuedMessage.objects.count)() == 1
    assert errors == []


async def test_it_shows_a_clear_error_for_a_blank_message(browser, live_server):
    """Only spaces: the server's error shows in the composer, the text stays."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(0)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    await page.fill("#composer-text", "   ")
    async with page.expect_response(lambda r: r.url.endswith("/send/")) as response:
        await page.click("button.send")
    assert (await response.value).status == 422
    await page.wait_for_function(
        "document.getElementById('composer-error').textContent === 'The message is empty.'"
    )
    assert await page.input_value("#composer-text") == "   "
    assert errors == []


async def test_a_page_far_behind_gets_its_log_replaced_by_the_latest_page(browser, live_server):
    """The socket's answer to a page more than a page behind (chat.follow.catch_up) is a
    new log: the latest page with its "older" trigger, even on a page scrolled back so far
    that it had stopped following, shown from its newest message as after a page load."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(30, page_size=20, dom_window=20)
    page, socket, errors = await open_tab(browser, live_server, session, tab, height=500)
    hello = await socket.hello()
    # Scrolled back past the DOM window: the newest chunks are dropped, the page detached.
    await page.evaluate("window.scrollTo(0, 0)")
    await page.wait_for_selector("#newer")

    later = [block("text", {"text": f"later {i}"}, turn_id=turn) for i in range(50)]
    await sync_to_async(log.append)(tab.id, later)
    plan = await sync_to_async(follow.catch_up)(tab.id, hello["last_seq"])
    assert plan.replaced and len(plan.frames) == 1
    socket.send(*plan.frames)
    await page.wait_for_selector(f"#chunk-{later[-1].id}")
    assert await chunk_ids(page) == [f"chunk-{b.id}" for b in later[-20:]]
    assert await page.query_selector("#newer") is None
    assert await page.get_attribute("#older", "hx-get") == f"/t/{tab.id}/older/?before=61"
    assert await page.get_attribute("#log", "data-dom-window") == "20"

    # At the newest message, as after a page load: the "older" trigger is out of view.
    assert (
        await page.evaluate(
            "(() => { const s = document.scrollingElement;"
            " return s.scrollHeight - s.scrollTop - s.clientHeight; })()"
        )
        <= 2
    )
    assert await page.get_attribute("#older", "data-hx-revealed") is None
    assert errors == []


async def test_on_a_phone_approval_asks_once_and_tables_keep_their_words(browser, live_server):
    """At 375 px the bar over the composer asks for approval (the card's own buttons would
    ask a second time); a Markdown table scrolls sideways instead of breaking its words."""
    tab, turn, blocks, session = await sync_to_async(_make_tab)(0)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await page.set_viewport_size({"width": 375, "height": 800})
    await socket.hello()
    call = block(
        "tool_call",
        {"call_id": "c7", "name": "shell", "arguments": {"command": "make"}},
        turn_id=turn,
        seq=1,
    )
    table = block(
        "text",
        {
            "text": "| A | B | C | D |\n|---|---|---|---|\n"
            "| internationalization | synchronization | authentication | configuration |\n"
        },
        role="assistant",
        turn_id=turn,
        seq=2,
    )
    socket.send(
        render.fragment_seal(call),
        render.fragment_seal(table),
        render.fragment_status(
            {
                "state": "waiting",
                "turn_id": str(turn),
                "step": 1,
                "approval": {"call_id": "c7", "name": "shell", "arguments": {"command": "make"}},
            }
        ),
    )
    await page.wait_for_selector("#approval:not([hidden])")
    assert await page.is_visible("#approval button[name=approve]")
    assert await page.is_hidden(f"#chunk-{call.id} .approve button[name=approve]")
    # Each cell at least as wide as its longest word (a word broken mid-word would let it
    # be narrower), and the table wider than its box: it scrolls.
    narrow = await page.eval_on_selector_all(
        f"#chunk-{table.id} td",
        """cells => {
          const ctx = document.createElement('canvas').getContext('2d');
          return cells.filter(c => {
            const style = getComputedStyle(c);
            ctx.font = style.font;
            const words = c.textContent.split(/\\s+/);
            const word = Math.max(...words.map(w => ctx.measureText(w).width));
            const pad = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
            const inner = c.clientWidth - pad;
            return inner + 1 < word;
          }).map(c => c.textContent);
        }""",
    )
    assert narrow == []
    assert await page.eval_on_selector(
        f"#chunk-{table.id} table", "t => t.scrollWidth > t.clientWidth"
    )
    # Wider than a phone too, the bar is the one place that asks (issue 31).
    await page.set_viewport_size({"width": 1100, "height": 800})
    assert await page.is_visible("#approval button[name=approve]")
    assert await page.is_hidden(f"#chunk-{call.id} .approve button[name=approve]")
    assert errors == []
