"""The web UI's views: accounts, tabs, the chat page and its actions, settings."""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat import bus, log, turns, worker
from chat.forms import SETTINGS_SECTIONS
from chat.models import (
    ApiKey,
    Chunk,
    ProviderEndpoint,
    QueuedMessage,
    RunningTurn,
    Setting,
    Tab,
    set_setting,
)
from chat.preferences import DEFAULT_SYSTEM_PROMPT
from chat.providers import check, default_model
from chat.providers.base import Finish, TextDelta
from chat.providers.replay import ScriptedProvider
from chat.turn import lease, step
from tests.engine import TURN_TIMEOUT, Watcher, make_tab, running_worker, submit
from tests.ui_helpers import block, parse, seed_every_type

pytestmark = pytest.mark.django_db

User = get_user_model()
HOSTILE = [
    "<script>alert('x')</script>",
    "<img src=x onerror=alert(1)>",
    "[click me](javascript:alert(1))",
]


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery", is_staff=True)


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


@pytest.fixture
def client_alice(alice):
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice):
    return Tab.objects.create(owner=alice, model="offline/demo", system_prompt="be brief")


def page(response) -> str:
    return response.content.decode()


def assert_inert(tree) -> None:
    assert not tree.find_all(lambda n: n.tag in ("script", "img"))
    for node in tree.iter():
        for name, value in node.attrs.items():
            assert not name.startswith("on"), (node.tag, name)
            assert "javascript:" not in (value or "").lower(), (node.tag, name, value)


# --- Accounts --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("home", {}),
        ("settings", {}),
        ("tab", {"tab_id": uuid.uuid4()}),
        ("tab_older", {"tab_id": uuid.uuid4()}),
        ("tab_delete", {"tab_id": uuid.uuid4()}),
    ],
)
def test_it_requires_login(alice, name, kwargs):
    """Every page sends an anonymous visitor to the login page."""
    response = Client().get(reverse(name, kwargs=kwargs))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_it_requires_login_for_actions(alice, tab):
    """Posting to an action anonymously changes nothing."""
    response = Client().post(reverse("tab_send", args=[tab.id]), {"text": "hi"})
    assert response.status_code == 302
    assert not QueuedMessage.objects.exists()


def test_it_shows_the_owner_setup_page_on_a_fresh_install():
    """No users: the first visit ends on the one-time setup page."""
    client = Client()
    response = client.get(reverse("home"), follow=True)
    assert response.redirect_chain[-1][0] == reverse("setup")
    assert "Create the owner account" in page(response)
    # The password rules are a list: in a <p> the browser splits it and leaves an empty
    # paragraph (a gap) under them.
    html = page(response)
    assert '<div class="help" id="id_password1_helptext"><ul>' in html
    assert '<p class="help"><ul>' not in html


def test_it_creates_the_owner_and_logs_them_in():
    """The setup form creates a superuser with staff rights and logs them in."""
    client = Client()
    response = client.post(
        reverse("setup"),
        {
            "username": "owner",
            "password1": "a long passphrase 42",
            "password2": "a long passphrase 42",
        },
    )
    assert response.status_code == 302 and response.url == reverse("home")
    owner = User.objects.get()
    assert owner.username == "owner" and owner.is_superuser and owner.is_staff
    assert client.get(reverse("home")).status_code == 200


def test_it_shows_setup_errors_and_creates_nobody():
    """Mismatched passwords: the form says so and no account exists."""
    response = Client().post(
        reverse("setup"),
        {"username": "owner", "password1": "a long passphrase 42", "password2": "different 42!"},
    )
    assert response.status_code == 200
    assert "password fields didn’t match" in page(response)
    assert not User.objects.exists()


def test_it_shows_setup_only_once(alice):
    """Once a user exists the setup page is gone: it leads to the login page, and posting to it
    creates no one."""
    client = Client()
    assert client.get(reverse("setup")).url == reverse("login")
    client.post(
        reverse("setup"),
        {
            "username": "mallory",
            "password1": "a long passphrase 42",
            "password2": "a long passphrase 42",
        },
    )
    assert not User.objects.filter(username="mallory").exists()
    response = client.get(reverse("home"), follow=True)
    assert response.redirect_chain[-1][0].startswith(reverse("login"))
    assert "Log in" in page(response)


def test_it_logs_in_and_out(alice):
    """Good credentials log in; a bad password says so; logout (POST) logs out."""
    client = Client()
    bad = client.post(reverse("login"), {"username": "alice", "password": "nope"})
    assert bad.status_code == 200 and "correct username and password" in page(bad)
    good = client.post(reverse("login"), {"username": "alice", "password": "correct horse battery"})
    assert good.status_code == 302
    assert client.get(reverse("home")).status_code == 200
    client.post(reverse("logout"))
    assert client.get(reverse("home")).status_code == 302


# --- Tabs and ownership ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, name, data",
    [
        ("get", "tab", None),
        ("get", "tab_older", {"before": "5"}),
        ("get", "tab_delete", None),
        ("post", "tab_delete", {}),
        ("post", "tab_rename", {"title": "mine now"}),
        ("post", "tab_model", {"model": "offline/demo"}),
        ("post", "tab_send", {"text": "hello"}),
        ("post", "tab_stop", {}),
        ("post", "tab_approve", {"approve": "c1"}),
    ],
)
def test_it_hides_another_users_tab(bob, tab, method, name, data):
    """Another user's tab is a 404 for every view, and nothing changes."""
    client = Client()
    client.force_login(bob)
    response = getattr(client, method)(reverse(name, args=[tab.id]), data or {})
    assert response.status_code == 404
    tab.refresh_from_db()
    assert tab.title == "" and not QueuedMessage.objects.exists()


def test_it_creates_a_tab_with_the_default_model_and_prompt(client_alice, alice):
    """New tab: owned by the user, the default model, the default system prompt frozen in."""
    response = client_alice.post(reverse("tab_new"))
    tab = Tab.objects.get()
    assert response.url == reverse("tab", args=[tab.id])
    assert tab.owner == alice
    assert tab.model == default_model()
    assert tab.system_prompt == DEFAULT_SYSTEM_PROMPT


def test_it_freezes_the_configured_prompt_and_model_into_a_new_tab(client_alice):
    """The settings' prompt and default model apply to tabs created after they change."""
    set_setting("system_prompt", "Answer in French.")
    set_setting("default_model", "offline/demo")
    client_alice.post(reverse("tab_new"))
    set_setting("system_prompt", "Answer in German.")
    tab = Tab.objects.get()
    assert (tab.system_prompt, tab.model) == ("Answer in French.", "offline/demo")


def test_it_lists_the_users_tabs_newest_first_with_a_running_indicator(client_alice, alice, bob):
    """The sidebar: own tabs only, most recent activity first, running ones marked."""
    old = Tab.objects.create(owner=alice, title="old one")
    new = Tab.objects.create(owner=alice, title="new one")
    Tab.objects.create(owner=bob, title="bobs secret")
    RunningTurn.objects.create(
        tab=old, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    log.append(new.id, [block("text", {"text": "hi"}, role="user", step=0)])
    html = page(client_alice.get(reverse("tab", args=[new.id])))
    tree = parse(html)
    links = tree.find_all(lambda n: "tab-link" in n.classes)
    assert [n.find_all(lambda x: "tab-title" in x.classes)[0].text for n in links] == [
        "new one",
        "old one",
    ]
    assert "running" in links[1].classes and "running" not in links[0].classes
    assert "current" in links[0].classes
    assert "bobs secret" not in html


def test_it_redirects_home_to_the_latest_tab(client_alice, alice):
    """Home opens the most recently active tab, or offers a new one when there is none (a
    tab never sent to and untitled is none: tests/test_versions_views.py)."""
    assert "No tabs yet" in page(client_alice.get(reverse("home")))
    tab = Tab.objects.create(owner=alice, title="Plans")
    assert client_alice.get(reverse("home")).url == reverse("tab", args=[tab.id])


def test_it_renames_a_tab(client_alice, tab):
    """Rename sets the title; too long a title is refused with a message."""
    client_alice.post(reverse("tab_rename", args=[tab.id]), {"title": "  Plans  "})
    tab.refresh_from_db()
    assert tab.title == "Plans"
    response = client_alice.post(
        reverse("tab_rename", args=[tab.id]), {"title": "x" * 201}, follow=True
    )
    tab.refresh_from_db()
    assert tab.title == "Plans"
    assert "at most 200 characters" in page(response)


def test_it_deletes_a_tab_after_confirmation(client_alice, tab):
    """GET asks (saying how much goes), POST deletes the tab and its log."""
    log.append(tab.id, [block("text", {"text": "hi"}, role="user", step=0)])
    confirm = client_alice.get(reverse("tab_delete", args=[tab.id]))
    assert confirm.status_code == 200 and "1 chunk" in page(confirm)
    assert Tab.objects.filter(pk=tab.pk).exists()
    response = client_alice.post(reverse("tab_delete", args=[tab.id]))
    assert response.url == reverse("home")
    assert not Tab.objects.filter(pk=tab.pk).exists()


def test_it_stops_a_running_turn_before_deleting_its_tab(client_alice, tab):
    """Deleting a tab asks its running turn to stop (the row goes with the tab)."""
    group_channel = async_to_sync(get_channel_layer().new_channel)()
    async_to_sync(get_channel_layer().group_add)(bus.control_group(tab.id), group_channel)
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    client_alice.post(reverse("tab_delete", args=[tab.id]))
    message = async_to_sync(get_channel_layer().receive)(group_channel)
    assert message == {"type": "turn.cancel", "tab_id": str(tab.id)}


def test_it_changes_the_tabs_model_to_a_listed_one_only(client_alice, tab, monkeypatch):
    """The model picker accepts the models the server offers and refuses others."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-for-tests-1234")
    response = client_alice.post(
        reverse("tab_model", args=[tab.id]), {"model": "anthropic/claude-sonnet-4-5"}
    )
    assert response.status_code == 302
    tab.refresh_from_db()
    assert tab.model == "anthropic/claude-sonnet-4-5"
    response = client_alice.post(
        reverse("tab_model", args=[tab.id]), {"model": "evil/model"}, follow=True
    )
    tab.refresh_from_db()
    assert tab.model == "anthropic/claude-sonnet-4-5"
    assert "is not a model this server offers" in page(response)


def test_changing_the_model_of_an_idle_tab_leaves_a_system_chunk(client_alice, tab, monkeypatch):
    """With no turn running, the change is a role=system chunk in the log at once."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-for-tests-1234")
    previous = tab.model
    client_alice.post(reverse("tab_model", args=[tab.id]), {"model": "anthropic/claude-sonnet-4-5"})
    [chunk] = log.tail(tab.id)
    assert (chunk.role, chunk.type, chunk.data["kind"]) == ("system", "system", "model-changed")
    assert chunk.data["text"] == f"Model changed from {previous} to anthropic/claude-sonnet-4-5."


def test_changing_the_model_during_a_turn_is_left_to_the_turn(client_alice, tab):
    """A running turn reports it at its next step (config-reload); nothing is added now."""
    from django.utils import timezone

    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    client_alice.post(reverse("tab_model", args=[tab.id]), {"model": "anthropic/claude-sonnet-4-5"})
    assert log.tail(tab.id) == []


def test_it_labels_the_offline_model_honestly(client_alice, tab):
    """The picker calls the offline model the offline demo model, and it is the current one."""
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    [option] = tree.find_all(lambda n: n.tag == "button" and n.get("value") == "offline/demo")
    assert " ".join(option.text.split()) == "Offline demo model offline/demo"
    assert option.get("aria-current") == "true"


# --- The chat page -------------------------------------------------------------------------------


def test_it_renders_every_chunk_type_grouped(client_alice, tab):
    """The page shows each chunk once, by id and seq; the result inside its call's card."""
    blocks = seed_every_type(tab.id)
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    log_el = tree.by_id("log")
    ids = [c.get("id") for c in log_el.children]
    expected = [b for k, b in blocks.items() if k != "result"]
    assert ids == [f"chunk-{b.id}" for b in expected]
    assert [c.get("data-seq") for c in log_el.children] == [str(b.seq) for b in expected]
    card = log_el.by_id(f"chunk-{blocks['call'].id}")
    slot = card.find_all(lambda n: n.get("data-slot"))[0]
    assert [c.get("id") for c in slot.children] == [f"chunk-{blocks['result'].id}"]
    assert "README.md" in slot.text
    user = log_el.by_id(f"chunk-{blocks['user'].id}")
    assert "user" in user.classes
    thinking = log_el.by_id(f"chunk-{blocks['thinking'].id}")
    assert thinking.tag == "details" and "open" not in thinking.attrs and "1.5 s" in thinking.text
    assert "529" in log_el.by_id(f"chunk-{blocks['error'].id}").text
    assert "alone" in log_el.by_id(f"chunk-{blocks['notice'].id}").classes
    ws = tree.find_all(lambda n: n.get("ws-connect"))[0]
    assert ws.get("ws-connect") == f"/ws/tabs/{tab.id}/" and ws.get("hx-ext") == "ws"


def test_it_expands_thinking_when_the_setting_says_so(client_alice, tab):
    """'Expand thinking' renders reasoning open."""
    blocks = seed_every_type(tab.id)
    set_setting("expand_thinking", True)
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    assert "open" in tree.by_id(f"chunk-{blocks['thinking'].id}").attrs


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_it_renders_hostile_messages_inert(client_alice, tab, role):
    """Script tags, event handlers and javascript: links in a message do nothing."""
    log.append(tab.id, [block("text", {"text": t}, role=role, step=0) for t in HOSTILE])
    log_el = parse(page(client_alice.get(reverse("tab", args=[tab.id])))).by_id("log")
    assert len(log_el.children) == len(HOSTILE)
    assert_inert(log_el)
    assert "<script>alert('x')</script>" in log_el.text


def test_it_pages_the_log_and_loads_older_chunks(client_alice, tab):
    """The page shows the last page_size chunks; 'older' loads the page before by seq."""
    set_setting("page_size", 20)
    turn = uuid.uuid4()
    log.append(tab.id, [block("text", {"text": f"m{i}"}, turn_id=turn) for i in range(45)])
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    log_el = tree.by_id("log")
    older, *chunks = log_el.children
    assert [c.get("data-seq") for c in chunks] == [str(n) for n in range(26, 46)]
    # The page starts mid-turn: its first bubble is no turn's start (app.css draws it partial).
    assert "turn-start" not in chunks[0].classes
    assert older.get("hx-get") == reverse("tab_older", args=[tab.id]) + "?before=26"
    assert older.get("hx-trigger") == "revealed"

    nodes = parse(page(client_alice.get(older.get("hx-get")))).children
    assert nodes[0].get("id") == "older"
    assert nodes[0].get("hx-get").endswith("?before=6")
    assert [n.get("data-seq") for n in nodes[1:]] == [str(n) for n in range(6, 26)]

    last = parse(page(client_alice.get(nodes[0].get("hx-get")))).children
    assert [n.get("data-seq") for n in last] == ["1", "2", "3", "4", "5"]
    assert "turn-start" in last[0].classes


def test_an_older_page_takes_its_calls_results_from_the_page_below(client_alice, tab):
    """A page that begins with a result whose call is on the page before shows it on its
    own; loading that page brings the call's card holding the result (and any other
    result of it further down), and deletes the lone copy from the page below."""
    set_setting("page_size", 20)
    turn = uuid.uuid4()
    texts = [block("text", {"text": f"m{i}"}, turn_id=turn) for i in range(19)]
    call = block("tool_call", {"call_id": "c1", "name": "shell", "arguments": {}}, turn_id=turn)
    output = block(
        "tool_result",
        {"call_id": "c1", "name": "shell", "shell_output": "x"},
        role="tool",
        turn_id=turn,
    )
    result = block(
        "tool_result",
        {"call_id": "c1", "name": "shell", "result": "ok", "is_error": False},
        role="tool",
        turn_id=turn,
    )
    other = block(
        "tool_result",
        {"call_id": "c1", "name": "shell", "result": "of another step", "is_error": False},
        role="tool",
        turn_id=turn,
        step=2,
    )
    after = [block("text", {"text": f"n{i}"}, turn_id=turn) for i in range(17)]
    log.append(tab.id, [*texts, call, output, result, other, *after])
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    older, *chunks = tree.by_id("log").children
    assert [c.get("id") for c in chunks[:3]] == [
        f"chunk-{output.id}",
        f"chunk-{result.id}",
        f"chunk-{other.id}",
    ]
    assert "Result of" in chunks[0].text

    nodes = parse(page(client_alice.get(older.get("hx-get")))).children
    card = next(n for n in nodes if n.get("id") == f"chunk-{call.id}")
    slot = card.find_all(lambda n: n.get("data-slot"))[0]
    assert [r.get("id") for r in slot.children] == [f"chunk-{output.id}", f"chunk-{result.id}"]
    assert "Result of" not in card.text
    deletes = [n for n in nodes if n.get("hx-swap-oob") == "delete"]
    assert [n.get("id") for n in deletes] == [f"chunk-{output.id}", f"chunk-{result.id}"]
    assert nodes[-len(deletes) - 1] is card


def test_the_tab_page_holds_the_dom_windows_markers_and_a_hint_css_can_hide(client_alice, tab):
    """The markers the page's script puts into #log when it drops chunks are the server's
    markup (templates), "older" waiting only for the seq the page then starts at; the empty
    tab's hint and prompt editor come after the log and the queue, whose first element
    hides them (app.css)."""
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    live = tree.by_id("live")
    assert [c.get("id") for c in live.children] == [
        "log",
        "queued",
        "empty-hint",
        "starters",  # the starter prompts, hidden with the hint
        "sysprompt-edit",  # a new tab's own prompt, hidden with the hint
        "older-template",
        "newer-template",
    ]
    assert tree.by_id("log").children == [] and tree.by_id("queued").children == []
    [older] = tree.by_id("older-template").children
    assert older.get("id") == "older" and older.get("hx-trigger") == "revealed"
    assert older.get("hx-get") == reverse("tab_older", args=[tab.id]) + "?before="
    [newer] = tree.by_id("newer-template").children
    assert newer.get("id") == "newer"
    [link] = newer.find_all(lambda n: n.tag == "a")
    assert link.get("href") == reverse("tab", args=[tab.id])


@pytest.mark.parametrize("before", ["", "abc", "0", "-3"])
def test_it_refuses_a_bad_older_cursor(client_alice, tab, before):
    """?before= must be a positive seq."""
    response = client_alice.get(reverse("tab_older", args=[tab.id]), {"before": before})
    assert response.status_code == 400
    assert "before" in page(response)


def test_it_shows_queued_messages(client_alice, tab):
    """Messages waiting for the turn show as queued, by id."""
    q = QueuedMessage.objects.create(tab=tab, text="also this")
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    assert "also this" in tree.by_id(f"queued-{q.pk}").text


def test_it_shows_approval_buttons_while_a_turn_waits(client_alice, tab):
    """A page rendered while the turn waits for approval has Approve/Deny on the call, and
    "always allow" its rule in this tab or all the user's tabs."""
    turn = uuid.uuid4()
    call = block(
        "tool_call",
        {"call_id": "c1", "name": "shell", "arguments": {"command": "ls"}},
        turn_id=turn,
    )
    log.append(tab.id, [call])
    RunningTurn.objects.create(
        tab=tab, turn_id=turn, worker="w", heartbeat_at=timezone.now(), status="waiting"
    )
    tree = parse(page(client_alice.get(reverse("tab", args=[tab.id]))))
    card = tree.by_id(f"chunk-{call.id}")
    buttons = card.find_all(lambda n: n.tag == "button")
    assert [(b.get("name"), b.get("value")) for b in buttons] == [
        ("approve", "c1"),
        ("deny", "c1"),
        ("always_tab", "c1"),
        ("always_user", "c1"),
    ]
    assert "hidden" not in tree.by_id("approval").attrs
    assert tree.by_id("status").get("data-state") == "waiting"
    assert tree.by_id("composer-actions").find_all(lambda n: n.get("form") == "stop-form")


# --- The composer ---------------------------------------------------------------------------------


def test_it_queues_a_sent_message(client_alice, tab):
    """Send persists the message as queued for a turn, and titles an untitled tab."""
    response = client_alice.post(
        reverse("tab_send", args=[tab.id]), {"text": "  Plan my week  "}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert list(QueuedMessage.objects.values_list("tab_id", "text")) == [(tab.id, "Plan my week")]
    tab.refresh_from_db()
    assert tab.title == "Plan my week"
    tree = parse(page(response))
    error = tree.by_id("composer-error")
    assert error.get("hx-swap-oob") == "true" and error.text == ""
    assert tree.by_id("tab-title").text == "Plan my week"
    assert tree.by_id(f"tablink-title-{tab.id}").get("hx-swap-oob") == "true"
    again = client_alice.post(
        reverse("tab_send", args=[tab.id]), {"text": "more"}, HTTP_HX_REQUEST="true"
    )
    assert parse(page(again)).by_id("tab-title") is None


@pytest.mark.parametrize("text", ["", "   \n  "])
def test_it_refuses_an_empty_message(client_alice, tab, text):
    """An empty message is a 422 with a clear error in the composer, and nothing is queued."""
    response = client_alice.post(
        reverse("tab_send", args=[tab.id]), {"text": text}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 422
    assert parse(page(response)).by_id("composer-error").text == "The message is empty."
    assert not QueuedMessage.objects.exists()


@pytest.mark.parametrize(
    "text",
    [
        "\u200b",
        "\u200b\u200d\ufeff",
        " \u200b \n\u2060\u00ad\u200e",
        "\ufe0f\u0301",
        "\u3164\u2800",
        "\u2028\u2029\u3000",
    ],
)
def test_it_refuses_a_message_of_invisible_characters_like_an_empty_one(client_alice, tab, text):
    """Zero-width characters, joiners, the BOM, lone marks and blank letters show nothing."""
    response = client_alice.post(
        reverse("tab_send", args=[tab.id]), {"text": text}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 422
    assert parse(page(response)).by_id("composer-error").text == "The message is empty."
    assert not QueuedMessage.objects.exists()
    with pytest.raises(ValueError, match="The message is empty."):
        turns.submit(tab, text)


@pytest.mark.parametrize(
    "text",
    [
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family: one emoji of three joined
        "\u2764\ufe0f",
        "e\u0301",
        "\u200bhi\u200b",
        "\u0928\u093f",  # Devanagari: a letter and its vowel sign
        ".",
    ],
)
def test_it_accepts_visible_text_made_with_joiners_and_marks(client_alice, tab, text):
    response = client_alice.post(
        reverse("tab_send", args=[tab.id]), {"text": text}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert list(QueuedMessage.objects.values_list("text", flat=True)) == [text]


def test_it_refuses_an_overlong_message(client_alice, tab):
    """A message past the limit is refused with its size."""
    response = client_alice.post(
        reverse("tab_send", args=[tab.id]), {"text": "x" * 100_001}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 422
    assert "at most 100000 characters" in page(response)


def test_it_sends_without_javascript(client_alice, tab):
    """Without htmx, send redirects back to the tab (and errors become messages)."""
    response = client_alice.post(reverse("tab_send", args=[tab.id]), {"text": "hi"})
    assert response.url == reverse("tab", args=[tab.id])
    response = client_alice.post(reverse("tab_send", args=[tab.id]), {"text": ""}, follow=True)
    assert "The message is empty." in page(response)


def test_it_enforces_csrf_on_forms(alice, tab):
    """A POST without the CSRF token is refused; with the page's token it goes through."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    url = reverse("tab_send", args=[tab.id])
    assert client.post(url, {"text": "hi"}).status_code == 403
    assert client.post(reverse("tab_new")).status_code == 403
    assert not QueuedMessage.objects.exists()
    html = page(client.get(reverse("tab", args=[tab.id])))
    body = parse(html).find_all(lambda n: n.tag == "body")[0]
    token = body.get("hx-headers").split('"X-CSRFToken": "')[1].split('"')[0]
    response = client.post(url, {"text": "hi"}, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert QueuedMessage.objects.count() == 1


def test_it_asks_the_running_turn_to_stop(client_alice, tab):
    """Stop marks the running turn's row and tells its worker."""
    channel = async_to_sync(get_channel_layer().new_channel)()
    async_to_sync(get_channel_layer().group_add)(bus.control_group(tab.id), channel)
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    response = client_alice.post(reverse("tab_stop", args=[tab.id]), HTTP_HX_REQUEST="true")
    assert response.status_code == 204
    assert RunningTurn.objects.get(tab=tab).cancel_requested is True
    assert async_to_sync(get_channel_layer().receive)(channel)["type"] == "turn.cancel"


def test_stop_names_the_turn_it_was_pressed_for(client_alice, tab):
    """A Stop carrying an earlier turn's id leaves the running turn alone; a bad id is refused."""
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    url = reverse("tab_stop", args=[tab.id])
    client_alice.post(url, {"turn": str(uuid.uuid4())}, HTTP_HX_REQUEST="true")
    assert RunningTurn.objects.get(tab=tab).cancel_requested is False
    assert client_alice.post(url, {"turn": "nope"}, HTTP_HX_REQUEST="true").status_code == 400
    running = RunningTurn.objects.get(tab=tab)
    client_alice.post(url, {"turn": str(running.turn_id)}, HTTP_HX_REQUEST="true")
    assert RunningTurn.objects.get(tab=tab).cancel_requested is True


@pytest.mark.parametrize("field, approved", [("approve", True), ("deny", False)])
def test_it_answers_an_approval(client_alice, tab, field, approved):
    """Approve/Deny send the answer for that call to the turn's worker."""
    channel = async_to_sync(get_channel_layer().new_channel)()
    async_to_sync(get_channel_layer().group_add)(bus.control_group(tab.id), channel)
    response = client_alice.post(
        reverse("tab_approve", args=[tab.id]), {field: "call_7"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 204
    message = async_to_sync(get_channel_layer().receive)(channel)
    assert message == {
        "type": "turn.approve",
        "tab_id": str(tab.id),
        "call_id": "call_7",
        "approved": approved,
    }


@pytest.mark.parametrize("data", [{}, {"approve": "a", "deny": "a"}, {"approve": ""}])
def test_it_refuses_an_unclear_approval(client_alice, tab, data):
    """Exactly one of approve/deny, naming a call."""
    response = client_alice.post(reverse("tab_approve", args=[tab.id]), data)
    assert response.status_code == 400


# --- Settings ------------------------------------------------------------


def settings_post(client, **data):
    """Post each Settings section whose fields `data` names, as its form does (unnamed
    fields at their defaults); the first refusal, else the last response."""
    base = {
        "default_model": "",
        "fallback_model": "",
        "system_prompt": "",
        "approve_tools": "on",
        "page_size": "200",
        "dom_window": "600",
    }
    response = None
    for section, names in SETTINGS_SECTIONS.items():
        if not set(names) & set(data):
            continue
        fields = {name: data.get(name, base.get(name, "")) for name in names}
        response = client.post(
            reverse("settings_section", args=[section]),
            {"action": "settings", "section": section, **fields},
        )
        if response.status_code != 302:
            return response
    return response


def test_it_keeps_settings_from_non_staff(bob):
    """Settings hold the API keys: a plain user gets a 403."""
    client = Client()
    client.force_login(bob)
    assert client.get(reverse("settings")).status_code == 403
    assert client.post(reverse("apikey_delete", args=["anthropic"])).status_code == 403


def test_it_saves_settings(client_alice, monkeypatch):
    """Valid settings are stored under their keys."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-for-this-test")
    response = settings_post(
        client_alice,
        default_model="anthropic/claude-sonnet-4-5",
        fallback_model="offline/demo",
        expand_thinking="on",
        approve_tools="",
        page_size="50",
        dom_window="300",
        system_prompt="Be terse.",
    )
    assert response.status_code == 302
    stored = dict(Setting.objects.values_list("key", "value"))
    assert stored["default_model"] == "anthropic/claude-sonnet-4-5"
    assert stored["fallback_model"] == "offline/demo"
    assert stored["expand_thinking"] is True and stored["approve_tools"] is False
    assert (stored["page_size"], stored["dom_window"]) == (50, 300)
    assert stored["system_prompt"] == "Be terse."


@pytest.mark.parametrize(
    "data, message",
    [
        ({"page_size": "5"}, "greater than or equal to 20"),
        ({"page_size": "abc"}, "Enter a whole number"),
        ({"dom_window": "100", "page_size": "200"}, "must hold at least one page (200 chunks)"),
        ({"dom_window": "99999"}, "less than or equal to 5000"),
        ({"default_model": "gpt"}, "is not a model id"),
        ({"default_model": "acme/x1"}, "Unknown provider “acme”"),
        ({"default_model": "offline/other"}, "The offline provider has one model"),
        ({"default_model": "offline/demo", "fallback_model": "offline/demo"}, "must differ"),
        (
            {"default_model": "anthropic/claude-sonnet-4-5"},
            "anthropic/claude-sonnet-4-5 cannot run: Anthropic has no API key",
        ),
        (
            {"fallback_model": "openai/gpt-5"},
            "openai/gpt-5 cannot run: OpenAI-compatible has no API key",
        ),
    ],
)
def test_it_validates_settings(client_alice, data, message):
    """Each bad value gets its own clear error, and nothing is saved."""
    response = settings_post(client_alice, **data)
    assert response.status_code == 422
    assert message in page(response)
    assert not Setting.objects.filter(key="page_size").exists()


def test_it_accepts_an_unlisted_model_of_a_known_provider(client_alice, monkeypatch):
    """A model the table does not list yet still works with its provider's defaults."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-for-this-test")
    assert settings_post(client_alice, default_model="openai/gpt-9").status_code == 302
    assert Setting.objects.get(key="default_model").value == "openai/gpt-9"


def test_it_stores_an_api_key_and_never_shows_it(client_alice, monkeypatch):
    """A saved key is encrypted and shown masked; the full key is in no page."""
    # A saved key is tested at its endpoint: not Anthropic's real one from a test.
    monkeypatch.setattr(check, "check_key", lambda *a, **k: check.KeyCheck(check.Outcome.OK, ""))
    secret = "sk-ant-api03-VERYSECRET-abcd1234"
    response = client_alice.post(
        reverse("settings"), {"action": "key", "provider": "anthropic", "key": secret}, follow=True
    )
    row = ApiKey.objects.get(provider="anthropic")
    assert row.get_key() == secret and secret not in row.encrypted
    html = page(response)
    assert secret not in html and "VERYSECRET" not in html
    assert row.masked in html
    assert secret not in page(client_alice.get(reverse("settings")))


@pytest.mark.parametrize(
    "key, message",
    [
        ("", "Paste the key."),
        ("sk-abc1", "too short for an API key"),
        ("sk-has a space-123", "no spaces or line breaks"),
        ("sk-ünïcode-123456", "plain ASCII"),
    ],
)
def test_it_validates_api_keys(client_alice, key, message):
    """A bad key is refused with a clear reason and is not echoed back."""
    response = client_alice.post(
        reverse("settings"), {"action": "key", "provider": "anthropic", "key": key}
    )
    assert response.status_code == 422
    assert message in page(response)
    assert not ApiKey.objects.exists()
    if key:
        assert key not in page(response)


def test_it_deletes_an_api_key(client_alice):
    """Delete removes the stored key."""
    row = ApiKey(provider="openai")
    row.set_key("sk-1234567890", endpoint="https://api.openai.com/v1")
    row.save()
    response = client_alice.post(reverse("apikey_delete", args=["openai"]), follow=True)
    assert not ApiKey.objects.exists()
    assert "Deleted the openai key" in page(response)


def test_it_saves_and_removes_an_endpoint(client_alice, alice):
    """An endpoint must be an http(s) URL; it can be removed again (by a superuser: the
    stored keys are sent there, see test_key_binding)."""
    alice.is_superuser = True
    alice.save()
    bad = client_alice.post(
        reverse("settings"),
        {"action": "endpoint", "provider": "openai", "base_url": "ftp://example.com"},
    )
    assert bad.status_code == 422 and "http:// or https:// URL" in page(bad)
    client_alice.post(
        reverse("settings"),
        {"action": "endpoint", "provider": "openai", "base_url": "http://127.0.0.1:8080/v1"},
    )
    assert ProviderEndpoint.objects.get().base_url == "http://127.0.0.1:8080/v1"
    client_alice.post(reverse("endpoint_delete", args=["openai"]))
    assert not ProviderEndpoint.objects.exists()


def test_it_refuses_an_unknown_provider_for_keys(client_alice):
    """Keys are for the providers the server knows."""
    response = client_alice.post(
        reverse("settings"), {"action": "key", "provider": "acme", "key": "sk-1234567890"}
    )
    assert response.status_code == 422 and "Select a valid choice" in page(response)


def test_it_refuses_an_unknown_settings_action(client_alice):
    """A post that is none of the settings forms is a 400."""
    assert client_alice.post(reverse("settings"), {"action": "x"}).status_code == 400


def test_it_says_where_each_providers_key_comes_from(client_alice, monkeypatch):
    """The settings page tells a key from the environment, a stored key and none apart."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env-123456")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    row = ApiKey(provider="anthropic")
    row.set_key("sk-stored-123456", endpoint="https://api.anthropic.com")
    row.save()
    tree = parse(page(client_alice.get(reverse("settings"))))
    lines = {
        name: " ".join(tree.by_id(f"provider-{name}").text.split())
        for name in ("anthropic", "openai", "deepseek")
    }
    assert "ready" in lines["anthropic"] and "Key …3456" in lines["anthropic"]
    assert "ready" in lines["openai"] and "Key from OPENAI_API_KEY" in lines["openai"]
    assert "no key" in lines["deepseek"] and "Key none" in lines["deepseek"]
    assert "sk-from-env-123456" not in page(client_alice.get(reverse("settings")))


# --- Deleting a tab while its turn runs ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["the delete view", "a plain delete (admin, wipe)"])
@pytest.mark.parametrize("heartbeat", ["slow", "fast"])
async def test_deleting_a_tab_mid_turn_ends_the_turn_quietly(caplog, monkeypatch, how, heartbeat):
    """The runner stops at once and logs no error or traceback, and nothing of the tab stays:
    whether the view cancels first or the row just goes, and whether the runner first
    notices at a write or at its heartbeat."""
    if heartbeat == "fast":
        monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.05)
    provider = ScriptedProvider(
        [[*[TextDelta(f"w{i} ") for i in range(400)], Finish()]], delay=0.01
    )

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    caplog.set_level(logging.INFO)
    async with running_worker():
        tab = await make_tab()
        owner = await sync_to_async(lambda: tab.owner)()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "delta")
        if how == "the delete view":
            client = Client()
            await sync_to_async(client.force_login)(owner)
            response = await sync_to_async(client.post)(reverse("tab_delete", args=[tab.pk]))
            assert response.status_code == 302
        else:
            await Tab.objects.filter(pk=tab.pk).adelete()
        async with asyncio.timeout(TURN_TIMEOUT):
            while tab.pk in worker.RUNNING or lease._claims[tab.pk]:
                await asyncio.sleep(0.01)
    assert not await RunningTurn.objects.filter(tab_id=tab.pk).aexists()
    assert not await Chunk.objects.filter(tab_id=tab.pk).aexists()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == [], [r.getMessage() for r in loud]


def test_no_template_comment_leaks_into_a_page(client_alice, tab):
    """Django's {# #} comments are one line only: a multi-line one is shown as text."""
    html = page(client_alice.get(reverse("tab", args=[tab.id])))
    assert "{#" not in html and "#}" not in html
    root = Path(__file__).resolve().parent.parent / "templates"
    for template in root.rglob("*.html"):
        for number, line in enumerate(template.read_text().splitlines(), start=1):
            if "{#" in line:
                assert "#}" in line.split("{#", 1)[1], f"{template}:{number}: multi-line {{# #}}"


def test_a_missing_page_is_the_apps_own_not_found_page(client_alice):
    response = client_alice.get(f"/t/{uuid.uuid4()}/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "app.css" in html and "Not found" in html and 'href="/"' in html


def test_the_server_error_page_renders_without_a_request():
    """Django renders 500.html with no context (no request, no user): it must still work."""
    html = render_to_string("500.html")
    assert "app.css" in html and "Something went wrong" in html
