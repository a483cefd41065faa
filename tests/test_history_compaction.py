"""The request builder's view after a compaction and after an elision (ARCHITECTURE.md,
Context management). Pure: chunks in, messages out."""

from __future__ import annotations

import uuid

import pytest

from chat import context
from chat.history import History
from chat.providers.base import Message, TextPart, ThinkingPart, ToolCallPart, ToolResultPart
from chat.stream import Block

T1, T2, T3 = (uuid.UUID(int=n) for n in range(1, 4))


def chunk(seq, turn, role, type, step=1, **data):
    return Block(uuid.uuid4(), turn, step, role, type, data, seq)


def compaction(seq, turn, through, summary="S."):
    return chunk(seq, turn, "system", "compaction", summary=summary, through_seq=through)


def elide(seq, turn, seqs):
    return chunk(seq, turn, "system", "system", kind=context.ELIDE, text="…", seqs=seqs)


BIG = "line\n" * 2000

LOG = [
    chunk(1, T1, "user", "text", text="Read the log"),
    chunk(2, T1, "assistant", "tool_call", call_id="c1", name="shell", arguments={"cmd": "cat"}),
    chunk(3, T1, "tool", "tool_result", call_id="c1", name="shell", result=BIG),
    chunk(4, T1, "assistant", "text", step=2, text="It is long."),
    chunk(5, T2, "user", "text", text="Now fix it"),
    chunk(6, T2, "assistant", "thinking", text="plan", signature="sig"),
    chunk(7, T2, "assistant", "tool_call", call_id="c2", name="shell", arguments={"cmd": "fix"}),
    chunk(8, T2, "tool", "tool_result", call_id="c2", name="shell", result="done"),
]


def summary_message(summary="S."):
    return Message("user", (TextPart(context.summary_message(summary)),))


def test_a_compaction_through_the_end_leaves_only_the_summary_then_what_follows():
    log = [*LOG, chunk(9, T2, "assistant", "text", step=2, text="Fixed.")]
    log += [compaction(10, T3, through=9), chunk(11, T3, "user", "text", text="Thanks")]
    history = History.build(log)
    assert list(history.messages()) == [
        Message("user", (TextPart(context.summary_message("S.")), TextPart("Thanks")))
    ]
    assert history.last_seq == 11


def test_a_compaction_inside_a_turn_keeps_that_turn_verbatim():
    """Mid-turn overflow: the compaction is appended at the end, summarising through the
    previous turn; the current turn (signed thinking, call, result) follows the summary."""
    history = History.build([*LOG, compaction(9, T2, through=4)])
    assert list(history.messages()) == [
        Message("user", (TextPart(context.summary_message("S.")), TextPart("Now fix it"))),
        Message(
            "assistant",
            (ThinkingPart("plan", "sig"), ToolCallPart("c2", "shell", {"cmd": "fix"})),
        ),
        Message("user", (ToolResultPart("c2", "shell", "done"),)),
    ]
    # What log.context_tail loads (the chunks after through_seq) builds the same.
    assert list(History.build([*LOG[4:], compaction(9, T2, through=4)]).messages()) == list(
        history.messages()
    )


def test_the_newest_compaction_wins():
    log = [*LOG[:4], compaction(5, T2, through=4, summary="old")]
    log += [chunk(6, T2, "user", "text", text="more"), chunk(7, T2, "assistant", "text", text="ok")]
    log += [compaction(8, T3, through=7, summary="new"), chunk(9, T3, "user", "text", text="go")]
    messages = list(History.build(log).messages())
    assert messages == [
        Message("user", (TextPart(context.summary_message("new")), TextPart("go"))),
    ]


def test_an_elided_result_is_sent_as_its_sentinel():
    history = History.build([*LOG, elide(9, T2, [3])])
    messages = list(history.messages())
    sentinel = context.sentinel("shell", len(BIG))
    assert messages[2] == Message("user", (ToolResultPart("c1", "shell", sentinel),))
    # The later result is not elided, and the log's order is untouched.
    assert messages[-1] == Message("user", (ToolResultPart("c2", "shell", "done"),))


@pytest.mark.parametrize(
    "seqs",
    [["3"], [True], "3", None, [999]],
    ids=["strings", "bools", "not-a-list", "none", "unknown-seq"],
)
def test_a_malformed_elide_chunk_elides_nothing(seqs):
    log = [*LOG, chunk(9, T2, "system", "system", kind=context.ELIDE, seqs=seqs)]
    assert list(History.build(log).messages()) == list(History.build(LOG).messages())


def test_incremental_compaction_or_elision_marks_the_history_stale():
    for late in (compaction(9, T2, through=4), elide(9, T2, [3])):
        history = History.build(LOG)
        history.add(late)
        assert history.stale and history.last_seq == 9
        with pytest.raises(RuntimeError, match="compacted or elided"):
            history.messages()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"through_seq": 4}, "no summary"),
        ({"summary": "   ", "through_seq": 4}, "no summary"),
        ({"summary": "S", "through_seq": "4"}, "through_seq"),
        ({"summary": "S", "through_seq": -1}, "through_seq"),
        ({"summary": "S", "through_seq": 9}, "later seq"),
    ],
)
def test_a_malformed_compaction_chunk_is_refused(data, match):
    with pytest.raises(ValueError, match=match):
        History.build([*LOG, chunk(9, T2, "system", "compaction", **data)])


def test_with_ask_is_the_live_request_plus_the_answer_and_one_message():
    log = [*LOG, chunk(9, T2, "assistant", "text", step=2, text="Fixed.")]
    history = History.build(log)
    live = list(history.messages())
    asked = history.with_ask("Summarise")
    assert asked[: len(live)] == live
    # The last answer, which a step's request leaves out, is in: the summary covers it.
    assert asked[len(live) :] == [
        Message("assistant", (TextPart("Fixed."),)),
        Message("user", (TextPart("Summarise"),)),
    ]
    # Mid-turn (the log ends with tool results): nothing to add but the question.
    mid = History.build(LOG)
    assert mid.with_ask("Summarise")[:-1] == list(mid.messages())
