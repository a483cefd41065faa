"""The search's results read as the messages do (issue 31): plain text with the matched words
marked (no Markdown marks, no escaped newlines), the tab's title and when the message was
written, in a dialog; not "#38 · assistant text"."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from chat import log, turns
from chat.models import Chunk, Tab
from chat.search import plain_text
from tests.ui_helpers import block, parse

pytestmark = pytest.mark.django_db

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")


@pytest.mark.parametrize(
    ("raw", "plain"),
    [
        ("**Bold** and `code` and *em*", "Bold and code and em"),
        ("# Heading\n- item\n> quoted\n1. first", "Heading item quoted first"),
        ("[a link](https://example.com) and ![an image](x.png)", "a link and an image"),
        ('{"text": "line one\\nline two\\tend"}', '{"text": "line one line two end"}'),
        ("```python\nprint(1)\n```", "print(1)"),
        # An address with parentheses in it, as Wikipedia's are.
        ("[click](https://en.wikipedia.org/wiki/Go_(game)) here", "click here"),
        ("snake_case_name, 2 * 3 and a_b", "snake_case_name, 2 * 3 and a_b"),
    ],
)
def test_plain_text_takes_markdowns_marks_out(raw, plain):
    assert plain_text(raw) == plain


def test_a_hit_shows_its_tabs_title_when_and_plain_text():
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    tab = Tab.objects.create(owner=user, title="Trip planning")
    [old, new] = log.append(
        tab.id,
        [
            block(
                "text", {"text": "The **needle** is in `haystack.md`"}, role="user", turn_id=TURN
            ),
            block("text", {"text": "Found the needle:\\n- *here*"}, role="assistant", turn_id=TURN),
        ],
    )
    Chunk.objects.filter(id=old.id).update(
        created_at=timezone.now() - timedelta(hours=2, minutes=5)
    )
    client = Client()
    client.force_login(user)
    html = client.get("/search/", {"q": "needle"}, headers={"HX-Request": "true"}).content.decode()
    tree = parse(html)
    [dialog] = tree.find_all(lambda n: "search-dialog" in n.classes)
    assert dialog.get("role") == "dialog"
    links = dialog.find_all(lambda n: "hit-link" in n.classes)
    shown = [
        (
            n.find_all(lambda m: "hit-title" in m.classes)[0].text,
            n.find_all(lambda m: "hit-meta" in m.classes)[0].text,
            n.find_all(lambda m: "hit-snippet" in m.classes)[0].text,
        )
        for n in links
    ]
    assert shown == [
        ("Trip planning", "just now", "Found the needle: here"),
        ("Trip planning", "2\xa0hours ago", "The needle is in haystack.md"),
    ]
    assert "#1" not in html and "user text" not in html
    assert "<mark>needle</mark>" in html


def test_a_message_every_version_copies_is_one_hit_in_its_newest_version():
    """Regenerate copies the conversation's chunks into the new version: the search shows
    each message once, opening the newest version; another conversation's copy (a plain
    branch) is a hit of its own."""
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    tab = Tab.objects.create(owner=user, title="Trip planning")
    log.append(
        tab.id,
        [
            block("text", {"text": "Where is the needle?"}, role="user", turn_id=TURN),
            block("text", {"text": "Under the hay."}, role="assistant", turn_id=TURN),
        ],
    )
    latest = turns.regenerate(tab, 2).tab
    plain = turns.branch(tab, 2).tab
    client = Client()
    client.force_login(user)
    html = client.get("/search/", {"q": "needle"}, headers={"HX-Request": "true"}).content.decode()
    hrefs = [n.get("href") for n in parse(html).find_all(lambda n: "hit-link" in n.classes)]
    assert sorted(h.split("?")[0] for h in hrefs) == sorted([f"/t/{latest.id}/", f"/t/{plain.id}/"])
