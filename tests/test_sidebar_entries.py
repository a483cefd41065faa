"""The entry a change of state sends the owner's pages (sidebar.with_entries) is the one a
page load lists (sidebar.tabs), in the same state, read in one query."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat import sidebar
from chat.models import QueuedMessage, RunningTurn, Tab

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice")


@pytest.fixture
def bob():
    return get_user_model().objects.create_user("bob")


def make(owner, *, title="", last_seq=0, conversation=None, ago=0) -> Tab:
    tab = Tab.objects.create(owner=owner, title=title, last_seq=last_seq)
    Tab.objects.filter(pk=tab.pk).update(
        conversation=conversation or tab.pk, updated_at=timezone.now() - timedelta(seconds=ago)
    )
    tab.refresh_from_db()
    return tab


def lease(tab: Tab, status: str) -> None:
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", status=status, heartbeat_at=timezone.now()
    )


def announced(tab: Tab) -> tuple[Tab, list[str]]:
    found = sidebar.stated(tab.pk)
    assert found is not None
    return found.entry, found.versions


def listed(owner) -> dict[uuid.UUID, str]:
    return {t.conversation: f"{t.pk} {sidebar.state(t)}" for t in sidebar.tabs(owner)}


def test_a_versions_change_announces_the_latest_version_in_the_state_of_any(alice):
    root = make(alice, title="Plans", last_seq=3, ago=60)
    newer = make(alice, title="Plans", last_seq=3, conversation=root.pk, ago=10)
    make(alice, title="Other", last_seq=1)
    lease(root, RunningTurn.Status.RUNNING)
    entry, versions = announced(root)
    assert (entry.pk, sidebar.state(entry)) == (newer.pk, sidebar.RUNNING)
    assert sorted(versions) == sorted([str(root.pk), str(newer.pk)])
    assert listed(alice)[root.pk] == f"{entry.pk} {sidebar.state(entry)}"


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (None, sidebar.IDLE),
        (RunningTurn.Status.RUNNING, sidebar.RUNNING),
        (RunningTurn.Status.WAITING, sidebar.WAITING),
        # Its idle status was sent: the lease goes next.
        (RunningTurn.Status.FINISHING, sidebar.IDLE),
    ],
)
def test_the_state_is_the_leases(alice, status, state):
    tab = make(alice, title="t", last_seq=1)
    if status is not None:
        lease(tab, status)
    entry, _ = announced(tab)
    assert sidebar.state(entry) == state
    assert listed(alice)[tab.pk] == f"{tab.pk} {state}"


def test_another_users_tab_of_the_conversation_is_no_version(alice, bob):
    mine = make(alice, title="Mine", last_seq=2, ago=60)
    theirs = make(bob, title="Theirs", last_seq=2, conversation=mine.pk)
    lease(theirs, RunningTurn.Status.RUNNING)
    entry, versions = announced(mine)
    assert (entry.pk, sidebar.state(entry), versions) == (mine.pk, sidebar.IDLE, [str(mine.pk)])


def test_a_version_never_sent_to_is_the_entry_once_a_message_is_queued(alice):
    root = make(alice, title="Plans", last_seq=3, ago=60)
    empty = make(alice, conversation=root.pk)
    assert announced(root)[0].pk == root.pk
    QueuedMessage.objects.create(tab=empty, text="hi")
    assert announced(root)[0].pk == empty.pk
    assert listed(alice)[root.pk] == f"{empty.pk} {sidebar.IDLE}"


def test_a_tab_never_sent_to_is_still_announced(alice):
    tab = make(alice)
    lease(tab, RunningTurn.Status.RUNNING)
    entry, versions = announced(tab)
    assert (entry.pk, sidebar.state(entry), versions) == (tab.pk, sidebar.RUNNING, [str(tab.pk)])


def test_a_deleted_tab_announces_nothing(alice):
    tab_id = make(alice, title="t", last_seq=1).pk
    Tab.objects.filter(pk=tab_id).delete()
    assert sidebar.stated(tab_id) is None
    assert sidebar.with_entries(sidebar.message(tab_id, sidebar.IDLE, None)) is None


def test_an_announcement_reads_one_query(alice, django_assert_num_queries):
    """Every turn announces its tab twice (running, idle) to an owner with a page open."""
    root = make(alice, title="Plans", last_seq=3, ago=60)
    make(alice, title="Plans", last_seq=3, conversation=root.pk)
    with django_assert_num_queries(1):
        owner_id, sent = sidebar.with_entries(sidebar.message(root.pk, sidebar.RUNNING, None))
    assert owner_id == alice.pk and f'id="tablink-{root.pk}"' in sent["entries"]["other"]


def test_the_sidebar_and_its_entries_render_from_one_query(alice, django_assert_num_queries):
    """A page's list reads what its entries show, and nothing per entry."""
    for n in range(3):
        tab = make(alice, title=f"t{n}", last_seq=1, ago=n)
        if n == 1:
            lease(tab, RunningTurn.Status.WAITING)
    with django_assert_num_queries(1):
        listed = sidebar.tabs(alice)
        html = "".join(sidebar.entry(t, current=listed[0].pk) for t in listed)
    assert [t.title for t in listed] == ["t0", "t1", "t2"]
    assert html.count('data-state="waiting"') == 1 and "t2" in html
