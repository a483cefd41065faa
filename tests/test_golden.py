"""A recorded tab, imported, renders the same page and builds the same next requests.

The runtime and the renderer are reorganised from time to time; what a user sees and
what a provider gets must not move with them. `fixtures/golden/tab.jsonl` is an export
holding one chunk of every shape the app writes (signed and redacted thinking, parallel
tool calls, a truncated shell result, an interrupted answer, an error, notices, a
compaction). The test imports it, renders its page and its socket catch-up, and runs
one turn on it against the fake Anthropic and OpenAI servers, and compares all of it
with the files beside it.

Pages are compared as a canonical form of their HTML: whitespace-only text between
elements, and the whitespace inside a tag, do not count (a template may be wrapped over
lines); everything else — every element, attribute and character of text — does. Ids,
tokens and clock times are replaced by stable placeholders. Request bodies are compared
byte for byte (the workspace's temporary path replaced).

After a deliberate change to what a page or a request holds, rewrite the files with
`GOLDEN_UPDATE=1 pytest tests/test_golden.py` and review their diff.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.urls import reverse

from chat import log, render, transfer
from chat.models import Tab
from harness.fakeprovider import Reply, openai_text
from tests.anthropic_wire import MODEL, reply, settled, text, use_anthropic
from tests.engine import Watcher, owner_workspace, running_worker, submit

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
UPDATE = os.environ.get("GOLDEN_UPDATE") == "1"
OPENAI_MODEL = "openai/gpt-4.1"
NEXT = "One more question."

# Elements whose text is shown as it is, whitespace included.
VERBATIM = {"pre", "textarea", "code", "script", "style"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source"}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
VOLATILE = [
    (re.compile(r'(name="csrfmiddlewaretoken" value=")[^"]+'), r"\1<csrf>"),
    (re.compile(r'("X-CSRFToken": ?&quot;|"X-CSRFToken": ?")[A-Za-z0-9]+'), r"\1<csrf>"),
    (re.compile(r'(nonce=")[^"]+'), r"\1<nonce>"),
    (re.compile(r"\b1[6-9]\d{11}\b"), "<epoch-ms>"),
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?"), "<iso>"),
    (re.compile(r"\b\d\d:\d\d(:\d\d)?\b"), "<hh:mm>"),
    (re.compile(r"/static/([\w/.-]+?)\.[0-9a-f]{8,}\.(\w+)"), r"/static/\1.\2"),
]


class _Canonical(HTMLParser):
    """HTML re-written one element, text run or comment per line, attributes in order."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.out: list[str] = []
        self.verbatim = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(f"<{tag}{_attrs(attrs)}>")
        if tag in VERBATIM:
            self.verbatim += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.out.append(f"<{tag}{_attrs(attrs)}/>")

    def handle_endtag(self, tag: str) -> None:
        if tag in VERBATIM:
            self.verbatim = max(0, self.verbatim - 1)
        if tag not in VOID:
            self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if self.verbatim or data.strip():
            self.out.append(f"text:{data!r}")

    def handle_entityref(self, name: str) -> None:
        self.out.append(f"&{name};")

    def handle_charref(self, name: str) -> None:
        self.out.append(f"&#{name};")

    def handle_comment(self, data: str) -> None:
        self.out.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.out.append(f"<!{decl}>")


def _attrs(attrs: list[tuple[str, str | None]]) -> str:
    return "".join(f' {k}="{" ".join(v.split())}"' if v is not None else f" {k}" for k, v in attrs)


def canonical(html: str) -> str:
    parser = _Canonical()
    parser.feed(html)
    parser.close()
    return stable("\n".join(parser.out) + "\n")


def stable(text: str) -> str:
    """`text` with every uuid replaced by its order of first appearance, and tokens and
    clock times by placeholders."""
    seen: dict[str, str] = {}
    text = UUID.sub(lambda m: seen.setdefault(m.group(0), f"<uuid-{len(seen) + 1}>"), text)
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def check(name: str, actual: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(actual, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    # Compared line by line, so a failure shows the first lines that moved.
    assert actual.splitlines() == expected.splitlines(), name


def import_golden(owner) -> Tab:
    with open(GOLDEN / "tab.jsonl", "rb") as stream:
        return transfer.import_jsonl(owner, stream)


@pytest.fixture
def owner(db):
    return get_user_model().objects.create_user("owner", password="pw-golden")


@pytest.mark.django_db
def test_the_page_of_a_recorded_tab_is_unchanged(client, owner, settings, tmp_path):
    settings.DISPATCH_WORKSPACE = tmp_path
    tab = import_golden(owner)
    client.force_login(owner)
    response = client.get(reverse("tab", args=[tab.pk]))
    assert response.status_code == 200
    check("page.html.txt", canonical(response.content.decode()))


@pytest.mark.django_db
def test_the_socket_frames_of_a_recorded_tab_are_unchanged(owner):
    tab = import_golden(owner)
    rows = log.tail(tab.pk)
    frames = render.catch_up_frames(rows, 1_000_000)
    check("frames.html.txt", canonical("\n".join(frames)))


async def next_request(fake_server, tab: Tab) -> bytes:
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, NEXT)
        await watcher.until_idle()
    await settled(tab.pk)
    assert len(fake_server.requests) == 1
    return fake_server.requests[0].body


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_the_next_request_of_a_recorded_tab_is_unchanged(
    fake_server, monkeypatch, settings, tmp_path, provider
):
    workspace = await database_sync_to_async(owner_workspace)(settings, tmp_path)
    owner = await get_user_model().objects.aget(username="owner")
    tab = await database_sync_to_async(import_golden)(owner)
    if provider == "anthropic":
        use_anthropic(monkeypatch, fake_server)
        fake_server.add(reply(text("Nothing more.")))
    else:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        monkeypatch.setenv("OPENAI_BASE_URL", fake_server.openai_url)
        fake_server.add(Reply(events=openai_text(["Nothing more."])))
        await Tab.objects.filter(pk=tab.pk).aupdate(model=OPENAI_MODEL)
        await tab.arefresh_from_db()
    assert tab.model == (MODEL if provider == "anthropic" else OPENAI_MODEL)
    body = (await next_request(fake_server, tab)).decode()
    body = body.replace(str(workspace), "<workspace>").replace(str(tmp_path), "<tmp>")
    check(f"request.{provider}.json", stable(body))
