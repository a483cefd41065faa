"""The error card's markup: the summary heads it, the provider's words follow, the hint
(escaped, `names` as code) says what to do, the endpoint is shown once, and Retry is
there; the same on a live fragment and on the page."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat import log
from chat.models import Tab
from chat.render import code_spans, fragment_seal
from tests.ui_helpers import block, parse, top

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")
URL = "http://127.0.0.1:8099/v1"
HOSTILE = {
    "message": "OpenAI-compatible server error 401: <img src=x onerror=alert(1)>",
    "status_code": 401,
    "summary": "The <b>server</b> did not accept the API key",
    "hint": "The key comes from `OPENAI_API_KEY</code><script>x()</script>` in the "
    "server's environment: set a valid key there & restart the server, then Retry.",
    "base_url": URL,
}


def card_of(data: dict, *, seq: int = 5):
    [wrapper] = top(fragment_seal(block("error", data, turn_id=TURN, seq=seq)))
    [chunk] = wrapper.children
    [card] = chunk.children
    return chunk, card


def by_class(node, name: str):
    found = node.find_all(lambda n: name in n.classes)
    assert len(found) <= 1
    return found[0] if found else None


def test_an_explained_error_shows_summary_message_hint_endpoint_and_retry():
    chunk, card = card_of(HOSTILE)
    assert chunk.get("role") == "alert"
    head = by_class(card, "card-head")
    assert by_class(head, "err-summary").text == HOSTILE["summary"]
    assert by_class(head, "status-code").text == "401"
    assert by_class(card, "err-msg").text == HOSTILE["message"]
    hint = by_class(card, "err-hint")
    assert hint.text == HOSTILE["hint"].replace("`", "")
    [code] = [n for n in hint.children if n.tag == "code"]
    assert code.text == "OPENAI_API_KEY</code><script>x()</script>"
    assert by_class(card, "err-url").text == f"Sent to {URL}"
    retry = by_class(card, "act-retry")
    assert (retry.get("form"), retry.get("value"), retry.text) == ("retry-form", "5", "Retry")


def test_nothing_in_an_error_becomes_markup():
    """Summary, message, hint and URL are text: only the hint's code spans are elements."""
    _, card = card_of(HOSTILE)
    tags = {n.tag for n in card.iter()}
    assert not tags & {"b", "img", "script"}
    html = fragment_seal(block("error", HOSTILE, turn_id=TURN, seq=5))
    assert "<script>" not in html and "<img" not in html and "<b>" not in html


def test_the_endpoint_is_not_repeated_when_the_hint_names_it():
    data = {**HOSTILE, "hint": f"Nothing answers at `{URL}` (connection refused)."}
    _, card = card_of(data)
    assert by_class(card, "err-url") is None
    assert URL in by_class(card, "err-hint").text


def test_an_error_from_before_explanations_still_renders_as_before():
    """Error chunks already in logs (and imports) have only message and status code."""
    _, card = card_of({"message": "Anthropic error 529 (overloaded_error)", "status_code": 529})
    assert by_class(card, "card-head").text.split() == ["Error", "529"]
    assert by_class(card, "err-hint") is None and by_class(card, "err-url") is None
    assert by_class(card, "act-retry") is not None


def test_code_spans_escape_first():
    assert str(code_spans("a `<i>` & `b`")) == "a <code>&lt;i&gt;</code> &amp; <code>b</code>"
    assert str(code_spans("an `unclosed <span")) == "an `unclosed &lt;span"


@pytest.mark.django_db
def test_the_tab_page_shows_the_card_with_its_hint_and_retry():
    user = get_user_model().objects.create_user("alice", password="pw-for-tests-only")
    tab = Tab.objects.create(owner=user, model="openai/gpt-4.1")
    user_turn = block("text", {"text": "hi"}, role="user", turn_id=TURN)
    error = block("error", HOSTILE, turn_id=TURN)
    log.append(tab.pk, [user_turn, error])
    client = Client()
    client.force_login(user)
    response = client.get(f"/t/{tab.pk}/")
    assert response.status_code == 200
    cards = parse(response.content.decode()).find_all(lambda n: "error" in n.classes)
    [card] = [c for c in cards if c.tag == "div" and "card" in c.classes]
    assert by_class(card, "err-summary").text == HOSTILE["summary"]
    assert by_class(card, "err-hint").text == HOSTILE["hint"].replace("`", "")
    assert by_class(card, "act-retry").get("form") == "retry-form"
    assert "<script>x()" not in response.content.decode()
