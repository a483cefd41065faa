"""Taking and passing on a tab's lease (lease.acquire, lease.release_or_continue): the tab's
lock, its lease and its queue are read in one statement, and what each finds is acted on."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from chat.turn import lease

pytestmark = pytest.mark.django_db

# A worker on another host whose heartbeat stopped long ago.
DEAD = "elsewhere:1:gone"


@pytest.fixture
def tab():
    owner = get_user_model().objects.create_user("alice")
    return Tab.objects.create(owner=owner, title="t", model="offline/demo")


def statements(queries) -> list[str]:
    """The statements but the test transaction's savepoints, by their first word and table."""
    kept = [q["sql"].replace('"', "") for q in queries if "SAVEPOINT" not in q["sql"]]
    return [sql.split()[0] for sql in kept]


def dead_lease(tab: Tab) -> RunningTurn:
    stale = timezone.now() - timedelta(seconds=lease.LEASE_STALE_SECONDS * 2)
    return RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker=DEAD, heartbeat_at=stale
    )


def test_a_queued_message_is_taken_with_one_read_after_the_lock(tab):
    QueuedMessage.objects.create(tab=tab, text="hi")
    with CaptureQueriesContext(connection) as queries:
        turn_id = lease.acquire(tab.pk, "w:1:c")
    # The lock, then the lease and the queue (test_lease_lock_snapshot: not in one).
    assert statements(queries) == ["SELECT", "SELECT", "INSERT"]
    assert RunningTurn.objects.get(tab=tab).turn_id == turn_id


def test_nothing_queued_takes_no_lease(tab):
    assert lease.acquire(tab.pk, "w:1:c") is None
    assert not RunningTurn.objects.exists()


def test_a_missing_tab_takes_no_lease():
    assert lease.acquire(uuid.uuid4(), "w:1:c") is None


def test_a_live_lease_is_left_alone(tab):
    QueuedMessage.objects.create(tab=tab, text="hi")
    held = RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="elsewhere:1:alive", heartbeat_at=timezone.now()
    )
    assert lease.acquire(tab.pk, "w:1:c") is None
    assert RunningTurn.objects.get(tab=tab).turn_id == held.turn_id


def test_a_dead_lease_is_recovered_and_the_message_taken(tab):
    QueuedMessage.objects.create(tab=tab, text="hi")
    dead = dead_lease(tab)
    turn_id = lease.acquire(tab.pk, "w:1:c")
    assert turn_id is not None and turn_id != dead.turn_id
    assert RunningTurn.objects.get(tab=tab).worker == "w:1:c"


def test_a_recovery_that_queues_a_rerun_for_a_running_child_takes_it(tab):
    """The dead turn's `agent` call has a child that runs on: the recovery queues a rerun
    to wait for it, which this acquire takes, though nothing was queued before."""
    turn = uuid.uuid4()
    Chunk.objects.create(
        tab=tab, seq=1, turn_id=turn, step=0, role="user", type="text", data={"text": "go"}
    )
    Chunk.objects.create(
        tab=tab,
        seq=2,
        turn_id=turn,
        step=1,
        role="assistant",
        type="tool_call",
        data={"call_id": "c1", "name": "agent", "arguments": {}},
    )
    Tab.objects.filter(pk=tab.pk).update(last_seq=2)
    Tab.objects.create(
        id=uuid.uuid5(tab.pk, "c1"),
        owner=tab.owner,
        title="c",
        model="offline/demo",
        parent_tab=tab,
        parent_call_id="c1",
    )
    dead_lease(tab)
    assert lease.acquire(tab.pk, "w:1:c") is not None
    assert list(QueuedMessage.objects.values_list("rerun", flat=True)) == [True]


def test_a_message_waiting_at_the_end_goes_on_as_the_next_turn(tab):
    QueuedMessage.objects.create(tab=tab, text="hi")
    turn_id = lease.acquire(tab.pk, "w:1:c")
    with CaptureQueriesContext(connection) as queries:
        next_id = lease.release_or_continue(tab.pk, turn_id)
    assert statements(queries) == ["SELECT", "SELECT", "UPDATE"]
    assert next_id is not None and RunningTurn.objects.get(tab=tab).turn_id == next_id


def test_with_nothing_waiting_the_end_releases_the_lease(tab):
    QueuedMessage.objects.create(tab=tab, text="hi")
    turn_id = lease.acquire(tab.pk, "w:1:c")
    QueuedMessage.objects.all().delete()
    assert lease.release_or_continue(tab.pk, turn_id) is None
    assert not RunningTurn.objects.exists()


def test_the_end_of_a_turn_whose_lease_was_taken_releases_nothing(tab):
    QueuedMessage.objects.create(tab=tab, text="hi")
    lease.acquire(tab.pk, "w:1:c")
    assert lease.release_or_continue(tab.pk, uuid.uuid4()) is None
    assert RunningTurn.objects.filter(tab=tab).exists()


def test_the_end_of_a_turn_on_a_deleted_tab_says_so(tab):
    tab_id = tab.pk
    Tab.objects.filter(pk=tab_id).delete()
    with pytest.raises(Tab.DoesNotExist):
        lease.release_or_continue(tab_id, uuid.uuid4())


# --- The status a page and each socket's catch-up read (lease.status) -------------------


def test_an_idle_tabs_status_is_two_reads(tab):
    QueuedMessage.objects.create(tab=tab, text="later")
    with CaptureQueriesContext(connection) as queries:
        now = lease.status(tab.pk)
    # The tab's meter with its lease, then its queue.
    assert statements(queries) == ["SELECT", "SELECT"]
    assert now["state"] == "idle" and now["context"] == lease.meter(tab.pk)
    assert [q["text"] for q in now["queued"]] == ["later"]


@pytest.mark.parametrize(
    ("status", "state"),
    [
        (RunningTurn.Status.RUNNING, "running"),
        (RunningTurn.Status.WAITING, "waiting"),
        (RunningTurn.Status.FINISHING, "idle"),
    ],
)
def test_the_status_is_the_leases(tab, status, state):
    running = RunningTurn.objects.create(
        tab=tab,
        turn_id=uuid.uuid4(),
        worker="w:1:c",
        status=status,
        step=3,
        heartbeat_at=timezone.now(),
    )
    now = lease.status(tab.pk)
    assert now["state"] == state
    if state != "idle":
        assert (now["turn_id"], now["step"], now["stale"]) == (str(running.turn_id), 3, False)
        assert now["started_at"] == RunningTurn.objects.get(tab=tab).started_at.isoformat()
        assert now["usage"] == {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}


def test_a_dead_workers_lease_shows_stale(tab):
    dead_lease(tab)
    assert lease.status(tab.pk)["stale"] is True


def test_a_deleted_tabs_status_is_idle_without_a_meter():
    assert lease.status(uuid.uuid4()) == {"state": "idle", "queued": [], "context": None}
