"""The sidebar search (fragment and page) and the tab page opened at a chunk (?seq=)."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from chat import log, search
from chat.models import Setting, Tab
from chat.stream import Block

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = 20


@pytest.fixture(autouse=True)
def _empty_index():
    # Django's flush between transactional tests leaves the index's plain tables as they were.
    with connection.cursor() as cursor:
        search.clear(cursor)


@pytest.fixture
def alice():
    return User.objects.create_user("alice")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice) -> Tab:
    """100 chunks; seq 10 says "needle", and pages are 20 chunks."""
    Setting.objects.create(key="page_size", value=PAGE)
    tab = Tab.objects.create(owner=alice, title="Haystack", model="offline/demo")
    words = [("needle <b>here</b>" if n == 10 else f"hay {n}") for n in range(1, 101)]
    log.append(tab.pk, [Block(uuid.uuid4(), None, 0, "user", "text", {"text": w}) for w in words])
    return tab


def in_log(html: str) -> str:
    return html.split('id="log"', 1)[1].split('id="queued"', 1)[0]


def seqs(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-seq="(\d+)"', in_log(html))]


def test_the_fragment_lists_hits_that_open_the_tab_at_their_chunk(client, tab):
    response = client.get("/search/", {"q": "needle"}, headers={"HX-Request": "true"})

    assert response.status_code == 200
    html = response.content.decode()
    assert f'href="/t/{tab.pk}/?seq=10"' in html
    snippet = html.split('class="hit-snippet">', 1)[1].split("</span>", 1)[0]
    # SQLite's snippet escapes the markup; PostgreSQL's headline leaves it out.
    assert snippet.startswith("<mark>needle</mark>") and "<b>" not in snippet
    assert "Haystack" in html and "<aside" not in html


def test_the_fragment_says_when_nothing_matched_and_is_empty_for_no_query(client, tab):
    none = client.get("/search/", {"q": "absent"}, headers={"HX-Request": "true"})
    empty = client.get("/search/", {"q": "  "}, headers={"HX-Request": "true"})

    assert none.status_code == 200 and "Nothing found for “absent”." in none.content.decode()
    assert empty.status_code == 200 and empty.content.decode().strip() == ""


@pytest.mark.parametrize(
    ("q", "message"),
    [
        ('"*(', "The search has no letters or digits to look for."),
        ("x" * 201, "A search can be at most 200 characters."),
    ],
)
def test_a_query_with_nothing_to_search_for_is_a_422_with_the_reason(client, tab, q, message):
    response = client.get("/search/", {"q": q}, headers={"HX-Request": "true"})
    assert response.status_code == 422
    assert message in response.content.decode()


def test_without_htmx_it_is_a_page_with_the_hits_in_its_sidebar(client, tab):
    response = client.get("/search/", {"q": "needle"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "<aside" in html and f'href="/t/{tab.pk}/?seq=10"' in html
    assert 'value="needle"' in html


def test_search_needs_a_login(tab):
    response = Client().get("/search/", {"q": "needle"})
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_every_page_has_the_search_box(client, tab):
    html = client.get(f"/t/{tab.pk}/").content.decode()
    assert 'id="search-q"' in html and 'hx-get="/search/"' in html


def test_a_tab_opened_at_a_seq_shows_the_window_around_it_highlighted_and_detached(client, tab):
    html = client.get(f"/t/{tab.pk}/", {"seq": 30}).content.decode()

    assert seqs(html) == list(range(21, 41))
    [hit] = re.findall(r'class="([^"]*\bhit\b[^"]*)" id="chunk-[^"]+" data-seq="(\d+)"', html)
    assert hit[1] == "30"
    # Not the live end: the "newer" link, and the seq the socket's hello starts from.
    assert 'id="newer"' in in_log(html) and 'data-live-seq="100"' in html
    assert 'id="older"' in in_log(html)


def test_a_seq_near_the_end_opens_the_live_page(client, tab):
    html = client.get(f"/t/{tab.pk}/", {"seq": 95}).content.decode()

    assert seqs(html) == list(range(81, 101))
    assert 'id="newer"' not in in_log(html) and "data-live-seq" not in html
    assert re.search(r'class="[^"]*\bhit\b[^"]*" id="chunk-[^"]+" data-seq="95"', html)


def test_the_plain_tab_page_is_unchanged(client, tab):
    html = client.get(f"/t/{tab.pk}/").content.decode()
    assert seqs(html) == list(range(81, 101))
    assert 'id="newer"' not in in_log(html) and " hit" not in in_log(html)


@pytest.mark.parametrize(
    ("seq", "message"),
    [
        ("abc", "?seq= must be a chunk seq (a whole number)."),
        ("", "?seq= must be a chunk seq (a whole number)."),
        ("0", "?seq= must be at least 1."),
        ("-3", "?seq= must be at least 1."),
    ],
)
def test_a_bad_seq_is_a_400_with_the_reason(client, tab, seq, message):
    response = client.get(f"/t/{tab.pk}/", {"seq": seq})
    assert response.status_code == 400
    assert response.content.decode() == message


def test_a_seq_past_the_end_opens_the_live_page(client, tab):
    html = client.get(f"/t/{tab.pk}/", {"seq": 5000}).content.decode()
    assert seqs(html) == list(range(81, 101))
