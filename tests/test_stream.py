"""The reducer (chat.stream): provider events in, open/delta/seal ops out. Pure."""

from __future__ import annotations

import itertools
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from chat.providers.base import (
    ErrorEvent,
    Finish,
    ReasoningDelta,
    ReasoningEnd,
    ShellOutput,
    SystemEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)
from chat.stream import Block, Delta, Kind, Open, Reducer, Role, Seal
from tests.pure_helpers import MemoryLog

TURN = uuid.UUID(int=1)

# One sample of each event kind; the calls all use one id so that a result or
# shell output after a call belongs to it.
SAMPLES = {
    "text": TextDelta("hi"),
    "reasoning": ReasoningDelta("hm"),
    "reasoning-end": ReasoningEnd(signature="sig"),
    "tool-call": ToolCallEvent("c1", "shell", {"cmd": "ls"}),
    "tool-result": ToolResultEvent("c1", "shell", "ok"),
    "shell-output": ShellOutput("c1", "out"),
    "error": ErrorEvent("boom", 500),
    "system": SystemEvent("notice", "note"),
    "finish": Finish(),
}

# (first, second) -> ops of feeding both, and the chunk types in the log once
# the step ends. Op notation: "open T", "delta T@offset", "seal T", where T is
# the type of the block the op addresses.
_T = "open text, delta text@0"
_R = "open thinking, delta thinking@0"
_S = "open tool_result, delta tool_result@0"
TRANSITIONS = {
    ("text", "text"): (f"{_T}, delta text@2", "text"),
    ("text", "reasoning"): (f"{_T}, seal text, {_R}", "text thinking"),
    ("text", "reasoning-end"): (f"{_T}, seal text, seal thinking", "text thinking"),
    ("text", "tool-call"): (f"{_T}, seal text, seal tool_call", "text tool_call"),
    ("text", "tool-result"): (f"{_T}, seal text, seal tool_result", "text tool_result"),
    ("text", "shell-output"): (f"{_T}, seal text, {_S}", "text tool_result"),
    ("text", "error"): (f"{_T}, seal text, seal error", "text error"),
    ("text", "system"): (f"{_T}, seal text, seal system", "text system"),
    ("text", "finish"): (f"{_T}, seal text", "text"),
    ("reasoning", "text"): (f"{_R}, seal thinking, {_T}", "thinking text"),
    ("reasoning", "reasoning"): (f"{_R}, delta thinking@2", "thinking"),
    ("reasoning", "reasoning-end"): (f"{_R}, seal thinking", "thinking"),
    ("reasoning", "tool-call"): (f"{_R}, seal thinking, seal tool_call", "thinking tool_call"),
    ("reasoning", "tool-result"): (
        f"{_R}, seal thinking, seal tool_result",
        "thinking tool_result",
    ),
    ("reasoning", "shell-output"): (f"{_R}, seal thinking, {_S}", "thinking tool_result"),
    ("reasoning", "error"): (f"{_R}, seal thinking, seal error", "thinking error"),
    ("reasoning", "system"): (f"{_R}, seal thinking, seal system", "thinking system"),
    ("reasoning", "finish"): (f"{_R}, seal thinking", "thinking"),
    ("reasoning-end", "text"): (f"seal thinking, {_T}", "thinking text"),
    ("reasoning-end", "reasoning"): (f"seal thinking, {_R}", "thinking thinking"),
    ("reasoning-end", "reasoning-end"): ("seal thinking, seal thinking", "thinking thinking"),
    ("reasoning-end", "tool-call"): ("seal thinking, seal tool_call", "thinking tool_call"),
    ("reasoning-end", "tool-result"): ("seal thinking, seal tool_result", "thinking tool_result"),
    ("reasoning-end", "shell-output"): (f"seal thinking, {_S}", "thinking tool_result"),
    ("reasoning-end", "error"): ("seal thinking, seal error", "thinking error"),
    ("reasoning-end", "system"): ("seal thinking, seal system", "thinking system"),
    ("reasoning-end", "finish"): ("seal thinking", "thinking"),
    ("tool-call", "text"): (f"seal tool_call, {_T}", "tool_call text"),
    ("tool-call", "reasoning"): (f"seal tool_call, {_R}", "tool_call thinking"),
    ("tool-call", "reasoning-end"): ("seal tool_call, seal thinking", "tool_call thinking"),
    ("tool-call", "tool-call"): ("seal tool_call, seal tool_call", "tool_call tool_call"),
    ("tool-call", "tool-result"): ("seal tool_call, seal tool_result", "tool_call tool_result"),
    ("tool-call", "shell-output"): (f"seal tool_call, {_S}", "tool_call tool_result"),
    ("tool-call", "error"): ("seal tool_call, seal error", "tool_call error"),
    ("tool-call", "system"): ("seal tool_call, seal system", "tool_call system"),
    ("tool-call", "finish"): ("seal tool_call", "tool_call"),
    ("tool-result", "text"): (f"seal tool_result, {_T}", "tool_result text"),
    ("tool-result", "reasoning"): (f"seal tool_result, {_R}", "tool_result thinking"),
    ("tool-result", "reasoning-end"): (
        "seal tool_result, seal thinking",
        "tool_result thinking",
    ),
    ("tool-result", "tool-call"): ("seal tool_result, seal tool_call", "tool_result tool_call"),
    ("tool-result", "tool-result"): (
        "seal tool_result, seal tool_result",
        "tool_result tool_result",
    ),
    ("tool-result", "shell-output"): (f"seal tool_result, {_S}", "tool_result tool_result"),
    ("tool-result", "error"): ("seal tool_result, seal error", "tool_result error"),
    ("tool-result", "system"): ("seal tool_result, seal system", "tool_result system"),
    ("tool-result", "finish"): ("seal tool_result", "tool_result"),
    ("shell-output", "text"): (f"{_S}, seal tool_result, {_T}", "tool_result text"),
    ("shell-output", "reasoning"): (f"{_S}, seal tool_result, {_R}", "tool_result thinking"),
    ("shell-output", "reasoning-end"): (
        f"{_S}, seal tool_result, seal thinking",
        "tool_result thinking",
    ),
    ("shell-output", "tool-call"): (
        f"{_S}, seal tool_result, seal tool_call",
        "tool_result tool_call",
    ),
    ("shell-output", "tool-result"): (f"{_S}, seal tool_result", "tool_result"),
    ("shell-output", "shell-output"): (f"{_S}, delta tool_result@3", "tool_result"),
    ("shell-output", "error"): (f"{_S}, seal tool_result, seal error", "tool_result error"),
    ("shell-output", "system"): (f"{_S}, seal tool_result, seal system", "tool_result system"),
    ("shell-output", "finish"): (f"{_S}, seal tool_result", "tool_result"),
    ("error", "text"): (f"seal error, {_T}", "error text"),
    ("error", "reasoning"): (f"seal error, {_R}", "error thinking"),
    ("error", "reasoning-end"): ("seal error, seal thinking", "error thinking"),
    ("error", "tool-call"): ("seal error, seal tool_call", "error tool_call"),
    ("error", "tool-result"): ("seal error, seal tool_result", "error tool_result"),
    ("error", "shell-output"): (f"seal error, {_S}", "error tool_result"),
    ("error", "error"): ("seal error, seal error", "error error"),
    ("error", "system"): ("seal error, seal system", "error system"),
    ("error", "finish"): ("seal error", "error"),
    ("system", "text"): (f"seal system, {_T}", "system text"),
    ("system", "reasoning"): (f"seal system, {_R}", "system thinking"),
    ("system", "reasoning-end"): ("seal system, seal thinking", "system thinking"),
    ("system", "tool-call"): ("seal system, seal tool_call", "system tool_call"),
    ("system", "tool-result"): ("seal system, seal tool_result", "system tool_result"),
    ("system", "shell-output"): (f"seal system, {_S}", "system tool_result"),
    ("system", "error"): ("seal system, seal error", "system error"),
    ("system", "system"): ("seal system, seal system", "system system"),
    ("system", "finish"): ("seal system", "system"),
    ("finish", "text"): (_T, "text"),
    ("finish", "reasoning"): (_R, "thinking"),
    ("finish", "reasoning-end"): ("seal thinking", "thinking"),
    ("finish", "tool-call"): ("seal tool_call", "tool_call"),
    ("finish", "tool-result"): ("seal tool_result", "tool_result"),
    ("finish", "shell-output"): (_S, "tool_result"),
    ("finish", "error"): ("seal error", "error"),
    ("finish", "system"): ("seal system", "system"),
    ("finish", "finish"): ("", ""),
}


def notation(ops) -> str:
    """Ops as "open T, delta T@n, seal T", T being the addressed block's type."""
    types: dict[uuid.UUID, str] = {}
    out = []
    for op in ops:
        match op:
            case Open(block=block):
                types[block.id] = block.type
                out.append(f"open {block.type}")
            case Delta(chunk_id=chunk_id, offset=offset):
                out.append(f"delta {types.get(chunk_id, '?')}@{offset}")
            case Seal(block=block):
                out.append(f"seal {block.type}")
    return ", ".join(out)


def run(*events, step: int = 0) -> tuple[list, MemoryLog]:
    """Feed events through a fresh reducer, then end the step; ops and the log."""
    reducer = Reducer(TURN, step)
    log = MemoryLog()
    ops = log.feed(reducer, events)
    log.apply(reducer.seal())
    return ops, log


def test_it_has_a_row_for_every_transition_pair():
    """The transition table covers all 81 ordered pairs of the 9 event kinds."""
    assert set(TRANSITIONS) == set(itertools.product(SAMPLES, repeat=2))


@pytest.mark.parametrize(("first", "second"), sorted(TRANSITIONS))
def test_it_reduces_each_transition_pair(first, second):
    """Each pair of event kinds gives exactly the expected ops and chunks."""
    expected_ops, expected_chunks = TRANSITIONS[first, second]
    ops, log = run(SAMPLES[first], SAMPLES[second])
    assert notation(ops) == expected_ops
    assert " ".join(b.type for b in log.blocks) == expected_chunks
    assert [b.seq for b in log.blocks] == list(range(1, len(log.blocks) + 1))
    assert all(b.turn_id == TURN and b.step == 0 for b in log.blocks)


def test_it_coalesces_two_text_deltas_into_one_chunk():
    """Consecutive text deltas extend one assistant text chunk."""
    _, log = run(TextDelta("Hello, "), TextDelta("world"), Finish())
    [chunk] = log.blocks
    assert (chunk.role, chunk.type, chunk.data) == (
        Role.ASSISTANT,
        Kind.TEXT,
        {"text": "Hello, world"},
    )


def test_it_splits_text_then_reasoning_into_two_chunks():
    """A reasoning delta after text seals the text and opens a thinking chunk."""
    _, log = run(TextDelta("a"), ReasoningDelta("b"), Finish())
    assert [(b.type, b.data) for b in log.blocks] == [
        (Kind.TEXT, {"text": "a"}),
        (Kind.THINKING, {"text": "b"}),
    ]


def test_it_makes_two_tool_call_chunks_for_two_calls():
    """Tool calls are never coalesced, and each keeps its own arguments."""
    _, log = run(
        ToolCallEvent("c1", "read", {"path": "a"}),
        ToolCallEvent("c2", "read", {"path": "b"}),
    )
    assert [(b.role, b.type, b.data) for b in log.blocks] == [
        (
            Role.ASSISTANT,
            Kind.TOOL_CALL,
            {"call_id": "c1", "name": "read", "arguments": {"path": "a"}},
        ),
        (
            Role.ASSISTANT,
            Kind.TOOL_CALL,
            {"call_id": "c2", "name": "read", "arguments": {"path": "b"}},
        ),
    ]


def test_it_names_a_result_after_its_call_even_with_another_call_between():
    """A result takes the call's name by id, whatever came between."""
    _, log = run(
        ToolCallEvent("c1", "read", {}),
        ToolCallEvent("c2", "write", {}),
        ToolResultEvent("c1", "", "contents"),
        ToolResultEvent("c2", "stale-name", "done", is_error=True, truncated=True),
    )
    results = [b for b in log.blocks if b.type == Kind.TOOL_RESULT]
    assert [(b.role, b.data) for b in results] == [
        (Role.TOOL, {"call_id": "c1", "name": "read", "result": "contents", "is_error": False}),
        (
            Role.TOOL,
            {
                "call_id": "c2",
                "name": "write",
                "result": "done",
                "is_error": True,
                "truncated": True,
            },
        ),
    ]


def test_it_names_results_of_repeated_call_ids_in_call_order():
    """Servers that repeat a call id still get each result named after its own call."""
    reducer = Reducer(TURN)
    log = MemoryLog()
    log.feed(
        reducer,
        [
            ToolCallEvent("dup", "read", {}),
            ToolCallEvent("dup", "write", {}),
            ToolResultEvent("dup", "", "r1"),
            ToolResultEvent("dup", "", "r2"),
        ],
    )
    assert [b.data["name"] for b in log.blocks if b.type == Kind.TOOL_RESULT] == ["read", "write"]
    assert reducer.pending_calls == []


def test_it_keeps_unanswered_calls_pending_in_call_order():
    """pending_calls lists the calls still without a result, for a cancel to answer."""
    reducer = Reducer(TURN)
    for event in [
        ToolCallEvent("a", "read", {}),
        ToolCallEvent("b", "write", {}),
        ToolCallEvent("c", "shell", {}),
        ToolResultEvent("b", "write", "ok"),
    ]:
        reducer.feed(event)
    assert reducer.pending_calls == [("a", "read"), ("c", "shell")]


def test_it_names_a_result_without_a_call_after_the_event():
    """A result for an unknown call keeps the name it came with."""
    _, log = run(ToolResultEvent("zz", "grep", "x"))
    assert log.blocks[0].data["name"] == "grep"


def test_it_makes_two_chunks_for_two_system_events():
    """System events are never coalesced; each is a role=system chunk."""
    _, log = run(SystemEvent("notice", "a"), SystemEvent("model-changed", "b"))
    assert [(b.role, b.type, b.data) for b in log.blocks] == [
        (Role.SYSTEM, Kind.SYSTEM, {"kind": "notice", "text": "a"}),
        (Role.SYSTEM, Kind.SYSTEM, {"kind": "model-changed", "text": "b"}),
    ]


def test_it_keeps_interleaved_thinking_text_and_tools_in_order():
    """think, text, think, tool, think, text gives six chunks in that order."""
    _, log = run(
        ReasoningDelta("t1"),
        ReasoningEnd(signature="s1"),
        TextDelta("x1"),
        ReasoningDelta("t2"),
        ReasoningEnd(signature="s2"),
        ToolCallEvent("c1", "read", {"p": 1}),
        ReasoningDelta("t3"),
        ReasoningEnd(signature="s3"),
        TextDelta("x2"),
        Finish(Usage(1, 2), "end_turn"),
    )
    assert [(b.type, b.data.get("text"), b.data.get("signature")) for b in log.blocks] == [
        (Kind.THINKING, "t1", "s1"),
        (Kind.TEXT, "x1", None),
        (Kind.THINKING, "t2", "s2"),
        (Kind.TOOL_CALL, None, None),
        (Kind.THINKING, "t3", "s3"),
        (Kind.TEXT, "x2", None),
    ]


def test_it_keeps_a_thinking_block_with_only_a_signature():
    """Thinking with display omitted (no deltas, only a signature) is still a chunk."""
    ops, log = run(ReasoningEnd(signature="EqQBCkgIAR=="), TextDelta("answer"))
    assert isinstance(ops[0], Seal)
    assert [(b.type, b.data) for b in log.blocks] == [
        (Kind.THINKING, {"text": "", "signature": "EqQBCkgIAR=="}),
        (Kind.TEXT, {"text": "answer"}),
    ]


def test_it_keeps_redacted_thinking_without_deltas():
    """Redacted thinking arrives whole; its data is kept for replay."""
    _, log = run(ReasoningEnd(redacted_data="opaque+/="))
    assert [(b.role, b.type, b.data) for b in log.blocks] == [
        (Role.ASSISTANT, Kind.THINKING, {"text": "", "redacted_data": "opaque+/="}),
    ]


def test_it_attaches_the_signature_to_the_open_thinking_chunk():
    """reasoning-end seals the thinking it closes, with the signature attached."""
    ops, log = run(ReasoningDelta("why"), ReasoningDelta(" so"), ReasoningEnd(signature="sig"))
    assert notation(ops) == "open thinking, delta thinking@0, delta thinking@3, seal thinking"
    assert log.blocks[0].data == {"text": "why so", "signature": "sig"}


def test_it_makes_no_chunk_for_a_reasoning_end_with_nothing_to_keep():
    """A reasoning-end with no thinking open and no metadata only seals the open block."""
    ops, log = run(TextDelta("a"), ReasoningEnd(), TextDelta("b"))
    assert notation(ops) == "open text, delta text@0, seal text, open text, delta text@0"
    assert [b.type for b in log.blocks] == [Kind.TEXT, Kind.TEXT]


def test_it_streams_shell_output_into_the_result_and_seals_it_with_the_result():
    """Shell output opens the call's tool_result; the result seals it, keeping the output."""
    ops, log = run(
        ToolCallEvent("c1", "shell", {"cmd": "make"}),
        ShellOutput("c1", "building\n"),
        ShellOutput("c1", "done\n"),
        ToolResultEvent("c1", "shell", "exit 0", truncated=True),
    )
    assert notation(ops) == (
        "seal tool_call, open tool_result, delta tool_result@0, delta tool_result@9, "
        "seal tool_result"
    )
    opened = ops[1].block
    result = log.blocks[1]
    assert result.id == opened.id
    assert (result.role, result.type) == (Role.TOOL, Kind.TOOL_RESULT)
    assert result.data == {
        "call_id": "c1",
        "name": "shell",
        "result": "exit 0",
        "is_error": False,
        "truncated": True,
        "shell_output": "building\ndone\n",
    }


def test_it_opens_a_tool_result_on_empty_shell_output():
    """An empty shell-output opens the tool_result (the tool started) with no delta."""
    ops, log = run(ToolCallEvent("c1", "shell", {}), ShellOutput("c1", ""), ShellOutput("c1", ""))
    assert notation(ops) == "seal tool_call, open tool_result"
    assert log.blocks[1].data == {"call_id": "c1", "name": "shell", "shell_output": ""}


def test_it_seals_one_calls_output_when_another_calls_output_starts():
    """Shell output of another call seals the open tool_result as it is."""
    ops, log = run(
        ToolCallEvent("c1", "shell", {}),
        ToolCallEvent("c2", "shell", {}),
        ShellOutput("c1", "one"),
        ShellOutput("c2", "two"),
        ToolResultEvent("c2", "shell", "ok"),
    )
    assert notation(ops).endswith(
        "open tool_result, delta tool_result@0, seal tool_result, "
        "open tool_result, delta tool_result@0, seal tool_result"
    )
    partial, done = log.blocks[2], log.blocks[3]
    assert partial.data == {"call_id": "c1", "name": "shell", "shell_output": "one"}
    assert done.data["call_id"] == "c2" and done.data["shell_output"] == "two"


def test_it_omits_shell_output_from_a_result_that_had_none():
    """A result with no streamed output carries no shell_output key."""
    _, log = run(ToolCallEvent("c1", "read", {}), ToolResultEvent("c1", "read", "x"))
    assert "shell_output" not in log.blocks[1].data


def test_it_gives_correct_delta_offsets():
    """Each delta's offset is the body's length (in characters) before it."""
    reducer = Reducer(TURN)
    deltas = [d for t in ["ab", "ćé", "🙂", "", "xyz"] for d in reducer.feed(TextDelta(t))]
    deltas = [d for d in deltas if isinstance(d, Delta)]
    assert [(d.offset, d.text) for d in deltas] == [(0, "ab"), (2, "ćé"), (4, "🙂"), (5, "xyz")]
    assert len({d.chunk_id for d in deltas}) == 1
    assert reducer.open.text == "abćé🙂xyz"


def test_it_carries_a_snapshot_in_open_that_later_deltas_do_not_change():
    """The Open op's block is a copy: streaming on does not mutate it."""
    reducer = Reducer(TURN)
    [open_op, _] = reducer.feed(TextDelta("first"))
    reducer.feed(TextDelta(" second"))
    [seal] = reducer.feed(Finish())
    assert open_op.block.data == {"text": ""}
    assert open_op.block.id == seal.block.id
    assert seal.block.data == {"text": "first second"}


def test_it_carries_a_snapshot_for_shell_output_too():
    """The Open of a tool_result is a copy as well."""
    reducer = Reducer(TURN)
    reducer.feed(ToolCallEvent("c1", "shell", {}))
    [open_op, _] = reducer.feed(ShellOutput("c1", "x"))
    reducer.feed(ToolResultEvent("c1", "shell", "ok"))
    assert open_op.block.data == {"call_id": "c1", "name": "shell", "shell_output": ""}


def test_it_ignores_empty_text_and_reasoning_deltas():
    """An empty delta neither opens a block nor seals the open one."""
    ops, log = run(
        TextDelta(""),
        ReasoningDelta(""),
        ReasoningDelta("r"),
        TextDelta(""),
        ReasoningEnd(signature="s"),
    )
    assert notation(ops) == "open thinking, delta thinking@0, seal thinking"
    assert [b.data for b in log.blocks] == [{"text": "r", "signature": "s"}]


def test_it_seals_the_open_block_as_it_is_with_extra_data():
    """seal(**extra) ends the open block (cancel, recovery) and marks it."""
    reducer = Reducer(TURN)
    reducer.feed(ReasoningDelta("half a tho"))
    [seal] = reducer.seal(interrupted=True)
    assert seal.block.data == {"text": "half a tho", "interrupted": True}
    assert reducer.open is None
    assert reducer.seal() == []


def test_it_records_errors_with_and_without_a_status_code():
    """An error event is one sealed assistant error chunk."""
    _, log = run(ErrorEvent("overloaded", 529), ErrorEvent("connection reset"))
    assert [(b.role, b.type, b.data) for b in log.blocks] == [
        (Role.ASSISTANT, Kind.ERROR, {"message": "overloaded", "status_code": 529}),
        (Role.ASSISTANT, Kind.ERROR, {"message": "connection reset"}),
    ]


def test_it_stamps_blocks_with_turn_step_and_fresh_ids():
    """Every block carries the reducer's turn and step and an id from new_id."""
    ids = iter(uuid.UUID(int=n) for n in range(100, 200))
    reducer = Reducer(TURN, 3, new_id=lambda: next(ids))
    log = MemoryLog()
    log.feed(reducer, [TextDelta("a"), SystemEvent("notice", "n"), ToolCallEvent("c", "t", {})])
    assert [(b.id.int, b.turn_id, b.step, b.seq) for b in log.blocks] == [
        (100, TURN, 3, 1),
        (101, TURN, 3, 2),
        (102, TURN, 3, 3),
    ]


def test_it_copies_tool_arguments():
    """The chunk's arguments are not the event's mapping (the event may be reused)."""
    arguments = {"path": "a"}
    [seal] = Reducer(TURN).feed(ToolCallEvent("c", "read", arguments))
    arguments["path"] = "b"
    assert seal.block.data["arguments"] == {"path": "a"}


def test_it_rejects_what_is_not_a_provider_event():
    """Feeding anything else is a TypeError naming it."""
    with pytest.raises(TypeError, match="not a provider event: 'text'"):
        Reducer(TURN).feed("text")


def test_it_rejects_a_tool_call_without_a_name():
    """A nameless call could never be sent back, so it never reaches the log."""
    reducer = Reducer(TURN)
    with pytest.raises(ValueError, match="tool call 'c1' has no tool name"):
        reducer.feed(ToolCallEvent("c1", "", {}))
    assert reducer.pending_calls == []


def test_block_text_is_the_streamable_body():
    """Block.text is the text for text/thinking and the live output for tool results."""
    text = Block(uuid.uuid4(), None, 0, Role.ASSISTANT, Kind.TEXT, {"text": "t"})
    result = Block(uuid.uuid4(), None, 0, Role.TOOL, Kind.TOOL_RESULT, {"result": "r"})
    assert (text.text, result.text) == ("t", "")


# A fresh interpreter imports in well under a second; the bound only stops a hang.
IMPORT_TIMEOUT_S = 30


def test_the_pure_core_imports_nothing_from_django():
    """stream.py and history.py load without Django (the pure core: no Django, no database)."""
    code = (
        "import sys, chat.stream, chat.history\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'django')\n"
        "assert not loaded, loaded\n"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-c", code], cwd=root, check=True, timeout=IMPORT_TIMEOUT_S, env={}
    )
