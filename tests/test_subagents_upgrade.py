"""Children made before calls were keyed on their seq (id uuid5(parent, call id)): a tab
that crossed that upgrade still finds each one from the call that made it — its usage in
the parent's turn, its result for a resumed turn, no second child — and a later call that
repeats the id does not take it (call ids repeat; seqs do not)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth.models import User

from chat import usage
from chat.models import Chunk, Tab, UsageRecord, agent_child_id, agent_children
from chat.turn import agents

pytestmark = pytest.mark.django_db


def parent_with_a_legacy_child() -> tuple[Tab, Tab, uuid.UUID]:
    owner = User.objects.create(username="u")
    parent = Tab.objects.create(owner=owner, title="p", model="offline/demo")
    turn = uuid.uuid4()
    Chunk.objects.create(
        tab=parent, seq=1, turn_id=turn, step=0, role="user", type="text", data={"text": "go"}
    )
    Chunk.objects.create(
        tab=parent,
        seq=2,
        turn_id=turn,
        step=1,
        role="assistant",
        type="tool_call",
        data={"call_id": "c1", "name": "agent", "arguments": {}},
    )
    child = Tab.objects.create(
        id=uuid.uuid5(parent.pk, "c1"),
        owner=owner,
        title="c",
        model="offline/demo",
        parent_tab=parent,
        parent_call_id="c1",
    )
    child_turn = uuid.uuid4()
    Chunk.objects.create(
        tab=child,
        seq=1,
        turn_id=child_turn,
        step=0,
        role="user",
        type="text",
        data={"text": "x", "origin": {"kind": "agent", "parent_tab": str(parent.pk)}},
    )
    UsageRecord.objects.create(tab_id=parent.pk, turn_id=turn, step=1, model="m", input_tokens=10)
    UsageRecord.objects.create(
        tab_id=child.pk, turn_id=child_turn, step=1, model="m", input_tokens=1000
    )
    return parent, child, turn


def test_a_legacy_child_counts_in_its_parents_turn():
    parent, _, turn = parent_with_a_legacy_child()
    assert usage.tab_totals(parent.pk).as_dict()["input"] == 1010
    assert usage.turn_totals(parent.pk, [turn])[turn].as_dict()["input"] == 1010
    # What the turn's end tells the page (it reads the tab's tree once for both).
    ended = usage.turn_end(parent.pk, turn)
    assert (ended["turn"]["input"], ended["tab"]["input"]) == (1010, 1010)


def test_the_call_that_made_a_legacy_child_finds_it_and_makes_no_second():
    parent, child, _ = parent_with_a_legacy_child()
    assert agents.made(parent.pk, [("c1", 2)]) == {"c1"}
    found, made_now = agents.ensure(
        parent.pk, "c1", {"description": "d", "prompt": "p"}, call_seq=2
    )
    assert (found.pk, made_now) == (child.pk, False)
    assert Tab.objects.filter(parent_tab=parent).count() == 1


def test_a_later_call_repeating_the_id_does_not_take_the_legacy_child():
    parent, child, _ = parent_with_a_legacy_child()
    Chunk.objects.create(
        tab=parent,
        seq=3,
        turn_id=uuid.uuid4(),
        step=1,
        role="assistant",
        type="tool_call",
        data={"call_id": "c1", "name": "agent", "arguments": {}},
    )
    assert agent_children(parent.pk, [("c1", 2), ("c1", 3)]) == {("c1", 2): child.pk}
    assert agent_child_id(parent.pk, "c1", 3) != child.pk
