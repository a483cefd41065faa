"""Chunks to HTML: markdown and sanitising, the page's view of the log, and the live fragments.

Everything here renders the partials of `chat/tab.html`, so a chunk looks the
same whether it came with the page, with an older page, or over the socket.
Nothing here touches the database: the socket consumer calls these functions
from async code.

The log in the page is flat: `#log` holds one element per chunk, in seq order,
and only a tool call's results nest (in its card's result slot). Assistant
chunks of a turn look like one bubble through CSS adjacency, not through a
wrapper, so every live update is one insert or one replace by id.

Live frames (ARCHITECTURE.md, "The page's JavaScript") are plain HTML whose
top-level elements carry `hx-swap-oob`; the htmx ws extension swaps each one.
Inserts use `beforeend:<target>` on a wrapper (the wrapper itself is dropped);
the page's JS (static/chat/app.js) turns an insert of an id already on the page
into a replace in place, so a frame sent twice is harmless.

A fragment carries everything the page shows about its chunk, so the page never
fixes up elements around an insert: whether a chunk starts a bubble is its
`turn-start` class (see `Item.turn_start`); the partial first bubble, the empty
tab's hint, a card's approval buttons once nothing waits for approval, and the
current tab's dot in the sidebar follow from the elements the server sent, in
CSS (static/chat/app.css).

The modules, in reading order: markup (Markdown to safe HTML), live (an open text
block's Markdown as it streams), item (what every chunk element has), messages and
cards (one presenter per kind), presenters (which kind gets which), page (grouping
and what a page render marks), usage and status (the status line's contexts),
fragments (what the socket sends). This module names what the rest of chat uses.
"""

from __future__ import annotations

from chat.render.cards import (
    OUTPUT_BOX_CHARS,
    OUTPUT_BOX_LINES,
    ToolCall,
    ToolResult,
    approve_key,
    slot_key,
)
from chat.render.figures import counts, line_count, output_text, size, tokens
from chat.render.fragments import (
    catch_up_frames,
    fragment_chunks,
    fragment_delta,
    fragment_live,
    fragment_log,
    fragment_open,
    fragment_queued,
    fragment_seal,
    fragment_status,
    fragment_taken,
)
from chat.render.item import THUMB_EDGE_PX, Attachment, Fork, Item
from chat.render.live import (
    LINE_HEAD_CHARS,
    TAIL_RENDER_FACTOR,
    TAIL_RENDER_MAX_CHARS,
    LiveText,
    is_live,
    live_body,
)
from chat.render.markup import CODE_COPY, code_spans, markdown, stream_text
from chat.render.messages import (
    ENDING_KINDS,
    SYSTEM_LABELS,
    Compaction,
    Error,
    Notice,
    Text,
    Thinking,
    UserText,
)
from chat.render.page import group, mark_hit, mark_page, page_items
from chat.render.presenters import present
from chat.render.status import context_meter, status_context
from chat.render.usage import mark_usage, usage_line, usage_target
from chat.usage import Totals

__all__ = [
    "CODE_COPY",
    "ENDING_KINDS",
    "LINE_HEAD_CHARS",
    "OUTPUT_BOX_CHARS",
    "OUTPUT_BOX_LINES",
    "SYSTEM_LABELS",
    "TAIL_RENDER_FACTOR",
    "TAIL_RENDER_MAX_CHARS",
    "THUMB_EDGE_PX",
    "Attachment",
    "Compaction",
    "Error",
    "Fork",
    "Item",
    "LiveText",
    "Notice",
    "Text",
    "Thinking",
    "ToolCall",
    "ToolResult",
    "Totals",
    "UserText",
    "approve_key",
    "catch_up_frames",
    "code_spans",
    "context_meter",
    "counts",
    "fragment_chunks",
    "fragment_delta",
    "fragment_live",
    "fragment_log",
    "fragment_open",
    "fragment_queued",
    "fragment_seal",
    "fragment_status",
    "fragment_taken",
    "group",
    "is_live",
    "line_count",
    "live_body",
    "mark_hit",
    "mark_page",
    "mark_usage",
    "markdown",
    "output_text",
    "page_items",
    "present",
    "size",
    "slot_key",
    "status_context",
    "stream_text",
    "tokens",
    "usage_line",
    "usage_target",
]
