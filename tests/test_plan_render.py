"""An external agent's plan on the page (chat.render.messages.Plan): each revision a chunk,
a turn's later revisions in its first plan's slot, where CSS shows only the last; and what
history sends of it (nothing)."""

from __future__ import annotations

import uuid

from chat.history import History
from chat.render import fragment_chunks, fragment_seal, group
from tests.ui_helpers import block, top

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")
OTHER = uuid.UUID("99999999-2222-3333-4444-555555555555")


def plan(*statuses: str, seq: int | None = None, turn: uuid.UUID = TURN, omitted: int = 0):
    entries = [
        {"content": f"step {n}", "status": s, "priority": "high"} for n, s in enumerate(statuses)
    ]
    data: dict = {"entries": entries, **({"omitted": omitted} if omitted else {})}
    return block("plan", data, turn_id=turn, seq=seq)


def test_a_turns_later_plans_go_in_its_first_plans_slot():
    first, second, third = plan("pending", seq=2), plan("completed", seq=4), plan(seq=6)
    text = block("text", {"text": "x"}, turn_id=TURN, seq=3)
    elsewhere = plan("pending", seq=8, turn=OTHER)
    items = group([first, text, second, third, elsewhere])
    assert [i.id for i in items] == [first.id, text.id, elsewhere.id]
    assert [r.id for r in items[0].results] == [second.id, third.id]


def test_a_sealed_plan_shows_its_entries_and_goes_to_its_turns_slot_or_the_log():
    [wrapper] = top(fragment_seal(plan("completed", "in_progress", "pending", omitted=2)))
    assert wrapper.get("hx-swap-oob") == f'beforeend:.plan-slot[data-plan="{TURN}"]'
    assert wrapper.get("data-fallback") == "#log"
    [chunk] = wrapper.children
    assert {"chunk", "t-plan", "a"} <= chunk.classes
    entries = chunk.find_all(lambda n: "plan-entry" in n.classes)
    assert [(e.classes - {"plan-entry"}, e.text) for e in entries] == [
        ({"plan-completed"}, "✓ step 0"),
        ({"plan-in_progress"}, "▸ step 1"),
        ({"plan-pending"}, "○ step 2"),
    ]
    assert "1 of 3 done" in chunk.text and "and 2 more" in chunk.text
    [slot] = chunk.find_all(lambda n: "plan-slot" in n.classes)
    assert slot.get("data-plan") == str(TURN) and not slot.children


def test_a_catch_up_batch_nests_revisions_and_sends_each_first_plan_on_its_own():
    before = block("text", {"text": "a"}, turn_id=TURN, seq=4)
    first, second = plan("pending", seq=5), plan("completed", seq=6)
    after = block("text", {"text": "b"}, turn_id=TURN, seq=7)
    wrappers = top(fragment_chunks([before, first, second, after]))
    assert [w.get("hx-swap-oob") for w in wrappers] == [
        "beforeend:#log",
        f'beforeend:.plan-slot[data-plan="{TURN}"]',
        "beforeend:#log",
    ]
    [shown] = wrappers[1].children
    [slot] = [n for n in shown.children if "plan-slot" in n.classes]
    assert [c.get("data-seq") for c in slot.children] == ["6"]


def test_history_sends_no_plan():
    user = block("text", {"text": "go"}, role="user", turn_id=TURN, seq=1, step=0)
    answer = block("text", {"text": "done"}, turn_id=TURN, seq=3)
    then = block("text", {"text": "next"}, role="user", turn_id=OTHER, seq=4, step=0)
    sent = History.build([user, plan("completed", seq=2), answer, then]).messages()
    assert [(m.role, [getattr(p, "text", None) for p in m.parts]) for m in sent] == [
        ("user", ["go"]),
        ("assistant", ["done"]),
        ("user", ["next"]),
    ]


def test_an_export_shows_a_plan_as_a_task_list():
    from chat.transfer import markdown_chunk

    assert markdown_chunk(plan("completed", "in_progress", "pending")) == (
        "**Plan**\n\n- [x] step 0\n- [ ] step 1 *(in progress)*\n- [ ] step 2\n\n"
    )
