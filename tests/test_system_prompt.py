"""A tab's own system prompt: editable until the first message, frozen after (issue 15.6)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chat import turns
from chat.forms import MAX_SYSTEM_PROMPT_CHARS
from chat.models import Setting, Tab
from chat.preferences import DEFAULT_SYSTEM_PROMPT, new_tab
from chat.providers.base import Finish, TextDelta
from chat.providers.replay import ScriptedProvider
from chat.turn import step
from tests.engine import Watcher, make_tab, running_worker, submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice():
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice) -> Tab:
    return new_tab(alice, "offline/demo")


def save(client: Client, tab: Tab, text: str):
    return client.post(
        reverse("tab_system_prompt", args=[tab.id]), {"system_prompt": text}, follow=True
    )


def page(client: Client, tab: Tab) -> str:
    return client.get(reverse("tab", args=[tab.id])).content.decode()


def test_a_new_tab_shows_the_default_prompt_editable(client, tab):
    Setting.objects.create(key="system_prompt", value="Answer like a pirate.")
    fresh = new_tab(tab.owner, "offline/demo")
    html = page(client, fresh)
    assert 'id="sysprompt-edit"' in html and "Answer like a pirate." in html
    assert "editable until the first message" in html


def test_the_prompt_saved_before_the_first_message_is_the_tabs(client, tab):
    response = save(client, tab, "  You review Go code.  \n")
    assert "Saved this tab" in response.content.decode()
    tab.refresh_from_db()
    assert tab.system_prompt == "You review Go code."
    # Other tabs and the default are untouched.
    assert new_tab(tab.owner, "offline/demo").system_prompt == DEFAULT_SYSTEM_PROMPT


def test_after_the_first_message_it_is_frozen_and_shown_read_only(client, tab):
    save(client, tab, "First prompt.")
    turns.submit(tab, "hello")
    response = save(client, tab, "Second prompt.")
    assert "fixed once the first message is sent" in response.content.decode()
    tab.refresh_from_db()
    assert tab.system_prompt == "First prompt."
    html = page(client, tab)
    assert 'id="sysprompt-edit"' not in html
    assert "First prompt." in html and "Fixed once the first message is sent" in html


def test_too_long_or_another_users_tab_changes_nothing(client, tab):
    response = save(client, tab, "x" * (MAX_SYSTEM_PROMPT_CHARS + 1))
    assert "at most" in response.content.decode()
    tab.refresh_from_db()
    assert tab.system_prompt == DEFAULT_SYSTEM_PROMPT
    bob = User.objects.create_user("bob", password="pw")
    other = new_tab(bob, "offline/demo")
    assert save(client, other, "mine now").status_code == 404
    other.refresh_from_db()
    assert other.system_prompt == DEFAULT_SYSTEM_PROMPT


def test_the_prompt_is_escaped_in_the_page(client, tab):
    save(client, tab, "<script>alert(1)</script>")
    html = page(client, tab)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


async def test_the_model_is_sent_the_tabs_own_prompt(monkeypatch):
    provider = ScriptedProvider([[TextDelta("ok"), Finish()]])

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    tab = await make_tab()
    await database_sync_to_async(turns.set_system_prompt)(tab, "Only ever say ok.")
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "hi")
        await watcher.until_idle()
    assert [r.system for r in provider.requests] == ["Only ever say ok."]
