"""The socket's fragments: plain HTML whose top-level elements carry `hx-swap-oob` (see
ARCHITECTURE.md, "The page's JavaScript"), each rendered from a partial of
chat/tab.html, or built with format_html on the streaming hot path.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.template.loader import render_to_string
from django.utils.html import format_html

from chat.render.cards import ToolResult
from chat.render.item import Item
from chat.render.live import LiveText, is_live, live_body, live_tail
from chat.render.markup import stream_text
from chat.render.messages import Plan
from chat.render.page import group
from chat.render.presenters import present
from chat.render.status import status_context
from chat.stream import Block

TEMPLATE = "chat/tab.html"


def render_partial(partial: str, context: dict[str, Any]) -> str:
    return render_to_string(f"{TEMPLATE}#{partial}", context)


def _target(item: Item) -> tuple[str, str]:
    """Where an inserted item goes, and where it goes if that is not on the page."""
    if isinstance(item, ToolResult):
        return f'[data-slot="{item.slot}"]', "#log"
    if isinstance(item, Plan):
        # Into the slot of the turn's first plan on the page, if there is one.
        return f'.plan-slot[data-plan="{item.turn_attr}"]', "#log"
    return "#log", ""


def insert(items: list[Item]) -> str:
    target, fallback = _target(items[0])
    return render_partial("insert", {"items": items, "target": target, "fallback": fallback})


def fragment_open(block: Block, *, turn_start: bool = False, live: LiveText | None = None) -> str:
    """Insert an open chunk (seq None; body empty or the block's text so far).

    Also the snapshot of the open block on (re)connect: if the page already has
    that chunk, the page's JS replaces it in place. `turn_start`: the chunk before
    it on the page is another turn's (the sender knows; see follow.HtmlRenderer).
    A text block's body is live Markdown: `live` is fed the text so far (the sender
    keeps it to feed the deltas to, `fragment_live`).
    """
    item = present(block, open=True)
    item.turn_start = turn_start
    if is_live(block):
        live = live or LiveText(block.id)
        item.live = live_body(block.id, live.feed(block.text))
    return insert([item])


def fragment_delta(chunk_id: uuid.UUID, text: str) -> str:
    """Append escaped text to the open chunk's body.

    The one fragment on the streaming hot path (every coalesced delta, for every
    socket): format_html escapes like the template does, at a fiftieth of the
    cost of a template render.
    """
    return format_html(
        '<div hx-swap-oob="beforeend:#body-{}">{}</div>', chunk_id, stream_text(text)
    )


def fragment_live(live: LiveText, text: str) -> str:
    """A delta of an open text chunk: stable blocks appended, the tail replaced, or the
    text appended at the tail's end ("" when the delta changes nothing shown yet).

    As the plain delta, on the streaming hot path: format_html, no template. Not
    idempotent either: the follower sends each offset once and, on a reconnect, the
    whole open chunk again (`chat.follow.HtmlRenderer.resumes`).
    """
    update = live.feed(text)
    parts = []
    if update.stable:
        parts.append(
            format_html('<div hx-swap-oob="beforeend:#body-{}-s">{}</div>', live.id, update.stable)
        )
    if update.tail is not None:
        parts.append(live_tail(live.id, update.tail, oob=True))
    elif update.raw:
        parts.append(
            format_html('<div hx-swap-oob="beforeend:#body-{}-r">{}</div>', live.id, update.raw)
        )
    return "".join(parts)


def fragment_seal(block: Block, *, turn_start: bool = False) -> str:
    """The chunk's final rendering: replaces the open element by id, else is inserted."""
    item = present(block)
    item.turn_start = turn_start
    return insert([item])


def fragment_chunks(chunks: Iterable[Any]) -> str:
    """A batch of sealed chunks (catch-up): results nest in cards of the same batch.

    The first joins what the page shows before it, as every live chunk does.
    """
    frames: list[str] = []
    run: list[Item] = []
    for item in group(chunks, continues=True):
        if item.orphan or isinstance(item, Plan):
            if run:
                frames.append(insert(run))
                run = []
            frames.append(insert([item]))
        else:
            run.append(item)
    if run:
        frames.append(insert(run))
    return "".join(frames)


def catch_up_frames(chunks: Iterable[Any], max_chars: int, *, continues: bool = True) -> list[str]:
    """Sealed chunks the page lacks, as insert frames of at most `max_chars` each.

    Results nest in cards of the same batch. Each top-level item is its own
    insert, so frames split anywhere between items; a frame holds at least one,
    so only a single item larger than `max_chars` makes a larger frame. The first
    joins what the page shows before it when `continues` (the page's last chunk is
    of the same turn).
    """
    frames: list[str] = []
    parts: list[str] = []
    size = 0
    for item in group(chunks, continues=continues):
        html = insert([item])
        if parts and size + len(html) > max_chars:
            frames.append("".join(parts))
            parts, size = [], 0
        parts.append(html)
        size += len(html)
    if parts:
        frames.append("".join(parts))
    return frames


def fragment_log(
    chunks: Sequence[Any],
    *,
    tab_id: uuid.UUID,
    has_more: bool,
    continues: bool,
    dom_window: int,
    expand_thinking: bool,
) -> str:
    """Replace the page's whole log with these chunks, as a page render has them."""
    return render_partial(
        "log",
        {
            "items": group(chunks, continues=continues),
            "page": True,
            "oob": True,
            "tab_id": tab_id,
            "has_more": has_more,
            "before": chunks[0].seq if chunks else 0,
            "dom_window": dom_window,
            "expand_thinking": expand_thinking,
        },
    )


def fragment_status(status: dict[str, Any]) -> str:
    """Status line, composer buttons and approval bar; the queued list when the status has one.

    A pending approval also fills the buttons of its call's card.
    """
    return render_partial("status_frame", {"s": status_context(status, oob=True)})


def fragment_queued(id: int, text: str, *, compact: bool = False) -> str:
    """A message waiting for the running turn to take it, or a compaction (`compact`)
    waiting for the turn's end."""
    return render_partial("queued_insert", {"q": {"id": id, "text": text, "compact": compact}})


def fragment_taken(ids: Iterable[int]) -> str:
    """Remove queued messages the turn has moved into the log."""
    return render_partial("taken", {"ids": list(ids)})
