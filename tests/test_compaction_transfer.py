"""A compacted tab in the export and the import (issue 16): the Markdown export shows a
compaction as a notice with its summary; a JSONL export of a compacted tab imports to a
tab whose next request is the original's, and a compaction chunk that no request could
start from is refused with its line."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from chat import transfer
from chat.history import History
from chat.stream import Block
from tests.test_transfer import (
    export_bytes,
    import_bytes,
    lines_of,
    make_tab,
    refused,
    request_json,
    to_bytes,
)

pytestmark = pytest.mark.django_db

User = get_user_model()
T1, T2, T3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
SUMMARY = "## So far\n\n- The user wants `ls` run.\n- Output: *one* file, a.txt."


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery")


def b(role: str, type: str, data: dict[str, Any], turn: uuid.UUID, step: int = 1) -> Block:
    return Block(uuid.uuid4(), turn, step, role, type, data)


def compacted_log() -> list[Block]:
    """A turn with a bulky shell output (seqs 1..5), a compaction through it (6), an elide
    notice (7), and a turn after it (8..9)."""
    return [
        b("user", "text", {"text": "list the files"}, T1, 0),
        b("assistant", "tool_call",
          {"call_id": "c1", "name": "shell", "arguments": {"command": "ls"}}, T1),
        b("tool", "tool_result",
          {"call_id": "c1", "name": "shell", "result": "a.txt\n" * 2000}, T1),
        b("assistant", "text", {"text": "One file, many times."}, T1, 2),
        b("user", "text", {"text": "and now?"}, T2, 0),
        b("system", "compaction",
          {"summary": SUMMARY, "through_seq": 4, "model": "anthropic/claude-sonnet-4-5",
           "trigger": "manual", "instructions": "the *files*", "tokens_before": 150_123}, T2),
        b("system", "system",
          {"kind": "elide", "text": "Removed 1 old tool output.", "seqs": [3], "chars": 12000},
          T2),
        b("assistant", "text", {"text": "Still one file."}, T2),
        b("user", "text", {"text": "ok"}, T3, 0),
    ]  # fmt: skip


def test_markdown_export_shows_a_compaction_as_a_notice_with_its_summary(alice):
    tab = make_tab(alice, compacted_log())
    text = "".join(transfer.export_markdown(tab))
    notice = (
        "*Conversation compacted (through #4; manual; 150,123 tokens summarised; "
        "by anthropic/claude-sonnet-4-5; focus: the \\*files\\*).*\n\n"
        f"<details><summary>Summary</summary>\n\n{SUMMARY}\n\n</details>\n\n"
    )
    assert notice in text
    # Everything before it stays in the export: the log keeps what the model no longer gets.
    assert text.index("list the files") < text.index(notice)
    assert "*Elide: Removed 1 old tool output.*" in text


def test_a_compaction_with_only_its_required_fields_exports(alice):
    blocks = compacted_log()[:5]
    blocks.append(b("system", "compaction", {"summary": "S.", "through_seq": 4}, T2))
    text = "".join(transfer.export_markdown(make_tab(alice, blocks)))
    assert "*Conversation compacted (through #4).*\n\n<details>" in text


def test_a_compacted_tab_round_trips_and_its_next_request_starts_from_the_summary(alice):
    original = make_tab(alice, compacted_log())
    data = export_bytes(original)
    copy = import_bytes(alice, data)
    assert request_json(copy) == request_json(original)
    strip = {"id", "tab_id", "created_at", "exported_at"}
    again = [{k: v for k, v in x.items() if k not in strip} for x in lines_of(export_bytes(copy))]
    assert again == [{k: v for k, v in x.items() if k not in strip} for x in lines_of(data)]
    # The builder starts at the compaction: the summary, then what came after seq 4.
    from_log = History.build(list(copy.chunks.order_by("seq"))).messages()
    assert SUMMARY in from_log[0].parts[0].text
    assert "list the files" not in request_json(copy)
    assert "and now?" in request_json(copy)


def compaction_line(alice, **change: Any) -> bytes:
    lines = lines_of(export_bytes(make_tab(alice, compacted_log())))
    data = lines[6]["data"]
    for key, value in change.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    return to_bytes(lines)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"summary": None}, "the data of this compaction chunk (system) has no 'summary'"),
        ({"through_seq": None}, "the data of this compaction chunk (system) has no 'through_seq'"),
        ({"summary": "  \n"}, "a compaction with an empty summary"),
        ({"summary": 7}, "'summary' must be a string, not a number"),
        ({"through_seq": "4"}, "'through_seq' must be an integer, not a string"),
        ({"through_seq": True}, "'through_seq' must be an integer, not a boolean"),
        ({"through_seq": 6}, "a compaction at seq 6 cannot summarise through seq 6"),
        ({"through_seq": 99}, "a compaction at seq 6 cannot summarise through seq 99"),
        ({"through_seq": -1}, "a compaction at seq 6 cannot summarise through seq -1"),
        ({"tokens_before": -5}, "tokens_before is negative"),
        ({"trigger": ["auto"]}, "'trigger' must be a string, not an array"),
        ({"server_block": {}}, "unknown field(s) in the data of this compaction chunk"),
    ],
)
def test_a_compaction_no_request_could_start_from_is_refused_with_its_line(alice, change, problem):
    error = refused(alice, compaction_line(alice, **change))
    assert error.line == 7
    assert problem in error.problem


def test_a_compaction_chunk_must_be_a_system_one(alice):
    lines = lines_of(export_bytes(make_tab(alice, compacted_log())))
    lines[6]["role"] = "assistant"
    error = refused(alice, to_bytes(lines))
    assert (error.line, error.problem) == (7, "a assistant chunk cannot be of type 'compaction'")
