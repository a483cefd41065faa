"""Where a log can be cut for a branch (chat.cuts). Pure: no Django.

Each log below is a list of chunk specs; every cut position 0..len is checked
against the rule, so a table row fixes the validity of every cut in its log.
"""

from __future__ import annotations

import uuid

import pytest

from chat import cuts
from chat.cuts import CutError
from chat.stream import Block, Kind, Role

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


def U(text="q", turn=T1, step=0):
    return (turn, step, Role.USER, Kind.TEXT, {"text": text})


def A(text="a", step=1, turn=T1):
    return (turn, step, Role.ASSISTANT, Kind.TEXT, {"text": text})


def TH(step=1, turn=T1):
    return (turn, step, Role.ASSISTANT, Kind.THINKING, {"text": "t", "signature": "s"})


def C(call_id, step=1, turn=T1):
    return (turn, step, Role.ASSISTANT, Kind.TOOL_CALL, {"call_id": call_id, "name": "shell"})


def R(call_id, step=1, turn=T1):
    data = {"call_id": call_id, "name": "shell", "result": "ok", "is_error": False}
    return (turn, step, Role.TOOL, Kind.TOOL_RESULT, data)


def LIVE(call_id, step=1, turn=T1):
    """Live output sealed without its result: it answers nothing."""
    return (turn, step, Role.TOOL, Kind.TOOL_RESULT, {"call_id": call_id, "shell_output": "…"})


def SYS(kind="notice", step=1, turn=T1, **extra):
    return (turn, step, Role.SYSTEM, Kind.SYSTEM, {"kind": kind, "text": kind, **extra})


def IDLE_SYS(kind="model-changed"):
    return (None, 0, Role.SYSTEM, Kind.SYSTEM, {"kind": kind, "text": kind})


def ERR(step=1, turn=T1):
    return (turn, step, Role.ASSISTANT, Kind.ERROR, {"message": "boom"})


def log(*specs) -> list[Block]:
    return [
        Block(uuid.uuid4(), turn, step, role, kind, data, seq=n)
        for n, (turn, step, role, kind, data) in enumerate(specs, start=1)
    ]


def check(blocks: list[Block], at_seq: int, running: uuid.UUID | None = None) -> None:
    """cuts.check with the arguments chat.turns gathers from the database."""
    at = blocks[at_seq - 1] if 1 <= at_seq <= len(blocks) else None
    after = blocks[at_seq] if 0 <= at_seq < len(blocks) else None
    turn = (
        [b for b in blocks[:at_seq] if b.turn_id == at.turn_id]
        if at is not None and at.turn_id is not None
        else []
    )
    cuts.check(at_seq, at, after, turn, running_turn=running)


# Log -> the seqs that are valid cuts (every other position 0..len must be refused).
CUTS = {
    "question and answer": (
        [U(), A()],
        {0, 1, 2},  # before the question, after it (regenerate), after the answer
    ),
    "thinking, text, a call and its result, then the answer": (
        [U(), TH(), A(), C("c1"), R("c1"), A("done", step=2)],
        {0, 1, 5, 6},  # never inside step 1; after its result (step end, all answered)
    ),
    "two calls, both answered": (
        [U(), C("c1"), C("c2"), R("c1"), R("c2"), A(step=2)],
        {0, 1, 5, 6},
    ),
    "a call without a result at the end of the log": (
        [U(), C("c1")],
        {0, 1},
    ),
    "a result holding only live output answers nothing": (
        [U(), C("c1"), LIVE("c1"), A(step=2)],
        {0, 1},
    ),
    "a result of no call in the step answers nothing": (
        [U(), C("c1"), R("zz"), A(step=2)],
        {0, 1},
    ),
    "repeated call ids: each result answers one call": (
        [U(), C("x"), C("x"), R("x"), A(step=2)],
        {0, 1},
    ),
    "two turns": (
        [U(), A(), U("q2", turn=T2), A(turn=T2)],
        {0, 1, 2, 3, 4},
    ),
    "a mid-turn message after tool results": (
        [U(), C("c1"), R("c1"), U("more"), A(step=2)],
        {0, 1, 3, 4, 5},
    ),
    "a step's notices end the step; a retry notice is in its middle": (
        [U(), A("half"), SYS(retry=True), A("whole"), SYS("output-limit")],
        {0, 1, 5},
    ),
    "an error ends its step": (
        [U(), C("c1"), R("c1"), A("half", step=2), ERR(step=2)],
        {0, 1, 3, 5},
    ),
    "system chunks outside any turn": (
        [IDLE_SYS(), U(), A(), IDLE_SYS()],
        {1, 2, 3, 4},  # not 0: the first chunk is not the user's
    ),
    "a crash: the open block interrupted, the call answered, a notice": (
        [U(), C("c1"), R("c1"), SYS("interrupted")],
        {0, 1, 4},
    ),
    "a log that starts with the answer (imported)": (
        [A(), U()],
        {1, 2},
    ),
}


@pytest.mark.parametrize("specs, valid", CUTS.values(), ids=CUTS.keys())
def test_every_cut_position_of_each_log(specs, valid):
    blocks = log(*specs)
    got = set()
    for at_seq in range(len(blocks) + 1):
        try:
            check(blocks, at_seq)
        except CutError:
            continue
        got.add(at_seq)
    assert got == valid


@pytest.mark.parametrize("specs, valid", CUTS.values(), ids=CUTS.keys())
def test_valid_cuts_of_a_page_agrees_with_check(specs, valid):
    assert cuts.valid_cuts(log(*specs)) == valid


def test_the_messages_say_why():
    blocks = log(U(), C("c1"), R("c1"), A(step=2))
    with pytest.raises(CutError, match="There is no message 9"):
        check(blocks, 9)
    with pytest.raises(CutError, match="There is no message -1"):
        check(blocks, -1)
    with pytest.raises(CutError, match="not in the middle of a step"):
        check(blocks, 2)
    with pytest.raises(CutError, match="has no result yet"):
        check(log(U(), C("c1")), 2)
    with pytest.raises(CutError, match="empty"):
        check([], 0)


def test_nothing_inside_the_running_turn_is_a_cut_but_the_turns_before_are():
    blocks = log(U(), A(), U("q2", turn=T2), C("c1", turn=T2), R("c1", turn=T2))
    for at_seq in (3, 5):
        with pytest.raises(CutError, match="running"):
            check(blocks, at_seq, running=T2)
    for at_seq in (0, 1, 2):  # 2: right before the running turn's question
        check(blocks, at_seq, running=T2)
    assert cuts.valid_cuts(blocks, running_turn=T2) == {0, 1, 2}


def test_a_page_starting_inside_the_running_turn_offers_nothing_before_it():
    """Its first chunk may be a message sent mid-turn: the chunk before it is the
    running turn's, so no cut is offered there (the server would refuse it)."""
    blocks = log(U(), C("c1"), R("c1"), U("more"), A(step=2))
    assert 3 not in cuts.valid_cuts(blocks[3:], running_turn=T1)


REGENERATE = {
    "one question": ([U(), A()], 1),
    "two messages start the turn": ([U(), U("and"), A()], 2),
    "a mid-turn message is not the question": ([U(), C("c1"), R("c1"), U("more"), A(step=2)], 1),
}


@pytest.mark.parametrize("specs, expected", REGENERATE.values(), ids=REGENERATE.keys())
def test_regenerate_cuts_right_after_the_question(specs, expected):
    assert cuts.regenerate_at(log(*specs)) == expected


def test_regenerate_of_a_turn_without_a_question_is_refused():
    with pytest.raises(CutError, match="no message of yours"):
        cuts.regenerate_at(log(A(), A()))


RETRY = {
    "an error in the first step: from the question": ([U(), A("half"), ERR()], 1),
    "an error at step 3: from the end of step 2, its tool work kept": (
        [U(), C("c1"), R("c1"), C("c2", step=2), R("c2", step=2), A("x", step=3), ERR(step=3)],
        5,
    ),
    "an error right at a step's start": ([U(), C("c1"), R("c1"), ERR(step=2)], 3),
    "retry notices before the error stay out": (
        [U(), A("a"), SYS(retry=True), A("b"), SYS(retry=True), ERR()],
        1,
    ),
}


@pytest.mark.parametrize("specs, expected", RETRY.values(), ids=RETRY.keys())
def test_retry_cuts_at_the_last_finished_step_before_the_error(specs, expected):
    blocks = log(*specs)
    error = next(b for b in blocks if b.type == Kind.ERROR)
    assert cuts.retry_at(blocks, error.seq) == expected


def test_retry_with_nothing_before_the_error_is_refused():
    blocks = log(A(), ERR())
    with pytest.raises(CutError, match="nothing before this error"):
        cuts.retry_at(blocks, 2)
