"""What Continue tells the model about an interrupted turn (chat.resume). Pure: no Django."""

from __future__ import annotations

import uuid

import pytest

from chat import resume
from chat.stream import Block, Kind, Role

T = uuid.UUID(int=7)


def U(text="fix the tests"):
    return (0, Role.USER, Kind.TEXT, {"text": text})


def A(text, step=1, **extra):
    return (step, Role.ASSISTANT, Kind.TEXT, {"text": text, **extra})


def TH(text, step=1, **extra):
    return (step, Role.ASSISTANT, Kind.THINKING, {"text": text, **extra})


def C(call_id, command, step=1, name="shell"):
    data = {"call_id": call_id, "name": name, "arguments": {"command": command}}
    return (step, Role.ASSISTANT, Kind.TOOL_CALL, data)


def R(call_id, result, step=1, *, is_error=False, name="shell", **extra):
    data = {"call_id": call_id, "name": name, "result": result, "is_error": is_error, **extra}
    return (step, Role.TOOL, Kind.TOOL_RESULT, data)


def SYS(kind, step=1, **extra):
    return (step, Role.SYSTEM, Kind.SYSTEM, {"kind": kind, "text": kind, **extra})


def ERR(message, step=1):
    return (step, Role.ASSISTANT, Kind.ERROR, {"message": message, "status_code": 529})


def turn(*specs) -> list[Block]:
    return [
        Block(uuid.uuid4(), T, step, role, kind, data, seq=n)
        for n, (step, role, kind, data) in enumerate(specs, start=1)
    ]


LONG = "word " * 100 + "the very end"

# Turn -> (the interruption's kind, phrases its Continue message must hold).
CASES = {
    "server restart while a shell command ran": (
        [
            U(),
            C("c1", "npm test"),
            R(
                "c1",
                "Interrupted: the server stopped while this call ran.",
                is_error=True,
                shell_output="PASS a\n",
                interrupted=True,
            ),
            SYS("interrupted"),
        ],
        "interrupted",
        [
            "The server restarted in the middle of your previous reply.",
            "`shell: npm test` was running: its exit status is unknown",
            "its output so far is in its result",
            resume.NOT_AGAIN,
        ],
    ),
    "server restart while writing": (
        [U(), A("Here is the plan: first", interrupted=True), SYS("interrupted")],
        "interrupted",
        ["The server restarted", "You were writing", "ends with: “Here is the plan: first”"],
    ),
    "server restart while thinking": (
        [U(), TH("Let me see", interrupted=True), SYS("interrupted")],
        "interrupted",
        ["You were thinking (that thinking is lost)"],
    ),
    "server restart before the first token": (
        [U(), SYS("interrupted", step=1)],
        "interrupted",
        ["You had not written anything yet."],
    ),
    "Stop during a shell command, a second call never ran": (
        [
            U(),
            C("c1", "make build"),
            C("c2", "make deploy"),
            R("c1", "Cancelled by the user.", is_error=True, shell_output="", interrupted=True),
            R("c2", "Cancelled by the user.", is_error=True, interrupted=True),
            SYS("cancelled"),
        ],
        "cancelled",
        [
            "I stopped your previous reply.",
            "`shell: make build` was running: its exit status is unknown",
            "`shell: make deploy` was not run.",
            resume.NOT_AGAIN,
        ],
    ),
    "Stop while writing: the quote is the end of the text": (
        [U(), A(LONG, interrupted=True), SYS("cancelled")],
        "cancelled",
        ["I stopped your previous reply", "the very end”", "“…"],
    ),
    "output limit": (
        [U(), A("def main():\n    return 4"), SYS("output-limit")],
        "output-limit",
        ["cut off at the output limit", "def main(): return 4"],
    ),
    "context window": (
        [U(), A("so"), SYS("context-limit")],
        "context-limit",
        ["filled your context window"],
    ),
    "step limit after tool results": (
        [U(), C("c1", "ls"), R("c1", "a b"), SYS("step-limit")],
        "step-limit",
        ["stopped at the step limit", "last tool results are above"],
    ),
    "a provider error, after notices": (
        [U(), A("half", interrupted=True), SYS("notice", retry=True), ERR("Overloaded (529)")],
        "error",
        ["stopped on an error: Overloaded (529).", "ends with: “half”"],
    ),
    "an error right after a call": (
        [U(), C("c1", "rm -rf build"), ERR("Internal error in the turn runner: boom")],
        "error",
        ["right after you called `shell: rm -rf build`", "Internal error", resume.NOT_AGAIN],
    ),
    "a config reload after the cut does not hide it": (
        [U(), A("x"), SYS("output-limit"), SYS("config-reload")],
        "output-limit",
        ["cut off at the output limit"],
    ),
}


@pytest.mark.parametrize("specs, kind, phrases", CASES.values(), ids=CASES.keys())
def test_each_interruption_is_named_with_where_it_stopped(specs, kind, phrases):
    chunks = turn(*specs)
    assert resume.interruption(chunks) == kind
    text = resume.message(chunks)
    for phrase in phrases:
        assert phrase in text
    # Never a bare "continue": the model is told what to do next, and a call
    # cut short is not to be run again blindly (only then is that said).
    assert resume.GO_ON in text
    assert (resume.NOT_AGAIN in text) == (resume.NOT_AGAIN in phrases)
    assert len(text) < 1000


FINISHED = {
    "an answer": [U(), A("done")],
    "an answer then a notice": [U(), A("done"), SYS("config-reload")],
    "a forked notice is no interruption": [U(), A("done"), SYS("forked")],
}


@pytest.mark.parametrize("specs", FINISHED.values(), ids=FINISHED.keys())
def test_a_finished_turn_has_nothing_to_continue(specs):
    chunks = turn(*specs)
    assert resume.interruption(chunks) is None
    with pytest.raises(ValueError, match="finished normally"):
        resume.message(chunks)


def test_no_turn_at_all():
    with pytest.raises(ValueError, match="no turn yet"):
        resume.message([])


def test_a_long_command_is_shortened_and_whitespace_folded():
    command = "echo " + "x" * 500 + "\n\n  done"
    chunks = turn(
        U(),
        C("c1", command),
        R("c1", "Cancelled by the user.", is_error=True, shell_output="", interrupted=True),
        SYS("cancelled"),
    )
    text = resume.message(chunks)
    assert "x" * (resume.CALL_CHARS - 10) in text
    assert "x" * resume.CALL_CHARS not in text
    assert "\n\n  done" not in text
