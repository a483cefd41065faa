"""Live Markdown: the open text block as it streams.

An open text block is rendered as Markdown while it streams, with the sealed text's
renderer and sanitiser, at a bounded cost. Its stable part (the top-level blocks of its
complete lines that no later text can change) is rendered once, in segments appended as
they become stable; only the tail after it is rendered again (without highlighting), and
only when new text could render otherwise than as itself (markup, a line's start) and
enough of it has come to pay for the rendering. Otherwise new text is appended as it
came, escaped, at the end of the tail's last element; an open code fence in the tail is
rendered once and its lines appended, and highlighted once it closes.

Where the stable part ends depends on the text alone (its lines are taken one at a time,
however the deltas cut them), so a socket that saw every delta and the open fragment of a
snapshot hold the same stable HTML; and rendered in one piece the same text gives the same
HTML, so the seal's replace moves nothing (tests/test_live_markdown.py). Two things change
at the seal: the tail's code gets its colours, and a link reference defined below its use
(rare in a model's answer) turns the earlier text into a link.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from chat.chunks import Kind
from chat.render.markup import cleaner, md, md_tail

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
        md.block.parse(region, md, {}, tokens)
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
            html = md.render(self.text[self.stable_end : to], self.env)
            self._added.append(cleaner.clean(html))
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
        html = cleaner.clean(md_tail.render(tail, env))
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
        live_tail(chunk_id, update.tail or mark_safe(""), oob=False),
    )


def live_tail(chunk_id: uuid.UUID, html: SafeString, *, oob: bool) -> SafeString:
    return format_html(
        '<div class="tail" id="body-{}-t"{}>{}</div>',
        chunk_id,
        mark_safe(' hx-swap-oob="true"') if oob else "",
        html,
    )
