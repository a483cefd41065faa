"""chat.turn.ending, the one way a turn ends: what each ending writes, from the turn's
reducer as it is when the turn stops (pure: no database)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from chat.providers.base import ShellOutput, TextDelta, ToolCallEvent, ToolResultEvent
from chat.stream import Block, Reducer
from chat.turn.calls import Approvals
from chat.turn.ending import (
    CRASHED_WHILE_RUNNING,
    NOT_RUN_CRASHED,
    RECOVERED_WHILE_RUNNING,
    RESUMING,
    End,
    Ending,
    end_ops,
    sealed,
)
from chat.turn.state import TurnCancelled, TurnState


def reducer_with(*events) -> Reducer:
    reducer = Reducer(uuid.uuid4(), step=2)
    for event in events:
        reducer.feed(event)
    return reducer


def shapes(reducer: Reducer, end: End) -> list[tuple[str, str, dict]]:
    return [(b.role, b.type, b.data) for b in sealed(end_ops(reducer, end))]


def test_a_stop_seals_the_open_text_and_answers_the_calls():
    """The open block is kept, marked interrupted; each call without a result gets one;
    the notice says who stopped it."""
    reducer = reducer_with(ToolCallEvent("a", "read_file", {}), TextDelta("half"))
    assert shapes(reducer, End.stopped()) == [
        ("assistant", "text", {"text": "half", "interrupted": True}),
        (
            "tool",
            "tool_result",
            {
                "call_id": "a",
                "name": "read_file",
                "result": "Cancelled by the user.",
                "is_error": True,
                "interrupted": True,
            },
        ),
        ("system", "system", {"kind": "cancelled", "text": "Stopped by the user."}),
    ]
    assert reducer.open is None and reducer.pending_calls == []


def test_a_crash_completes_the_running_calls_output():
    """The call whose output was streaming is answered as having run, its output kept;
    the others as never run; an error chunk closes the turn."""
    reducer = reducer_with(
        ToolCallEvent("s", "shell", {"command": "ls"}),
        ToolCallEvent("t", "shell", {"command": "pwd"}),
        ShellOutput("s", "a.txt\n"),
    )
    got = shapes(reducer, End.crashed("Internal error in the turn runner: boom"))
    assert [(d["call_id"], d["result"], d.get("shell_output")) for _, _, d in got[:2]] == [
        ("s", CRASHED_WHILE_RUNNING, "a.txt\n"),
        ("t", NOT_RUN_CRASHED, None),
    ]
    assert got[2] == ("assistant", "error", {"message": "Internal error in the turn runner: boom"})


@pytest.mark.parametrize(
    ("end", "kind", "text"),
    [
        (End.stopped("its parent was stopped"), "cancelled", "Stopped: its parent was stopped."),
        (
            End.shut_down(resuming=False),
            "interrupted",
            "The server shut down in the middle of this turn. Send a message to go on.",
        ),
        (
            End.shut_down(resuming=True),
            "interrupted",
            "The server shut down in the middle of this turn. " + RESUMING.strip(),
        ),
        (
            End.recovered(checkpoint_lost=False, resuming=True),
            "interrupted",
            "The server stopped in the middle of this turn." + RESUMING,
        ),
        (End.limit("step-limit", "Stopped after 3 steps."), "step-limit", "Stopped after 3 steps."),
        (
            End.stopped_before_start(),
            "cancelled",
            "Stopped by the user before it started.",
        ),
    ],
)
def test_each_ending_writes_its_notice(end, kind, text):
    """With nothing open, an ending is its notice alone, of its kind."""
    assert shapes(Reducer(uuid.uuid4()), end) == [
        ("system", "system", {"kind": kind, "text": text})
    ]


def test_done_writes_nothing():
    assert end_ops(reducer_with(TextDelta("open")), End(Ending.DONE)) == []


@pytest.mark.parametrize(
    "before",
    [
        # An earlier call of the step left without a result (an `agent` call whose
        # answer comes at the step's end, a call of an attempt cut off and retried).
        [ToolCallEvent("c1", "agent", {})],
        # The running call's id repeats a call answered in an earlier step.
        [ToolCallEvent("c2", "shell", {}), ToolResultEvent("c2", "shell", "old", False)],
    ],
    ids=["earlier-call-pending", "id-answered-before"],
)
def test_the_running_calls_output_gets_its_result_whatever_came_before(before):
    """Exactly one result for the running call: its output block, completed with the
    running text; never the block sealed bare and a second, empty result after it."""
    reducer = reducer_with(
        *before, ToolCallEvent("c2", "shell", {"command": "make"}), ShellOutput("c2", "partial\n")
    )
    got = [d for _, kind, d in shapes(reducer, End.crashed("boom")) if kind == "tool_result"]
    running = [d for d in got if d["call_id"] == "c2"]
    assert running == [
        {
            "call_id": "c2",
            "name": "shell",
            "result": CRASHED_WHILE_RUNNING,
            "is_error": True,
            "shell_output": "partial\n",
            "interrupted": True,
        }
    ]
    assert [d["result"] for d in got if d["call_id"] != "c2"] == [NOT_RUN_CRASHED] * (len(got) - 1)
    assert reducer.open is None and reducer.pending_calls == []


def test_a_recovered_running_call_whose_id_was_answered_before_still_gets_its_result():
    """Recovery rebuilds the reducer from the log: a running call whose id repeats an
    answered one is not pending, and its checkpointed output is the open block."""
    output = Block(
        uuid.uuid4(), uuid.uuid4(), 2, "tool", "tool_result",
        {"call_id": "c2", "name": "shell", "shell_output": "partial\n"},
    )  # fmt: skip
    reducer = Reducer(output.turn_id, 2, _open=output)
    got = shapes(reducer, End.recovered(checkpoint_lost=False, resuming=False))
    assert got[0] == (
        "tool",
        "tool_result",
        {
            "call_id": "c2",
            "name": "shell",
            "result": RECOVERED_WHILE_RUNNING,
            "is_error": True,
            "shell_output": "partial\n",
            "interrupted": True,
        },
    )
    assert [kind for _, kind, _ in got] == ["tool_result", "system"]


async def test_a_stop_that_came_before_the_approval_wait_is_not_lost():
    """Stop while a call was being judged (no approval waiting yet to answer): asking
    for approval then ends the turn at once instead of waiting for an answer."""
    state = TurnState(tab_id=uuid.uuid4(), turn_id=uuid.uuid4())
    state.cancel()
    approvals = Approvals(state, outbox=None)  # type: ignore[arg-type]
    with pytest.raises(TurnCancelled):
        await asyncio.wait_for(approvals.ask("c1", "shell", {"command": "ls"}), 1)
    assert state.approvals == {}
