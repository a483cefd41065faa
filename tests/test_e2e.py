"""End to end: Chromium against a live `manage.py serve`, on the pytest database.

Nothing is faked between the browser and the server: real HTTP, the real
WebSocket, the embedded turn worker, real tools in a temporary workspace. The
model is the offline demo (paced like a hosted model), or the real Anthropic
adapter talking to the fake provider server (harness/fakeprovider.py) for long
scripted streams. Screenshots of the main states go to test-artifacts/.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from chat import log
from chat.models import Chunk, QueuedMessage
from chat.providers.base import Message, Request, TextPart
from chat.providers.offline import make_plan
from chat.stream import Block
from harness.login import session_for
from tests.live import (
    anthropic_env,
    anthropic_reply,
    check_against_log,
    check_open_prefix,
    expected,
    log_dom_hazards,
    make_tab,
    make_user,
    open_page,
    read_log,
    rows,
    screenshot,
    send_message,
    set_setting,
    synced,
    turn_ended,
)
from tests.ui_helpers import seed_every_type

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


def offline_reply(text: str) -> str:
    """The text the offline model answers a first message with."""
    request = Request(system="", tools=(), messages=(Message("user", (TextPart(text),)),))
    return make_plan(request).text


def kinds(chunks: list[Chunk]) -> list[str]:
    return [f"{c.role}/{c.type}" for c in chunks]


async def owner_and_tab(model: str = "offline/demo"):
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, model)
    session = await sync_to_async(session_for)(user)
    return user, tab, session


# --- Accounts ----------------------------------------------------------------------------

OWNER = "ada"
OWNER_PASSWORD = "copper-kettle-orbit-73"


async def test_it_creates_the_owner_on_first_run_then_logs_out_and_in(browser, serve):
    """A fresh install sends everyone to /setup/; the account made there owns the install
    and is logged in; /setup/ is gone after that; logout and login work, a wrong password
    gets a clear error."""
    server = await serve()
    live = await open_page(browser, server, "/")
    page = live.page
    assert page.url == f"{server.url}/setup/"

    await page.fill("#id_username", OWNER)
    await page.fill("#id_password1", OWNER_PASSWORD)
    await page.fill("#id_password2", OWNER_PASSWORD + "x")
    await page.click("button[type=submit]")
    assert page.url == f"{server.url}/setup/"
    assert "didn’t match" in await page.text_content("#id_password2_error")

    await page.fill("#id_password1", OWNER_PASSWORD)
    await page.fill("#id_password2", OWNER_PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{server.url}/")
    assert await page.text_content(".empty h2") == "No tabs yet"
    assert await page.text_content(".user-name") == OWNER
    owner = await sync_to_async(get_user_model().objects.get)()
    assert (owner.username, owner.is_staff, owner.is_superuser) == (OWNER, True, True)

    await page.goto(f"{server.url}/setup/")
    assert page.url == f"{server.url}/", "the setup page must be gone once an owner exists"
    await page.click("button.primary:has-text('New tab')")
    await page.wait_for_url(f"{server.url}/t/*/")
    tab_url = page.url

    await page.click(".sidebar-foot button:has-text('Log out')")
    await page.wait_for_url(f"{server.url}/login/")
    await page.goto(tab_url)
    assert page.url.startswith(f"{server.url}/login/?next=")

    await page.fill("#id_username", OWNER)
    await page.fill("#id_password", "not-the-password")
    await page.click("button[type=submit]")
    assert "correct username and password" in await page.text_content(".auth-card .error")

    await page.fill("#id_password", OWNER_PASSWORD)
    await page.click("button[type=submit]")
    await page.wait_for_url(tab_url)
    await page.click(".sidebar-foot button:has-text('Log out')")
    await page.wait_for_url(f"{server.url}/login/")
    await page.fill("#id_username", OWNER)
    await page.fill("#id_password", OWNER_PASSWORD)
    await page.click("button[type=submit]")
    # Home opens the most recent tab.
    await page.wait_for_url(tab_url)
    live.assert_clean()


# --- Streaming ---------------------------------------------------------------------------


async def test_it_streams_thinking_text_and_a_tool_card_then_seals_them(browser, serve):
    """A message to the offline model: thinking and text stream into open chunks that grow
    and then seal in place; the list_files call shows as a card holding its result; the
    page ends up showing exactly the log."""
    server = await serve()
    user, tab, session = await owner_and_tab()
    (serve.workspace_of(user) / "notes.txt").write_text("some notes\n")
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    page = live.page
    await synced(page)

    await send_message(page, "list the files")
    first_open = await page.wait_for_selector("#log .chunk.open")
    chunk_id = (await first_open.get_attribute("id")).removeprefix("chunk-")
    # The answer streaming in (or, on a slow machine, just streamed).
    await page.wait_for_function(
        "[...document.querySelectorAll('#log .t-text.open :is(.body, .live-md)')].some("
        "(b) => b.textContent.length > 20) || !!document.querySelector('#log .t-text.a:not(.open)')"
    )
    await screenshot(page, "streaming")
    await page.wait_for_selector(f"#chunk-{chunk_id}:not(.open)")
    await page.wait_for_selector("#log .t-tool-call .slot .t-tool-result.has-result")
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    await screenshot(page, "tool-card")

    grew = await page.evaluate("window.__e2e.grew")
    samples = grew[chunk_id]
    assert len(set(samples)) >= 2 and samples == sorted(samples), (
        f"the open chunk did not grow while it streamed: {samples}"
    )
    log_rows = await sync_to_async(rows)(tab.id)
    assert kinds(log_rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/thinking",
        "assistant/text",
    ]
    assert str(log_rows[1].id) == chunk_id
    assert len(samples) > 1 and samples[-1] <= len(log_rows[1].data["text"])
    # Every streamed chunk was seen open before it sealed.
    streamed = [r for r in log_rows if r.type in ("thinking", "text") and r.role == "assistant"]
    assert all(str(r.id) in grew for r in streamed)

    shown = await read_log(page)
    check_against_log(shown, log_rows, complete=True)
    card = page.locator(f"#chunk-{log_rows[3].id}")
    assert await card.locator(".card-head .tool-name").text_content() == "list_files"
    result = card.locator(f".slot > #chunk-{log_rows[4].id} .result")
    assert "notes.txt" in await result.text_content()
    assert await page.query_selector("#composer-actions [data-stop]") is None
    live.assert_clean()


# --- Reload at any moment ---------------------------------------------------------------

# Fixed, so a failure can be replayed moment for moment.
RELOAD_SEED = 20240611
RELOADS = 20
# Seconds before each piece of the scripted stream; with the pieces below the
# turn takes about 15 s, long enough for 20 reloads to land all over it.
PIECE_PAUSE = 0.1
# The reloads are spread over this much of the turn (the rest lets the last ones settle).
RELOAD_WINDOW = 12.0


def long_turn() -> list:
    """Thinking, text and a list_files call, then a second step of text: ~15 s in all.

    The pieces mix markdown, HTML-looking text, entities, non-BMP characters and
    CR/LF, so an escaping slip or an off-by-one in offsets shows as a mismatch.
    """
    thinking = [f"Thought {i}: the user wants 😀 <b>files</b> & more. " for i in range(25)]
    text = [f"Part **{i}** of the plan, `code {i}` & <i>x</i> é.\r\n" for i in range(25)]
    closing = [f"Result line {i}: *fine* 👋 — [{i}]\n" for i in range(50)]
    return [
        anthropic_reply(
            [
                ("thinking", thinking),
                ("text", text),
                ("tool_use", ("toolu_e2e_1", "list_files", {"path": "."})),
            ],
            stop_reason="tool_use",
            pause=PIECE_PAUSE,
        ),
        anthropic_reply([("text", closing)], stop_reason="end_turn", pause=PIECE_PAUSE),
    ]


async def test_a_reload_at_any_moment_shows_exactly_the_log(browser, serve, fake_server):
    """20 reloads at seeded random moments of one long streamed turn: right after each,
    the page holds every chunk sealed so far, exactly; what each page load streamed is a
    true prefix of the chunk it sealed into (no gap, no repeat); once the turn ends the
    reloaded page and a page that watched the whole turn both show exactly the log."""
    fake_server.add(*long_turn())
    server = await serve(**anthropic_env(fake_server))
    user, tab, session = await owner_and_tab("anthropic/claude-sonnet-4-5")
    (serve.workspace_of(user) / "notes.txt").write_text("some notes\n")
    watcher = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    reloader = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    page = reloader.page
    await synced(watcher.page)
    await synced(page)

    rng = random.Random(RELOAD_SEED)
    moments = sorted(rng.uniform(0, RELOAD_WINDOW) for _ in range(RELOADS))
    await send_message(page, "list the files, slowly")
    start = time.monotonic()
    open_seen = []
    landed_open = 0
    for moment in moments:
        await asyncio.sleep(max(0.0, start + moment - time.monotonic()))
        # What the page streamed since its last load: checked against the log at the end.
        before = await read_log(page)
        open_seen += [s for s in before if s.open]
        sealed_before = len(await sync_to_async(rows)(tab.id))
        await page.reload()
        await synced(page)
        shown = await read_log(page)
        log_rows = await sync_to_async(rows)(tab.id)
        opened = check_against_log(shown, log_rows, complete=False, at_least=sealed_before)
        if opened is not None:
            open_seen.append(opened)
            landed_open += 1
    print(
        f"reloads done {time.monotonic() - start:.1f} s after sending, "
        f"{landed_open} of {RELOADS} while a chunk was open"
    )

    await turn_ended(tab.id)
    print(f"turn ended {time.monotonic() - start:.1f} s after sending")
    for live in (reloader, watcher):
        await live.page.wait_for_selector("#status[data-state=idle]")
    log_rows = await sync_to_async(rows)(tab.id)
    assert kinds(log_rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/text",
    ]
    assert len(fake_server.requests) == 2
    for live in (reloader, watcher):
        check_against_log(await read_log(live.page), log_rows, complete=True)
        live.assert_clean()
    # The reloads hit the turn while chunks were open, in more than one chunk.
    assert len({s.id for s in open_seen}) >= 2, open_seen
    for opened in open_seen:
        check_open_prefix(opened, log_rows)


# --- Stop -----------------------------------------------------------------------------------


async def stopped(live, tab, cancelled: int) -> list[Chunk]:
    """Wait for the n-th cancelled notice, an idle composer and a released turn; the log."""
    page = live.page
    await page.wait_for_function(
        f"document.querySelectorAll('#log .t-system.kind-cancelled').length === {cancelled}"
    )
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    assert await page.query_selector("#composer-actions [data-stop]") is None
    assert await page.query_selector("#log .chunk.open") is None
    log_rows = await sync_to_async(rows)(tab.id)
    last = log_rows[-1]
    assert (last.role, last.type, last.data["kind"]) == ("system", "system", "cancelled")
    check_against_log(await read_log(page), log_rows, complete=True)
    return log_rows


async def test_stop_and_escape_cancel_the_turn_and_leave_a_valid_log(browser, serve):
    """Stop mid-stream (the button, then Esc, then Stop while a call waits for approval):
    each time the open chunk seals as it was, a 'cancelled' notice closes the turn, the
    composer goes idle, and the log ends with the cancelled chunk; a call that never ran
    gets a 'cancelled' result."""
    # Half the usual pace: a greeting streams for ~5 s, ample time to press Stop in it.
    server = await serve(DISPATCH_OFFLINE_PACE="20")
    user, tab, session = await owner_and_tab()
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    page = live.page
    await synced(page)

    await send_message(page, "hello there")
    await page.wait_for_selector("#log .t-text.open")
    async with page.expect_response(lambda r: r.url.endswith("/stop/")) as response:
        await page.click("#composer-actions [data-stop]")
    assert (await response.value).status == 204
    log_rows = await stopped(live, tab, 1)
    assert kinds(log_rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "system/system",
    ]
    # Cut mid-text: the sealed text is a strict start of what the model would have said.
    cut, whole = log_rows[2].data["text"], offline_reply("hello there")
    assert cut and whole.startswith(cut) and cut != whole
    await screenshot(page, "cancelled")

    await send_message(page, "hello again")
    await page.wait_for_selector("#log .t-text.open")
    await page.focus("#composer-text")
    async with page.expect_response(lambda r: r.url.endswith("/stop/")):
        await page.keyboard.press("Escape")
    log_rows = await stopped(live, tab, 2)
    assert kinds(log_rows)[4:] == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "system/system",
    ]
    cut, whole = log_rows[6].data["text"], offline_reply("hello again")
    assert cut and whole.startswith(cut) and cut != whole

    await send_message(page, "run `echo never`")
    await page.wait_for_selector("#approval:not([hidden]) button[name=approve]")
    await page.click("#composer-actions [data-stop]")
    log_rows = await stopped(live, tab, 3)
    assert kinds(log_rows)[8:] == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "system/system",
    ]
    result = log_rows[-2].data
    assert (result["result"], result["is_error"]) == ("Cancelled by the user.", True)
    assert not (serve.workspace_of(user) / "never").exists()
    assert await page.is_hidden("#approval")
    live.assert_clean()


# --- A message in the middle of a turn -----------------------------------------------------


async def test_a_mid_turn_message_is_queued_then_taken_after_the_tool_results(browser, serve):
    """A message sent while a shell call waits for approval shows as queued (and survives a
    reload); after Approve the call runs, and the message enters the log right after the
    call's result, in the same turn, so the next step answers it."""
    server = await serve(DISPATCH_OFFLINE_PACE="0")
    user, tab, session = await owner_and_tab()
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    page = live.page
    await synced(page)

    await send_message(page, "run `echo approved`")
    await page.wait_for_selector("#approval:not([hidden]) button[name=approve]")
    assert "echo approved" in await page.text_content("#approval")
    await send_message(page, "and list the files")
    queued = await page.wait_for_selector("#queued > li.queued")
    assert await (await queued.query_selector(".plain")).text_content() == "and list the files"
    await screenshot(page, "approval")

    await page.reload()
    await synced(page)
    assert await page.text_content("#queued > li.queued .plain") == "and list the files"
    assert await sync_to_async(QueuedMessage.objects.count)() == 1
    assert await page.is_visible("#approval button[name=approve]")
    async with page.expect_response(lambda r: r.url.endswith("/approve/")) as response:
        await page.click("#approval button[name=approve]")
    assert (await response.value).status == 204

    await page.wait_for_selector("#queued > li", state="detached")
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    log_rows = await sync_to_async(rows)(tab.id)
    assert kinds(log_rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/thinking",
        "assistant/text",
    ]
    shell_result, mid = log_rows[4], log_rows[5]
    assert shell_result.data["shell_output"] == "approved\n"
    assert mid.data["text"] == "and list the files"
    assert {c.turn_id for c in log_rows} == {log_rows[0].turn_id}
    assert "About your new message" in log_rows[7].data["text"]
    assert log_rows[8].data["name"] == "list_files"
    check_against_log(await read_log(page), log_rows, complete=True)
    # On the page the message follows the shell call's card, which holds its result.
    top = await page.eval_on_selector_all("#log > .chunk", "els => els.map(e => e.id)")
    assert top.index(f"chunk-{mid.id}") == top.index(f"chunk-{log_rows[3].id}") + 1
    assert await sync_to_async(QueuedMessage.objects.count)() == 0
    live.assert_clean()


# --- Paging ----------------------------------------------------------------------------------

LONG_TAB_CHUNKS = 1000
# The page size (the default) and a DOM window low enough that older pages overflow it.
PAGE_SIZE = 200
DOM_WINDOW = 300


def long_tab(user) -> list[Chunk]:
    """A tab of LONG_TAB_CHUNKS chunks: question and answer turns, appended in one go."""
    tab = make_tab(user, title="A long tab")
    blocks = []
    for n in range(LONG_TAB_CHUNKS // 2):
        turn = uuid.uuid4()
        blocks.append(Block(uuid.uuid4(), turn, 0, "user", "text", {"text": f"Question {n}"}))
        blocks.append(
            Block(uuid.uuid4(), turn, 1, "assistant", "text", {"text": f"Answer **{n}**."})
        )
    log.append(tab.id, blocks)
    set_setting("dom_window", DOM_WINDOW)
    return rows(tab.id)


async def test_scrolling_up_loads_older_pages_and_keeps_the_dom_bounded(browser, serve):
    """In a 1,000-chunk tab, reaching the top loads the page before, again and again, down
    to the first chunk: each page lands in order with no gap and no duplicate, and the page
    never holds more chunks than the DOM window (the newest go). Detached from the live end,
    the page adds no chunk of a turn another window starts (it would follow a gap); a link
    leads back to the latest page, and sending a message goes there, showing the log's end
    exactly."""
    server = await serve(DISPATCH_OFFLINE_PACE="0")
    user = await sync_to_async(make_user)()
    log_rows = await sync_to_async(long_tab)(user)
    tab_id = log_rows[0].tab_id
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab_id}/", session=session, height=700)
    page = live.page
    await synced(page)
    counts = []
    while True:
        shown = await read_log(page)
        counts.append(len(shown))
        seqs = [s.seq for s in shown]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap or a duplicate"
        for s in shown:
            row = log_rows[s.seq - 1]
            assert (s.id, s.type, s.body) == (str(row.id), *expected(row)[:2])
        if seqs[0] == 1 or len(counts) > LONG_TAB_CHUNKS // PAGE_SIZE:
            break
        older = f"/t/{tab_id}/older/?before={seqs[0]}"
        assert await page.get_attribute("#older", "hx-get") == older
        async with page.expect_response(lambda r: "/older/" in r.url):
            await page.evaluate("window.scrollTo(0, 0)")
        await page.wait_for_function(
            f"document.querySelector('#log .chunk')?.getAttribute('data-seq') !== '{seqs[0]}'"
        )
    assert seqs == list(range(1, DOM_WINDOW + 1)), counts
    assert counts == [PAGE_SIZE] + [DOM_WINDOW] * (len(counts) - 1)
    assert await page.query_selector("#older") is None
    await screenshot(page, "paged")

    # Another window starts a turn: its chunks stay off the detached page.
    other = await open_page(browser, server, f"/t/{tab_id}/", session=session)
    await synced(other.page)
    await send_message(other.page, "hello")
    await other.page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab_id)
    await page.wait_for_selector("#status[data-state=idle]")
    assert [s.seq for s in await read_log(page)] == seqs
    assert await page.text_content("#newer") == "Newer messages are not shown · jump to the latest"

    assert await page.get_attribute("#newer a", "href") == f"/t/{tab_id}/"

    # Sending from the detached page goes to the latest page, where the answer shows.
    async with page.expect_navigation(url=f"{server.url}/t/{tab_id}/"):
        await send_message(page, "hello from far back")
    await synced(page)
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab_id)
    log_rows = await sync_to_async(rows)(tab_id)
    assert len(log_rows) == LONG_TAB_CHUNKS + 6
    assert log_rows[-3].data["text"] == "hello from far back"
    # The latest page as rendered (200 chunks), then whatever streamed in after it loaded.
    shown = await read_log(page)
    tail = log_rows[shown[0].seq - 1 :]
    assert PAGE_SIZE <= len(tail) <= PAGE_SIZE + 3
    assert [s.seq for s in shown] == [r.seq for r in tail]
    for s, row in zip(shown, tail, strict=True):
        assert (s.id, s.type, s.body, s.result) == (str(row.id), *expected(row))
    assert await page.query_selector("#newer") is None
    live.assert_clean()
    other.assert_clean()


# --- Hostile content -------------------------------------------------------------------------

# Each would run script if it reached the DOM as markup; all must show as text.
HOSTILE = (
    "<script>alert(1)</script> <img src=x onerror=alert(2)> [x](javascript:alert(3)) "
    '<a href="javascript:alert(4)">y</a> <javascript:alert(5)> <svg onload=alert(6)>'
)


def hostile_turn() -> list:
    """The model says it, thinks it, and calls tools whose path and output carry it; the
    pieces cut tags in half so each delta is harmless only if escaped on its own."""
    pieces = [HOSTILE[i : i + 7] for i in range(0, len(HOSTILE), 7)]
    return [
        anthropic_reply(
            [
                ("thinking", pieces),
                ("text", pieces),
                ("tool_use", ("toolu_x1", "list_files", {"path": "."})),
                ("tool_use", ("toolu_x2", "list_files", {"path": "<img src=x onerror=alert(7)>"})),
            ],
            stop_reason="tool_use",
            pause=0.06,
        ),
        anthropic_reply([("text", [*pieces, "\n\n", HOSTILE])], stop_reason="end_turn"),
    ]


async def inert(live) -> None:
    assert await log_dom_hazards(live.page) == []
    assert live.dialogs == []


async def test_hostile_user_and_model_content_renders_inert(browser, serve, fake_server):
    """Script tags, onerror images, javascript: links and SVG handlers in a user message,
    in streamed model thinking and text, in tool arguments and in tool output show as
    text: no dialog opens, and no script element, event-handler attribute, javascript:
    URL or image is in the page, while streaming, after sealing, or after a reload."""
    fake_server.add(*hostile_turn())
    server = await serve(**anthropic_env(fake_server))
    user, tab, session = await owner_and_tab("anthropic/claude-sonnet-4-5")
    hostile = serve.workspace_of(user) / "<img src=x onerror=alert(8)>.txt"
    hostile.write_text("<script>alert(9)</script>")
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    page = live.page
    await synced(page)

    await send_message(page, HOSTILE)
    # Half the text streamed (as markup, were it not escaped, it would hold an <img>), or on
    # a slow machine the whole of it.
    await page.wait_for_function(
        "[...document.querySelectorAll('#log .t-text.open :is(.body, .live-md)')]"
        f".some((b) => b.innerHTML.length > {len(HOSTILE) // 2})"
        " || !!document.querySelector('#log .t-text.a:not(.open)')"
    )
    await inert(live)
    await page.wait_for_selector("#status[data-state=idle]")
    await turn_ended(tab.id)
    await inert(live)

    log_rows = await sync_to_async(rows)(tab.id)
    assert kinds(log_rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/text",
        "assistant/tool_call",
        "assistant/tool_call",
        "tool/tool_result",
        "tool/tool_result",
        "assistant/text",
    ]
    assert "<img src=x onerror=alert(8)>.txt" in log_rows[5].data["result"]
    assert "<img src=x onerror=alert(7)>: no such directory" in log_rows[6].data["result"]
    check_against_log(await read_log(page), log_rows, complete=True)
    # Inert, not dropped: the reader sees the characters.
    for row in (log_rows[0], log_rows[2]):
        assert HOSTILE in await page.text_content(f"#chunk-{row.id}")
    assert await page.text_content("#tab-title") == HOSTILE[:60].rsplit(" ", 1)[0] + "…"

    await page.reload()
    await synced(page)
    await inert(live)
    check_against_log(await read_log(page), log_rows, complete=True)
    await page.click(f"#chunk-{log_rows[1].id} summary")
    assert HOSTILE in await page.text_content(f"#chunk-{log_rows[1].id}")
    live.assert_clean()


# --- Phones and dark mode -------------------------------------------------------------------

PHONE = {"width": 375, "height": 740}
# Relative luminance (0 black .. 1 white) below which a background reads as dark.
DARK_LUMINANCE = 0.1

BACKGROUND = """
(sel) => {
  const [r, g, b] = getComputedStyle(document.querySelector(sel)).backgroundColor
    .match(/\\d+(\\.\\d+)?/g).slice(0, 3).map((v) => Number(v) / 255)
    .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
"""


async def test_it_fits_a_phone_and_follows_the_dark_color_scheme(browser, serve):
    """A tab with every kind of chunk fits a 375 px phone screen (nothing wider than the
    screen, the tab list tucked away behind its button, the composer on screen) and
    switches to its dark palette when the system asks for dark."""
    server = await serve()
    user, tab, session = await owner_and_tab()
    await sync_to_async(seed_every_type)(tab.id)

    phone = await open_page(browser, server, f"/t/{tab.id}/", session=session, mobile=True, **PHONE)
    page = phone.page
    await synced(page)
    assert await page.evaluate("document.scrollingElement.scrollWidth") <= PHONE["width"]
    assert not await page.is_visible(".sidebar .new-tab") or (
        await page.evaluate("document.querySelector('.sidebar').getBoundingClientRect().right") <= 0
    )
    assert await page.is_visible("#composer-text") and await page.is_visible(".nav-open")
    await screenshot(page, "mobile")
    await page.click(".nav-open")
    await page.wait_for_function(
        "document.querySelector('.sidebar').getBoundingClientRect().left >= 0"
    )
    await screenshot(page, "mobile-tabs")
    await page.click(".nav-close")
    await page.wait_for_function(
        "document.querySelector('.sidebar').getBoundingClientRect().right <= 0"
    )
    await page.emulate_media(color_scheme="dark")
    await page.wait_for_function(f"({BACKGROUND})('body') < {DARK_LUMINANCE}")
    await screenshot(page, "dark-mobile")
    phone.assert_clean()

    desktop = await open_page(browser, server, f"/t/{tab.id}/", session=session)
    page = desktop.page
    await synced(page)
    light = await page.evaluate(BACKGROUND, "body")
    await page.emulate_media(color_scheme="dark")
    await page.wait_for_function(f"({BACKGROUND})('body') < {DARK_LUMINANCE}")
    assert light > DARK_LUMINANCE
    await screenshot(page, "dark")
    desktop.assert_clean()


# --- Content-Security-Policy -------------------------------------------------------------

# Runs before each page's own scripts: every CSP violation the page reports.
CSP_RECORDER = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__csp.push(e.violatedDirective + ' ' + (e.blockedURI || 'inline') + ' ' + e.sourceFile
    + ':' + e.lineNumber);
});
"""
# Polled from Python with page.evaluate (wait_for_function would need eval, which the
# policy refuses); checked this often.
POLL_SECONDS = 0.05


async def _until(page, expression: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await page.evaluate(expression):
            await asyncio.sleep(POLL_SECONDS)


async def test_no_page_breaks_its_content_security_policy(browser, serve):
    """Chat (the socket, a live turn, every chunk type, a table), settings, admin and login
    run under the policy with nothing refused: no violation event, no console complaint."""
    user, tab, session = await owner_and_tab()
    await sync_to_async(seed_every_type)(tab.id)
    chunk = await sync_to_async(lambda: Chunk.objects.filter(tab=tab).first())()
    await sync_to_async(type(user).objects.filter(pk=user.pk).update)(is_superuser=True)
    server = await serve()
    live = await open_page(browser, server, "/login/", bypass_csp=False)
    page = live.page
    await live.context.add_init_script(CSP_RECORDER)
    console: list[str] = []
    page.on("console", lambda m: console.append(m.text))

    found: dict[str, list[str]] = {}
    await page.goto(server.url + "/login/")
    found["/login/"] = await page.evaluate("window.__csp")
    await live.context.add_cookies([{"name": "sessionid", "value": session, "url": server.url}])
    await page.goto(f"{server.url}/t/{tab.id}/")
    await _until(page, "window.__e2e.synced")
    before = await page.evaluate("document.querySelectorAll('#log .chunk').length")
    await send_message(page, "| a | b |\n|:-:|--:|\n| 1 | 2 |")
    await _until(
        page,
        f"document.querySelectorAll('#log .chunk').length >= {before + 2} && "
        "document.getElementById('status').dataset.state === 'idle'",
    )
    assert await page.evaluate("getComputedStyle(document.querySelector('td')).textAlign") in (
        "center",
        "-webkit-center",
    )
    found["tab"] = await page.evaluate("window.__csp")
    complaints = list(console)
    # The policy is in force: markup that slipped through could not run a script.
    injected = """() => {
      const s = document.createElement('script');
      s.textContent = 'window.__ran = true';
      document.body.appendChild(s);
      return window.__ran === true;
    }"""
    assert await page.evaluate(injected) is False
    assert [v.split()[0] for v in await page.evaluate("window.__csp")] == ["script-src-elem"]
    console[:] = complaints
    for path in ("/settings/", "/admin/", f"/admin/chat/chunk/{chunk.pk}/change/"):
        await page.goto(server.url + path)
        found[path] = await page.evaluate("window.__csp")
    assert all(v == [] for v in found.values()), found
    refused = [m for m in console if "Content Security Policy" in m or "Refused" in m]
    assert refused == []
    live.assert_clean()
