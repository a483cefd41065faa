"""Chunks to HTML: markdown and sanitising, the page's view of the log, and the live fragments.

Everything here renders the partials of `chat/tab.html`, so a chunk looks the
same whether it came with the page, with an older page, or over the socket.
Nothing here touches the database: the socket consumer calls these functions
from async code.

The log in the page is flat: `#log` holds one element per chunk, in seq order,
and only a tool call's results nest (in its card's result slot). Assistant
chunks of a turn look like one bubble through CSS adjacency, not through a
wrapper, so every live update is one insert or one replace by id.

Live frames (DESIGN §5) are plain HTML whose top-level elements carry
`hx-swap-oob`; the htmx ws extension swaps each one. Inserts use
`beforeend:<target>` on a wrapper (the wrapper itself is dropped); the page's
JS (static/chat/app.js) turns an insert of an id already on the page into a
replace in place, so a frame sent twice is harmless.

A fragment carries everything the page shows about its chunk, so the page never
fixes up elements around an insert: whether a chunk starts a bubble is its
`turn-start` class (see `Item.turn_start`); the partial first bubble, the empty
tab's hint, a card's approval buttons once nothing waits for approval, and the
current tab's dot in the sidebar follow from the elements the server sent, in
CSS (static/chat/app.css).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

import nh3
from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince
from markdown_it import MarkdownIt
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

from chat import context, rules, schedule
from chat.stream import Block, Kind, Role
from chat.tools import sandbox, shell
from chat.usage import Totals, format_usd

TEMPLATE = "chat/tab.html"

# Highlighting is for reading code, not for megabyte dumps: past this size a
# code block is shown plain, so one huge paste cannot stall a page render.
MAX_HIGHLIGHT_CHARS = 50_000
# Tool arguments longer than this many lines start collapsed (a write_file call
# carries a whole file; the card should still fit on a screen).
ARGS_OPEN_LINES = 12
# The one-line summary of a call's arguments in its card header.
ARGS_SUMMARY_CHARS = 120
# An argument value longer than this is shown as a block, not inline.
ARGS_INLINE_CHARS = 80
# Argument names that hold a shell command (shown as a terminal line).
COMMAND_KEYS = ("command", "cmd")
# Argument names that say best what a call does, in order of preference.
SUMMARY_KEYS = ("command", "cmd", "path", "file", "query", "url", "pattern", "name")
# A tool's output box shows about this many lines before it scrolls (app.css: .term's
# max-height of 24rem at a line height of 0.8rem x 1.45): past it, or past as many
# lines' worth of characters (long lines wrap), the card offers full height and the
# plain-text view.
OUTPUT_BOX_LINES = 20
OUTPUT_BOX_CHARS = OUTPUT_BOX_LINES * 100
# Up to this size an output's size is given in bytes, exactly; past it in KiB or MiB.
EXACT_BYTES_BELOW = 100_000
# The long edge of an image attachment's thumbnail in a message, in CSS pixels: a
# screenshot is recognisable at this size, and two side by side fit a phone's bubble.
THUMB_EDGE_PX = 160
# What a blob's URL may carry: a chunk's data could come from an edited import.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# An image that can hold script: never shown, a download (templates/chat/_attachment.html
# makes the same exception).
SVG_TYPE = "image/svg+xml"

SYSTEM_LABELS = {
    "notice": "Notice",
    "model-changed": "Model changed",
    "config-reload": "Settings reloaded",
    "cancelled": "Cancelled",
    "interrupted": "Interrupted",
    "forked": "Branch",
    "step-limit": "Step limit",
    "rule": "Rule",
    context.ELIDE: "Context trimmed",
}
# The system notices that end a turn early: with an error chunk, what Continue
# applies to (chat.resume.ENDINGS, which this layer may not import; a test holds
# the two equal).
ENDING_KINDS = frozenset(
    {"interrupted", "cancelled", "output-limit", "context-limit", "step-limit"}
)
# What a branch in a tab's lists is called, by the action that made it (chat.turns.Action).
FORK_LABELS = {
    "branch": "Branch",
    "edit": "Edited message",
    "regenerate": "Answered again",
    "retry": "Retried after an error",
}
# How a compaction chunk says it was asked for (chat.turn.compaction writes one of these).
COMPACTION_TRIGGERS = ("auto", "manual")
STATE_LABELS = {
    "idle": "Idle",
    "running": "Running",
    "waiting": "Waiting for approval",
    "stopping": "Stopping",
    "compacting": "Compacting the conversation…",
}


# --- Markdown ---------------------------------------------------------------------

_formatter = HtmlFormatter(nowrap=True)


def _highlight(code: str, lang: str, _attrs: str) -> str:
    """Pygments spans for a fenced block; "" lets markdown-it escape it as plain code."""
    if not lang or len(code) > MAX_HIGHLIGHT_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ""
    return pygments_highlight(code, lexer, _formatter)


def _image_as_link(self, tokens, idx, options, env) -> str:
    # A remote image loads by itself: a model (or a page it read) could leak
    # the conversation through the image URL. A link needs a click.
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env) or "image"
    return f'<a href="{escape(token.attrGet("src") or "")}">{escape("Image: " + alt)}</a>'


# A strict Content-Security-Policy forbids style attributes: a table column's
# alignment (markdown-it writes style="text-align:right") becomes a class.
ALIGN_CLASSES = {
    "text-align:left": "align-left",
    "text-align:center": "align-center",
    "text-align:right": "align-right",
}


def _cell_align_class(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    style = token.attrs.pop("style", None)
    if style in ALIGN_CLASSES:
        token.attrSet("class", ALIGN_CLASSES[style])
    return self.renderToken(tokens, idx, options, env)


# Every code block gets a copy button (app.js copies its <pre>'s text). The
# button's label is CSS, so the text of a message in the page stays its markdown's.
CODE_COPY = (
    '<div class="code"><button type="button" class="copy-code" data-copy="code" '
    'aria-label="Copy code" title="Copy code"></button>'
)


def _fence_with_copy(self, tokens, idx, options, env) -> str:
    return CODE_COPY + self.fence(tokens, idx, options, env) + "</div>\n"


def _code_block_with_copy(self, tokens, idx, options, env) -> str:
    return CODE_COPY + self.code_block(tokens, idx, options, env) + "</div>\n"


def _markdown_it(highlight: Any) -> MarkdownIt:
    # html=False: raw HTML in a message is shown as text (a model writing "<br>" in
    # prose means the characters); nh3 below is the second line of defence.
    md = MarkdownIt("commonmark", {"html": False, "highlight": highlight}).enable(
        ["table", "strikethrough"]
    )
    md.add_render_rule("image", _image_as_link)
    md.add_render_rule("fence", _fence_with_copy)
    md.add_render_rule("code_block", _code_block_with_copy)
    md.add_render_rule("th_open", _cell_align_class)
    md.add_render_rule("td_open", _cell_align_class)
    return md


_md = _markdown_it(_highlight)
# The live tail's (LiveText): the same without highlighting. The tail is rendered again
# as it grows, and highlighting costs more than the rest; a code block is highlighted
# once, when it becomes stable or seals.
_md_tail = _markdown_it(None)

_cleaner = nh3.Cleaner(
    tags={
        "a",
        "p",
        "br",
        "hr",
        "em",
        "strong",
        "del",
        "s",
        "code",
        "pre",
        "blockquote",
        "ul",
        "ol",
        "li",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "span",
        # Only the code blocks' copy buttons (CODE_COPY): raw HTML in a message is text.
        "div",
        "button",
    },
    attributes={
        "a": {"href", "title"},
        "code": {"class"},
        "span": {"class"},
        "ol": {"start"},
        "button": {"type", "data-copy", "aria-label", "title"},
    },
    url_schemes={"http", "https", "mailto"},
    link_rel="noopener noreferrer",
    set_tag_attribute_values={"a": {"target": "_blank"}},
    allowed_classes={
        **{cell: set(ALIGN_CLASSES.values()) for cell in ("th", "td")},
        "div": {"code"},
        "button": {"copy-code"},
    },
)


# Sealed text never changes, and every page load and every watching socket
# renders the same recent chunks again: keep the last few thousand renderings.
MARKDOWN_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=MARKDOWN_CACHE_SIZE)
def markdown(text: str) -> SafeString:
    """Sanitised HTML for a message: CommonMark + tables, code highlighted."""
    return mark_safe(_cleaner.clean(_md.render(text)))


def stream_text(text: str) -> SafeString:
    """Escaped text whose length in the DOM is exactly `len(text)` code points.

    The page reports its open body's length on reconnect, so the HTML parser
    must not change it: a raw CR would be folded into LF and a NUL dropped,
    while character references survive parsing (NUL still becomes U+FFFD,
    which keeps the count).
    """
    return mark_safe(str(escape(text)).replace("\r", "&#13;").replace("\x00", "&#xFFFD;"))


def code_spans(text: str) -> SafeString:
    """Plain text, escaped, with each `span` in backticks as <code> (an error's hint
    names variables and URLs this way). Escaped first, so nothing else is markup."""
    return mark_safe(_CODE_SPAN.sub(r"<code>\1</code>", str(escape(text))))


_CODE_SPAN = re.compile(r"`([^`]+)`")


def slot_key(turn_id: Any, step: int, call_id: str) -> str:
    """The result slot of one call. Servers reuse call ids across steps and turns, so
    the key includes both; it is hashed to be a safe CSS value whatever the id holds."""
    raw = f"{turn_id}:{step}:{call_id}".encode()
    return "s" + hashlib.blake2s(raw, digest_size=8).hexdigest()


def approve_key(call_id: str) -> str:
    """Where a call's approval buttons go (the pending approval names the call only)."""
    return "a" + hashlib.blake2s(call_id.encode(), digest_size=8).hexdigest()


# --- Live Markdown: the open text block as it streams -------------------------------------
#
# An open text block is rendered as Markdown while it streams, with the sealed text's
# renderer and sanitiser, at a bounded cost. Its stable part (the top-level blocks of its
# complete lines that no later text can change) is rendered once, in segments appended as
# they become stable; only the tail after it is rendered again (without highlighting), and
# only when new text could render otherwise than as itself (markup, a line's start) and
# enough of it has come to pay for the rendering. Otherwise new text is appended as it
# came, escaped, at the end of the tail's last element; an open code fence in the tail is
# rendered once and its lines appended, and highlighted once it closes.
#
# Where the stable part ends depends on the text alone (its lines are taken one at a time,
# however the deltas cut them), so a socket that saw every delta and the open fragment of a
# snapshot hold the same stable HTML; and rendered in one piece the same text gives the same
# HTML, so the seal's replace moves nothing (tests/test_live_markdown.py). Two things change
# at the seal: the tail's code gets its colours, and a link reference defined below its use
# (rare in a model's answer) turns the earlier text into a link.

# The tail is rendered again (when new text may render otherwise, see _MARKUP) once the
# text that came since its last rendering is at least 1/TAIL_RENDER_FACTOR of it. A
# rendering costs about the tail's length, so each of its characters costs at most this
# many renderings however long the tail grows; a short tail (a few frames' worth of text)
# is rendered on every frame that brings markup.
TAIL_RENDER_FACTOR = 8
# Past this length a tail (one huge paragraph or list) is not rendered again until it
# becomes stable or seals: one rendering would hold the socket's event loop for tens of
# milliseconds. It shows as text meanwhile.
TAIL_RENDER_MAX_CHARS = 16_000
# A region of the open text found with nothing stable is parsed again once it has grown
# by this fraction (1/N) of itself: a bound on re-parsing a long loose list.
SETTLE_GROWTH = 8
# Text that can render otherwise than as itself: Markdown's inline markup and escapes, the
# end of a link or an entity, a table's pipe, a line end (or a tab). Text without any is
# appended unrendered, unless it is at the head of a line (its first LINE_HEAD_CHARS
# characters): where a list item, a heading, a quote or a fence is told from a paragraph.
_MARKUP = re.compile(r"[\\`*_\[\]()<>&;!~|#\n\t]")
LINE_HEAD_CHARS = 8
# A complete line that may end a block, or start one that ends the block before it:
# an ATX heading, a setext underline, a thematic break, a fence. markdown-it's block parser
# then decides. Blank lines and the lines right after them are checked too; any other
# line (a list item or a quote interrupting a paragraph) can only delay the stable part.
_MAYBE_BOUNDARY = re.compile(
    r" {0,3}(?:#{1,6}(?:[ \t]|$)|=+[ \t]*$|-+[ \t]*$|([-*_])(?:[ \t]*\1){2,}[ \t]*$|`{3}|~{3})"
)
# Top-level blocks that a blank line ends (a list or an indented code block goes on past one).
_ENDED_BY_BLANK = frozenset({"paragraph_open", "table_open", "blockquote_open"})
# Top-level blocks complete at their last line.
_ENDED_AT_ONCE = frozenset({"heading_open", "hr"})


def _blank(line: str) -> bool:
    # markdown-it's blank line: spaces and tabs only (not every Unicode space).
    return not line.strip(" \t")


def is_live(block: Any) -> bool:
    """Whether an open block streams as Markdown (thinking and tool output stay text)."""
    return block.type == Kind.TEXT


@dataclass(frozen=True)
class LiveUpdate:
    """What one delta changes in a live body: HTML appended to the stable part, and
    either the tail's new HTML or text appended at its end."""

    stable: SafeString
    tail: SafeString | None
    raw: str


class LiveText:
    """The live rendering of one open text block, fed its text delta by delta. One per
    socket (chat.follow.HtmlRenderer): it holds the block's text and where its stable
    part ends."""

    def __init__(self, chunk_id: uuid.UUID) -> None:
        self.id = chunk_id
        # The text so far as markdown-it normalises it (CR LF and CR as LF, NUL as U+FFFD).
        # A CR that ended the last delta waits for the next: it may be half of a CR LF.
        self.text = ""
        self.cr = False
        # Where the complete lines taken so far end, and where the stable part ends.
        self.lines_end = 0
        self.stable_end = 0
        # The length of text[stable_end:] when it was last found with nothing stable.
        self.unsettled = 0
        self.after_blank = False
        # The stable part's link reference definitions, for the blocks after them.
        self.env: dict[str, Any] = {}
        # The tail is an open code fence of this marker character ("" when it is not).
        self.fence = ""
        # len(text) when the tail was last rendered; None before the first rendering.
        self.rendered_at: int | None = None
        # The text since then holds markup (or a line's head): rendering it may change it.
        self.marked = False
        self._added: list[str] = []

    def feed(self, delta: str) -> LiveUpdate:
        delta = self._normalise(delta)
        start = len(self.text)
        self.text += delta
        if start - self.lines_end < LINE_HEAD_CHARS or _MARKUP.search(delta):
            self.marked = True
        stable_end, fence = self.stable_end, self.fence
        # Only the new text can hold a new line end.
        end = self.text.find("\n", start)
        while end != -1:
            self._line(self.lines_end, end + 1)
            self.lines_end = end + 1
            end = self.text.find("\n", end + 1)
        stable = mark_safe("".join(self._added))
        self._added.clear()
        tail_len = len(self.text) - self.stable_end
        if (
            self.rendered_at is None
            or self.stable_end != stable_end
            or self.fence != fence
            or (
                self.marked
                and not self.fence
                and tail_len <= TAIL_RENDER_MAX_CHARS
                and (len(self.text) - self.rendered_at) * TAIL_RENDER_FACTOR >= tail_len
            )
        ):
            self.rendered_at, self.marked = len(self.text), False
            return LiveUpdate(stable, self._tail(), "")
        return LiveUpdate(stable, None, delta)

    def _normalise(self, delta: str) -> str:
        if self.cr:
            delta, self.cr = "\r" + delta, False
        if delta.endswith("\r"):
            delta, self.cr = delta[:-1], True
        if "\r" in delta:
            delta = delta.replace("\r\n", "\n").replace("\r", "\n")
        return delta.replace("\x00", "\ufffd") if "\x00" in delta else delta

    def _line(self, start: int, end: int) -> None:
        """Take the complete line text[start:end] (its newline included)."""
        line = self.text[start : end - 1]
        blank = _blank(line)
        if self.fence:
            # Only a closing fence ends an open one (at the top level nothing else does).
            check = line.lstrip(" \t").startswith(self.fence)
        else:
            check = blank or self.after_blank or bool(_MAYBE_BOUNDARY.match(line))
        self.after_blank = blank
        if check:
            self._settle(end)

    def _settle(self, end: int) -> None:
        """Move the stable part's end up to the last block of text[stable_end:end] that
        nothing after `end` can change, and render what it passed.

        A region found with nothing stable (a long loose list never is, until it ends)
        is parsed again only once it has grown by 1/SETTLE_GROWTH: checking at every
        blank line would parse the whole list once per item. A fence is always checked
        (its close decides how later lines are read)."""
        region = self.text[self.stable_end : end]
        if not self.fence and len(region) < self.unsettled + self.unsettled // SETTLE_GROWTH:
            return
        tokens: list[Any] = []
        _md.block.parse(region, _md, {}, tokens)
        blocks = [t for t in tokens if t.level == 0 and t.nesting >= 0 and t.map]
        lines = region.split("\n")[:-1]
        self.fence = ""
        if not blocks:
            # Blank lines, or link reference definitions: done once a blank line follows.
            cut = len(lines) if _blank(lines[-1]) else 0
        else:
            last = blocks[-1]
            first, stop = last.map
            if last.type == "fence":
                ended = stop - first > 1 and _closes(lines[stop - 1], last.markup)
                if not ended:
                    self.fence = last.markup[0]
            else:
                ended = last.type in _ENDED_AT_ONCE or (
                    last.type in _ENDED_BY_BLANK and stop < len(lines) and _blank(lines[stop])
                )
            if not ended:
                cut = first
            elif all(_blank(line) for line in lines[stop:]):
                cut = len(lines)
            else:
                # A link reference definition follows, which a next line may still extend.
                cut = stop
        if cut:
            to = self.stable_end + sum(len(line) + 1 for line in lines[:cut])
            html = _md.render(self.text[self.stable_end : to], self.env)
            self._added.append(_cleaner.clean(html))
            self.stable_end = to
            self.unsettled = 0
        else:
            self.unsettled = len(region)

    def _tail(self) -> SafeString:
        """The tail's HTML, with the element new text is appended to at the end of its last
        element (where the text would go on)."""
        tail = self.text[self.stable_end :]
        if len(tail) > TAIL_RENDER_MAX_CHARS:
            return format_html('<span class="raw" id="body-{}-r">{}</span>', self.id, tail)
        env = {"references": dict(self.env["references"])} if "references" in self.env else {}
        html = _cleaner.clean(_md_tail.render(tail, env))
        at = _end_of_last_element(html)
        # Rendering drops what ends the text: a finished line's line break (text after it
        # starts a line; not a fence's first line: that line break is not the code's), or
        # spaces (text after them does not join the word before).
        ended = tail.rstrip(" \t")
        nl = ended.endswith("\n") and not self.fence and not html[:at].endswith("\n")
        spaces = "" if nl or self.fence else tail[len(ended) :]
        anchor = format_html(
            '<span class="raw{}" id="body-{}-r">{}</span>', " nl" if nl else "", self.id, spaces
        )
        return mark_safe(html[:at] + anchor + html[at:])


def _closes(line: str, markup: str) -> bool:
    """Whether `line` closes a fence opened with `markup` (as markdown-it's fence rule)."""
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3:
        return False
    run = len(stripped) - len(stripped.lstrip(markup[0]))
    return run >= len(markup) and _blank(stripped[run:])


# End tags text goes on inside of: blocks. Not inline ones (text typed after `**x**`
# is not bold), except a code block's <code>, which its </pre> follows.
_BLOCK_TAGS = frozenset(
    [
        "p",
        "li",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "td",
        "th",
        "tr",
        "tbody",
        "thead",
        "table",
        "blockquote",
        "ul",
        "ol",
        "div",
        "pre",
    ]
)


def _end_of_last_element(html: str) -> int:
    """Where text goes on at the end of `html`: before its trailing block end tags."""
    at = len(html)
    inside_pre = False
    while True:
        end = len(html[:at].rstrip())
        if not html.endswith(">", 0, end):
            return at
        lt = html.rfind("<", 0, end)
        if lt == -1 or not html.startswith("</", lt):
            return at
        tag = html[lt + 2 : end - 1].strip().lower()
        if tag not in _BLOCK_TAGS and not (tag == "code" and inside_pre):
            return at
        inside_pre = tag == "pre"
        at = lt


def live_body(chunk_id: uuid.UUID, update: LiveUpdate) -> SafeString:
    """The body of an open text chunk: its stable part, then its tail."""
    return format_html(
        '<div class="md live-md" id="body-{}"><div class="stable" id="body-{}-s">{}</div>{}</div>',
        chunk_id,
        chunk_id,
        update.stable,
        _live_tail(chunk_id, update.tail or mark_safe(""), oob=False),
    )


def _live_tail(chunk_id: uuid.UUID, html: SafeString, *, oob: bool) -> SafeString:
    return format_html(
        '<div class="tail" id="body-{}-t"{}>{}</div>',
        chunk_id,
        mark_safe(' hx-swap-oob="true"') if oob else "",
        html,
    )


# --- The page's view of a chunk ------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    """A file under a user's message or in a tool's result (`data["attachments"]`,
    DESIGN §13): a reference to its blob, never its bytes. Images show as a thumbnail
    linking to the image; anything else (an SVG too) as a chip that downloads it."""

    sha256: str
    name: str
    mime: str
    size: int
    width: int | None
    height: int | None

    @classmethod
    def of(cls, value: Any) -> Attachment | None:
        """None for an entry without a blob address to link to."""
        if not isinstance(value, dict) or not SHA256_HEX.fullmatch(str(value.get("sha256"))):
            return None
        return cls(
            sha256=value["sha256"],
            name=str(value.get("name") or "attachment"),
            mime=str(value.get("mime") or ""),
            size=_count(value.get("size")) or 0,
            width=_count(value.get("width")),
            height=_count(value.get("height")),
        )

    @property
    def image(self) -> bool:
        """A raster image: the normaliser measured it, so there is a thumbnail."""
        return bool(self.width and self.height) and self.mime != SVG_TYPE

    @property
    def url(self) -> str:
        return reverse("blob", args=[self.sha256])

    @property
    def thumb_url(self) -> str:
        return reverse("blob_thumb", args=[self.sha256])

    @property
    def thumb_size(self) -> tuple[int, int]:
        """The thumbnail's box, the image's shape at most THUMB_EDGE_PX long: given to
        the <img> before it loads, so nothing below it moves when it does."""
        width, height = self.width or 1, self.height or 1
        scale = min(1.0, THUMB_EDGE_PX / max(width, height))
        return max(1, round(width * scale)), max(1, round(height * scale))


def _count(value: Any) -> int | None:
    """A positive integer from chunk data, else None (bool is an int to Python)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


@dataclass(eq=False)
class Item:
    """One chunk element as the templates see it."""

    id: uuid.UUID
    seq: int | None
    turn_id: uuid.UUID | None
    step: int
    role: str
    type: str
    data: dict[str, Any]
    open: bool = False
    # An open text chunk's body, its Markdown rendered as it streams (`live_body`).
    live: SafeString | None = None
    # A tool call's results, in seq order (live output, then the result).
    results: list[Item] = field(default_factory=list)
    # The chunk before it is of another turn: it starts a bubble. Only `group`
    # sets it, where it sees that chunk. A live chunk joins whatever the page
    # shows before it: a turn opens with the user's messages, so an assistant-side
    # chunk only ever follows a chunk of its own turn (or a user's or a lone one,
    # which no bubble joins across).
    turn_start: bool = False
    # A result whose call is not in the same run of chunks: it is shown on its
    # own, or (live) sent to its card's slot.
    orphan: bool = False
    pending_approval: bool = False
    # The chunk a search result opened the page at: highlighted, scrolled to.
    hit: bool = False
    # What a page render knows about the log around the chunk (`mark_page`): a
    # valid cut here ("Branch from here"), a valid cut right before it ("Edit"),
    # the end of the tab's last answer ("Regenerate"), the last notice of an
    # interrupted last turn ("Continue"). A live fragment knows none of it
    # (`known` False): see `offers_end`.
    known: bool = False
    cut: bool = False
    cut_before: bool = False
    last_answer: bool = False
    resumable: bool = False
    # Branches of the tab that start right after this chunk (or a result in its
    # card), and, on the first chunk, those that start before it (at seq 0).
    forks: list[Fork] = field(default_factory=list)
    forks_before: list[Fork] = field(default_factory=list)
    # A `forked` notice on a page render: whether the tab it names still exists.
    origin_gone: bool = False
    # When the log took it (a Chunk row's); None for a stream Block, sealed just now.
    created_at: datetime | None = None
    # On the chunk a finished turn's tokens and cost show under (`mark_usage`): what
    # the `turn_usage` partial shows (`usage_line`).
    usage: dict[str, Any] | None = None

    @classmethod
    def of(cls, chunk: Any, *, open: bool = False) -> Item:
        """From a Chunk row or a stream Block (anything with the chunk fields)."""
        return cls(
            id=chunk.id,
            seq=chunk.seq,
            turn_id=chunk.turn_id,
            step=chunk.step,
            role=chunk.role,
            type=chunk.type,
            data=chunk.data or {},
            open=open,
            created_at=getattr(chunk, "created_at", None),
        )

    @property
    def seq_attr(self) -> str:
        return "" if self.seq is None else str(self.seq)

    @property
    def turn_attr(self) -> str:
        return "" if self.turn_id is None else str(self.turn_id)

    @property
    def assistant_side(self) -> bool:
        """Part of a turn's bubble (the user's own messages, lone notices and compactions
        are not: a compaction splits a turn it happens in)."""
        if self.role == Role.USER or self.type == Kind.COMPACTION:
            return False
        if self.type in (Kind.SYSTEM, Kind.ERROR):
            return self.turn_id is not None
        return True

    @property
    def css(self) -> str:
        names = ["chunk", f"t-{self.type.replace('_', '-')}"]
        if self.role == Role.USER:
            names.append("user")
        elif self.assistant_side:
            names.append("a")
        else:
            names.append("alone")
        if self.open:
            names.append("open")
        if self.turn_start:
            names.append("turn-start")
        if self.hit:
            names.append("hit")
        if self.type == Kind.TOOL_RESULT:
            if self.has_result:
                names.append("has-result")
            if self.data.get("is_error"):
                names.append("is-error")
        return " ".join(names)

    # Text and thinking -------------------------------------------------------------

    @property
    def text(self) -> str:
        if self.type == Kind.TOOL_RESULT:
            return self.data.get("shell_output") or ""
        return self.data.get("text") or ""

    @property
    def body(self) -> SafeString:
        """The streamed body of an open chunk, escaped."""
        return stream_text(self.text)

    @cached_property
    def html(self) -> SafeString:
        return markdown(self.text)

    @cached_property
    def wake(self) -> dict[str, str] | None:
        """A wake's message: its name and scheduled time in its zone, for the clock badge."""
        origin = self.data.get("origin")
        if self.role != Role.USER or not isinstance(origin, dict):
            return None
        if origin.get("kind") != "wake":
            return None
        when = str(origin.get("scheduled_for", ""))
        with suppress(ValueError, schedule.ScheduleError):
            zone = schedule.zone(str(origin.get("timezone") or "UTC"))
            at = datetime.fromisoformat(when).astimezone(zone)
            when = f"{at:%Y-%m-%d %H:%M %Z}"
        return {"name": str(origin.get("name") or "wake"), "when": when}

    @cached_property
    def attachments(self) -> list[Attachment]:
        """A user message's files, or the images a tool result brought (read_file's, an
        MCP tool's): shown under it, as the model got them."""
        shown = self.role == Role.USER or self.type == Kind.TOOL_RESULT
        if not shown or not isinstance(self.data.get("attachments"), list):
            return []
        found = (Attachment.of(value) for value in self.data["attachments"])
        return [a for a in found if a is not None]

    @property
    def redacted(self) -> bool:
        return bool(self.data.get("redacted_data")) and not self.text

    @property
    def duration(self) -> str:
        ms = self.data.get("duration_ms")
        if not isinstance(ms, int | float) or ms < 0:
            return ""
        seconds = ms / 1000
        return (
            f"{seconds:.1f} s"
            if seconds < 60
            else f"{int(seconds // 60)} min {int(seconds % 60)} s"
        )

    # Tool calls and results ----------------------------------------------------------

    @property
    def call_id(self) -> str:
        return str(self.data.get("call_id") or "")

    @property
    def name(self) -> str:
        return str(self.data.get("name") or "")

    @property
    def slot(self) -> str:
        return slot_key(self.turn_id, self.step, self.call_id)

    @property
    def approve(self) -> str:
        return approve_key(self.call_id)

    @property
    def arguments(self) -> Any:
        return self.data.get("arguments") or {}

    @property
    def always_rule(self) -> str | None:
        """The rule the approval buttons' "always allow" adds (chat.rules.natural)."""
        args = self.arguments
        return rules.natural(self.name, args) if isinstance(args, dict) else None

    @property
    def command(self) -> str:
        """A shell command to show as a terminal line, if the call is one."""
        args = self.arguments
        if isinstance(args, dict):
            for key in COMMAND_KEYS:
                if isinstance(args.get(key), str):
                    return args[key]
        return ""

    @cached_property
    def args_items(self) -> list[tuple[str, str, bool]]:
        """(name, text, as a block) per argument: strings as written, the rest as JSON.

        A shell call's command is left out (the card shows it as a terminal line).
        """
        args = self.arguments
        if not isinstance(args, dict):
            return [("", json.dumps(args, indent=2, ensure_ascii=False), True)]
        command_key = next((k for k in COMMAND_KEYS if isinstance(args.get(k), str)), None)
        items = []
        for name, value in args.items():
            if name == command_key:
                continue
            text = (
                value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
            )
            items.append((str(name), text, "\n" in text or len(text) > ARGS_INLINE_CHARS))
        return items

    @property
    def args_long(self) -> bool:
        return sum(text.count("\n") + 1 for _, text, _ in self.args_items) >= ARGS_OPEN_LINES

    @property
    def show_args(self) -> bool:
        """Whether the arguments say more than the card's header already does."""
        items = self.args_items
        if not items:
            return False
        if len(items) == 1 and not items[0][2] and not self.command:
            return items[0][1] != self.args_summary
        return True

    @property
    def args_summary(self) -> str:
        args = self.arguments
        if not isinstance(args, dict) or not args:
            return ""
        value = next((args[k] for k in SUMMARY_KEYS if isinstance(args.get(k), str)), None)
        if value is None:
            value = next((v for v in args.values() if isinstance(v, str)), "")
        line = " ".join(value.split())
        if len(line) > ARGS_SUMMARY_CHARS:
            line = line[: ARGS_SUMMARY_CHARS - 1] + "…"
        return line

    @property
    def has_result(self) -> bool:
        return "result" in self.data

    @property
    def result(self) -> str:
        return str(self.data.get("result") or "")

    @property
    def answered(self) -> bool:
        return any(r.has_result for r in self.results)

    @property
    def since_ms(self) -> int:
        """When the call was made (epoch ms): where a running call's clock starts when
        the page did not see it start (app.js, "Tool cards")."""
        when = self.created_at.timestamp() if self.created_at else time.time()
        return int(when * 1000)

    # A tool's output: its size, full height, the plain-text view, what was cut ----------

    @cached_property
    def output(self) -> str:
        """The text of a sealed result's box (and of its plain-text view)."""
        return output_text(self.data)

    @property
    def shows_counts(self) -> bool:
        """A sealed result says how big its output is; not a bare error message
        (denied, cancelled, refused), which is one short line."""
        return (
            self.type == Kind.TOOL_RESULT
            and self.sealed
            and (bool(self.text) or (self.has_result and not self.data.get("is_error")))
        )

    @property
    def output_counts(self) -> str:
        return counts(self.output)

    @property
    def output_long(self) -> bool:
        """Longer than its box: full height and the plain-text view are offered."""
        text = self.output
        return len(text) > OUTPUT_BOX_CHARS or line_count(text) > OUTPUT_BOX_LINES

    @property
    def cut_note(self) -> str:
        """What a truncated result left out, as far as the log knows."""
        cut = self.data.get("truncated_bytes")
        if not isinstance(cut, int) or isinstance(cut, bool) or cut <= 0:
            return "The output was cut to fit; the model was told how to get the rest."
        lines = self.data.get("truncated_lines")
        amount = size(cut)
        if isinstance(lines, int) and not isinstance(lines, bool) and lines > 0:
            amount += f" ({lines:,} line{'s' if lines != 1 else ''})"
        return (
            f"{amount} cut from the middle of the output: the model got its first and "
            f"last {shell.OUTPUT_HEAD // 1024} KiB."
        )

    # Errors and system chunks --------------------------------------------------------

    @property
    def message(self) -> str:
        return str(self.data.get("message") or "")

    @property
    def status_code(self) -> Any:
        return self.data.get("status_code")

    @property
    def summary(self) -> str:
        """What happened, in words (providers.errors.explain); older errors have none."""
        return str(self.data.get("summary") or "")

    @property
    def hint(self) -> SafeString:
        """What to do about the error: its text escaped, `names` as code."""
        return code_spans(str(self.data.get("hint") or ""))

    @property
    def base_url(self) -> str:
        """The endpoint tried, when the hint does not already say it."""
        url = str(self.data.get("base_url") or "")
        return "" if url in str(self.data.get("hint") or "") else url

    @property
    def kind(self) -> str:
        return str(self.data.get("kind") or "notice")

    @property
    def kind_label(self) -> str:
        return SYSTEM_LABELS.get(self.kind, self.kind.replace("-", " ").capitalize())

    @property
    def rule_text(self) -> SafeString:
        """A rule's decision (chat.rules.Decision.text): its `patterns` as code."""
        return code_spans(str(self.data.get("text") or ""))

    # Compactions (chat.context) ----------------------------------------------------------

    @property
    def compaction_summary(self) -> str:
        return str(self.data.get("summary") or "")

    @cached_property
    def compaction_html(self) -> SafeString:
        """The summary is the model's Markdown: rendered and sanitised as its answers are."""
        return markdown(self.compaction_summary)

    @property
    def compaction_line(self) -> str:
        """What the folded notice says after its label: how it was asked for, how much,
        up to where."""
        parts = []
        if (trigger := self.data.get("trigger")) in COMPACTION_TRIGGERS:
            parts.append(trigger)
        if before := _count(self.data.get("tokens_before")):
            parts.append(f"{tokens(before)} tokens summarised")
        if through := _count(self.data.get("through_seq")):
            parts.append(f"up to #{through}")
        return " · ".join(parts)

    @property
    def compaction_note(self) -> str:
        """Under the summary: who wrote it, what it was told to focus on."""
        notes = [
            "The model is sent this summary instead of the messages before it; the log keeps them."
        ]
        if model := str(self.data.get("model") or ""):
            notes.append(f"Written by {model}.")
        if focus := " ".join(str(self.data.get("instructions") or "").split()):
            notes.append(f"Focus: {focus}")
        return " ".join(notes)

    # Branches and message actions ------------------------------------------------------

    @property
    def user_text(self) -> bool:
        return self.role == Role.USER and self.type == Kind.TEXT

    @property
    def sealed(self) -> bool:
        return self.seq is not None and not self.open

    @property
    def forked(self) -> bool:
        return self.type == Kind.SYSTEM and self.kind == "forked"

    @property
    def ends_turn(self) -> bool:
        """An error or a notice that cuts a turn short: what Continue applies to."""
        if self.turn_id is None:
            return False
        return self.type == Kind.ERROR or (self.type == Kind.SYSTEM and self.kind in ENDING_KINDS)

    @property
    def offers_end(self) -> bool:
        """A live chunk that may turn out to be the end of its turn: it carries
        "Regenerate" and "Branch from here", which CSS shows only where it is that
        end (the next chunk starts a turn, or it is the last and nothing runs)."""
        return (
            not self.known
            and self.sealed
            and self.turn_id is not None
            and self.type in (Kind.TEXT, Kind.ERROR, Kind.SYSTEM)
            and self.role != Role.USER
        )

    @property
    def offers_edit(self) -> bool:
        return self.sealed and self.user_text and (self.cut_before or not self.known)

    @property
    def offers_retry(self) -> bool:
        return self.sealed and self.type == Kind.ERROR and self.turn_id is not None

    @property
    def offers_continue(self) -> bool:
        return self.sealed and (self.resumable or (not self.known and self.ends_turn))

    @property
    def offers_copy(self) -> bool:
        # A message of files alone has no Markdown to copy.
        return self.sealed and self.type == Kind.TEXT and bool(self.text)

    @property
    def offers_compact(self) -> bool:
        """ "Summarise up to here": on an answer that ends its turn (a compaction keeps
        turns whole). A page render knows where (`cut`, as for a branch); a live answer
        carries it `if-end`, as `offers_end`."""
        return (
            self.sealed
            and self.role == Role.ASSISTANT
            and self.type == Kind.TEXT
            and self.turn_id is not None
            and (self.cut or not self.known)
        )

    @property
    def has_actions(self) -> bool:
        # A notice outside any turn (a model change, a branch's origin) is no place to
        # act from: the chunk before it offers the same cut.
        if not self.sealed or (self.type == Kind.SYSTEM and self.turn_id is None):
            return False
        return (
            self.offers_copy
            or self.has_output
            or self.offers_retry
            or self.offers_continue
            or self.cut
            or self.last_answer
            or self.offers_end
        )

    @property
    def has_output(self) -> bool:
        """A tool result with something to copy: its output, else what the model got."""
        return self.type == Kind.TOOL_RESULT and not self.open and bool(self.text or self.result)

    @property
    def fork_text(self) -> tuple[str, str, str]:
        """A `forked` notice's text around the parent's title: (before, title, after).
        ("", "", text) when the text does not quote a title."""
        text = str(self.data.get("text") or "")
        before, quote, rest = text.partition("“")
        title, close, after = rest.rpartition("”")
        if not quote or not close:
            return "", "", text
        return before, f"“{title}”", after

    @property
    def origin_url(self) -> str:
        """The parent tab at the cut, for a `forked` notice ("" when its data is not one)."""
        try:
            tab_id = uuid.UUID(str(self.data.get("from_tab")))
            at_seq = int(self.data.get("at_seq"))
        except (TypeError, ValueError):
            return ""
        url = reverse("tab", args=[tab_id])
        # The tab page's ?seq= starts at 1: a cut before the first message shows that one.
        return f"{url}?seq={max(at_seq, 1)}"


@dataclass(frozen=True)
class Fork:
    """A branch of the tab, as its lists show it."""

    id: uuid.UUID
    action: str
    fork_seq: int
    created_at: datetime

    @property
    def label(self) -> str:
        return FORK_LABELS.get(self.action, FORK_LABELS["branch"])

    @property
    def age(self) -> str:
        """How long ago it was made, for a glance ("just now", "3 minutes ago")."""
        if timezone.now() - self.created_at < timedelta(minutes=1):
            return "just now"
        return f"{timesince(self.created_at)} ago"


def mark_page(
    items: Sequence[Item],
    *,
    cuts: set[int],
    running_turn: uuid.UUID | None = None,
    last_answer: int | None = None,
    resumable: int | None = None,
    forks: Sequence[Fork] = (),
    gone: set[str] = frozenset(),
) -> None:
    """What a page render offers on its chunks (the view knows the log around them):
    `cuts` (chat.cuts.valid_cuts of the page), the seq that ends the last answer, the seq of
    the interrupted last turn's last notice, the tab's branches, and the tabs named
    by `forked` notices that no longer exist (ids as strings).

    The running turn's chunks are left as live ones are: where such a chunk turns
    out to end its turn is known only later, to CSS (see `Item.offers_end`)."""
    at: dict[int, list[Fork]] = {}
    for fork in forks:
        at.setdefault(fork.fork_seq, []).append(fork)
    for n, item in enumerate(items):
        for candidate in (item, *item.results):
            seq = candidate.seq
            if seq is None or (running_turn is not None and candidate.turn_id == running_turn):
                continue
            candidate.known = True
            candidate.cut = seq in cuts
            candidate.cut_before = seq - 1 in cuts
            candidate.last_answer = seq == last_answer
            candidate.resumable = seq == resumable
            candidate.origin_gone = candidate.forked and str(candidate.data.get("from_tab")) in gone
            item.forks.extend(at.get(seq, ()))
        if n == 0 and item.seq == 1:
            item.forks_before.extend(at.get(0, ()))


def group(chunks: Iterable[Any], *, continues: bool = False) -> list[Item]:
    """The top-level items of a run of chunks (seq order), results placed in their cards.

    `continues`: the chunk before the first one belongs to the same turn, so the
    first bubble is not a turn's start. Shown right after the "older" sentinel,
    such a bubble is drawn as partial (app.css), which stays true however the page
    later grows or trims around it.
    """
    items: list[Item] = []
    cards: dict[str, list[Item]] = {}
    for chunk in chunks:
        item = Item.of(chunk)
        if item.type == Kind.TOOL_RESULT:
            card = _card_for(cards.get(item.slot, []))
            if card is not None:
                card.results.append(item)
                continue
            item.orphan = True
        elif item.type == Kind.TOOL_CALL:
            cards.setdefault(item.slot, []).append(item)
        items.append(item)
    previous: Item | None = None
    for item in items:
        if previous is None:
            item.turn_start = not continues
        else:
            item.turn_start = previous.turn_id != item.turn_id
        previous = item
    return items


def _card_for(cards: list[Item]) -> Item | None:
    """The call a result answers: the first with this key still unanswered.

    Some servers repeat a call id within a step; each result then goes to the
    first call not yet answered, as the reducer pairs them.
    """
    for card in cards:
        if not card.answered:
            return card
    return cards[-1] if cards else None


def page_items(
    chunks: Sequence[Any], status: dict[str, Any], *, continues: bool = False
) -> tuple[list[Item], dict[str, Any]]:
    """A page render's items and status context.

    The status in the database says "waiting" but not for which call (the
    runner holds that); it is the running turn's call that has no result yet.
    """
    status = dict(status)
    items = group(chunks, continues=continues)
    if status.get("state") == "waiting" and not status.get("approval"):
        for item in reversed(items):
            if item.type == Kind.TOOL_CALL and item.turn_attr == str(status.get("turn_id")):
                if not item.answered:
                    status["approval"] = {
                        "call_id": item.call_id,
                        "name": item.name,
                        "arguments": item.arguments,
                    }
                break
    approval = status.get("approval")
    if approval:
        _mark_pending(items, str(approval.get("call_id") or ""))
    return items, status_context(status)


def mark_hit(items: Sequence[Item], seq: int) -> None:
    """Highlight the chunk of this seq, at the top level or as a result in its card."""
    for item in items:
        for candidate in (item, *item.results):
            if candidate.seq == seq:
                candidate.hit = True
                return


def _mark_pending(items: Sequence[Item], call_id: str) -> None:
    for item in reversed(items):
        if item.type == Kind.TOOL_CALL and item.call_id == call_id and not item.answered:
            item.pending_approval = True
            return


def output_text(data: dict[str, Any]) -> str:
    """A tool result's output as its card shows it: the command's output, else the result."""
    return str(data.get("shell_output") or data.get("result") or "")


def counts(text: str) -> str:
    """Lines and bytes (UTF-8) of a tool's output, for a glance: "400 lines · 3,600 bytes".

    A last line without a line end counts; an empty output is "empty".
    """
    if not text:
        return "empty"
    lines = line_count(text)
    return f"{lines:,} line{'s' if lines != 1 else ''} · {size(len(utf8(text)))}"


def line_count(text: str) -> int:
    """Lines as a reader counts them: a last line without a line end counts too."""
    return text.count("\n") + (bool(text) and not text.endswith("\n"))


def utf8(text: str) -> bytes:
    # A lone surrogate (an imported log may hold one) is counted, not an error.
    return text.encode("utf-8", "surrogatepass")


def size(n: int) -> str:
    """A size in bytes: exact while it is short enough to read, then KiB or MiB."""
    if n < EXACT_BYTES_BELOW:
        return f"{n:,} byte{'s' if n != 1 else ''}"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


# --- Status -----------------------------------------------------------------------------


def _epoch_ms(value: Any) -> int | None:
    if isinstance(value, int | float):
        return int(value * 1000)
    if isinstance(value, str) and value:
        try:
            return int(datetime.fromisoformat(value).timestamp() * 1000)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return None


def tokens(n: Any) -> str:
    """A token count for a glance: 950, 12.3k, 1.2M."""
    n = int(n or 0)
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{n / 1_000_000:.1f}M".replace(".0M", "M")


def elapsed(ms: int | None, now: float | None = None) -> str:
    if ms is None:
        return ""
    seconds = max(0, int((now if now is not None else time.time()) - ms / 1000))
    return f"{seconds // 60}:{seconds % 60:02d}"


def waited(ms: int | None, now: float | None = None) -> str:
    """How long the model has been silent, as the status line counts it."""
    if ms is None:
        return ""
    seconds = max(0, int((now if now is not None else time.time()) - ms / 1000))
    return f"waiting for the model · {seconds} s"


# --- Tokens and cost (chat.usage's totals, as the page shows them) -------------------------

# Chunks a finished turn's usage line never goes in: a thinking block's line would hide
# in its fold, a card's sit among its results. It goes in the turn's last other
# top-level chunk, at its end (in an error's card), where `usage_target` finds it too.
NO_USAGE_LINE = (Kind.THINKING, Kind.TOOL_CALL)


def usage_line(totals: Totals, turn_id: Any = None) -> dict[str, Any]:
    """What the `turn_usage` and `tab_usage` partials show of some steps' totals.

    `turn_id`: a turn's line (its element's id, and where a live one goes)."""
    t = totals.tokens
    share = t.cache_share
    if share is None:
        cached = None
    elif 0 < share < 0.005:
        cached = "<1"
    else:
        cached = str(int(share * 100 + 0.5))
    if totals.free:
        cost = "free"
    elif totals.priced:
        cost = format_usd(totals.usd)
    elif totals.usd:
        cost = f"{format_usd(totals.usd)} + price unknown"
    else:
        cost = "price unknown"
    detail = [
        f"input {t.input:,} (uncached)",
        f"cache read {t.cache_read:,}",
        f"cache write {t.cache_write:,}",
        f"output {t.output:,}",
        f"{totals.steps} request{'s' if totals.steps != 1 else ''}",
        ", ".join(totals.models),
    ]
    if totals.free:
        detail.append("the offline demo model costs nothing")
    elif totals.unknown:
        detail.append(f"no price for {', '.join(totals.unknown)} in the price table")
    turn = str(turn_id) if turn_id else ""
    return {
        "turn_id": turn,
        "target": usage_target(turn) if turn else "",
        "steps": totals.steps,
        "prompt": tokens(t.prompt),
        "output": tokens(t.output),
        "cached": cached,
        "cost": cost,
        "unknown": bool(totals.unknown),
        "detail": " · ".join(part for part in detail if part),
        # Each count at a glance and exact, for the tables of Settings and the admin.
        "compact": {
            "input": tokens(t.input),
            "cache_read": tokens(t.cache_read),
            "cache_write": tokens(t.cache_write),
            "steps": tokens(totals.steps),
        },
        "exact": {
            "input": f"{t.input:,}",
            "cache_read": f"{t.cache_read:,}",
            "cache_write": f"{t.cache_write:,}",
            "output": f"{t.output:,}",
            "steps": f"{totals.steps:,}",
        },
    }


def usage_target(turn_id: str) -> str:
    """The element a turn's usage line goes at the end of, live: the chunk a page render
    puts it in (`mark_usage`), so a reload shows it in the same place."""
    ours = f'.chunk[data-turn="{turn_id}"]:not(.t-thinking):not(.t-tool-call)'
    last = f"#log > {ours}:not(:has(~ {ours}))"
    return f"{last}:not(.t-error), {last}.t-error > .card"


def mark_usage(items: Sequence[Item], totals: dict[Any, Totals]) -> None:
    """Put each turn's usage line (`totals` by turn id: the turns that ended on this
    page) on its last chunk that can carry one."""
    last: dict[Any, Item] = {}
    for item in items:
        if item.turn_id in totals and item.type not in NO_USAGE_LINE:
            last[item.turn_id] = item
    for turn_id, item in last.items():
        item.usage = usage_line(totals[turn_id], turn_id)


def _turn_end_context(status: dict[str, Any]) -> dict[str, Any]:
    """The usage line of the turn that just ended and the tab's new totals, from the
    runner's idle status (`turn_end`, chat.usage.turn_end)."""
    end = status.get("turn_end")
    if (status.get("state") or "idle") != "idle" or not isinstance(end, dict):
        return {"turn_usage": None, "tab_usage": None}
    try:
        turn_id = uuid.UUID(str(end.get("turn_id")))
    except ValueError:
        turn_id = None
    turn = Totals.from_dict(end.get("turn") or {})
    return {
        "turn_usage": usage_line(turn, turn_id) if turn.steps and turn_id else None,
        "tab_usage": usage_line(Totals.from_dict(end.get("tab") or {})),
    }


# --- The context meter (chat.context.Meter, in the status line) -----------------------------

# The meter's bar is an SVG (the CSP allows no style attribute to set a width): its
# user units, the bar being this long.
METER_UNITS = 100


def context_meter(raw: Any) -> dict[str, Any] | None:
    """What the `meter` partial shows of a status's `context` (chat.context.Meter.as_dict):
    used / window at a glance, the bar with its compaction tick, the cached share, and
    the exact figures in its title. None for no meter (a status without one, whose page
    keeps the last it showed)."""
    if not isinstance(raw, dict):
        return None
    window = _count(raw.get("window"))
    if window is None:
        return None
    used = _count(raw.get("used")) or 0
    compact_at = min(_count(raw.get("compact_at")) or window, window)
    estimated = raw.get("estimated") is True
    known = raw.get("window_known") is not False
    cached = raw.get("cached")
    if not isinstance(cached, int | float) or isinstance(cached, bool) or not 0 <= cached <= 1:
        cached = 0
    # A share of an estimate's cache is meaningless: an estimate has no cache reads.
    cached_pct = round(cached * 100) if used and not estimated else None
    share = min(used / window, 1.0)
    pct = round(share * 100)
    if not used:
        title = [f"Context: nothing sent yet; the window is {window:,} tokens."]
    elif estimated:
        title = [
            f"Context: about {used:,} of {window:,} tokens ({pct}%), estimated since the "
            "compaction; the next request counts it."
        ]
    else:
        title = [
            f"Context: {used:,} of {window:,} tokens ({pct}%); the last request read "
            f"{cached_pct}% of its input from the prompt cache."
        ]
    title.append(
        f"The conversation is compacted when a turn would start above {compact_at:,} tokens "
        f"({round(compact_at / window * 100)}%)."
    )
    if not known:
        title.append(f"This model's context window is unknown: assuming {window:,} tokens.")
    return {
        "used": ("≈" if estimated else "") + tokens(used),
        "window": tokens(window),
        "window_known": known,
        "cached": cached_pct,
        "fill": round(share * METER_UNITS, 2),
        "tick": round(compact_at / window * METER_UNITS, 2),
        "near": used >= compact_at,
        "estimated": estimated,
        "title": " ".join(title),
    }


def approval_context(approval: dict[str, Any] | None) -> dict[str, Any] | None:
    """An approval request ({call_id, name, arguments}) as the approval bar shows it."""
    if not approval or not isinstance(approval, dict):
        return None
    call = Item(
        id=uuid.uuid4(),
        seq=None,
        turn_id=None,
        step=0,
        role=Role.ASSISTANT,
        type=Kind.TOOL_CALL,
        data=dict(approval),
    )
    return {
        "call_id": call.call_id,
        "name": call.name,
        "key": call.approve,
        "summary": call.command or call.args_summary,
        "rule": call.always_rule,
    }


# How a sub-agent's state reads on its call's card.
CHILD_STATES = {
    "queued": "starting",
    "running": "running",
    "waiting": "waiting for approval",
    "stopping": "stopping",
    "compacting": "compacting",
}


def children_context(entries: list[Any], path: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The status's sub-agents (chat.turn.state.TurnStatus.children) for the page: each with its
    card's key (its call's approve key: the parent's card for that call) and every approval
    pending in its subtree, each naming the tab that asks and answered there (`path`: the
    sub-agents above it, for a sub-agent's own sub-agents)."""
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("tab"):
            continue
        title = str(entry.get("title") or "Sub-agent")
        state = str(entry.get("state") or "running")
        approval = approval_context(entry.get("approval"))
        own = (
            [{"tab": str(entry["tab"]), "title": title, "via": list(path), **approval}]
            if approval
            else []
        )
        nested = children_context(entry.get("children") or [], (*path, title))
        out.append(
            {
                "tab": str(entry["tab"]),
                "title": title,
                "call_id": str(entry.get("call_id") or ""),
                "key": approve_key(str(entry.get("call_id") or "")),
                "state": state,
                "label": CHILD_STATES.get(state, state),
                "step": entry.get("step") or 0,
                "approval": approval,
                "approvals": own + [a for k in nested for a in k["approvals"]],
            }
        )
    return out


def children_line(kids: list[dict[str, Any]]) -> str:
    """The status line's short word on the sub-agents (their cards say the rest)."""
    if not kids:
        return ""
    asking = sum(len(k["approvals"]) for k in kids)
    if len(kids) == 1:
        return "sub-agent asks approval" if asking else f"sub-agent {kids[0]['label']}"
    verb = "asks" if asking == 1 else "ask"
    return f"{len(kids)} sub-agents" + (f" · {asking} {verb} approval" if asking else "")


def status_context(status: dict[str, Any], *, oob: bool = False) -> dict[str, Any]:
    """What the status partials need, from chat.turns.status() or the runner's status."""
    state = status.get("state") or "idle"
    usage = status.get("usage") or {}
    started = _epoch_ms(status.get("started_at")) if state != "idle" else None
    # Set by the runner once a stream has been silent a while (chat.turn.step.WAITING_STATUS_AFTER).
    waiting = _epoch_ms(status.get("waiting_since")) if state == "running" else None
    approval = approval_context(status.get("approval"))
    kids = children_context(status.get("children") or []) if state != "idle" else []
    label = STATE_LABELS.get(state, state.capitalize())
    if status.get("stale"):
        label = "Not responding"
    return {
        "oob": oob,
        "state": state,
        "label": label,
        "running": state != "idle",
        "turn_id": status.get("turn_id") or "",
        "step": status.get("step") or 0,
        "model": status.get("model") or "",
        "started_ms": started,
        "elapsed": elapsed(started),
        "waiting_ms": waiting,
        "waiting": waited(waiting),
        "usage": {
            "input": tokens(usage.get("input")),
            "output": tokens(usage.get("output")),
            "cache_read": tokens(usage.get("cache_read")),
            "cache_write": tokens(usage.get("cache_write")),
            "has_cache_write": bool(usage.get("cache_write")),
        },
        # Once idle, the turn's tokens are its usage line's (and a reload has no status usage).
        "has_usage": state != "idle"
        and any(usage.get(k) for k in ("input", "output", "cache_read", "cache_write")),
        "approval": approval,
        # Sub-agents the turn waits for (chat.turn.agents), each shown on its call's card;
        # their approvals (a sub-agent's own sub-agents' too) in the approval bar.
        "children": kids,
        "child_approvals": [a for k in kids for a in k["approvals"]],
        "children_line": children_line(kids),
        "has_queued": "queued" in status,
        "queued": status.get("queued") or [],
        "context": context_meter(status.get("context")),
        # A warning only when the shell is unsandboxed or unavailable (cached verdict).
        "sandbox": sandbox.state(sandbox.policy_from(settings)),
        **_turn_end_context(status),
    }


# --- Fragments for the socket ------------------------------------------------------------


def _render(partial: str, context: dict[str, Any]) -> str:
    return render_to_string(f"{TEMPLATE}#{partial}", context)


def _target(item: Item) -> tuple[str, str]:
    """Where an inserted item goes, and where it goes if that is not on the page."""
    if item.type == Kind.TOOL_RESULT:
        return f'[data-slot="{item.slot}"]', "#log"
    return "#log", ""


def _insert(items: list[Item]) -> str:
    target, fallback = _target(items[0])
    return _render("insert", {"items": items, "target": target, "fallback": fallback})


def fragment_open(block: Block, *, turn_start: bool = False, live: LiveText | None = None) -> str:
    """Insert an open chunk (seq None; body empty or the block's text so far).

    Also the snapshot of the open block on (re)connect: if the page already has
    that chunk, the page's JS replaces it in place. `turn_start`: the chunk before
    it on the page is another turn's (the sender knows; see follow.HtmlRenderer).
    A text block's body is live Markdown: `live` is fed the text so far (the sender
    keeps it to feed the deltas to, `fragment_live`).
    """
    item = Item.of(block, open=True)
    item.turn_start = turn_start
    if is_live(block):
        live = live or LiveText(block.id)
        item.live = live_body(block.id, live.feed(block.text))
    return _insert([item])


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
        parts.append(_live_tail(live.id, update.tail, oob=True))
    elif update.raw:
        parts.append(
            format_html('<div hx-swap-oob="beforeend:#body-{}-r">{}</div>', live.id, update.raw)
        )
    return "".join(parts)


def fragment_seal(block: Block, *, turn_start: bool = False) -> str:
    """The chunk's final rendering: replaces the open element by id, else is inserted."""
    item = Item.of(block)
    item.turn_start = turn_start
    return _insert([item])


def fragment_chunks(chunks: Iterable[Any]) -> str:
    """A batch of sealed chunks (catch-up): results nest in cards of the same batch.

    The first joins what the page shows before it, as every live chunk does.
    """
    frames: list[str] = []
    run: list[Item] = []
    for item in group(chunks, continues=True):
        if item.orphan:
            if run:
                frames.append(_insert(run))
                run = []
            frames.append(_insert([item]))
        else:
            run.append(item)
    if run:
        frames.append(_insert(run))
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
        html = _insert([item])
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
    return _render(
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
    return _render("status_frame", {"s": status_context(status, oob=True)})


def fragment_queued(id: int, text: str, *, compact: bool = False) -> str:
    """A message waiting for the running turn to take it, or a compaction (`compact`)
    waiting for the turn's end."""
    return _render("queued_insert", {"q": {"id": id, "text": text, "compact": compact}})


def fragment_taken(ids: Iterable[int]) -> str:
    """Remove queued messages the turn has moved into the log."""
    return _render("taken", {"ids": list(ids)})
