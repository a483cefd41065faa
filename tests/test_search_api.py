"""GET /api/v1/search: hits as JSON (validated against openapi.yaml), and every bad input a 4xx."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from chat import log, search
from chat.models import ApiToken, Tab
from chat.stream import Block
from tests.api_helpers import ApiClient

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/search"


@pytest.fixture(autouse=True)
def _empty_index():
    # Django's flush between transactional tests leaves the index's plain tables as they were.
    with connection.cursor() as cursor:
        search.clear(cursor)


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice")


@pytest.fixture
def api(alice) -> ApiClient:
    return ApiClient(token=ApiToken.issue(alice, name="laptop", read_only=True)[1])


@pytest.fixture
def tab(alice) -> Tab:
    tab = Tab.objects.create(owner=alice, title="Deploys")
    log.append(
        tab.pk,
        [
            Block(uuid.uuid4(), None, 0, "user", "text", {"text": "how do I deploy <it>?"}),
            Block(uuid.uuid4(), None, 0, "assistant", "thinking", {"text": "deploy with make"}),
        ],
    )
    return tab


def test_it_returns_hits_with_their_tab_seq_snippet_and_link(api, tab):
    response = api.get(URL, {"q": "deploy"})

    assert response.status_code == 200
    hits = response.json()["hits"]
    assert [(h["seq"], h["type"], h["role"]) for h in hits] == [
        (2, "thinking", "assistant"),
        (1, "text", "user"),
    ]
    assert hits[1]["tab_id"] == str(tab.pk) and hits[1]["tab_title"] == "Deploys"
    assert hits[1]["url"] == f"/t/{tab.pk}/?seq=1"
    assert "<mark>deploy</mark>" in hits[1]["snippet"] and "<it>" not in hits[1]["snippet"]


def test_it_filters_by_tab_role_type_and_limit(api, tab, alice):
    other = Tab.objects.create(owner=alice)
    log.append(other.pk, [Block(uuid.uuid4(), None, 0, "user", "text", {"text": "deploy"})])

    assert len(api.get(URL, {"q": "deploy"}).json()["hits"]) == 3
    assert len(api.get(URL, {"q": "deploy", "tab": str(tab.pk)}).json()["hits"]) == 2
    assert len(api.get(URL, {"q": "deploy", "role": "user"}).json()["hits"]) == 2
    assert len(api.get(URL, {"q": "deploy", "type": "thinking"}).json()["hits"]) == 1
    assert len(api.get(URL, {"q": "deploy", "limit": "1"}).json()["hits"]) == 1
    assert len(api.get(URL, {"q": "deploy", "limit": "5000"}).json()["hits"]) == 3


@pytest.mark.parametrize(
    ("q", "hits"),
    [
        ('"deploy', 2),
        ("deploy*", 2),
        ("(deploy", 2),
        ("deploy)", 2),
        ("-deploy", 2),
        ("deploy:", 2),
        ("DÉPLOY", 2),
        # One word, one phrase: "near deploy" is not in the log.
        ("NEAR(deploy", 0),
        ("deploy AND", 0),
    ],
)
def test_query_syntax_is_searched_as_text(api, tab, q, hits):
    response = api.get(URL, {"q": q})
    assert response.status_code == 200, response.content
    assert len(response.json()["hits"]) == hits


@pytest.mark.parametrize(
    ("params", "status", "code", "message"),
    [
        ({}, 400, "missing_parameter", "?q= is required: the words to search for."),
        ({"q": ""}, 400, "invalid_query", "Type a word to search for."),
        ({"q": "*"}, 400, "invalid_query", "The search has no letters or digits to look for."),
        ({"q": '"'}, 400, "invalid_query", "The search has no letters or digits to look for."),
        ({"q": "x" * 201}, 400, "invalid_query", "A search can be at most 200 characters."),
        (
            {"q": "deploy", "role": "system"},
            400,
            "invalid_query",
            "role must be one of: user, assistant, tool (got 'system').",
        ),
        (
            {"q": "deploy", "type": "nope"},
            400,
            "invalid_query",
            "type must be one of: text, thinking, tool_call, tool_result, error (got 'nope').",
        ),
        (
            {"q": "deploy", "tab": "abc"},
            400,
            "invalid_parameter",
            "?tab= must be a tab id (a UUID), not 'abc'.",
        ),
        ({"q": "deploy", "limit": "-1"}, 400, "invalid_parameter", "?limit= must be at least 1."),
        (
            {"q": "deploy", "limit": "abc"},
            400,
            "invalid_parameter",
            "?limit= must be a whole number, not 'abc'.",
        ),
    ],
)
def test_bad_input_is_a_4xx_with_a_message(api, tab, params, status, code, message):
    response = api.get(URL, params)
    assert response.status_code == status
    assert response.json() == {"error": {"code": code, "message": message}}


def test_another_users_tab_is_404(api, tab):
    bob = get_user_model().objects.create_user("bob")
    theirs = Tab.objects.create(owner=bob)

    response = api.get(URL, {"q": "deploy", "tab": str(theirs.pk)})

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_it_needs_a_token_or_a_session(tab):
    response = ApiClient().get(URL, {"q": "deploy"})
    assert response.status_code == 401
