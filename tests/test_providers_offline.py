"""The offline demo model: a deterministic agent with no network."""

from __future__ import annotations

import uuid

import pytest

from chat.history import History
from chat.providers.base import (
    Finish,
    Message,
    ReasoningDelta,
    ReasoningEnd,
    Request,
    TextDelta,
    TextPart,
    ToolCallEvent,
    ToolCallPart,
    ToolResultPart,
)
from chat.providers.offline import MAX_CALLS, OfflineProvider, find_calls
from chat.stream import Block, Reducer, Seal
from harness.fakeprovider import collect


def ask(text: str) -> Request:
    return Request("", (), (Message("user", (TextPart(text),)),))


def text_of(events, kind=TextDelta) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


def shape(events) -> list[type]:
    out: list[type] = []
    for event in events:
        if not out or out[-1] is not type(event):
            out.append(type(event))
    return out


async def test_it_lists_files_then_summarises_the_result():
    """ "List the files": thinking, text, a list_files call; given the result, a summary
    of it and the end of the turn."""
    provider = OfflineProvider(pace=0)
    first = await collect(provider.stream(ask("Can you list the files here?")))
    assert shape(first) == [ReasoningDelta, ReasoningEnd, TextDelta, ToolCallEvent, Finish]
    call = first[-2]
    assert (call.name, call.arguments) == ("list_files", {"path": "."})
    assert "offline demo model" in text_of(first)
    assert first[-1].stop_reason == "tool_use"

    followup = Request(
        "",
        (),
        (
            Message("user", (TextPart("Can you list the files here?"),)),
            Message(
                "assistant",
                (TextPart(text_of(first)), ToolCallPart(call.call_id, call.name, call.arguments)),
            ),
            Message(
                "user", (ToolResultPart(call.call_id, "list_files", "README.md\nchat/\nmanage.py"),)
            ),
        ),
    )
    second = await collect(provider.stream(followup))
    assert shape(second) == [ReasoningDelta, ReasoningEnd, TextDelta, Finish]
    summary = text_of(second)
    assert "3 entries" in summary
    for name in ("README.md", "chat/", "manage.py"):
        assert f"`{name}`" in summary
    assert second[-1].stop_reason == "end_turn"


async def test_it_is_deterministic():
    """The same request gives the same events, call ids included."""
    provider = OfflineProvider(pace=0)
    request = ask("read README.md and run `git status`")
    assert await collect(provider.stream(request)) == await collect(provider.stream(request))


async def test_its_call_ids_differ_between_conversation_states():
    """Two different requests never share call ids, so a log never holds duplicates."""
    provider = OfflineProvider(pace=0)
    a = [
        e for e in await collect(provider.stream(ask("list files"))) if isinstance(e, ToolCallEvent)
    ]
    b = [
        e
        for e in await collect(provider.stream(ask("list the files")))
        if isinstance(e, ToolCallEvent)
    ]
    assert a[0].call_id != b[0].call_id
    assert a[0].call_id.replace("_", "").isalnum()


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("list the files", [("list_files", {"path": "."})]),
        ("What files are in the workspace?", [("list_files", {"path": "."})]),
        ("please read README.md", [("read_file", {"path": "README.md"})]),
        ("what does `chat/models.py` say", [("read_file", {"path": "chat/models.py"})]),
        ("run `ls -la`", [("shell", {"command": "ls -la"})]),
        ("Run echo hello", [("shell", {"command": "echo hello"})]),
        (
            "run pytest -q. Then show notes.txt",
            [("shell", {"command": "pytest -q"}), ("read_file", {"path": "notes.txt"})],
        ),
        ("can you run the tests?", []),
        ("e.g. example.com is a site", []),
        ("hello there", []),
    ],
)
def test_it_finds_the_tool_calls_a_message_asks_for(text, calls):
    """File names, listing requests and commands map to read_file, list_files and shell."""
    assert [(c.name, c.arguments) for c in find_calls(text)] == calls


def test_it_caps_the_calls_of_one_message():
    """A message naming many files gets at most MAX_CALLS calls."""
    text = " ".join(f"f{i}.txt" for i in range(MAX_CALLS + 3))
    assert len(find_calls(text)) == MAX_CALLS


async def test_it_introduces_itself_when_no_tool_is_asked_for():
    """A plain message gets a friendly answer that says it is an offline demo and what to try."""
    events = await collect(OfflineProvider(pace=0).stream(ask("How are you?")))
    assert shape(events) == [ReasoningDelta, ReasoningEnd, TextDelta, Finish]
    text = text_of(events)
    assert "offline demo model" in text
    assert "How are you?" in text
    assert "ANTHROPIC_API_KEY" in text
    assert events[-1].stop_reason == "end_turn"
    assert events[-1].usage.output_tokens > 0


async def test_it_summarises_a_failed_tool_and_a_file():
    """An error result says the tool failed; a file result quotes its first lines in a fence
    longer than any backticks inside."""
    request = Request(
        "",
        (),
        (
            Message("user", (TextPart("read a.md and b.txt"),)),
            Message(
                "assistant",
                (
                    ToolCallPart("c1", "read_file", {"path": "a.md"}),
                    ToolCallPart("c2", "read_file", {"path": "b.txt"}),
                ),
            ),
            Message(
                "user",
                (
                    ToolResultPart("c1", "read_file", "# Title\n```code```\nend"),
                    ToolResultPart("c2", "read_file", "No such file: b.txt", is_error=True),
                ),
            ),
        ),
    )
    text = text_of(await collect(OfflineProvider(pace=0).stream(request)))
    assert "`a.md` is 3 lines long" in text
    assert "````\n# Title\n```code```\nend\n````" in text
    assert "`read_file` failed: No such file: b.txt" in text


async def test_it_answers_a_message_queued_beside_tool_results():
    """Results plus new text: the results are summarised and the new request acted on."""
    request = Request(
        "",
        (),
        (
            Message("user", (TextPart("list files"),)),
            Message("assistant", (ToolCallPart("c1", "list_files", {"path": "."}),)),
            Message(
                "user", (ToolResultPart("c1", "list_files", "a.py"), TextPart("now read a.py"))
            ),
        ),
    )
    events = await collect(OfflineProvider(pace=0).stream(request))
    assert "1 entry" in text_of(events)
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [(c.name, c.arguments) for c in calls] == [("read_file", {"path": "a.py"})]


async def test_its_events_make_a_valid_log_through_the_reducer_and_history():
    """Fed through the reducer, the events seal thinking, text and tool_call chunks that
    chat.history turns back into a valid request."""
    provider = OfflineProvider(pace=0)
    turn = uuid.uuid4()
    log = [Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "read README.md"}, seq=1)]
    reducer = Reducer(turn, 0)
    async for event in provider.stream(Request("", (), History.build(log).messages())):
        for op in reducer.feed(event):
            if isinstance(op, Seal):
                op.block.seq = len(log) + 1
                log.append(op.block)
    assert [b.type for b in log] == ["text", "thinking", "text", "tool_call"]
    call = log[-1].data
    log.append(
        Block(
            uuid.uuid4(),
            turn,
            0,
            "tool",
            "tool_result",
            {"call_id": call["call_id"], "name": "read_file", "result": "Hello", "is_error": False},
            seq=len(log) + 1,
        )
    )
    events = await collect(provider.stream(Request("", (), History.build(log).messages())))
    assert "`README.md` is 1 line long" in text_of(events)


def test_it_takes_its_pace_from_settings_and_rejects_a_negative_one(settings):
    """No pace argument: settings.DISPATCH_OFFLINE_PACE; a negative pace is refused."""
    settings.DISPATCH_OFFLINE_PACE = 12.5
    assert OfflineProvider().pace == 12.5
    assert OfflineProvider(pace=0).pace == 0
    with pytest.raises(ValueError, match="pace"):
        OfflineProvider(pace=-1)


async def test_pacing_changes_the_timing_not_the_events():
    """A paced stream yields exactly the events of an unpaced one."""
    request = ask("hello")
    paced = await collect(OfflineProvider(pace=10_000).stream(request))
    assert paced == await collect(OfflineProvider(pace=0).stream(request))
