"""Versions in place, through the views: Regenerate, Edit and Retry switch to a new
version of the same conversation (one sidebar entry, opening its last active tab), the
page's "‹ n / total ›" links the siblings, and what can go wrong: a deleted parent, a fork
at the first message, another user's tab claiming the conversation. A "+ New tab" never
sent to has no entry and is reused. The API says each tab's conversation. The migration
groups tabs made before it."""

from __future__ import annotations

import importlib
import inspect
import sys
import uuid

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chat import log, sidebar, turns
from chat.models import Chunk, Tab
from chat.stream import Block, Kind, Role
from tests.api_helpers import ApiClient
from tests.ui_helpers import parse

T1 = uuid.uuid4()


def block(turn, role, kind, **data) -> Block:
    return Block(uuid.uuid4(), turn, 0, role, kind, data)


def answer(text: str, turn: uuid.UUID | None = None) -> list[Block]:
    """A turn with no message of its own (a regenerated branch's): thinking and text."""
    turn = turn or uuid.uuid4()
    return [
        block(turn, Role.ASSISTANT, Kind.THINKING, text="hm", signature="s"),
        block(turn, Role.ASSISTANT, Kind.TEXT, text=text),
    ]


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="pw")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice) -> Tab:
    """Hello: a question (1) and its answer (2, 3)."""
    tab = Tab.objects.create(owner=alice, title="Hello", model="offline/demo")
    log.append(
        tab.pk,
        [block(T1, Role.USER, Kind.TEXT, text="hello, what can you do?"), *answer("Hi.", T1)],
    )
    return tab


def page(client: Client, tab: Tab):
    response = client.get(reverse("tab", args=[tab.id]))
    assert response.status_code == 200
    return parse(response.content.decode())


def switchers(tree) -> list[tuple[str, str | None, str | None, str]]:
    """Each switcher on the page: its count, the previous and next links, and where it
    sits (the seq of the chunk before it)."""
    log_node = tree.by_id("log")
    out = []
    before = None
    for node in log_node.children:
        if "chunk" in node.classes:
            before = node.get("data-seq")
        if "versions" not in node.classes:
            continue
        links = {a.get("rel"): a.get("href") for a in node.find_all(lambda n: n.tag == "a")}
        [count] = node.find_all(lambda n: "ver-count" in n.classes)
        spoken = count.find_all(lambda n: "visually-hidden" in n.classes)[0].text
        out.append((spoken, links.get("prev"), links.get("next"), before))
    return out


def entries(tree) -> list[tuple[str, str, bool]]:
    """The sidebar: each entry's element id, the tab it opens, and whether it is current."""
    return [
        (n.get("id"), n.get("data-tab"), n.get("aria-current") == "page")
        for n in tree.find_all(lambda n: "tab-link" in n.classes)
    ]


def url(tab: Tab) -> str:
    return reverse("tab", args=[tab.id])


def last(tab: Tab) -> int:
    return Tab.objects.get(pk=tab.pk).last_seq


def regenerate(client: Client, tab: Tab, seq: int) -> Tab:
    response = client.post(reverse("tab_regenerate", args=[tab.id]), {"seq": seq})
    assert response.status_code == 302
    return Tab.objects.get(pk=response.url.split("/")[2])


def test_regenerate_twice_makes_three_versions_of_one_answer(client, tab):
    """The root, its regeneration and that one's regeneration are "1 / 3", "2 / 3" and
    "3 / 3" of the same answer, each linking its neighbours; the sidebar has one entry,
    for the conversation, opening the newest; Regenerate goes to the new version."""
    first = regenerate(client, tab, 3)
    log.append(first.pk, answer("Hello again."))
    second = regenerate(client, first, last(first))
    log.append(second.pk, answer("Hi, a third time."))
    assert {t.conversation for t in (tab, first, second)} == {tab.id}

    shown = {t.id: page(client, t) for t in (tab, first, second)}
    assert switchers(shown[tab.id]) == [("Version 1 of 3", None, url(first), "3")]
    assert switchers(shown[first.id]) == [("Version 2 of 3", url(tab), url(second), "4")]
    assert switchers(shown[second.id]) == [("Version 3 of 3", url(first), None, "5")]
    for tree in shown.values():
        assert entries(tree) == [(f"tablink-{tab.id}", str(second.id), True)]
    # The versions' `forked` notices are there (the log is the log), marked for CSS to hide.
    notices = shown[second.id].find_all(lambda n: "kind-forked" in n.classes)
    assert len(notices) == 2 and all("version-fork" in n.classes for n in notices)


def test_the_entry_opens_the_last_active_version(client, tab):
    first = regenerate(client, tab, 3)
    log.append(first.pk, answer("Hello again."))
    # A message in the root makes it the conversation's last active tab.
    log.append(tab.pk, [block(uuid.uuid4(), Role.USER, Kind.TEXT, text="and then?")])
    assert entries(page(client, first)) == [(f"tablink-{tab.id}", str(tab.id), True)]
    [only] = sidebar.tabs(tab.owner)
    assert only.pk == tab.pk


def test_edit_at_the_first_message_is_a_version_of_that_message(client, tab):
    """A fork at seq 0: the root shows "1 / 2" under its first message; the new version,
    before anything is sent, shows "2 / 2" under its (hidden) notice at the end; once
    sent, under its own message."""
    response = client.post(reverse("tab_edit", args=[tab.id]), {"seq": 1})
    edited = Tab.objects.get(pk=response.url.split("/")[2])
    assert edited.draft == "hello, what can you do?"
    assert switchers(page(client, tab)) == [("Version 1 of 2", None, url(edited), "1")]
    assert switchers(page(client, edited)) == [("Version 2 of 2", url(tab), None, "1")]
    log.append(edited.pk, [block(uuid.uuid4(), Role.USER, Kind.TEXT, text="hello!")])
    tree = page(client, edited)
    assert switchers(tree) == [("Version 2 of 2", url(tab), None, "2")]
    [nav] = tree.by_id("log").find_all(lambda n: "versions" in n.classes)
    assert "at-user" in nav.classes and nav.get("aria-label") == "Versions of this message"


def test_retry_is_a_version_of_the_failed_answer(client, alice):
    tab = Tab.objects.create(owner=alice, title="Flaky", model="offline/demo")
    turn = uuid.uuid4()
    log.append(
        tab.pk,
        [
            block(turn, Role.USER, Kind.TEXT, text="hi"),
            block(turn, Role.ASSISTANT, Kind.ERROR, message="Overloaded", status_code=529),
        ],
    )
    response = client.post(reverse("tab_retry", args=[tab.id]), {"seq": 2})
    retried = Tab.objects.get(pk=response.url.split("/")[2])
    assert retried.conversation == tab.conversation
    assert switchers(page(client, tab)) == [("Version 1 of 2", None, url(retried), "2")]
    assert len(sidebar.tabs(alice)) == 1


def test_a_plain_branch_is_a_conversation_of_its_own(client, tab):
    response = client.post(reverse("tab_branch", args=[tab.id]), {"seq": 3})
    branch = Tab.objects.get(pk=response.url.split("/")[2])
    assert branch.conversation == branch.id != tab.conversation and branch.lineage == []
    assert switchers(page(client, tab)) == []
    assert {e[1] for e in entries(page(client, tab))} == {str(tab.id), str(branch.id)}


def test_deleting_the_parent_keeps_its_versions_together(client, tab):
    """The root deleted (its branches' `parent` set to null): its two versions are still
    "1 / 2" and "2 / 2", and one sidebar entry."""
    first = regenerate(client, tab, 3)
    second = regenerate(client, tab, 3)  # a repeat within REPEAT_WINDOW is `first`
    assert second == first
    Tab.objects.filter(pk=first.pk).update(created_at=first.created_at.replace(year=2020))
    second = turns.branch(tab, 1, action=turns.Action.REGENERATE, run=True).tab
    tab.delete()
    first.refresh_from_db()
    assert first.parent_id is None and first.conversation == second.conversation
    assert switchers(page(client, first)) == [("Version 1 of 2", None, url(second), "2")]
    assert switchers(page(client, second)) == [("Version 2 of 2", url(first), None, "2")]
    assert len(sidebar.tabs(first.owner)) == 1


def test_deleting_a_version_in_the_middle_renumbers_the_rest(client, tab):
    first = regenerate(client, tab, 3)
    log.append(first.pk, answer("Hello again."))
    second = regenerate(client, first, last(first))
    first.delete()
    assert switchers(page(client, tab)) == [("Version 1 of 2", None, url(second), "3")]
    assert switchers(page(client, second)) == [("Version 2 of 2", url(tab), None, "3")]


def test_another_users_tab_is_never_a_version(client, tab, bob):
    """A tab of another user claiming the conversation and a place among its versions
    (an admin gave it away, or a forged row) is never counted, linked or listed."""
    first = regenerate(client, tab, 3)
    Tab.objects.filter(pk=first.pk).update(owner=bob)
    stranger = Tab.objects.create(
        owner=bob, title="Mine", conversation=tab.conversation, lineage=[[str(tab.id), 1]]
    )
    log.append(stranger.pk, answer("not yours"))
    tree = page(client, tab)
    assert switchers(tree) == []
    assert [e[1] for e in entries(tree)] == [str(tab.id)]
    assert client.get(url(stranger)).status_code == 404


def test_the_switcher_is_reachable_and_labelled(client, tab):
    first = regenerate(client, tab, 3)
    tree = page(client, first)
    [nav] = tree.by_id("log").find_all(lambda n: "versions" in n.classes)
    assert nav.tag == "nav" and nav.get("aria-label") == "Versions of this answer"
    [link] = nav.find_all(lambda n: n.tag == "a")
    # A link (in the Tab order, Enter follows it) saying where it goes; the dead end's
    # arrow is hidden from screen readers.
    assert link.get("aria-label") == "Previous version (1 of 2)"
    dead = nav.find_all(lambda n: n.tag == "span" and "ver-arrow" in n.classes)
    assert [d.get("aria-hidden") for d in dead] == ["true"]


# --- "+ New tab" ------------------------------------------------------------------------------


def test_a_new_tab_never_sent_to_has_no_entry_and_is_reused(client, alice):
    """The sidebar's "+ New tab" twice is one tab, with no sidebar entry; its model choice
    is kept; once a message is queued it has an entry, and the next "+ New tab" is new."""
    made = client.post(reverse("tab_new"))
    unsent = Tab.objects.get(pk=made.url.split("/")[2])
    client.post(reverse("tab_model", args=[unsent.id]), {"model": "offline/demo"})
    again = client.post(reverse("tab_new"))
    assert again.url == made.url and Tab.objects.filter(owner=alice).count() == 1
    assert entries(page(client, unsent)) == []
    assert sidebar.tabs(alice) == []

    turns.submit(unsent, "hello")
    assert [e[1] for e in entries(page(client, unsent))] == [str(unsent.id)]
    fresh = client.post(reverse("tab_new"))
    assert fresh.url != made.url and Tab.objects.filter(owner=alice).count() == 2


def test_home_opens_the_unsent_tab_only_when_there_is_no_conversation(client, alice):
    assert client.get(reverse("home")).status_code == 200
    unsent = client.post(reverse("tab_new")).url
    assert client.get(reverse("home")).url == unsent
    kept = Tab.objects.create(owner=alice, title="Plans")
    assert client.get(reverse("home")).url == url(kept)


def test_a_new_tab_with_other_options_is_another_tab(client, alice):
    made = client.post(reverse("tab_new"))
    other = client.post(reverse("tab_new"), {"workdir": "site"})
    assert other.status_code == 302 and other.url != made.url
    # Each is reused for its own options.
    assert client.post(reverse("tab_new"), {"workdir": "site"}).url == other.url


def test_a_titled_tab_is_kept_though_never_sent_to(client, alice):
    made = client.post(reverse("tab_new"))
    tab_id = made.url.split("/")[2]
    client.post(reverse("tab_rename", args=[tab_id]), {"title": "Plans"})
    assert [t.title for t in sidebar.tabs(alice)] == ["Plans"]
    assert client.post(reverse("tab_new")).url != made.url


# --- The user channel --------------------------------------------------------------------------


def test_a_versions_change_of_state_is_its_conversations_entry(client, tab):
    """What the worker sends the owner's pages for a version: the conversation's entry
    (its id), opening the last active version, in the state of any of them."""
    first = regenerate(client, tab, 3)
    owner_id, sent = sidebar.with_entries(sidebar.message(tab.pk, "idle", None))
    assert owner_id == tab.owner_id
    doc = parse(sent["entries"]["other"])
    [link] = doc.find_all(lambda n: "tab-link" in n.classes)
    assert (link.get("id"), link.get("data-tab")) == (f"tablink-{tab.id}", str(first.id))
    # Current on the pages of any of its versions (the socket picks by this list).
    assert sorted(sent["versions"]) == sorted([str(tab.id), str(first.id)])
    # A page that holds the root's entry is sent the conversation's newer one.
    [frame] = sidebar.catch_up(tab.owner, {str(tab.id): "idle"}, current=tab.id)
    [link] = parse(frame).find_all(lambda n: "tab-link" in n.classes)
    assert link.get("data-tab") == str(first.id) and link.get("aria-current") == "page"


# --- The API -----------------------------------------------------------------------------------


def test_the_api_lists_versions_as_tabs_with_their_conversation(client, tab, alice):
    first = regenerate(client, tab, 3)
    plain = turns.branch(tab, 3).tab
    api = ApiClient(user=alice)
    listed = {t["id"]: t for t in api.get("/api/v1/tabs").json()["tabs"]}
    assert listed[str(first.id)]["conversation"] == str(tab.id)
    assert listed[str(tab.id)]["conversation"] == str(tab.id)
    assert listed[str(plain.id)]["conversation"] == str(plain.id)
    detail = api.get(f"/api/v1/tabs/{first.id}").json()
    assert detail["conversation"] == str(tab.id)
    assert detail["parent"] == {"id": str(tab.id), "at_seq": 1}


# --- The migration -----------------------------------------------------------------------------


def test_the_migration_groups_the_tabs_made_before_it(client, tab, alice, bob):
    """From the parent chain and each branch's `forked` action: versions join their
    parent's conversation, with the lineage a new one would get; a plain branch, a
    branch whose parent was deleted and one given to another user start their own."""
    first = regenerate(client, tab, 3)
    log.append(first.pk, answer("Hello again."))
    second = regenerate(client, first, last(first))
    edited = turns.edit(first, 1).tab
    plain = turns.branch(tab, 3).tab
    orphan = regenerate(client, plain, 3)
    given = turns.edit(tab, 1).tab
    Tab.objects.filter(pk=orphan.pk).update(parent=None)
    Tab.objects.filter(pk=given.pk).update(owner=bob)
    expected = {
        t.pk: (t.conversation, t.lineage)
        for t in Tab.objects.filter(pk__in=[tab.pk, first.pk, second.pk, edited.pk, plain.pk])
    }
    Tab.objects.update(conversation=uuid.uuid4(), lineage=[])
    migration = importlib.import_module("chat.migrations.0021_tab_conversation_lineage")
    migration.backfill(apps, None)
    after = {t.pk: (t.conversation, t.lineage) for t in Tab.objects.all()}
    for pk, value in expected.items():
        assert after[pk] == value
    assert after[orphan.pk] == (orphan.pk, [])
    assert after[given.pk] == (given.pk, [])
    assert Chunk.objects.filter(tab=second, type=Kind.SYSTEM).count() == 2


def test_the_migration_follows_a_chain_of_versions_deeper_than_the_stack(tab):
    """Regenerate looped (through the API) makes a chain of versions, each the parent of
    the next: the backfill walks it without recursing, each in the root's conversation."""
    depth = 300
    forked = {"kind": "forked", "action": "regenerate", "text": "Answered again."}
    parent = tab
    for _ in range(depth):
        child = Tab.objects.create(owner=tab.owner, parent=parent, fork_seq=3)
        Chunk.objects.create(tab=child, seq=4, role="system", type="system", data=forked)
        parent = child
    Tab.objects.update(conversation=uuid.uuid4(), lineage=[])
    migration = importlib.import_module("chat.migrations.0021_tab_conversation_lineage")
    # Room for the ORM, not for a frame (or two) per version.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 150)
    try:
        migration.backfill(apps, None)
    finally:
        sys.setrecursionlimit(limit)
    assert set(Tab.objects.values_list("conversation", flat=True)) == {tab.pk}
