"""What the lease reads under the tab's lock sees what the lock's last holder committed.

On PostgreSQL (READ COMMITTED, the scaled mode's database) a statement that waits for a
row lock reads everything but the locked row as it was when the statement began: an
EXISTS in the locking statement misses a message queued by the transaction it waited
for. The lease must read the queue and the lease in a statement after the lock. On
SQLite a writer's BEGIN IMMEDIATE waits before it reads anything, and two connections to
the tests' in-memory database cannot wait on each other's locks, so these run where
the CI's PostgreSQL re-run runs them.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, connections, transaction
from django.utils import timezone

from chat.models import QueuedMessage, RunningTurn, Tab
from chat.preferences import new_tab
from chat.turn import lease

pytestmark = pytest.mark.django_db(transaction=True)

# How long the other transaction holds the tab's lock after queueing: the lease's
# statement must be waiting for it by then.
HOLD_SECONDS = 0.5


@pytest.fixture(autouse=True)
def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("a lock wait's snapshot is PostgreSQL's (see the module's docstring)")


def make_tab() -> Tab:
    return new_tab(get_user_model().objects.create(username="owner"), "offline/demo")


def _under_the_lock(tab_id: uuid.UUID, change) -> threading.Thread:
    """A thread whose transaction locks the tab, makes `change`, holds the lock for
    HOLD_SECONDS and commits (as turns.submit and the lease do); started, and returned
    once it holds the lock."""
    locked = threading.Event()

    def run() -> None:
        try:
            with transaction.atomic():
                Tab.objects.select_for_update().filter(pk=tab_id).values_list("pk").get()
                change()
                locked.set()
                threading.Event().wait(HOLD_SECONDS)
        finally:
            connections.close_all()

    other = threading.Thread(target=run)
    other.start()
    assert locked.wait(10)
    return other


def _queue(tab_id: uuid.UUID):
    return lambda: QueuedMessage.objects.create(tab_id=tab_id, text="meanwhile")


def test_a_turn_ending_while_a_message_is_queued_goes_on_with_it():
    tab = make_tab()
    QueuedMessage.objects.create(tab=tab, text="first")
    turn_id = lease.acquire(tab.pk, "worker-1")
    assert turn_id is not None
    QueuedMessage.objects.filter(tab=tab).delete()  # the turn took it

    other = _under_the_lock(tab.pk, _queue(tab.pk))
    next_turn = lease.release_or_continue(tab.pk, turn_id)
    other.join(10)

    assert next_turn is not None, "the message queued meanwhile was left behind"
    assert RunningTurn.objects.get(tab=tab).turn_id == next_turn


def test_a_message_queued_while_a_worker_waited_for_the_lock_starts_a_turn():
    tab = make_tab()

    other = _under_the_lock(tab.pk, _queue(tab.pk))
    turn_id = lease.acquire(tab.pk, "worker-1")
    other.join(10)

    assert turn_id is not None, "the message queued meanwhile was left behind"
    assert RunningTurn.objects.get(tab=tab).worker == "worker-1"


def test_a_lease_taken_while_a_worker_waited_for_the_lock_is_left_to_its_holder():
    tab = make_tab()
    QueuedMessage.objects.create(tab=tab, text="first")

    def take() -> None:
        RunningTurn.objects.create(
            tab=tab, turn_id=uuid.uuid4(), worker="worker-1", heartbeat_at=timezone.now()
        )

    other = _under_the_lock(tab.pk, take)
    turn_id = lease.acquire(tab.pk, "worker-2")
    other.join(10)

    assert turn_id is None
    assert RunningTurn.objects.get(tab=tab).worker == "worker-1"
