"""Property: any provider event sequence gives a sound log and a valid request. Pure.

Turns of user messages and steps of arbitrary provider events go through the
Reducer into an in-memory log (seq 1..n), the way the turn runner drives them;
the request is built incrementally at the start of every step, as the runner
does, and checked against the provider's rules and against a cold build.
"""

from __future__ import annotations

import json
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from chat import history
from chat.history import History
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
from chat.stream import Delta, Kind, Reducer
from tests.pure_helpers import MemoryLog, assert_valid_request, to_bytes

# Enough cases to reach every transition many times over, few enough that
# this file stays a second or two of the suite.
MAX_EXAMPLES = 200

# Markers that only system and error events carry; generated text cannot
# contain them (its alphabet has no capitals), so finding one in a request
# means a system or error chunk was sent to the model.
SYSTEM_TEXT = "SYSTEM-ONLY"
ERROR_TEXT = "ERROR-ONLY"

texts = st.text(alphabet="ab é🙂\n", max_size=4)
# A small pool, so results and output usually meet their call; it holds an
# unsafe id, an empty one and one that collides with a made-safe id.
call_ids = st.sampled_from(["c1", "c2", "toolu.3", "", "c1_2"])
names = st.sampled_from(["read", "shell"])
metadata = st.none() | st.text(alphabet="ab+/=", max_size=3)

events = st.one_of(
    st.builds(TextDelta, texts),
    st.builds(ReasoningDelta, texts),
    st.builds(ReasoningEnd, metadata, metadata),
    st.builds(
        ToolCallEvent,
        call_ids,
        names,
        st.dictionaries(st.sampled_from("zyxa"), st.integers(0, 3), max_size=3),
    ),
    st.builds(ToolResultEvent, call_ids, names | st.just(""), texts, st.booleans(), st.booleans()),
    st.builds(ShellOutput, call_ids, texts),
    st.builds(ErrorEvent, st.just(ERROR_TEXT), st.none() | st.just(529)),
    st.builds(SystemEvent, st.sampled_from(["notice", "model-changed"]), st.just(SYSTEM_TEXT)),
    st.builds(Finish, st.builds(Usage), st.sampled_from(["end_turn", "tool_use"])),
)
steps = st.tuples(st.lists(events, max_size=10), st.lists(texts, max_size=1))  # events, queued
turns = st.tuples(
    st.lists(st.builds(SystemEvent, st.just("notice"), st.just(SYSTEM_TEXT)), max_size=1),
    texts,  # the user's message
    st.lists(steps, min_size=1, max_size=4),
)

STREAMED = {Kind.TEXT, Kind.THINKING, Kind.TOOL_RESULT}


def expected_chunks(step_events) -> list[tuple[str, str | None]]:
    """What one step's events must leave in the log: (type, streamed body) per chunk.

    Written from the reducer's contract (ARCHITECTURE.md, Contracts of the pure core),
    independently of the reducer.
    """
    out: list[list] = []
    streaming = None  # (type, call_id) of the run the open chunk belongs to
    for event in step_events:
        match event:
            case TextDelta(text="") | ReasoningDelta(text=""):
                continue
            case TextDelta(text=text) | ReasoningDelta(text=text) | ShellOutput(text=text):
                kind = {
                    TextDelta: Kind.TEXT,
                    ReasoningDelta: Kind.THINKING,
                    ShellOutput: Kind.TOOL_RESULT,
                }[type(event)]
                run = (kind, getattr(event, "call_id", None))
                if streaming == run:
                    out[-1][1] += text
                else:
                    out.append([kind, text])
                    streaming = run
            case ReasoningEnd(signature=signature, redacted_data=redacted):
                if streaming != (Kind.THINKING, None) and (signature or redacted):
                    out.append([Kind.THINKING, ""])
                streaming = None
            case ToolResultEvent(call_id=call_id):
                if streaming != (Kind.TOOL_RESULT, call_id):
                    out.append([Kind.TOOL_RESULT, ""])
                streaming = None
            case ToolCallEvent():
                out.append([Kind.TOOL_CALL, None])
                streaming = None
            case ErrorEvent():
                out.append([Kind.ERROR, None])
                streaming = None
            case SystemEvent():
                out.append([Kind.SYSTEM, None])
                streaming = None
            case Finish():
                streaming = None
    return [(kind, body) for kind, body in out]


def check_request(h: History, log: MemoryLog, previous):
    """The request now: valid, equal to a cold build, and extending the one before."""
    messages = h.messages()
    assert messages == history.build(log.blocks)
    assert_valid_request(messages)
    serialised = json.dumps([json.loads(to_bytes(m)) for m in messages], ensure_ascii=False)
    assert SYSTEM_TEXT not in serialised and ERROR_TEXT not in serialised
    # Messages before the draft are final: the same objects, hence the same bytes.
    # (The draft is the last message, or the last two when calls await results.)
    finished = previous[:-2]
    assert all(messages[i] is finished[i] for i in range(len(finished)))
    stable = previous[:-1]
    assert [to_bytes(m) for m in messages[: len(stable)]] == [to_bytes(m) for m in stable]
    return messages


@settings(max_examples=MAX_EXAMPLES, deadline=None)
@given(st.lists(turns, min_size=1, max_size=4))
def test_it_turns_any_event_sequence_into_a_sound_log_and_a_valid_request(program):
    """Deltas land in their chunks, seqs are 1..n, and every request obeys the provider."""
    log = MemoryLog()
    h = History()
    request = ()
    for idle_events, user_text, turn_steps in program:
        idle = Reducer(None)
        log.feed(idle, idle_events)  # system events outside a turn
        turn_id = uuid.uuid4()
        log.user(user_text, turn_id)
        for step, (step_events, queued) in enumerate(turn_steps):
            h.extend(log.blocks[h.last_seq :])
            request = check_request(h, log, request)
            reducer = Reducer(turn_id, step)
            start = len(log.blocks)
            ops = log.feed(reducer, step_events) + log.apply(reducer.seal())
            assert reducer.open is None
            made = log.blocks[start:]
            assert [(b.type, b.text if b.type in STREAMED else None) for b in made] == (
                expected_chunks(step_events)
            )
            assert all(b.turn_id == turn_id and b.step == step for b in made)
            # Every character fed comes out in a delta, in order, and nothing else.
            fed = [
                e.text
                for e in step_events
                if isinstance(e, TextDelta | ReasoningDelta | ShellOutput)
            ]
            assert "".join(op.text for op in ops if isinstance(op, Delta)) == "".join(fed)
            for text in queued:
                log.user(text, turn_id)
    h.extend(log.blocks[h.last_seq :])
    check_request(h, log, request)
    assert [b.seq for b in log.blocks] == list(range(1, len(log.blocks) + 1))
    assert len({b.id for b in log.blocks}) == len(log.blocks)
