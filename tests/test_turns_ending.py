"""chat.turn.ending, the one way a turn ends: what each ending writes, from the turn's
reducer as it is when the turn stops (pure: no database)."""

from __future__ import annotations

import uuid

import pytest

from chat.providers.base import ShellOutput, TextDelta, ToolCallEvent
from chat.stream import Reducer
from chat.turn.ending import (
    CRASHED_WHILE_RUNNING,
    NOT_RUN_CRASHED,
    RESUMING,
    End,
    Ending,
    end_ops,
    sealed,
)


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
