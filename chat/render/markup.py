"""Markdown to sanitised HTML (markdown-it, Pygments, nh3), and the escaping of text a
page counts or marks up itself.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Highlighting is for reading code, not for megabyte dumps: past this size a
# code block is shown plain, so one huge paste cannot stall a page render.
MAX_HIGHLIGHT_CHARS = 50_000


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


def _image_as_link(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
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


def _cell_align_class(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
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


def _fence_with_copy(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    return CODE_COPY + self.fence(tokens, idx, options, env) + "</div>\n"


def _code_block_with_copy(
    self: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
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


md = _markdown_it(_highlight)


# The live tail's (LiveText): the same without highlighting. The tail is rendered again
# as it grows, and highlighting costs more than the rest; a code block is highlighted
# once, when it becomes stable or seals.
md_tail = _markdown_it(None)


cleaner = nh3.Cleaner(
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
    return mark_safe(cleaner.clean(md.render(text)))


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
