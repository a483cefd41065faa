"""Sending a message (turns.submit): the tab's lock, its draft and its title are one write,
and a message to a tab deleted meanwhile queues nothing."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat import turns
from chat.models import QueuedMessage, Tab

pytestmark = pytest.mark.django_db


@pytest.fixture
def tab():
    owner = get_user_model().objects.create_user("alice")
    return Tab.objects.create(owner=owner, draft="an edit's old text")


def writes(queries) -> list[str]:
    """The statements but the test transaction's savepoints, by their first two words and
    table."""
    kept = [q["sql"] for q in queries if "SAVEPOINT" not in q["sql"]]
    return [" ".join(sql.replace('"', "").split()[:3]) for sql in kept]


def test_a_first_message_locks_names_and_clears_the_draft_in_one_write(tab):
    with CaptureQueriesContext(connection) as queries:
        turns.submit(tab, "Plan the move\nwith details")
    assert writes(queries) == ["UPDATE chat_tab SET", "INSERT INTO chat_queuedmessage"]
    tab.refresh_from_db()
    assert (tab.title, tab.draft) == ("Plan the move", "")
    assert list(QueuedMessage.objects.values_list("text", flat=True)) == [
        "Plan the move\nwith details"
    ]


def test_a_later_message_keeps_the_title(tab):
    turns.submit(tab, "first")
    Tab.objects.filter(pk=tab.pk).update(draft="again")
    turns.submit(Tab.objects.get(pk=tab.pk), "second")
    tab.refresh_from_db()
    assert (tab.title, tab.draft) == ("first", "")


def test_a_message_to_a_deleted_tab_queues_nothing(tab):
    Tab.objects.filter(pk=tab.pk).delete()
    with pytest.raises(Tab.DoesNotExist):
        turns.submit(tab, "hello")
    assert not QueuedMessage.objects.exists()
