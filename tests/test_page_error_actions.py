"""An error's main action is its fix (issue 31): a configuration error (no key, a refused
key, a model the provider does not know) leads to where it is fixed, and offers no Continue
(nothing can go on before the fix); an error a retry may get past keeps Continue. No error
card offers Regenerate or Branch from here (its Retry asks again; a branch that keeps the
error helps nobody)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat import log
from chat.chunks import ErrorFix
from chat.models import Tab
from chat.providers.base import ProviderError
from chat.providers.errors import explain, where_to_fix
from chat.providers.registry import KEY_BOUND_ELSEWHERE, ProviderConfigError
from chat.render import fragment_seal
from tests.ui_helpers import block, parse, top

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")
MODEL = "anthropic/claude-sonnet-4-5"


def error(message: str, status: int | None = None, kind: str | None = None) -> ProviderError:
    exc = ProviderError(message, status_code=status, error_type=kind)
    return exc


@pytest.mark.parametrize(
    ("exc", "fix"),
    [
        (ProviderConfigError("No API key for Anthropic"), ErrorFix.CONNECTIONS),
        (error("invalid x-api-key", 401, "authentication_error"), ErrorFix.CONNECTIONS),
        (error("not allowed", 403, "permission_error"), ErrorFix.CONNECTIONS),
        (error("saved for another endpoint", None, KEY_BOUND_ELSEWHERE), ErrorFix.CONNECTIONS),
        (error("model: claude-nope", 404, "not_found_error"), ErrorFix.MODEL),
        (error("The model `gpt-nope` does not exist", 404), ErrorFix.MODEL),
        (error("Overloaded", 529, "overloaded_error"), ""),
        (error("rate limited", 429, "rate_limit_error"), ""),
        (error("no route", 404), ""),
        (error("internal", 500, "api_error"), ""),
    ],
)
def test_where_each_error_is_fixed(exc, fix):
    assert where_to_fix(exc) == fix
    data = explain(exc, model=MODEL).data()
    assert data.get("fix", "") == fix


def acts_of(data: dict) -> tuple[dict[str, str], list[str]]:
    """The card's fix link (href, text) and its actions' classes, as a live fragment has them."""
    [wrapper] = top(fragment_seal(block("error", data, turn_id=TURN, seq=5)))
    [chunk] = wrapper.children
    links = chunk.find_all(lambda n: "err-fix" in n.classes)
    fix = {}
    if links:
        [a] = [n for n in links[0].children if n.tag == "a"]
        fix = {"href": a.get("href"), "text": a.text, "class": " ".join(sorted(a.classes))}
    acts = [
        next(c for c in n.classes if c.startswith("act-"))
        for n in chunk.find_all(lambda n: any(c.startswith("act-") for c in n.classes))
    ]
    return fix, acts


def test_a_missing_or_refused_key_leads_to_settings_connections_and_offers_no_continue():
    for data in (
        {"message": "No API key", "summary": "Anthropic is not set up", "fix": "connections"},
        # An error from before `fix` was recorded: its 401 says the same.
        {"message": "Anthropic error 401 (authentication_error)", "status_code": 401},
    ):
        fix, acts = acts_of(data)
        assert fix == {
            "href": "/settings/",
            "text": "Fix it in Settings → Connections",
            "class": "btn primary small",
        }
        assert acts == ["act-retry"]


def test_an_unknown_model_leads_to_the_model_picker():
    fix, acts = acts_of({"message": "model: claude-nope", "status_code": 404, "fix": "model"})
    assert (fix["href"], fix["text"]) == ("#model-picker", "Choose another model")
    assert acts == ["act-retry"]


def test_an_error_a_retry_may_get_past_offers_continue_and_no_fix():
    fix, acts = acts_of({"message": "Overloaded", "status_code": 529})
    assert fix == {}
    assert acts == ["act-retry", "act-continue"]


@pytest.mark.django_db
def test_on_the_page_too_a_configuration_error_is_fixed_not_continued():
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    tab = Tab.objects.create(owner=user, model=MODEL)
    log.append(
        tab.id,
        [
            block("text", {"text": "hello"}, role="user", turn_id=TURN),
            block("error", {"message": "No API key", "fix": "connections"}, turn_id=TURN),
        ],
    )
    client = Client()
    client.force_login(user)
    page = parse(client.get(reverse("tab", args=[tab.id])).content.decode())
    card = page.find_all(lambda n: "t-error" in n.classes)[0]
    assert card.find_all(lambda n: "err-fix" in n.classes)
    classes = {c for n in card.iter() for c in n.classes}
    assert "act-retry" in classes
    assert not classes & {"act-continue", "act-regenerate", "act-branch"}
