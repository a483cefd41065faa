"""Asking for a compaction from the page (issue 16): "Summarise up to here"
(`tab_compact`), `/compact [focus]` in the composer, and what the tab page shows of
context management on a load (the meter from the tab's last request, the queued
compaction, the action on answers that end a turn). The runner's side is in
tests/test_compaction.py; the markup's details in tests/test_compaction_render.py."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat import context, log
from chat.models import QueuedMessage, Tab
from chat.stream import Block, Kind, Role
from tests.ui_helpers import parse

pytestmark = pytest.mark.django_db

User = get_user_model()
HTMX = {"HTTP_HX_REQUEST": "true"}
T1, T2 = uuid.uuid4(), uuid.uuid4()


def block(turn, step, role, type, **data) -> Block:
    return Block(uuid.uuid4(), turn, step, role, type, data)


def two_turns() -> list[Block]:
    """A question answered after a shell call (seqs 1..5), then a second answer (6..7)."""
    return [
        block(T1, 0, Role.USER, Kind.TEXT, text="list the files"),
        block(T1, 1, Role.ASSISTANT, Kind.TEXT, text="Let me look."),
        block(T1, 1, Role.ASSISTANT, Kind.TOOL_CALL, call_id="c1", name="shell",
              arguments={"command": "ls"}),
        block(T1, 1, Role.TOOL, Kind.TOOL_RESULT, call_id="c1", name="shell", result="a.txt"),
        block(T1, 2, Role.ASSISTANT, Kind.TEXT, text="One file: a.txt"),
        block(T2, 0, Role.USER, Kind.TEXT, text="thanks"),
        block(T2, 1, Role.ASSISTANT, Kind.TEXT, text="You're welcome."),
    ]  # fmt: skip


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice) -> Tab:
    tab = Tab.objects.create(owner=alice, title="Files", model="offline/demo")
    log.append(tab.pk, two_turns())
    return tab


def compact(client: Client, tab: Tab, seq: str | None = None, **extra):
    data = {} if seq is None else {"seq": seq}
    return client.post(reverse("tab_compact", args=[tab.id]), data, **extra)


def send(client: Client, tab: Tab, text: str):
    return client.post(reverse("tab_send", args=[tab.id]), {"text": text}, **HTMX)


def composer_error(response) -> str:
    node = parse(response.content.decode()).by_id("composer-error")
    assert node is not None and node.get("hx-swap-oob") == "true"
    return node.text


def queued(tab: Tab) -> list[tuple[bool, int | None, str]]:
    return list(
        QueuedMessage.objects.filter(tab=tab)
        .order_by("pk")
        .values_list("compact", "compact_through", "text")
    )


def page(client: Client, tab: Tab):
    response = client.get(reverse("tab", args=[tab.id]))
    assert response.status_code == 200
    return parse(response.content.decode())


# --- "Summarise up to here" ------------------------------------------------------------------


def test_summarise_up_to_here_queues_a_compaction_through_that_chunk(client, tab):
    """The answer at seq 5 asks for a compaction through it; the page hears the rest over
    the socket, so the htmx answer only clears the composer's error line."""
    response = compact(client, tab, "5", **HTMX)
    assert response.status_code == 200
    assert composer_error(response) == ""
    assert queued(tab) == [(True, 5, "")]


def test_summarise_without_htmx_redirects_to_the_tab(client, tab):
    response = compact(client, tab, "7")
    assert response.status_code == 302 and response.url == reverse("tab", args=[tab.id])
    assert queued(tab) == [(True, 7, "")]


@pytest.mark.parametrize(
    ("seq", "message"),
    [
        ("five", "Not a chunk number: 'five'."),
        ("5.0", "Not a chunk number: '5.0'."),
        ("99", "There is no chunk 99 in this tab."),
        ("0", "There is no chunk 0 in this tab."),
        ("-1", "There is no chunk -1 in this tab."),
    ],
)
def test_a_bad_seq_is_refused_on_the_composer_line(client, tab, seq, message):
    response = compact(client, tab, seq, **HTMX)
    assert response.status_code == 422
    assert composer_error(response) == message
    assert queued(tab) == []


def test_a_second_compaction_while_one_waits_is_refused(client, tab):
    assert compact(client, tab, "5", **HTMX).status_code == 200
    response = compact(client, tab, "7", **HTMX)
    assert response.status_code == 422
    assert composer_error(response) == "A compaction is already waiting to run."
    assert queued(tab) == [(True, 5, "")]


def test_another_users_tab_is_not_found(client, alice):
    bob = User.objects.create_user("bob", password="pw")
    theirs = Tab.objects.create(owner=bob, title="Bob's", model="offline/demo")
    log.append(theirs.pk, two_turns())
    assert compact(client, theirs, "5", **HTMX).status_code == 404
    assert queued(theirs) == []


def test_summarise_takes_a_post_only(client, tab):
    assert client.get(reverse("tab_compact", args=[tab.id])).status_code == 405
    assert queued(tab) == []


def test_signed_out_nothing_is_queued(tab):
    response = compact(Client(), tab, "5")
    assert response.status_code == 302 and "login" in response.url
    assert queued(tab) == []


# --- /compact in the composer ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "focus"),
    [
        ("/compact", ""),
        ("  /compact  ", ""),
        ("/compact the failing tests", "the failing tests"),
        ("/compact\nthe API design", "the API design"),
    ],
)
def test_slash_compact_queues_a_compaction_of_everything_with_its_focus(client, tab, text, focus):
    response = send(client, tab, text)
    assert response.status_code == 200
    assert composer_error(response) == ""
    assert queued(tab) == [(True, None, focus)]


@pytest.mark.parametrize("text", ["/compactly done", "please /compact", "/Compact", "/compact-it"])
def test_anything_else_is_a_message(client, tab, text):
    assert send(client, tab, text).status_code == 200
    assert queued(tab) == [(False, None, text)]


def test_slash_compact_on_an_empty_tab_says_there_is_nothing_to_compact(client, alice):
    empty = Tab.objects.create(owner=alice, title="New", model="offline/demo")
    response = send(client, empty, "/compact")
    assert response.status_code == 422
    assert composer_error(response) == "Nothing to compact yet: the tab has no messages."
    assert queued(empty) == []


def test_slash_compact_while_one_waits_is_refused_and_keeps_the_text(client, tab):
    assert send(client, tab, "/compact").status_code == 200
    response = send(client, tab, "/compact again")
    assert response.status_code == 422
    assert composer_error(response) == "A compaction is already waiting to run."
    assert queued(tab) == [(True, None, "")]


# --- The tab page ----------------------------------------------------------------------------


def test_the_page_offers_summarise_up_to_here_on_answers_that_end_a_turn(client, tab):
    """Seq 5 and 7 end their turns; seq 2 ("Let me look.") is followed by a call in its
    step. A page render knows, so none is marked if-end."""
    tree = page(client, tab)
    buttons = [n for n in tree.iter() if n.tag == "button" and n.get("form") == "compact-form"]
    assert [(b.get("value"), "if-end" in b.classes) for b in buttons] == [
        ("5", False),
        ("7", False),
    ]
    form = tree.by_id("compact-form")
    assert form.get("hx-post") == reverse("tab_compact", args=[tab.id])
    assert form.get("hx-sync") == "this:drop"


def test_the_composer_mentions_slash_compact(client, tab):
    area = page(client, tab).by_id("composer-text")
    assert "/compact [focus]" in area.get("placeholder")
    assert "/compact [focus]" in area.get("title")


def test_the_page_shows_the_meter_of_the_tabs_last_request(client, tab):
    size = context.Size(input=1_000, cache_read=40_000, cache_write=2_000, output=900)
    Tab.objects.filter(pk=tab.pk).update(context=size.as_dict())
    meter = page(client, tab).by_id("context-meter")
    assert "hidden" not in meter.attrs and meter.get("hx-swap-oob") is None
    assert "".join(n.text for n in meter.children if n.tag == "span") == (
        "Context43.9k/200k93% cached"
    )


def test_a_tab_of_an_unknown_model_says_which_window_it_assumes(client, tab):
    Tab.objects.filter(pk=tab.pk).update(model="openai/my-local-model")
    meter = page(client, tab).by_id("context-meter")
    note = next(n for n in meter.iter() if "ctx-note" in n.classes)
    assert note.text == "window unknown: assuming 128k"


def test_a_queued_compaction_shows_on_a_page_load_as_one(client, tab):
    compact(client, tab, "5", **HTMX)
    send(client, tab, "and a message")
    items = page(client, tab).by_id("queued").children
    assert [("compact" in li.classes, li.children[1].text) for li in items] == [
        (True, "Queued · runs once no turn is running"),
        (False, "Queued · the agent reads it at its next step"),
    ]
    assert (
        items[0].children[0].text == "Compact the conversation (through chunk 5) when the turn ends"
    )
