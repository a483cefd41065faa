"""Helpers of the end-to-end browser tests (tests/test_e2e.py), over the harness's live
server (`serve`) and Chromium (`browser`), which are fixtures in tests/conftest.py.

- Pages that record what their socket did (frames, the catch-up after each
  connect, how open chunks grew), and a reader for the chunk log as the DOM
  shows it, compared chunk by chunk with the rows in the database.
- Users, tabs and settings on the pytest database, and waits on it.
- Scripted Anthropic streams for the fake provider server (harness/fakeprovider.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model

from chat import log, render
from chat.models import Chunk, QueuedMessage, RunningTurn, Setting, Tab
from chat.stream import Block
from harness.fakeprovider import Pause, Reply
from harness.login import browser_cookie
from harness.servers import ROOT, Proc
from tests.ui_helpers import parse

ARTIFACTS = ROOT / "test-artifacts"
# Screenshots are for people looking at the pages (in test-artifacts/): they assert
# nothing and cost a browser test a second or more each, so the suite takes them only
# when asked: `DISPATCH_TEST_SHOTS=1 make test`.
SHOTS = os.environ.get("DISPATCH_TEST_SHOTS", "") not in ("", "0")

# Every wait in a browser or on the database: generous for a loaded CI machine (the
# suite on two cores with four workers, Chromium and agents beside it: a fresh server's
# first turn was seen to take over 15 s), and a passing test never comes near it.
WAIT_SECONDS = 30.0
# How often a Python-side wait looks again.
POLL_SECONDS = 0.05
PASSWORD = "pw-for-tests-only"


# --- The browser -----------------------------------------------------------------


# Runs in every page before its own scripts: counts socket frames, notes when
# the catch-up after a connect is complete (it ends with the status frame),
# and samples the length of every open chunk's body after each frame.
RECORDER = """
(() => {
  const d = window.__e2e = {frames: 0, connects: 0, synced: false, grew: {}};
  document.addEventListener('htmx:wsOpen', () => { d.connects += 1; d.synced = false; });
  document.addEventListener('htmx:wsAfterMessage', (e) => {
    d.frames += 1;
    const m = e.detail && e.detail.message;
    if (typeof m === 'string' && m.includes('id="status"')) d.synced = true;
    document.querySelectorAll('#log .chunk.open').forEach((el) => {
      const body = document.getElementById('body-' + el.id.slice(6));
      (d.grew[el.id.slice(6)] = d.grew[el.id.slice(6)] || []).push(
        body ? [...body.textContent].length : -1);
    });
  });
})();
"""


@dataclass
class LivePage:
    """A page and what went wrong in it: script errors and dialogs (which must never open)."""

    page: Any
    context: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.dialogs == [], f"a dialog opened: {self.dialogs}"
        assert self.errors == [], f"script errors: {self.errors}"


async def open_page(
    browser: Any,
    server: Proc,
    path: str = "/",
    *,
    session: str | None = None,
    width: int = 1100,
    height: int = 800,
    mobile: bool = False,
    bypass_csp: bool = True,
) -> LivePage:
    """`bypass_csp`: Playwright's `wait_for_function` evaluates its predicate with eval,
    which the pages' Content-Security-Policy refuses; the test of that policy says False."""
    context = await browser.new_context(
        viewport={"width": width, "height": height},
        is_mobile=mobile,
        has_touch=mobile,
        device_scale_factor=1,
        bypass_csp=bypass_csp,
    )
    if session:
        await context.add_cookies([browser_cookie(session, server.url)])
    await context.add_init_script(RECORDER)
    page = await context.new_page()
    page.set_default_timeout(WAIT_SECONDS * 1000)
    live = LivePage(page, context)
    page.on("pageerror", lambda exc: live.errors.append(str(exc)))

    def on_dialog(dialog: Any) -> None:
        live.dialogs.append(f"{dialog.type}: {dialog.message}")
        asyncio.ensure_future(dialog.dismiss())

    page.on("dialog", on_dialog)
    await page.goto(server.url + path)
    return live


async def synced(page: Any) -> None:
    """Wait until the socket has connected and its catch-up is on the page."""
    await page.wait_for_function("window.__e2e && window.__e2e.synced")


async def screenshot(page: Any, name: str, *, folder: Path = ARTIFACTS, **options: Any) -> None:
    """`page` as it is now, when screenshots are asked for (SHOTS)."""
    if SHOTS:
        folder.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(folder / f"{name}.png"), animations="disabled", **options)


async def shots(page: Any, phone: Any, name: str) -> None:
    """The state at 1280 px (`page`) and 375 px (`phone`, a touch phone), light and dark."""
    if not SHOTS:
        return
    for target, width in ((page, 1280), (phone, 375)):
        for scheme in ("light", "dark"):
            await target.emulate_media(color_scheme=scheme)
            await screenshot(target, f"{name}-{width}-{scheme}")
        await target.emulate_media(color_scheme="light")


async def shots_resized(page: Any, name: str, *, height: int = 800) -> None:
    """One page at 1280 and 375 px (its sidebar still), light and dark, then back."""
    if not SHOTS:
        return
    size = page.viewport_size
    for width in (1280, 375):
        await page.set_viewport_size({"width": width, "height": height})
        # The sidebar slides away when the page narrows: shot once it is still.
        await page.wait_for_function(
            "(document.querySelector('.sidebar')?.getAnimations().length ?? 0) === 0"
        )
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            await screenshot(page, f"{name}-{width}-{scheme}")
    await page.set_viewport_size(size)
    await page.emulate_media(color_scheme="light")


async def send_message(page: Any, text: str) -> None:
    """Type into the composer and press Enter; the server must accept it."""
    await page.fill("#composer-text", text)
    async with page.expect_response(lambda r: r.url.endswith("/send/")) as response:
        await page.press("#composer-text", "Enter")
    assert (await response.value).status == 200


# --- Users, tabs, settings (sync: wrap with sync_to_async in async tests) --------------


def make_user(username: str = "owner") -> Any:
    return get_user_model().objects.create_user(username, password=PASSWORD, is_staff=True)


def make_tab(user: Any, model: str = "offline/demo", title: str = "") -> Tab:
    return Tab.objects.create(owner=user, model=model, title=title)


def set_setting(key: str, value: Any) -> None:
    Setting.objects.update_or_create(key=key, defaults={"value": value})


def rows(tab_id: uuid.UUID) -> list[Chunk]:
    return log.tail(tab_id)


def running(tab_id: uuid.UUID) -> bool:
    return RunningTurn.objects.filter(tab_id=tab_id).exists()


async def until(
    predicate: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT_SECONDS
) -> Any:
    """Poll an async condition (usually the database) until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(POLL_SECONDS)


async def turn_ended(tab_id: uuid.UUID) -> None:
    """No turn runs on the tab any more (its lease is released), and no message waits for
    one: a message just sent (or a wake's, just fired) is queued before a worker takes it."""

    def idle_sync() -> bool:
        return not running(tab_id) and not QueuedMessage.objects.filter(tab_id=tab_id).exists()

    async def idle() -> bool:
        return await sync_to_async(idle_sync)()

    await until(idle, "the turn to end")


# --- The log as the page shows it ----------------------------------------------------

# Each chunk element of #log in document order (a card's results follow it):
# what its body says, read the way a reader sees it.
READ_LOG = """
() => Array.from(document.querySelectorAll('#log .chunk')).map((el) => {
  const id = el.id.slice('chunk-'.length);
  const type = (Array.from(el.classList).find((c) => c.startsWith('t-')) || 't-').slice(2);
  const open = el.classList.contains('open');
  const text = (sel) => { const n = el.querySelector(sel); return n ? n.textContent : ''; };
  let body = '';
  let result = null;
  // Live Markdown (an open text chunk) is read up to its tail, which is rendered again.
  const live = open && !!document.getElementById('body-' + id + '-s');
  if (open) {
    const b = document.getElementById('body-' + id + (live ? '-s' : ''));
    body = b ? b.textContent : null;
  } else if (type === 'text' || type === 'thinking') {
    body = text(':scope > .md');
  } else if (type === 'tool-call') {
    body = text(':scope > .card > .card-head > .tool-name');
  } else if (type === 'tool-result') {
    body = text(':scope > .term');
    const r = el.querySelector('.result');
    result = r ? r.textContent : null;
  } else if (type === 'system') {
    body = text(':scope > .sys-text');
  } else if (type === 'error') {
    body = text('.err-msg');
  }
  const seq = el.getAttribute('data-seq');
  return {id, type, open, body, result, seq: seq ? parseInt(seq, 10) : null,
          top: el.parentElement.id === 'log', live};
})
"""


@dataclass(frozen=True)
class Shown:
    """One chunk element as the page shows it."""

    id: str
    type: str
    open: bool
    body: str | None
    result: str | None
    seq: int | None
    top: bool
    # An open text chunk's live Markdown: `body` is the text of its stable part.
    live: bool = False


async def read_log(page: Any) -> list[Shown]:
    return [Shown(**item) for item in await page.evaluate(READ_LOG)]


def expected(chunk: Chunk | Block) -> tuple[str, str, str | None]:
    """(type, body, result) of a sealed chunk, as its rendering reads."""
    data = chunk.data or {}
    kind = chunk.type.replace("_", "-")
    result = None
    if chunk.type in ("text", "thinking"):
        body = parse(str(render.markdown(data.get("text") or ""))).text
    elif chunk.type == "tool_call":
        body = data.get("name") or ""
    elif chunk.type == "tool_result":
        body = data.get("shell_output") or ""
        if "result" in data:
            # An error without output is labelled in the result itself.
            label = "Error " if data.get("is_error") and not body else ""
            result = label + str(data.get("result") or "")
    elif chunk.type == "system":
        body = data.get("text") or ""
    elif chunk.type == "error":
        body = data.get("message") or ""
    else:
        body = ""
    return kind, body, result


def raw_text(chunk: Chunk) -> str:
    """The text an open chunk's body streams: text, thinking, or a call's live output."""
    data = chunk.data or {}
    return (data.get("shell_output") if chunk.type == "tool_result" else data.get("text")) or ""


def check_against_log(
    shown: list[Shown], log_rows: list[Chunk], *, complete: bool, at_least: int = 0
) -> Shown | None:
    """Assert that the sealed chunks on the page are the log's first chunks, exactly.

    No duplicate element, no gap in seqs, same ids, same text in every body.
    `complete`: the page shows the whole log and nothing is open. `at_least`:
    chunks sealed before the page loaded, which must all be there. Returns the
    open chunk, if any (at most one).
    """
    ids = [s.id for s in shown]
    assert len(ids) == len(set(ids)), f"a chunk is on the page twice: {ids}"
    sealed = sorted((s for s in shown if not s.open), key=lambda s: s.seq or 0)
    opened = [s for s in shown if s.open]
    assert len(opened) <= 1, f"more than one open chunk: {opened}"
    seqs = [s.seq for s in sealed]
    assert seqs == list(range(1, len(sealed) + 1)), f"sealed seqs with a gap: {seqs}"
    assert len(sealed) <= len(log_rows), "the page shows chunks the log does not have"
    assert len(sealed) >= at_least, (
        f"the page shows {len(sealed)} sealed chunks; {at_least} were sealed before it loaded"
    )
    for s, row in zip(sealed, log_rows, strict=False):
        assert s.id == str(row.id), f"seq {row.seq}: page has {s.id}, log has {row.id}"
        page_shows, log_says = (s.type, s.body, s.result), expected(row)
        assert page_shows == log_says, f"seq {row.seq}: page {page_shows!r}, log {log_says!r}"
    for s in opened:
        assert s.id not in {str(r.id) for r in log_rows[: len(sealed)]}, "open and sealed"
    if complete:
        assert opened == [], f"a chunk is still open: {opened}"
        assert len(sealed) == len(log_rows), (
            f"the page shows {len(sealed)} of the log's {len(log_rows)} chunks"
        )
    return opened[0] if opened else None


def check_open_prefix(open_chunk: Shown, log_rows: list[Chunk]) -> None:
    """An open chunk the page showed is the start of the chunk it sealed into."""
    row = next((r for r in log_rows if str(r.id) == open_chunk.id), None)
    assert row is not None, f"open chunk {open_chunk.id} never sealed into the log"
    final = raw_text(row)
    if open_chunk.live:
        # Its stable part is rendered as the sealed text is: the start of that.
        final = expected(row)[1]
    assert open_chunk.body is not None and final.startswith(open_chunk.body), (
        f"open chunk {open_chunk.id} showed {open_chunk.body!r}, which does not start "
        f"{final!r}: text lost or repeated"
    )


async def log_dom_hazards(page: Any) -> list[str]:
    """Anything in the page's body that could run script: must be empty."""
    return await page.evaluate(
        """
() => {
  const found = [];
  document.body.querySelectorAll('script').forEach((el) => found.push('script: ' + el.outerHTML));
  document.body.querySelectorAll('*').forEach((el) => {
    for (const a of el.attributes) {
      const value = a.value.replace(/[\\s\\u0000-\\u001f]/g, '').toLowerCase();
      if (a.name.toLowerCase().startsWith('on')) found.push(el.tagName + ' ' + a.name);
      if (['href', 'src', 'action', 'formaction', 'xlink:href'].includes(a.name.toLowerCase())
          && value.startsWith('javascript:')) found.push(el.tagName + ' ' + a.name + '=' + a.value);
    }
  });
  document.body.querySelectorAll('iframe, object, embed, img').forEach(
    (el) => found.push('element: ' + el.outerHTML));
  return found;
}
"""
    )


# --- Scripted Anthropic streams -------------------------------------------------------


def _sse_message_start(message_id: str) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 1},
        },
    }


def anthropic_reply(
    blocks: list[tuple[str, Any]], *, stop_reason: str, pause: float = 0.0
) -> Reply:
    """One streamed Anthropic message: ("thinking", [pieces]), ("text", [pieces]) or
    ("tool_use", (call_id, name, arguments)) blocks, with `pause` seconds before
    each piece of thinking or text."""
    events: list[Any] = [_sse_message_start(f"msg_{uuid.uuid4().hex[:12]}")]
    for index, (kind, content) in enumerate(blocks):
        if kind == "thinking":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                }
            )
            for piece in content:
                if pause:
                    events.append(Pause(pause))
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": piece},
                    }
                )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": f"sig-{index}"},
                }
            )
        elif kind == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            for piece in content:
                if pause:
                    events.append(Pause(pause))
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": piece},
                    }
                )
        elif kind == "tool_use":
            call_id, name, arguments = content
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
                }
            )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments)},
                }
            )
        else:
            raise ValueError(f"unknown block kind {kind!r}")
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"type": "message_delta", "stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"input_tokens": 100, "output_tokens": 50},
        }
    )
    events.append({"type": "message_stop"})
    return Reply(events=events)


def anthropic_env(fake: Any) -> dict[str, str]:
    """Server environment that sends Anthropic requests to the fake server."""
    return {
        "ANTHROPIC_API_KEY": "x",
        "ANTHROPIC_BASE_URL": fake.url,
        "DISPATCH_MODEL": "anthropic/claude-sonnet-4-5",
    }
