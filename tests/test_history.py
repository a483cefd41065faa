"""The request builder (chat.history): chunk log in, request messages out. Pure."""

from __future__ import annotations

import json
import uuid

import pytest

from chat import history
from chat.history import CONVERSATION_START, EMPTY_RESULT, MISSING_RESULT, History, canonical
from chat.providers.base import (
    Finish,
    Message,
    ReasoningDelta,
    ReasoningEnd,
    ShellOutput,
    TextDelta,
    TextPart,
    ThinkingPart,
    ToolCallEvent,
    ToolCallPart,
    ToolResultEvent,
    ToolResultPart,
)
from chat.stream import Block, Kind, Reducer, Role
from tests.pure_helpers import MemoryLog, assert_valid_request, reloaded, to_bytes

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)

# --- chunk builders: each returns a spec; `log()` turns specs into blocks ----


def U(text, turn=T1):
    return (turn, 0, Role.USER, Kind.TEXT, {"text": text})


def A(text, step=0, turn=T1, interrupted=False):
    data = {"text": text, "interrupted": True} if interrupted else {"text": text}
    return (turn, step, Role.ASSISTANT, Kind.TEXT, data)


def TH(text="", signature=None, redacted=None, step=0, turn=T1, interrupted=False):
    data = {"text": text}
    if interrupted:
        data["interrupted"] = True
    if signature is not None:
        data["signature"] = signature
    if redacted is not None:
        data["redacted_data"] = redacted
    return (turn, step, Role.ASSISTANT, Kind.THINKING, data)


def C(call_id, name="read", arguments=None, step=0, turn=T1):
    data = {"call_id": call_id, "name": name, "arguments": arguments or {}}
    return (turn, step, Role.ASSISTANT, Kind.TOOL_CALL, data)


def R(call_id, result="ok", is_error=False, name="read", step=0, turn=T1, interrupted=False):
    data = {"call_id": call_id, "name": name, "result": result, "is_error": is_error}
    if interrupted:
        data["interrupted"] = True
    return (turn, step, Role.TOOL, Kind.TOOL_RESULT, data)


def LIVE(call_id, output, step=0, turn=T1):
    """A tool_result sealed with only its live output (cancel, crash, interleaving)."""
    data = {"call_id": call_id, "name": "shell", "shell_output": output}
    return (turn, step, Role.TOOL, Kind.TOOL_RESULT, data)


def SYS(text="note", turn=T1):
    return (turn, 0, Role.SYSTEM, Kind.SYSTEM, {"kind": "notice", "text": text})


def RETRY(step=0, turn=T1):
    """The notice the runner writes when a response was cut off and is asked again."""
    data = {"kind": "notice", "text": "retrying", "retry": True}
    return (turn, step, Role.SYSTEM, Kind.SYSTEM, data)


def ERR(message="boom", role=Role.ASSISTANT, turn=T1):
    return (turn, 0, role, Kind.ERROR, {"message": message, "status_code": 500})


def log(*specs) -> list[Block]:
    return [
        Block(uuid.uuid4(), turn, step, role, kind, data, seq=n)
        for n, (turn, step, role, kind, data) in enumerate(specs, start=1)
    ]


# --- expected messages -------------------------------------------------------


def user(*parts):
    return Message(Role.USER, tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


def asst(*parts):
    return Message(Role.ASSISTANT, tuple(TextPart(p) if isinstance(p, str) else p for p in parts))


def call(call_id, name="read", **arguments):
    return ToolCallPart(call_id, name, arguments)


def result(call_id, text="ok", is_error=False, name="read"):
    return ToolResultPart(call_id, name, text, is_error)


def missing(call_id, name="read"):
    return ToolResultPart(call_id, name, MISSING_RESULT, True)


NORMALISATIONS = {
    "empty log": ([], []),
    "empty user text dropped": ([U(""), U("hi")], [user("hi")]),
    "only empty text gives no message": ([U(""), A("")], []),
    "empty assistant text dropped": (
        [U("q"), A(""), C("c1"), A(""), R("c1")],
        [user("q"), asst(call("c1")), user(result("c1"))],
    ),
    "signed thinking with empty text kept": (
        [U("q"), TH("", signature="sig"), C("c1"), R("c1")],
        [user("q"), asst(ThinkingPart("", "sig"), call("c1")), user(result("c1"))],
    ),
    "redacted thinking with empty text kept": (
        [U("q"), TH("", redacted="opaque"), C("c1"), R("c1")],
        [user("q"), asst(ThinkingPart("", None, "opaque"), call("c1")), user(result("c1"))],
    ),
    "unsigned empty thinking dropped": (
        [U("q"), TH(""), C("c1"), R("c1")],
        [user("q"), asst(call("c1")), user(result("c1"))],
    ),
    "unsigned thinking with text kept unmodified": (
        [U("q"), TH(" why\n"), C("c1"), R("c1")],
        [user("q"), asst(ThinkingPart(" why\n"), call("c1")), user(result("c1"))],
    ),
    # Cut off before its signature (a Stop, a crash, an error): half a thought,
    # and Anthropic rejects unsigned thinking. What came after it is still sent.
    "interrupted unsigned thinking dropped": (
        [U("q"), TH("half a", interrupted=True), U("go on")],
        [user("q", "go on")],
    ),
    "interrupted signed thinking kept": (
        [U("q"), TH("all", signature="sig", interrupted=True), U("more")],
        [user("q"), asst(ThinkingPart("all", "sig")), user("more")],
    ),
    "interrupted thinking before interrupted text: the text is sent as seen": (
        [U("q"), TH("plan", interrupted=True), A("I will wr", interrupted=True), U("continue")],
        [user("q"), asst("I will wr"), user("continue")],
    ),
    "interrupted call answered by its is_error result": (
        [
            U("q"),
            C("c1", "shell"),
            R("c1", "Cancelled by the user.", True, "shell", interrupted=True),
        ],
        [
            user("q"),
            asst(call("c1", "shell")),
            user(result("c1", "Cancelled by the user.", True, "shell")),
        ],
    ),
    "call ids made safe": (
        [U("q"), C("toolu.01/é x"), R("toolu.01/é x")],
        [user("q"), asst(call("toolu_01___x")), user(result("toolu_01___x"))],
    ),
    "empty call id made safe": (
        [U("q"), C(""), R("")],
        [user("q"), asst(call("call")), user(result("call"))],
    ),
    "call ids unique across the request": (
        [U("q"), C("call_0"), R("call_0"), C("call_0", step=1), R("call_0", step=1)],
        [
            user("q"),
            asst(call("call_0")),
            user(result("call_0")),
            asst(call("call_0_2")),
            user(result("call_0_2")),
        ],
    ),
    "an id reused every step numbered in order": (
        [
            U("q"),
            *[spec for n in range(4) for spec in (C("call_0", step=n), R("call_0", step=n))],
        ],
        [
            user("q"),
            *[
                m
                for cid in ["call_0", "call_0_2", "call_0_3", "call_0_4"]
                for m in (asst(call(cid)), user(result(cid)))
            ],
        ],
    ),
    "a safe id colliding with a made one stays unique": (
        [U("q"), C("a.b"), C("a_b"), C("a_b_2"), C("a.b"), R("a_b", "second"), R("a.b", "first")],
        [
            user("q"),
            asst(call("a_b"), call("a_b_2"), call("a_b_2_2"), call("a_b_3")),
            user(
                result("a_b_2", "second"),
                result("a_b", "first"),
                missing("a_b_2_2"),
                missing("a_b_3"),
            ),
        ],
    ),
    "repeated ids in one message answered in call order": (
        [U("q"), C("x", "read"), C("x", "write"), R("x", "r1"), R("x", "r2")],
        [
            user("q"),
            asst(call("x", "read"), call("x_2", "write")),
            user(result("x", "r1", name="read"), result("x_2", "r2", name="write")),
        ],
    ),
    "result named after its call": (
        [U("q"), C("c1", "grep"), R("c1", name="something-else")],
        [user("q"), asst(call("c1", "grep")), user(result("c1", name="grep"))],
    ),
    "an empty result sent as a placeholder": (
        [U("q"), C("c1"), R("c1", "")],
        [user("q"), asst(call("c1")), user(result("c1", EMPTY_RESULT))],
    ),
    "error results keep is_error": (
        [U("q"), C("c1"), R("c1", "denied", is_error=True)],
        [user("q"), asst(call("c1")), user(result("c1", "denied", True))],
    ),
    "results first, then queued user text": (
        [U("q"), C("c1"), C("c2"), R("c1", "one"), U("queued"), R("c2", "two")],
        [
            user("q"),
            asst(call("c1"), call("c2")),
            user(result("c1", "one"), result("c2", "two"), "queued"),
        ],
    ),
    "a call with no result answered by a synthetic error": (
        [U("q"), C("c1"), C("c2"), R("c2"), SYS("interrupted"), U("again", turn=T2)],
        [user("q"), asst(call("c1"), call("c2")), user(result("c2"), missing("c1"), "again")],
    ),
    "calls at the end of the log answered by synthetic errors": (
        [U("q"), C("c1"), A("and")],
        [user("q"), asst(call("c1"), "and"), user(missing("c1"))],
    ),
    "unanswered calls then another step: closed as the model saw them": (
        [U("q"), TH("a", "s1"), C("c1"), TH("b", "s2", step=1), C("c2", step=1), R("c2", step=1)],
        [
            user("q"),
            asst(ThinkingPart("a", "s1"), call("c1")),
            user(missing("c1")),
            asst(ThinkingPart("b", "s2"), call("c2")),
            user(result("c2")),
        ],
    ),
    "a result with no call dropped": (
        [U("q"), R("ghost"), C("c1"), R("c1"), R("ghost")],
        [user("q"), asst(call("c1")), user(result("c1"))],
    ),
    "a result for an older message's call dropped": (
        [U("q"), C("c1"), R("c1"), C("c2", step=1), R("c2", step=1), R("c1", "late")],
        [user("q"), asst(call("c1")), user(result("c1")), asst(call("c2")), user(result("c2"))],
    ),
    "a second result for one call dropped": (
        [U("q"), C("c1"), R("c1", "first"), R("c1", "second")],
        [user("q"), asst(call("c1")), user(result("c1", "first"))],
    ),
    "live output alone does not answer; the result after it does": (
        [U("q"), C("c1"), LIVE("c1", "partial"), R("c1", "cancelled", True)],
        [user("q"), asst(call("c1")), user(result("c1", "cancelled", True))],
    ),
    "live output alone at a crash: synthetic error": (
        [U("q"), C("c1"), LIVE("c1", "partial"), U("next", turn=T2)],
        [user("q"), asst(call("c1")), user(missing("c1"), "next")],
    ),
    "system and error chunks never sent": (
        [SYS(), U("q"), ERR(), ERR(role=Role.SYSTEM), A("hi"), SYS(), C("c1"), ERR(), R("c1")],
        [user("q"), asst("hi", call("c1")), user(result("c1"))],
    ),
    "a log starting with the assistant gets a user marker": (
        [SYS(), A("hello"), C("c1"), R("c1")],
        [user(CONVERSATION_START), asst("hello", call("c1")), user(result("c1"))],
    ),
    "adjacent user messages merged": ([U("a"), U("b")], [user("a", "b")]),
    "adjacent assistant steps merged": (
        [U("q"), A("x"), ERR(), A("y", step=1), C("c1", step=1), R("c1", step=1)],
        [user("q"), asst("x", "y", call("c1")), user(result("c1"))],
    ),
    "a trailing assistant message without tool calls left out": (
        [U("q"), TH("t", "s"), A("answer")],
        [user("q")],
    ),
    "a finished turn's answer is sent in the next turn": (
        [U("q"), A("answer"), U("more", turn=T2)],
        [user("q"), asst("answer"), user("more")],
    ),
    "a cut-off attempt is not sent once a retry notice follows": (
        [
            U("q"),
            TH("half", step=1),
            A("Partial", step=1),
            C("c1", step=1),
            RETRY(step=1),
            TH("t", "sig", step=1),
            A("Full", step=1),
        ],
        [user("q")],
    ),
    "the retried response is sent in the next turn": (
        [U("q"), A("Partial", step=1), RETRY(step=1), A("Full", step=1), U("more", turn=T2)],
        [user("q"), asst("Full"), user("more")],
    ),
    "a retry notice of another step discards nothing": (
        [
            U("q"),
            C("c1", step=1),
            R("c1", step=1),
            RETRY(step=2),
            A("done", step=2),
            U("more", turn=T2),
        ],
        [user("q"), asst(call("c1")), user(result("c1")), asst("done"), user("more")],
    ),
    "tool arguments with sorted keys": (
        [U("q"), C("c1", arguments={"b": 1, "a": {"d": [{"f": 1, "e": 2}], "c": None}}), R("c1")],
        [
            user("q"),
            asst(ToolCallPart("c1", "read", {"a": {"c": None, "d": [{"e": 2, "f": 1}]}, "b": 1})),
            user(result("c1")),
        ],
    ),
}


@pytest.mark.parametrize("case", NORMALISATIONS, ids=str)
def test_it_normalises_the_log_into_a_valid_request(case):
    """Each normalisation gives exactly the expected messages, and a valid request."""
    specs, expected = NORMALISATIONS[case]
    messages = history.build(log(*specs))
    assert messages == tuple(expected)
    assert_valid_request(messages)


def test_it_sorts_argument_keys_in_the_serialised_bytes():
    """Arguments serialise with sorted keys even without sort_keys (jsonb reorders them)."""
    [_, message, _] = history.build(
        log(U("q"), C("c1", arguments={"z": {"y": 1, "x": 2}, "a": 0}), R("c1"))
    )
    assert json.dumps(message.parts[0].arguments) == '{"a": 0, "z": {"x": 2, "y": 1}}'


def test_canonical_sorts_nested_keys_and_turns_tuples_into_lists():
    """canonical() is the same JSON value, keys sorted at every depth."""
    value = {"b": (1, {"d": 1, "c": 2}), "a": "x"}
    out = canonical(value)
    assert out == {"a": "x", "b": [1, {"c": 2, "d": 1}]}
    assert list(out) == ["a", "b"] and list(out["b"][1]) == ["c", "d"]


def test_it_replays_thinking_metadata_byte_for_byte():
    """Signature, redacted data and text come back exactly, through a reload too."""
    signature = 'EqQBCkgIARABGAIiQL+/=\n\u00e9\\"x'
    redacted = "EmwKAhgBEgy3va3pzix/LafPsn4a=="
    blocks = log(U("q"), TH(" t\r\n", signature), TH("", redacted=redacted), C("c1"), R("c1"))
    for messages in (history.build(blocks), history.build(reloaded(blocks))):
        first, second = messages[1].parts[:2]
        assert (first.text, first.signature, first.redacted_data) == (" t\r\n", signature, None)
        assert (second.text, second.signature, second.redacted_data) == ("", None, redacted)


# --- incremental == cold -----------------------------------------------------

LONG_LOG = [
    SYS("hello"),
    U("first"),
    TH("plan", "s0"),
    A("ok"),
    C("c1", "read", {"path": "a"}),
    C("c 2", "shell", {"cmd": "ls"}),
    R("c1", "A"),
    LIVE("c 2", "out"),
    U("queued"),
    R("c 2", "done"),
    TH("", "s1", step=1),
    C("c1", "write", {"path": "a", "text": "x"}, step=1),
    ERR(),
    SYS("interrupted"),
    U("second", turn=T2),
    A("answer", turn=T2),
    U("third", turn=T2),
    TH("t", redacted="r", turn=T2),
    A("final", turn=T2),
]


def test_it_builds_incrementally_exactly_what_a_cold_build_gives():
    """History.add one chunk at a time equals a cold build of the prefix, at every point."""
    blocks = log(*LONG_LOG)
    incremental = History()
    for n, block in enumerate(blocks, start=1):
        incremental.add(block)
        cold = history.build(blocks[:n])
        assert incremental.messages() == cold, f"differs after chunk {n}"
        assert [to_bytes(m) for m in incremental.messages()] == [to_bytes(m) for m in cold]
        assert_valid_request(cold)


def test_it_builds_the_same_after_extend_in_batches():
    """extend() in batches equals a cold build (the runner adds a step's chunks at once)."""
    blocks = log(*LONG_LOG)
    h = History()
    for start in range(0, len(blocks), 4):
        h.extend(blocks[start : start + 4])
        assert h.messages() == history.build(blocks[: start + 4])
    assert h.last_seq == len(blocks)


def test_it_reuses_finished_messages_across_steps():
    """Finished Message objects are reused, not rebuilt: the same objects step after step."""
    blocks = log(*LONG_LOG)
    h = History()
    before: tuple[Message, ...] = ()
    for block in blocks:
        h.add(block)
        now = h.messages()
        # All but the last two may be the draft and its synthetic answers.
        finished = before[:-2]
        assert all(now[i] is finished[i] for i in range(len(finished)))
        before = now
    assert len(before) >= 6


def test_it_does_not_fold_the_log_again_when_asked_twice():
    """messages() does not re-fold chunks: finished messages are the same objects."""
    h = History.build(log(*LONG_LOG))
    first, second = h.messages(), h.messages()
    assert all(a is b for a, b in zip(first[:-1], second[:-1], strict=True))


# --- bad input ---------------------------------------------------------------


def test_it_rejects_a_chunk_out_of_seq_order():
    """A chunk whose seq is not after the last one is a ValueError."""
    h = History.build(log(U("a"), U("b")))
    with pytest.raises(ValueError, match="chunk seq 2 is not after 2"):
        h.add(log(U("c"), U("d"))[1])


def test_it_accepts_blocks_without_a_seq():
    """Blocks not yet in the log (seq None) fold like any other chunk."""
    block = Block(uuid.uuid4(), T1, 0, Role.USER, Kind.TEXT, {"text": "hi"})
    assert history.build([block]) == (user("hi"),)


@pytest.mark.parametrize(
    ("role", "kind"),
    [
        (Role.TOOL, Kind.TEXT),
        (Role.SYSTEM, Kind.TEXT),
        (Role.USER, Kind.THINKING),
        (Role.USER, Kind.TOOL_CALL),
        (Role.ASSISTANT, Kind.TOOL_RESULT),
        (Role.ASSISTANT, "image"),
    ],
)
def test_it_rejects_a_chunk_no_request_can_hold(role, kind):
    """An unknown role/type pair is a ValueError naming the chunk."""
    [block] = log((T1, 0, role, kind, {"text": "x", "call_id": "c"}))
    with pytest.raises(ValueError, match=f"chunk 1: a '{role}' '{kind}' chunk cannot be sent"):
        history.build([block])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            (T1, 0, Role.ASSISTANT, Kind.TOOL_CALL, {"name": "read"}),
            "tool_call chunk 2 has no call_id",
        ),
        (
            (T1, 0, Role.ASSISTANT, Kind.TOOL_CALL, {"call_id": "c"}),
            "tool_call chunk 2 has no tool name",
        ),
        (
            (T1, 0, Role.TOOL, Kind.TOOL_RESULT, {"result": "x"}),
            "tool_result chunk 2 has no call_id",
        ),
    ],
)
def test_it_rejects_a_call_or_result_without_its_keys(spec, message):
    """A call without an id or name, or a result without an id, is a ValueError."""
    with pytest.raises(ValueError, match=message):
        history.build(log(U("q"), spec))


# --- byte stability ----------------------------------------------------------


def _tool_step(log_, turn, step, name):
    """One model step: signed thinking, text, a call; then the tool's output and result."""
    reducer = Reducer(turn, step)
    call_id = f"toolu_{step}"
    log_.feed(
        reducer,
        [
            ReasoningDelta(f"think {step} "),
            ReasoningDelta("more"),
            ReasoningEnd(signature=f"sig{step}+/=="),
            TextDelta(f"step {step}"),
            ToolCallEvent(call_id, name, {"z": step, "a": {"y": [1, 2], "b": "x"}}),
            Finish(stop_reason="tool_use"),
            ShellOutput(call_id, "line\n"),
            ToolResultEvent(call_id, name, f"result {step}"),
        ],
    )
    log_.apply(reducer.seal())


def test_it_keeps_earlier_steps_byte_identical_in_later_requests():
    """In a three-step tool turn, steps 0 and 1 are byte-identical in the requests for 2 and 3."""
    log_ = MemoryLog()
    turn = uuid.uuid4()
    log_.user("do the thing", turn)
    h = History()
    requests = {}
    for step in range(3):
        _tool_step(log_, turn, step, ["read", "shell", "write"][step])
        h.extend(log_.blocks[h.last_seq :])
        requests[step + 1] = h.messages()
        assert_valid_request(requests[step + 1])
    # user, then per step an assistant message and the user message with its result.
    steps_0_and_1 = slice(0, 5)
    for step in (2, 3):
        assert len(requests[step]) == 1 + 2 * step
    bytes_2 = [to_bytes(m) for m in requests[2][steps_0_and_1]]
    bytes_3 = [to_bytes(m) for m in requests[3][steps_0_and_1]]
    assert bytes_2 == bytes_3
    # A cold build from rows read back with their JSON keys reordered: same bytes.
    cold = history.build(reloaded(log_.blocks))
    assert [to_bytes(m) for m in cold] == [to_bytes(m) for m in requests[3]]
    # And the signatures came back byte for byte.
    signatures = [p.signature for m in cold for p in m.parts if isinstance(p, ThinkingPart)]
    assert signatures == ["sig0+/==", "sig1+/==", "sig2+/=="]
