"""Helpers for the web UI tests: a tiny HTML tree, and chunk builders."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

from chat import log
from chat.stream import Block

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None] = field(default_factory=dict)
    children: list[Node] = field(default_factory=list)
    parts: list[Any] = field(default_factory=list)  # text and child nodes, in order

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p.text for p in self.parts)

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def get(self, name: str) -> str | None:
        return self.attrs.get(name)

    def iter(self):
        yield self
        for child in self.children:
            yield from child.iter()

    def find_all(self, pred) -> list[Node]:
        return [n for n in self.iter() if pred(n)]

    def by_id(self, id: str) -> Node | None:
        return next((n for n in self.iter() if n.attrs.get("id") == id), None)


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root")
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs))
        self.stack[-1].children.append(node)
        self.stack[-1].parts.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return
        raise AssertionError(f"stray </{tag}>")

    def handle_data(self, data):
        self.stack[-1].parts.append(data)


def parse(html: str) -> Node:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    assert len(builder.stack) == 1, f"unclosed: {[n.tag for n in builder.stack[1:]]}"
    return builder.root


def top(html: str) -> list[Node]:
    """The top-level elements of a frame (what the ws extension swaps one by one)."""
    root = parse(html)
    stray = "".join(p for p in root.parts if isinstance(p, str)).strip()
    assert not stray, f"text outside any element: {stray!r}"
    return root.children


def block(
    type: str,
    data: dict[str, Any],
    *,
    role: str = "assistant",
    turn_id: uuid.UUID | None = None,
    step: int = 1,
    seq: int | None = None,
) -> Block:
    return Block(uuid.uuid4(), turn_id, step, role, type, data, seq)


def seed_every_type(tab_id: uuid.UUID) -> dict[str, Block]:
    """A turn with one chunk of every type, then a lone system notice; appended to the log."""
    turn = uuid.uuid4()
    blocks = {
        "user": block(
            "text", {"text": "List the files, please."}, role="user", turn_id=turn, step=0
        ),
        "thinking": block(
            "thinking",
            {"text": "I should run **ls**.", "signature": "sig", "duration_ms": 1500},
            turn_id=turn,
        ),
        "text": block("text", {"text": "Running `ls` now."}, turn_id=turn),
        "call": block(
            "tool_call",
            {"call_id": "call_1", "name": "shell", "arguments": {"command": "ls -la"}},
            turn_id=turn,
        ),
        "result": block(
            "tool_result",
            {
                "call_id": "call_1",
                "name": "shell",
                "result": "exit 0",
                "is_error": False,
                "shell_output": "README.md\nsrc\n",
            },
            role="tool",
            turn_id=turn,
        ),
        "error": block("error", {"message": "Overloaded", "status_code": 529}, turn_id=turn),
        "cancelled": block(
            "system",
            {"kind": "cancelled", "text": "Stopped by the user."},
            role="system",
            turn_id=turn,
        ),
        "notice": block(
            "system",
            {"kind": "notice", "text": "Settings changed."},
            role="system",
            turn_id=None,
            step=0,
        ),
    }
    log.append(tab_id, list(blocks.values()))
    return blocks


# A tag, its quoted attribute values kept whole (a `>` or `<` may be inside one).
_TAG = re.compile(r"""<(/?[A-Za-z][^\s/>]*)((?:"[^"]*"|'[^']*'|[^'">])*)>""")
_QUOTED_OR_SPACE = re.compile(r"""("[^"]*"|'[^']*')|\s+""")


def tidy_tags(html: str) -> str:
    """`html` with every tag written the one way a browser reads it all: attributes one
    space apart, nothing before its `>` (the templates break long tags across lines
    there). Attribute values and the text between tags stay exactly as they are, so an
    assertion on the result checks the same markup, wherever a tag's line breaks."""

    def tag(m: re.Match[str]) -> str:
        rest = _QUOTED_OR_SPACE.sub(lambda q: q.group(1) or " ", m.group(2)).rstrip()
        return f"<{m.group(1)}{rest}>"

    return _TAG.sub(tag, html)
