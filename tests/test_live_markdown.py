"""Live Markdown (chat.render.LiveText): where an open text block's stable part ends, that
stable + tail is the sealed rendering, the tail's bounded cost, hostile text mid-stream, and
the page a snapshot gives against the page the live frames build (chat.follow.HtmlRenderer).
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from html import escape

import pytest
from channels.db import database_sync_to_async

from chat import follow, render
from chat.providers.base import Finish, TextDelta
from chat.render import live as live_markdown
from chat.render import markup
from chat.stream import Block
from tests.engine import chunks, make_tab, running_worker, submit
from tests.test_socket import FRAME_TIMEOUT, open_socket
from tests.ui_helpers import Node, parse, top

TURN = uuid.uuid4()
CHUNK = uuid.uuid4()


def feed(text: str, cuts: list[int] | None = None) -> tuple[render.LiveText, list]:
    """A LiveText fed `text` cut at these offsets (one delta when None)."""
    live = render.LiveText(CHUNK)
    updates, at = [], 0
    for cut in [*(cuts or []), len(text)]:
        updates.append(live.feed(text[at:cut]))
        at = cut
    return live, updates


def as_sealed(live: render.LiveText, updates: list) -> str:
    """The stable HTML the updates appended, and the tail rendered as sealed text is."""
    env = {"references": dict(live.env["references"])} if "references" in live.env else {}
    tail = markup.cleaner.clean(markup.md.render(live.text[live.stable_end :], env))
    return "".join(u.stable for u in updates) + tail


def splits(text: str, seed: int) -> list[list[int]]:
    """Ways a stream may cut `text`: whole, a character at a time, a line at a time, and
    random pieces of 1 to 12 characters."""
    rng = random.Random(seed)
    lines = [i + 1 for i, c in enumerate(text) if c == "\n"]
    pieces, at = [], 0
    while at < len(text):
        at += rng.randint(1, 12)
        pieces.append(min(at, len(text)))
    return [[], list(range(1, len(text))), lines, pieces]


# --- Where the stable part ends ----------------------------------------------------------

# (text so far, its stable part, the tail is an open fence of this marker)
STABLE = [
    ("", "", ""),
    ("A paragraph still being writ", "", ""),
    ("A finished line\n", "", ""),
    ("One paragraph.\n\n", "One paragraph.\n\n", ""),
    ("One paragraph.\n\nAnother one", "One paragraph.\n\n", ""),
    ("Lines of\none paragraph\n", "", ""),
    ("# A heading", "", ""),
    ("# A heading\n", "# A heading\n", ""),
    ("## Heading\nand text right under it", "## Heading\n", ""),
    ("Setext\n======\n", "Setext\n======\n", ""),
    ("Setext\n---\n", "Setext\n---\n", ""),
    ("Text\n\n***\n", "Text\n\n***\n", ""),
    ("Text\n# Heading\n", "Text\n# Heading\n", ""),
    # A list goes on past a blank line (its next item makes it loose) ...
    ("- one\n- two\n", "", ""),
    ("- one\n- two\n\n", "", ""),
    ("- one\n\n- two\n", "", ""),
    # ... until a line that is not its own starts something else.
    ("- one\n- two\n\nAfter the list\n", "- one\n- two\n\n", ""),
    ("1. one\n2. two\n\nAfter", "", ""),
    ("> quoted\n> more\n", "", ""),
    ("> quoted\n\n", "> quoted\n\n", ""),
    ("> quoted\nlazy line\n\n", "> quoted\nlazy line\n\n", ""),
    ("| a | b |\n|---|---|\n| 1 | 2 |\n", "", ""),
    ("| a | b |\n|---|---|\n| 1 | 2 |\n\n", "| a | b |\n|---|---|\n| 1 | 2 |\n\n", ""),
    ("    indented code\n\n", "", ""),
    ("    indented code\n\nText\n", "    indented code\n\n", ""),
    # Fences: open, the tail appends its lines; closed, it is stable at once.
    ("```python\n", "", "`"),
    ("```python\ndef f():\n\n    return 1\n", "", "`"),
    ("Intro.\n\n```python\nx = 1\n", "Intro.\n\n", "`"),
    ("Intro.\n```\nx\n", "Intro.\n", "`"),
    ("~~~\nx\n~~~\n", "~~~\nx\n~~~\n", ""),
    ("```\nx\n```", "", "`"),
    ("```\nx\n```\n", "```\nx\n```\n", ""),
    ("````\n```\nstill code\n", "", "`"),
    ("```\nx\n   ```  \n", "```\nx\n   ```  \n", ""),
    ("```\nx\n    ```\n", "", "`"),
    ("``` a`b\n\nnot a fence\n", "``` a`b\n\n", ""),
    ("- item\n  ```\n  code\n", "", ""),
    # Link reference definitions: a title may follow on the next line.
    ("[ref]: https://example.com\n", "", ""),
    ("[ref]: https://example.com\n\n", "[ref]: https://example.com\n\n", ""),
    ("Text.\n\n[ref]: https://example.com\n", "Text.\n\n", ""),
    # Raw HTML is text (html=False): a blank line ends its paragraph like any other.
    ("<div>\n<script>x</script>\n\nAfter\n", "<div>\n<script>x</script>\n\n", ""),
    # Line ends as markdown-it reads them: CR LF and a lone CR are line ends.
    ("One.\r\n\r\nTwo", "One.\n\n", ""),
    ("One.\r\rTwo", "One.\n\n", ""),
    ("Héllo wörld 👋🏽\n\nnext", "Héllo wörld 👋🏽\n\n", ""),
]


@pytest.mark.parametrize(("text", "stable", "fence"), STABLE)
def test_the_stable_part_is_the_blocks_no_later_text_can_change(text, stable, fence):
    """Whatever the deltas were, the stable part ends at the same place."""
    for n, cuts in enumerate(splits(text, seed=len(text))):
        live, _ = feed(text, cuts)
        assert live.text[: live.stable_end] == stable, (cuts, n)
        assert live.fence == fence, cuts


def test_a_crlf_cut_between_its_cr_and_its_lf_is_one_line_end():
    live, _ = feed("One.\r\n\r\nTwo", [5, 6, 7])
    assert live.text == "One.\n\nTwo"
    assert live.text[: live.stable_end] == "One.\n\n"


def test_a_cr_at_the_end_waits_for_the_next_delta():
    live, updates = feed("a\r", [])
    assert live.text == "a" and updates[-1].tail is not None
    live.feed("b")
    assert live.text == "a\nb"


def test_characters_cut_between_deltas_come_out_whole():
    """A cluster (a base and its combining mark, an emoji sequence) cut between deltas."""
    text = "Cafe\u0301 👩\u200d💻 and 🇫🇷.\n\nNext"
    for cuts in splits(text, seed=3):
        live, updates = feed(text, cuts)
        assert live.text == text
        assert as_sealed(live, updates) == render.markdown(text)


# --- Stable + tail is the sealed rendering ------------------------------------------------

CORPUS = [
    "# Title\n\nSome **bold**, *em*, `code` and ~~gone~~ text.\n\n- one\n- two\n  - nested\n\n"
    "1. first\n2. second\n\n```python\ndef f(x):\n    return x + 1\n```\n\n"
    "| a | b |\n|:--|--:|\n| 1 | 2 |\n\n> a quote\n> on two lines\n\nThe end.",
    "Intro paragraph\nwith a soft break.\n\n- loose\n\n- list\n\n  with a paragraph\n\nAfter.\n",
    "Text\n---\n\nMore text\n===\n\n***\n\n    indented code\n\n    more of it\n\nDone",
    '[docs]: https://example.com/docs "Docs"\n\n'
    "See [the docs][docs] and [inline](https://example.com/a?b=c).\n\nLater [docs] again.",
    "```\nunclosed fence\n\nwith a blank line",
    "> quote\n\n> another quote\n\n- a\n- b\n\n1) x\n2) y\n\n  para with two spaces\n",
    "Line one\r\nLine two\r\n\r\n# Heading\r\n\r\ntext\rmore",
    "Table first\n| x | y |\n| - | - |\n| 1 | 2 |\n| 3 | 4 |\n\nand after\n",
    "~~~js\nconst a = `x`;\n~~~\n````\n```\nnested marker\n````\nTail ![alt](http://x/y.png)",
    "Tabs:\n\n\tcode with a tab\n\n- item\n\n\tnot code?\n\n"
    "A\\\nhard break and a trailing one  \nhere",
    "# Ünïcödé 👋🏽\n\nÀ café — “quotes” and 中文字符。\n\n- ✓ done\n",
    "1. one\n1. one again\n\n\n\n3. three starts a new list\n\nx" * 2,
]


@pytest.mark.parametrize("n", range(len(CORPUS)))
def test_stable_and_tail_render_as_the_sealed_text(n):
    """The seal's rendering is the live one: the stable segments as they were appended, and
    the tail rendered in one piece (with its code highlighted, as the seal does)."""
    text = CORPUS[n]
    for cuts in splits(text, seed=n):
        live, updates = feed(text, cuts)
        assert as_sealed(live, updates) == render.markdown(text), cuts


@pytest.mark.parametrize("n", range(len(CORPUS)))
def test_the_stable_html_does_not_depend_on_the_deltas(n):
    """A socket that saw every delta and the snapshot of the same text hold the same stable
    HTML, and the same tail."""
    text = CORPUS[n]
    whole, [first] = feed(text)
    for cuts in splits(text, seed=n)[1:]:
        live, updates = feed(text, cuts)
        assert "".join(u.stable for u in updates) == first.stable, cuts
        assert live.stable_end == whole.stable_end
        assert live._tail() == whole._tail()


def test_a_link_defined_in_the_stable_part_works_in_the_tail():
    live, updates = feed("[x]: https://example.com\n\nSee [x]")
    assert '<a href="https://example.com"' in updates[-1].tail


def test_a_link_defined_below_its_use_becomes_a_link_only_at_the_seal():
    """The one text whose stable part the seal changes (CommonMark lets a definition come
    after its use; models rarely write one)."""
    text = "See [x].\n\n[x]: https://example.com\n"
    live, updates = feed(text)
    assert updates[0].stable == "<p>See [x].</p>\n"
    assert "<a href" in render.markdown(text)


# --- The tail's cost ----------------------------------------------------------------------


def tail_renders(text: str, size: int) -> list[int]:
    """Feed `text` in deltas of `size`: the tail's length at each rendering. A delta that
    does not render the tail appends its text as it came."""
    live = render.LiveText(CHUNK)
    rendered = []
    for at in range(0, len(text), size):
        update = live.feed(text[at : at + size])
        if update.tail is not None:
            rendered.append(len(live.text) - live.stable_end)
        else:
            assert update.raw == text[at : at + size]
    return rendered


def test_a_short_tail_is_rendered_on_every_delta_that_brings_markup():
    text = ("Some *words* " * 8)[: 8 * render.TAIL_RENDER_FACTOR]
    assert len(tail_renders(text, 8)) == len(text) // 8


def test_plain_text_is_appended_as_it_came():
    """Text that renders as itself is not rendered again (the bench's stamps are such text,
    and so are most of a model's words), unless it is at the head of a line."""
    text = "A first line.\nThen plain words, numbers like 42.5 and “quotes” - or 'these'. " * 3
    live = render.LiveText(CHUNK)
    offsets = range(0, len(text), 6)
    updates = [live.feed(text[at : at + 6]) for at in offsets]
    appended, marked = 0, False
    for at, update in zip(offsets, updates, strict=True):
        head = at - (text.rfind("\n", 0, at) + 1) < render.LINE_HEAD_CHARS
        marked = marked or head or "\n" in text[at : at + 6]
        if update.tail is None:
            assert update.raw == text[at : at + 6]
            appended += 1
        else:
            # Only a line's head or end since the last rendering can render otherwise.
            assert marked
            marked = False
    assert appended > len(updates) * 3 / 4
    assert as_sealed(live, updates) == render.markdown(text)


def test_a_long_tail_costs_a_bounded_number_of_renderings_per_character():
    """Each rendering costs about the tail's length: however long the paragraph grows, the
    renderings add up to at most TAIL_RENDER_FACTOR times its length (once per delta, a
    20,000-character paragraph in 15-character deltas would render 13 million)."""
    text = "".join(f"word{n} **bold{n}** " for n in range(1000))
    rendered = tail_renders(text, 15)
    assert len(text) > render.TAIL_RENDER_MAX_CHARS
    assert sum(rendered) <= render.TAIL_RENDER_FACTOR * len(text) + 15
    assert max(rendered) <= render.TAIL_RENDER_MAX_CHARS
    assert len(rendered) < len(text) // 15 / 4


def test_an_open_fence_is_rendered_once_and_its_lines_appended_until_it_closes():
    live = render.LiveText(uuid.uuid4())
    opened = live.feed("Intro.\n\n```python\n")
    assert opened.stable == "<p>Intro.</p>\n"
    code = parse(opened.tail).find_all(lambda n: n.tag == "code")[0]
    assert code.get("class") == "language-python"
    assert [n.get("id") for n in code.children] == [f"body-{live.id}-r"]
    lines = ["def f(x):\n", "    return x + 1\n", "\n", "print(f(2))\n"]
    for line in lines:
        update = live.feed(line)
        assert (update.stable, update.tail, update.raw) == ("", None, line)
    closed = live.feed("```\nAfter.")
    assert '<span class="k">def</span>' in closed.stable
    assert closed.stable == render.markdown("```python\n" + "".join(lines) + "```\n")
    assert closed.tail.startswith("<p>After.<span")


# Where text appended to the tail goes: at the end of its last element.
ANCHOR = [
    ("Some words", "<p>Some words{}</p>\n"),
    ("A line\n", "<p>A line{nl}</p>\n"),
    ("- a\n- b", "<ul>\n<li>a</li>\n<li>b{}</li>\n</ul>\n"),
    ("> q", "<blockquote>\n<p>q{}</p>\n</blockquote>\n"),
    (
        "| a |\n|---|\n| 1 |",
        "<table>\n<thead>\n<tr>\n<th>a</th>\n</tr>\n</thead>\n<tbody>\n"
        "<tr>\n<td>1{}</td>\n</tr>\n</tbody>\n</table>\n",
    ),
    ("***", "<hr>\n{}"),
    # After inline markup, text goes on outside it (words typed after **Note:** are
    # not bold, after a link not part of it).
    ("**Note:**", "<p><strong>Note:</strong>{}</p>\n"),
    ("Run `ls`", "<p>Run <code>ls</code>{}</p>\n"),
    (
        "See [docs](http://x.y)",
        '<p>See <a href="http://x.y" target="_blank" rel="noopener noreferrer">docs</a>{}</p>\n',
    ),
    ("```sh\n", '<div class="code">{copy}<pre><code class="language-sh">{}</code></pre>\n</div>\n'),
    ("", "{}"),
]


@pytest.mark.parametrize(("text", "html"), ANCHOR)
def test_text_appended_to_the_tail_goes_on_at_the_end_of_its_last_element(text, html):
    live, [update] = feed(text)
    span = '<span class="raw{}" id="body-{}-r"></span>'
    copy = render.CODE_COPY.removeprefix('<div class="code">')
    assert update.tail == html.format(
        span.format("", live.id), nl=span.format(" nl", live.id), copy=copy
    )


# --- Hostile text mid-stream --------------------------------------------------------------

HOSTILE = (
    "<script>alert(1)</script> <img src=x onerror=alert(2)> [x](javascript:alert(3)) "
    '<a href="javascript:alert(4)">y</a> <javascript:alert(5)> <svg onload=alert(6)>\n\n'
    "[data](data:text/html;base64,PHNjcmlwdD4=) ![img](https://evil.example/x.png) "
    "<div><b>unclosed <i>html\n\n"
    "[ref]: javascript:alert(7)\n\nA [ref] and <style>body{display:none}</style>\n\n"
    "| <b>x</b> | y |\n|---|---|\n| <iframe src=//evil> | `<b>` |\n\n"
    "```html\n<script>alert(8)</script>\n\nnever closed <b>"
)
ALLOWED = {
    "div",
    "span",
    "p",
    "a",
    "code",
    "pre",
    "em",
    "strong",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "button",
    "br",
    "hr",
    "ul",
    "ol",
    "li",
    "blockquote",
    "del",
    "s",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
}


def inert(html: str) -> None:
    for node in parse(html).iter():
        if node.tag == "#root":
            continue
        assert node.tag in ALLOWED, node.tag
        for name, value in node.attrs.items():
            assert not name.startswith("on") and name not in ("style", "src"), (name, value)
            if name == "href":
                assert value.split(":")[0] in ("http", "https", "mailto"), value
        if node.tag == "a":
            # nh3's marks: the link went through the sanitiser.
            assert node.get("rel") == "noopener noreferrer" and node.get("target") == "_blank"


@pytest.mark.parametrize("seed", range(4))
def test_hostile_text_mid_stream_is_sanitised_as_sealed_text(seed):
    """Every frame, cut anywhere (inside a tag, a link, an entity), is inert, and stable +
    tail is exactly the sealed rendering."""
    block = Block(uuid.uuid4(), TURN, 1, "assistant", "text", {"text": ""})
    renderer = follow.HtmlRenderer()
    frames = [renderer.open(block)]
    cuts = splits(HOSTILE, seed)[3]
    at = 0
    for cut in cuts:
        frames.append(renderer.delta(str(block.id), at, HOSTILE[at:cut]))
        at = cut
    for frame in frames:
        inert(frame)
    assert "<script>alert" not in "".join(frames)
    live, updates = feed(HOSTILE, cuts)
    assert as_sealed(live, updates) == render.markdown(HOSTILE)
    assert live.fence == "`"


def test_a_huge_line_is_shown_as_text_without_rendering_it_again():
    """A 100,000-character line (and markup in it): past TAIL_RENDER_MAX_CHARS the tail is
    not rendered again, its text goes on escaped."""
    line = ("<b>bold?</b> **x** " * 6000)[:100_000]
    live = render.LiveText(uuid.uuid4())
    renders = 0
    for at in range(0, len(line), 4096):
        frame = render.fragment_live(live, line[at : at + 4096])
        inert(frame)
        renders += f'id="body-{live.id}-t"' in frame
    assert renders < 12
    live.feed("\n\n")
    assert live.stable_end == len(live.text)


def test_a_tail_too_long_to_render_after_a_boundary_is_its_text():
    text = "x\n\n" + "<i>" * render.TAIL_RENDER_MAX_CHARS
    live, [update] = feed(text)
    assert update.stable == "<p>x</p>\n"
    node = parse(update.tail).children[0]
    assert (
        node.get("id") == f"body-{live.id}-r" and node.text == "<i>" * render.TAIL_RENDER_MAX_CHARS
    )


# --- Frames, and the page they build --------------------------------------------------------


class Page:
    """#log as htmx and static/chat/app.js change it, for the frames of one text chunk:
    inserts (a chunk already there is replaced), beforeend:#id, and replaces by id."""

    def __init__(self) -> None:
        self.root = parse('<div id="log"></div>')

    def apply(self, frame: str) -> None:
        for node in top(frame):
            oob = node.attrs.pop("hx-swap-oob", None) or "true"
            if oob == "true":
                self._replace(node)
            elif oob.startswith("beforeend:#"):
                target = self.root.by_id(oob.removeprefix("beforeend:#"))
                if target is None:
                    continue
                for part in node.parts:
                    if (
                        isinstance(part, Node)
                        and part.get("id")
                        and self.root.by_id(part.get("id"))
                    ):
                        self._replace(part)
                    else:
                        _append(target, part)

    def _replace(self, node: Node) -> None:
        for parent in self.root.iter():
            for i, part in enumerate(parent.parts):
                if isinstance(part, Node) and part.get("id") == node.get("id"):
                    parent.parts[i] = node
                    parent.children = [p for p in parent.parts if isinstance(p, Node)]
                    return

    def body(self, chunk_id) -> str:
        return html(self.root.by_id(f"body-{chunk_id}"))

    def text_body(self, chunk_id) -> str:
        """The body with the text appended to its tail as if it were rendered there (an
        open fence's lines are appended, not rendered again)."""
        return html(unwrapped(self.root.by_id(f"body-{chunk_id}")))


def _append(target: Node, part) -> None:
    target.parts.append(part)
    if isinstance(part, Node):
        target.children.append(part)


def html(node) -> str:
    if isinstance(node, str):
        return escape(node, quote=False)
    attrs = "".join(f' {k}="{escape(v or "")}"' for k, v in node.attrs.items())
    return f"<{node.tag}{attrs}>" + "".join(html(p) for p in node.parts) + f"</{node.tag}>"


def flat(node: Node) -> str:
    """A live body's blocks as the sealed .md holds them: the stable and tail wrappers
    (boxless, app.css) and the text anchor left out (the text appended to it kept)."""
    out = []
    for part in node.parts:
        if isinstance(part, Node) and part.get("class") in ("stable", "tail"):
            out.append(flat(part))
        elif isinstance(part, Node):
            out.append(html(unwrapped(part)))
        else:
            out.append(html(part))
    return "".join(out)


def unwrapped(node: Node) -> Node:
    parts = []
    for part in node.parts:
        if isinstance(part, Node) and "raw" in part.classes:
            parts.extend(unwrapped(part).parts)
        else:
            parts.append(part if isinstance(part, str) else unwrapped(part))
    return Node(node.tag, node.attrs, [p for p in parts if isinstance(p, Node)], parts)


def live_and_snapshot(text: str, cuts: list[int]) -> tuple[Page, Page, Block]:
    """The page the live frames build (open, then each delta) and the page a snapshot of the
    same text builds."""
    block = Block(uuid.uuid4(), TURN, 1, "assistant", "text", {"text": ""})
    live_page, renderer = Page(), follow.HtmlRenderer()
    live_page.apply(renderer.open(block))
    at = 0
    for cut in [*cuts, len(text)]:
        live_page.apply(renderer.delta(str(block.id), at, text[at:cut]))
        at = cut
    snapshot_page = Page()
    snapshot = Block(block.id, TURN, 1, "assistant", "text", {"text": text})
    snapshot_page.apply(follow.HtmlRenderer().open(snapshot))
    return live_page, snapshot_page, block


@pytest.mark.parametrize("n", range(len(CORPUS)))
def test_a_snapshot_builds_the_page_the_live_frames_built(n, monkeypatch):
    """Rendered at every delta, the live tail leaves exactly the page a snapshot of the same
    text makes; at the default pace the stable part is the same, and the tail after its next
    rendering."""
    text = CORPUS[n]
    cuts = splits(text, seed=n)[3]
    live_page, snapshot_page, block = live_and_snapshot(text, cuts)
    stable = f"body-{block.id}-s"
    assert html(live_page.root.by_id(stable)) == html(snapshot_page.root.by_id(stable))
    monkeypatch.setattr(live_markdown, "TAIL_RENDER_FACTOR", 10**9)
    live_page, snapshot_page, block = live_and_snapshot(text, cuts)
    assert live_page.text_body(block.id) == snapshot_page.text_body(block.id)
    # Sent again (a reconnect), the snapshot replaces the chunk in place: the same page.
    again = Block(block.id, TURN, 1, "assistant", "text", {"text": text})
    before = live_page.text_body(block.id)
    live_page.apply(follow.HtmlRenderer().open(again))
    assert live_page.text_body(block.id) == before


@pytest.mark.parametrize("n", [0, 1, 2, 5, 7, 10])
def test_the_seal_replaces_the_live_blocks_with_the_same_blocks(n, monkeypatch):
    """The sealed .md holds the blocks the live body showed, element for element: what
    the reader looks at does not change (the code blocks here closed, so were highlighted
    once stable)."""
    monkeypatch.setattr(live_markdown, "TAIL_RENDER_FACTOR", 10**9)
    text = CORPUS[n].rstrip("\n") + "\n\nThe last paragraph."
    page, _, block = live_and_snapshot(text, splits(text, seed=n)[3])
    body = page.root.by_id(f"body-{block.id}")
    sealed = Block(block.id, TURN, 1, "assistant", "text", {"text": text}, 9)
    page.apply(render.fragment_seal(sealed))
    md = page.root.by_id(f"chunk-{block.id}").children[0]
    assert "md" in md.classes and page.root.by_id(f"body-{block.id}") is None
    assert flat(body) == "".join(html(p) for p in md.parts)


# --- Through the socket ---------------------------------------------------------------------

WORDS = (
    "# Heading\n\nSome **bold** words, then a list:\n\n- one\n- two\n\n"
    "```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nThe end of it."
)


@pytest.fixture
def script(script):
    """The turn's provider plays these events (an asyncio.Event holds the stream)."""
    return lambda *events: script(list(events))


def chunk_seq(frame: str, chunk_id: str) -> str | None:
    """The data-seq of the chunk's element in the frame ("" open), None if not in it."""
    node = parse(frame).by_id(f"chunk-{chunk_id}")
    return None if node is None else node.get("data-seq")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("factor", [render.TAIL_RENDER_FACTOR, 10**9])
async def test_a_socket_joining_mid_block_shows_what_a_socket_that_saw_it_all_shows(
    script, monkeypatch, factor
):
    """One socket watches the whole turn; another connects in the middle of the answer, its
    page holding part of the open chunk: it is sent the whole chunk again (never the rest as
    text on top of its Markdown), and right before the seal both pages hold the same stable
    part (and with the tail rendered on every delta, the same body)."""
    monkeypatch.setattr(live_markdown, "TAIL_RENDER_FACTOR", factor)
    pieces = [WORDS[i : i + 5] for i in range(0, len(WORDS), 5)]
    joined = asyncio.Event()
    half = len(pieces) // 2
    # The stream waits for the second socket half-way through the answer.
    script(
        *[TextDelta(p) for p in pieces[:half]],
        joined,
        *[TextDelta(p) for p in pieces[half:]],
        Finish(),
    )
    async with running_worker():
        tab = await make_tab()
        owner = await database_sync_to_async(lambda: tab.owner)()
        first = await open_socket(tab.pk, owner)
        await first.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
        await first.receive_from(FRAME_TIMEOUT)  # status: idle
        await submit(tab, "go")
        pages = [Page(), Page()]
        chunk_id = None
        while chunk_id is None:
            frame = await first.receive_from(FRAME_TIMEOUT)
            pages[0].apply(frame)
            live = parse(frame).find_all(lambda n: "live-md" in n.classes)
            chunk_id = live[0].get("id").removeprefix("body-") if live else None
        second = await open_socket(tab.pk, owner)
        hello = {"type": "hello", "last_seq": 1, "open_id": chunk_id, "open_len": 3}
        await second.send_to(text_data=json.dumps(hello))
        opened = 0
        while True:
            frame = await second.receive_from(FRAME_TIMEOUT)
            pages[1].apply(frame)
            if chunk_seq(frame, chunk_id) == "":
                opened += 1
            else:
                assert f"body-{chunk_id}" not in frame, "text for the chunk before it"
            if 'id="status"' in frame:
                break
        assert opened == 1
        joined.set()
        before_seal = []
        for socket, page in zip((first, second), pages, strict=True):
            while True:
                frame = await socket.receive_from(FRAME_TIMEOUT)
                if chunk_seq(frame, chunk_id):
                    before_seal.append(page.body(chunk_id))
                    break
                page.apply(frame)
        await first.disconnect()
        await second.disconnect()
    rows = await chunks(tab.pk)
    assert rows[-1].data["text"] == WORDS
    stable = [html(parse(body).by_id(f"body-{chunk_id}-s")) for body in before_seal]
    assert stable[0] == stable[1]
    assert "<h1>Heading</h1>" in stable[1] and '<span class="k">' not in stable[1]
    if factor > 1000:
        assert before_seal[0] == before_seal[1]


def test_a_long_loose_list_is_not_parsed_again_at_every_item(monkeypatch):
    """A loose list never becomes stable until it ends; parsing it whole at every blank
    line made an answer of 400 items cost seconds. Re-checks wait for 1/8 more text."""
    parsed: list[int] = []
    real = markup.md.block.parse

    def counting(src, md, env, tokens):
        parsed.append(len(src))
        return real(src, md, env, tokens)

    monkeypatch.setattr(markup.md.block, "parse", counting)
    text = "".join(f"- item number {i} of the list\n\n" for i in range(400))
    live, updates = feed(text, list(range(12, len(text), 12)))
    assert sum(parsed) < 40 * len(text), (len(parsed), sum(parsed))
    assert as_sealed(live, updates) == str(render.markdown(text))
