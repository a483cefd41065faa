"""chat.chunks: the one definition of roles, kinds, system kinds and each chunk type's data."""

from __future__ import annotations

import subprocess
import sys
import typing
import uuid
from typing import Any

import pytest

from chat import chunks
from chat.chunks import (
    OPEN_SHAPES,
    SHAPES,
    Kind,
    Role,
    ShapeError,
    SystemKind,
    check_data,
    check_kind,
)
from chat.providers.base import (
    ErrorEvent,
    Finish,
    PlanEvent,
    ReasoningDelta,
    ReasoningEnd,
    ShellOutput,
    SystemEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)
from chat.stream import Reducer, Seal

# The smallest data of each pair the app writes: its required keys only.
MINIMAL: dict[tuple[str, str], dict[str, Any]] = {
    (Role.USER, Kind.TEXT): {"text": "hi"},
    (Role.ASSISTANT, Kind.TEXT): {"text": "hello"},
    (Role.ASSISTANT, Kind.THINKING): {"text": ""},
    (Role.ASSISTANT, Kind.TOOL_CALL): {"call_id": "c1", "name": "shell", "arguments": {}},
    (Role.TOOL, Kind.TOOL_RESULT): {"call_id": "c1", "name": "shell"},
    (Role.ASSISTANT, Kind.ERROR): {"message": "boom"},
    (Role.SYSTEM, Kind.SYSTEM): {"kind": SystemKind.CANCELLED, "text": "Stopped."},
    (Role.SYSTEM, Kind.COMPACTION): {"summary": "So far.", "through_seq": 3},
    (Role.ASSISTANT, Kind.PLAN): {"entries": []},
}

# A value of each JSON type, and one of another type for each.
VALUE = {str: "x", bool: True, int: 3, float: 1.5, list: [1], dict: {"a": 1}}
WRONG = {
    str: (5, "a number"),
    bool: ("yes", "a string"),
    int: (True, "a boolean"),
    float: ("1.5", "a string"),
    list: ({"a": 1}, "an object"),
    dict: ([1], "an array"),
}
NAME = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
}


def fields(pair: tuple[str, str]) -> list[tuple[str, type, bool]]:
    """(key, JSON type, required) of a shape, read from the TypedDict here too."""
    shape = SHAPES[pair]
    hints = typing.get_type_hints(shape)
    return [(key, _outer(hint), key in shape.__required_keys__) for key, hint in hints.items()]


def _outer(hint: Any) -> type:
    return dict if typing.is_typeddict(hint) else typing.get_origin(hint) or hint


def where(pair: tuple[str, str]) -> str:
    role, kind = pair
    return f"the data of this {kind} chunk ({role})"


def refusal(role: Any, kind: Any, data: dict[str, Any] | None = None) -> str:
    with pytest.raises(ShapeError) as error:
        check_kind(role, kind)
        check_data(role, kind, data if data is not None else {})
    return str(error.value)


def test_every_constant_is_defined_once_and_listed():
    for cls in (Role, Kind, SystemKind):
        values = [v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)]
        assert tuple(values) == cls.ALL
        assert len(set(values)) == len(values)
    assert SystemKind.ENDINGS.issubset(SystemKind.ALL)


def test_the_values_are_the_strings_the_log_holds():
    assert Role.ALL == ("user", "assistant", "tool", "system")
    assert Kind.ALL == (
        "text",
        "thinking",
        "tool_call",
        "tool_result",
        "error",
        "system",
        "compaction",
        "plan",
    )
    assert type(Kind.TEXT) is str and type(SystemKind.MODEL_CHANGED) is str


def test_the_stream_and_models_use_these_definitions():
    from chat import stream
    from chat.models import Chunk

    assert stream.Role is Role and stream.Kind is Kind
    assert Chunk._meta.get_field("role").choices == [
        ("user", "User"),
        ("assistant", "Assistant"),
        ("tool", "Tool"),
        ("system", "System"),
    ]
    assert Chunk._meta.get_field("type").choices == [
        ("text", "Text"),
        ("thinking", "Thinking"),
        ("tool_call", "Tool Call"),
        ("tool_result", "Tool Result"),
        ("error", "Error"),
        ("system", "System"),
        ("compaction", "Compaction"),
        ("plan", "Plan"),
    ]


def test_every_shape_has_a_minimal_example():
    assert set(MINIMAL) == set(SHAPES)


@pytest.mark.parametrize("pair", list(SHAPES), ids="/".join)
def test_the_required_keys_alone_pass(pair):
    check_kind(*pair)
    check_data(*pair, MINIMAL[pair])


@pytest.mark.parametrize("pair", list(SHAPES), ids="/".join)
def test_every_key_of_its_type_passes(pair):
    data = {key: VALUE[json] for key, json, _ in fields(pair)}
    check_data(*pair, data)


@pytest.mark.parametrize(
    ("pair", "key"),
    [(pair, key) for pair in SHAPES for key, _, required in fields(pair) if required],
    ids=lambda v: "/".join(v) if isinstance(v, tuple) else v,
)
def test_a_missing_required_key_is_named(pair, key):
    data = {k: v for k, v in MINIMAL[pair].items() if k != key}
    with pytest.raises(ShapeError) as error:
        check_data(*pair, data)
    assert str(error.value) == f"{where(pair)} has no {key!r}"


@pytest.mark.parametrize(
    ("pair", "key", "json"),
    [(pair, key, json) for pair in SHAPES for key, json, _ in fields(pair)],
    ids=lambda v: "/".join(v) if isinstance(v, tuple) else getattr(v, "__name__", v),
)
def test_a_key_of_the_wrong_type_says_what_it_must_be(pair, key, json):
    value, said = WRONG[json]
    with pytest.raises(ShapeError) as error:
        check_data(*pair, {**MINIMAL[pair], key: value})
    assert str(error.value) == f"{where(pair)}: {key!r} must be {NAME[json]}, not {said}"


@pytest.mark.parametrize("pair", sorted(set(SHAPES) - OPEN_SHAPES), ids="/".join)
def test_a_key_a_closed_shape_does_not_name_is_refused(pair):
    with pytest.raises(ShapeError) as error:
        check_data(*pair, {**MINIMAL[pair], "zeta": 1, "alpha": 2})
    assert str(error.value) == f"unknown field(s) in {where(pair)}: alpha, zeta"


@pytest.mark.parametrize("pair", sorted(OPEN_SHAPES), ids="/".join)
def test_an_open_shape_takes_keys_it_does_not_name(pair):
    check_data(*pair, {**MINIMAL[pair], "zeta": {"anything": [1]}})


@pytest.mark.parametrize(
    ("role", "kind", "message"),
    [
        ("robot", Kind.TEXT, "unknown role 'robot' (known: assistant, system, tool, user)"),
        (
            Role.USER,
            "picture",
            "unknown type 'picture' (known: compaction, error, plan, system, text, thinking, "
            "tool_call, tool_result)",
        ),
        (Role.USER, Kind.THINKING, "a user chunk cannot be of type 'thinking'"),
        (Role.TOOL, Kind.TEXT, "a tool chunk cannot be of type 'text'"),
        (Role.ASSISTANT, Kind.COMPACTION, "a assistant chunk cannot be of type 'compaction'"),
        (5, Kind.TEXT, "role must be a string, not a number"),
        (Role.USER, None, "type must be a string, not null"),
    ],
)
def test_an_unknown_role_or_kind_or_pair_is_refused(role, kind, message):
    assert refusal(role, kind) == message


@pytest.mark.parametrize(
    ("value", "json", "ok"),
    [
        (1, int, True),
        (True, int, False),
        (1, float, True),
        (1.5, float, True),
        (False, float, False),
        (1.5, int, False),
        (False, bool, True),
        (0, bool, False),
        ([], list, True),
        ((), list, False),
        ({}, dict, True),
        (None, str, False),
    ],
)
def test_json_types_tell_booleans_from_numbers(value, json, ok):
    assert chunks.is_json(value, json) is ok


def test_what_the_reducer_writes_has_its_shape():
    """Every block the reducer seals, from every kind of event, passes the check an
    import makes: the shapes describe what the app writes."""
    reducer = Reducer(uuid.uuid4(), 1)
    events = [
        ReasoningDelta("hmm"),
        ReasoningEnd(signature="c2ln"),
        ReasoningEnd(redacted_data="cmVk"),
        TextDelta("Hello"),
        ToolCallEvent("c1", "shell", {"command": "ls"}, title="`ls`"),
        ShellOutput("c1", "a\n"),
        ToolResultEvent(
            "c1",
            "shell",
            "a",
            truncated=True,
            truncated_bytes=10,
            truncated_lines=2,
            attachments=({"sha256": "0" * 64, "name": "a.png", "mime": "image/png"},),
        ),
        ToolCallEvent("c2", "read_file", {"path": "x"}),
        ToolResultEvent("c2", "read_file", "", is_error=True, shell_output="out"),
        ErrorEvent("Overloaded", 529, {"summary": "Busy", "retry_after": 2.5, "attempts": 3}),
        SystemEvent(SystemKind.NOTICE, "Retrying."),
        PlanEvent(({"content": "Read", "status": "pending", "priority": "high"},), omitted=2),
        TextDelta("cut"),
        Finish(),
    ]
    sealed = []
    for event in events:
        sealed += [op.block for op in reducer.feed(event) if isinstance(op, Seal)]
    sealed += [op.block for op in reducer.seal(interrupted=True) if isinstance(op, Seal)]
    kinds = {(block.role, block.type) for block in sealed}
    assert kinds == set(SHAPES) - {(Role.USER, Kind.TEXT), (Role.SYSTEM, Kind.COMPACTION)}
    for block in sealed:
        check_kind(block.role, block.type)
        check_data(block.role, block.type, block.data)


def test_body_keys():
    assert chunks.body_key(Kind.TOOL_RESULT) == "shell_output"
    assert chunks.body_key(Kind.TEXT) == chunks.body_key(Kind.THINKING) == "text"


def test_the_module_is_pure():
    """No Django and nothing else of chat's: every layer may import it."""
    code = (
        "import sys, chat.chunks; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'chat')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "['chat', 'chat.chunks']"
