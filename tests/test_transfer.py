"""chat.transfer: JSONL and Markdown export, and the checked import of a JSONL export."""

from __future__ import annotations

import base64
import io
import json
import tracemalloc
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from chat import log, tools, transfer
from chat.history import History
from chat.models import Chunk, Tab
from chat.providers import anthropic, openai
from chat.providers.base import Request
from chat.providers.registry import model_info
from chat.stream import Block

pytestmark = pytest.mark.django_db

User = get_user_model()
SONNET = "anthropic/claude-sonnet-4-5"
GPT = "openai/gpt-4.1"
SIGNATURE = base64.b64encode(bytes(range(200))).decode()
REDACTED = base64.b64encode(b"encrypted reasoning" * 5).decode()


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery")


def b(role: str, type: str, data: dict[str, Any], turn: uuid.UUID | None, step: int = 1) -> Block:
    return Block(uuid.uuid4(), turn, step, role, type, data)


def rich_log() -> list[Block]:
    """Every chunk type and every normalisation history applies, in one tab."""
    one, two, three = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    return [
        b("user", "text", {"text": "List the files — please 🙂"}, one, 0),
        b(
            "assistant",
            "thinking",
            {"text": "I should run ls.", "signature": SIGNATURE, "duration_ms": 1500},
            one,
        ),
        b("assistant", "text", {"text": "Running it."}, one),
        # Keys out of order and an unsafe id: history sorts and renames, import must not.
        b(
            "assistant",
            "tool_call",
            {"call_id": "call:1", "name": "shell", "arguments": {"z": 1, "command": "ls"}},
            one,
        ),
        b(
            "tool",
            "tool_result",
            {"call_id": "call:1", "name": "shell", "shell_output": "a\n"},
            one,
        ),
        b(
            "tool",
            "tool_result",
            {
                "call_id": "call:1",
                "name": "shell",
                "result": "a\nb ```` c",
                "is_error": False,
                "shell_output": "a\nb\n",
                "truncated": True,
            },
            one,
        ),
        # A result without its call: history drops it, the import keeps it.
        b("tool", "tool_result", {"call_id": "ghost", "name": "shell", "result": "?"}, one),
        b("assistant", "text", {"text": "Partial answ"}, one, 2),
        b(
            "system",
            "system",
            {"kind": "notice", "text": "Overloaded; retrying", "retry": True},
            one,
            2,
        ),
        b("assistant", "thinking", {"text": "", "redacted_data": REDACTED}, one, 2),
        b("assistant", "text", {"text": "Two files."}, one, 2),
        b("system", "system", {"kind": "model-changed", "text": "Model changed."}, None, 0),
        b("user", "text", {"text": "Read a, then b."}, two, 0),
        b(
            "assistant",
            "tool_call",
            {"call_id": "", "name": "read_file", "arguments": {"path": "a"}},
            two,
        ),
        b("assistant", "error", {"message": "Overloaded", "status_code": 529}, two),
        b("system", "system", {"kind": "interrupted", "text": "The server stopped."}, two),
        b("user", "text", {"text": "Go on."}, three, 0),
    ]


def make_tab(owner, blocks: list[Block], **fields: Any) -> Tab:
    tab = Tab.objects.create(
        owner=owner,
        title=fields.get("title", "Files"),
        model=fields.get("model", SONNET),
        system_prompt=fields.get("system_prompt", "You are terse."),
    )
    log.append(tab.pk, blocks)
    tab.refresh_from_db()
    return tab


def export_bytes(tab: Tab) -> bytes:
    return "".join(transfer.export_jsonl(tab)).encode()


def import_bytes(owner, data: bytes, **kw: Any) -> Tab:
    return transfer.import_jsonl(owner, io.BytesIO(data), **kw)


def request_json(tab: Tab) -> str:
    """What the next step would send, to Anthropic and to OpenAI, as JSON text."""
    messages = History.build(log.tail(tab.pk)).messages()
    request = Request(system=tab.system_prompt, tools=tools.tool_specs(), messages=messages)
    return json.dumps(
        [
            anthropic.build_params(request, model_info(SONNET)),
            openai.build_params(request, model_info(GPT)),
        ]
    )


def lines_of(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


def to_bytes(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


# --- Export ---------------------------------------------------------------------------


def test_jsonl_export_is_a_header_then_every_chunk_as_stored(alice):
    blocks = rich_log()
    tab = make_tab(alice, blocks)
    header, *chunks = lines_of(export_bytes(tab))
    assert header["format"] == "dispatch-tab"
    assert header["version"] == 1
    assert (header["title"], header["model"], header["system_prompt"]) == (
        "Files",
        SONNET,
        "You are terse.",
    )
    assert header["tab_id"] == str(tab.pk)
    assert header["chunks"] == len(blocks)
    assert [c["seq"] for c in chunks] == list(range(1, len(blocks) + 1))
    for line, block in zip(chunks, blocks, strict=True):
        assert line["id"] == str(block.id)
        assert line["turn_id"] == (str(block.turn_id) if block.turn_id else None)
        assert (line["step"], line["role"], line["type"]) == (block.step, block.role, block.type)
        assert line["data"] == block.data
        assert line["created_at"]


def test_jsonl_export_reads_the_log_in_pages_and_stops_at_the_last_seq_it_started_with(
    alice, monkeypatch
):
    monkeypatch.setattr(transfer, "PAGE", 3)
    tab = make_tab(alice, [b("user", "text", {"text": str(i)}, None, 0) for i in range(7)])
    export = transfer.export_jsonl(tab)
    with CaptureQueriesContext(connection) as queries:
        header = json.loads(next(export))
        first_page = next(export)
    assert header["chunks"] == 7
    assert len(first_page.splitlines()) == 3
    assert len(queries) == 2  # last_seq, then one page: nothing read ahead
    # A turn appends while the export runs: the export is of the tab as it was.
    log.append(tab.pk, [b("user", "text", {"text": "late"}, None, 0)])
    rest = "".join(export).splitlines()
    assert [json.loads(line)["seq"] for line in rest] == [4, 5, 6, 7]


def test_export_of_a_tab_without_chunks_is_the_header_alone(alice):
    tab = make_tab(alice, [])
    assert [line["chunks"] for line in lines_of(export_bytes(tab))] == [0]


def test_export_memory_does_not_grow_with_the_tab(alice, monkeypatch):
    """A page at a time: peak memory for 2,000 chunks is that of 200, not 10 times it."""
    monkeypatch.setattr(transfer, "PAGE", 100)
    big = "x" * 2000

    def peak(n: int) -> int:
        tab = make_tab(alice, [b("user", "text", {"text": big}, None, 0) for _ in range(n)])
        tracemalloc.start()
        try:
            for _ in transfer.export_jsonl(tab):
                pass
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(200), peak(2000)
    # The whole 2,000-chunk export is over 4 MB; a page is ~200 KB.
    assert large < 2 * small
    assert large < 2_000_000


def test_markdown_export_renders_each_kind_for_people(alice):
    tab = make_tab(alice, rich_log())
    md = "".join(transfer.export_markdown(tab))
    assert md.startswith("# Files\n")
    assert "<details><summary>System prompt</summary>" in md
    assert "## User\n\nList the files — please 🙂\n" in md
    assert (
        "## Assistant\n\n<details><summary>Thinking</summary>\n\nI should run ls.\n\n</details>"
        in md
    )
    assert '**Tool call** `shell`\n\n```json\n{\n  "z": 1,\n  "command": "ls"\n}\n```' in md
    # The result holds a run of four backticks: the fence is longer.
    assert "**Result of** `shell`\n\n`````\na\nb ```` c\n`````\n" in md
    assert "*Reasoning not shown by the provider.*" in md
    assert "*Error 529: Overloaded*" in md
    assert "*Interrupted: The server stopped.*" in md
    assert "*Model changed: Model changed.*" in md
    assert "signature" not in md and SIGNATURE not in md


def test_markdown_cuts_long_tool_output_and_says_so(alice):
    long = "line\n" * 2000
    tab = make_tab(
        alice,
        [
            b("user", "text", {"text": "go"}, None, 0),
            b("assistant", "tool_call", {"call_id": "c", "name": "shell", "arguments": {}}, None),
            b("tool", "tool_result", {"call_id": "c", "name": "shell", "result": long}, None),
        ],
    )
    md = "".join(transfer.export_markdown(tab))
    shown = transfer.MARKDOWN_TOOL_CHARS
    assert f"*… {len(long) - shown:,} more characters not shown (the JSONL export" in md
    assert len(md) < shown + 1000


def test_markdown_system_notice_cannot_break_out_of_its_italics(alice):
    tab = make_tab(alice, [b("system", "system", {"kind": "notice", "text": "a*b_c\nd"}, None, 0)])
    md = "".join(transfer.export_markdown(tab))
    assert "*Notice: a\\*b\\_c d*" in md


@pytest.mark.parametrize(
    ("text", "fence"),
    [("plain", "```"), ("a ``` b", "````"), ("``````", "```````"), ("", "```")],
)
def test_fence_is_longer_than_any_backtick_run_inside(text, fence):
    out = transfer.fenced(text, "")
    assert out.startswith(fence + "\n") and out.endswith("\n" + fence + "\n")
    assert f"\n{fence}`" not in out


# --- Round trip -----------------------------------------------------------------------


def test_export_then_import_gives_a_new_tab_whose_next_request_is_byte_identical(alice):
    original = make_tab(alice, rich_log())
    data = export_bytes(original)
    copy = import_bytes(alice, data)
    assert copy.pk != original.pk
    assert copy.owner == alice
    assert (copy.title, copy.model, copy.system_prompt, copy.last_seq) == (
        original.title,
        original.model,
        original.system_prompt,
        original.last_seq,
    )
    assert request_json(copy) == request_json(original)
    # Lossless both ways: the copy exports to the same lines but for ids and times.
    strip = {"id", "tab_id", "created_at", "exported_at"}
    again = [
        {k: v for k, v in line.items() if k not in strip} for line in lines_of(export_bytes(copy))
    ]
    first = [{k: v for k, v in line.items() if k not in strip} for line in lines_of(data)]
    assert again == first


def test_messages_a_wake_or_a_parent_agent_sent_keep_their_origin_through_a_round_trip(alice):
    # QueuedMessage.chunk_data puts `origin` in the user chunk (chat.chunks.UserText).
    turn, child = uuid.uuid4(), uuid.uuid4()
    wake = {"kind": "wake", "wake_id": 3, "scheduled_for": "2026-01-01T09:00:00+00:00"}
    agent = {"kind": "agent", "parent_tab": str(uuid.uuid4()), "call_id": "c1"}
    original = make_tab(
        alice,
        [
            b("user", "text", {"text": "Daily report", "origin": wake}, turn, 0),
            b("assistant", "text", {"text": "Done."}, turn),
            b("user", "text", {"text": "Look into it", "origin": agent}, child, 0),
        ],
    )
    copy = import_bytes(alice, export_bytes(original))
    assert [c.data.get("origin") for c in Chunk.objects.filter(tab=copy)] == [wake, None, agent]
    assert request_json(copy) == request_json(original)


def test_import_of_a_file_whose_chunk_ids_exist_makes_new_ids_and_leaves_the_original(alice):
    original = make_tab(alice, rich_log())
    before = list(Chunk.objects.filter(tab=original).values_list("id", "seq", "data"))
    data = export_bytes(original)
    first, second = import_bytes(alice, data), import_bytes(alice, data)
    ids = [
        set(Chunk.objects.filter(tab=t).values_list("id", flat=True))
        for t in (original, first, second)
    ]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    assert list(Chunk.objects.filter(tab=original).values_list("id", "seq", "data")) == before


def test_import_of_an_empty_tab_gives_an_empty_tab(alice):
    copy = import_bytes(alice, export_bytes(make_tab(alice, [])))
    assert copy.last_seq == 0 and log.count(copy.pk) == 0


def test_import_takes_crlf_line_ends_and_a_byte_order_mark(alice):
    data = export_bytes(make_tab(alice, rich_log()))
    copy = import_bytes(alice, b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n"))
    assert copy.last_seq == len(rich_log())


def test_import_writes_in_batches(alice, monkeypatch):
    monkeypatch.setattr(transfer, "WRITE_BATCH", 4)
    original = make_tab(alice, rich_log())
    copy = import_bytes(alice, export_bytes(original))
    assert request_json(copy) == request_json(original)


def test_import_writes_each_batch_in_its_own_transaction_into_a_tab_no_one_sees_yet(
    alice, monkeypatch
):
    """One long transaction held SQLite's write lock for the whole import (13 s for
    100,000 chunks), stalling every running turn: batches commit one by one, into a
    tab owned by no one until the last is in."""
    monkeypatch.setattr(transfer, "WRITE_BATCH", 4)
    original = make_tab(alice, rich_log())
    data = export_bytes(original)
    depth = len(connection.atomic_blocks)  # the test's own transaction
    seen = []
    real_append = log.append

    def append(tab_id, blocks, **kw):
        seen.append((len(connection.atomic_blocks), Tab.objects.get(pk=tab_id).owner_id))
        return real_append(tab_id, blocks, **kw)

    monkeypatch.setattr(log, "append", append)
    copy = import_bytes(alice, data)
    assert len(seen) > 2
    assert seen == [(depth, None)] * len(seen), "no outer transaction; no owner yet"
    assert copy.owner_id == alice.pk
    assert request_json(copy) == request_json(original)


def test_an_import_whose_write_fails_leaves_no_tab_behind(alice, monkeypatch):
    monkeypatch.setattr(transfer, "WRITE_BATCH", 4)
    original = make_tab(alice, rich_log(), title="half written")
    data = export_bytes(original)
    calls = []
    real_append = log.append

    def append(tab_id, blocks, **kw):
        calls.append(tab_id)
        if len(calls) == 2:
            raise RuntimeError("the disk is full")
        return real_append(tab_id, blocks, **kw)

    monkeypatch.setattr(log, "append", append)
    with pytest.raises(RuntimeError, match="disk is full"):
        import_bytes(alice, data)
    assert list(Tab.objects.filter(title="half written").values_list("pk", flat=True)) == [
        original.pk
    ]
    assert not Chunk.objects.filter(tab_id=calls[0]).exists()


# --- Bad files ------------------------------------------------------------------------


def good_lines(alice) -> list[dict[str, Any]]:
    return lines_of(export_bytes(make_tab(alice, rich_log())))


def refused(alice, data: bytes, **kw: Any) -> transfer.ImportRefused:
    tabs, chunks = Tab.objects.count(), Chunk.objects.count()
    with pytest.raises(transfer.ImportRefused) as info:
        import_bytes(alice, data, **kw)
    # Nothing written: not the tab, not the chunks before the bad line.
    assert (Tab.objects.count(), Chunk.objects.count()) == (tabs, chunks)
    return info.value


def test_a_broken_json_line_is_refused_with_its_line_number(alice, monkeypatch):
    monkeypatch.setattr(transfer, "WRITE_BATCH", 2)  # some chunks written before line 6
    raw = export_bytes(make_tab(alice, rich_log())).split(b"\n")
    raw[5] = raw[5][:-10]
    error = refused(alice, b"\n".join(raw))
    assert error.line == 6
    assert str(error).startswith("line 6: not valid JSON: ")


def test_an_empty_file_is_refused(alice):
    error = refused(alice, b"")
    assert str(error) == 'line 1: the file is empty; an export starts with a "dispatch-tab" header'


def test_a_file_without_its_header_is_refused(alice):
    lines = good_lines(alice)
    error = refused(alice, to_bytes(lines[1:]))
    assert str(error) == (
        'line 1: no header: this line is a chunk, and an export starts with a "dispatch-tab" header'
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "other"}, "line 1: the first line must be the header"),
        ({"version": 2}, "line 1: version 2 of the format is not known here"),
        ({"version": "1"}, 'line 1: version "1" of the format is not known here'),
        ({"version": True}, "line 1: version true of the format is not known here"),
        ({"title": 5}, "line 1: the header's 'title' must be a string, not a number"),
        ({"title": "t" * 201}, "line 1: the title is longer than 200 characters"),
        ({"extra": 1}, "line 1: unknown field(s) in the header: extra"),
        ({"chunks": 99}, "line 18: the header says 99 chunks and the file holds 17"),
    ],
)
def test_a_bad_header_is_refused(alice, change, message):
    lines = good_lines(alice)
    lines[0].update(change)
    assert str(refused(alice, to_bytes(lines))).startswith(message)


def test_a_header_missing_a_field_is_refused(alice):
    lines = good_lines(alice)
    del lines[0]["system_prompt"]
    assert str(refused(alice, to_bytes(lines))) == "line 1: the header has no 'system_prompt'"


def test_a_file_cut_at_a_line_end_is_refused_by_the_header_count(alice):
    lines = good_lines(alice)
    error = refused(alice, to_bytes(lines[:-3]))
    assert str(error) == (
        "line 15: the header says 17 chunks and the file holds 14: is the file cut short?"
    )


@pytest.mark.parametrize(
    ("seqs", "line", "message"),
    [
        ([2, 3], 2, "seq 2 where 1 was expected"),
        ([1, 3], 3, "seq 3 where 2 was expected"),
        ([1, 1], 3, "seq 1 where 2 was expected"),
        ([1, "2"], 3, "seq must be an integer, not a string"),
    ],
)
def test_seqs_must_be_dense_from_one(alice, seqs, line, message):
    lines = good_lines(alice)[: 1 + len(seqs)]
    lines[0]["chunks"] = len(seqs)
    for chunk, seq in zip(lines[1:], seqs, strict=True):
        chunk["seq"] = seq
    error = refused(alice, to_bytes(lines))
    assert error.line == line
    assert error.problem.startswith(message)


# (line index in rich_log's export, change to the chunk line, expected problem)
CHUNK_CASES = [
    (1, {"type": "picture"}, "unknown type 'picture'"),
    (1, {"role": "robot"}, "unknown role 'robot'"),
    (1, {"role": "user", "type": "thinking"}, "a user chunk cannot be of type 'thinking'"),
    (
        1,
        {"data": {"text": 5}},
        "the data of this text chunk (user): 'text' must be a string, not a number",
    ),
    (1, {"data": {}}, "the data of this text chunk (user) has no 'text'"),
    (
        1,
        {"data": {"text": "x", "colour": "red"}},
        "unknown field(s) in the data of this text chunk (user): colour",
    ),
    (1, {"data": ["text"]}, "data must be a JSON object, not an array"),
    (
        1,
        {"data": {"text": "x", "attachments": "a.png"}},
        "the data of this text chunk (user): 'attachments' must be an array, not a string",
    ),
    (
        1,
        {"data": {"text": "x", "origin": "wake"}},
        "the data of this text chunk (user): 'origin' must be an object, not a string",
    ),
    (1, {"step": -1}, "step -1 is out of range"),
    (1, {"step": 1.5}, "step must be an integer, not a number"),
    (1, {"turn_id": "not-a-uuid"}, "turn_id is not a UUID: 'not-a-uuid'"),
    (1, {"id": 7}, "id must be a string, not a number"),
    (1, {"created_at": "yesterday"}, "created_at is not an ISO 8601 date and time"),
    (1, {"colour": "red"}, "unknown field(s) in a chunk line: colour"),
    (
        4,
        {"data": {"call_id": "c", "name": "shell", "arguments": "ls"}},
        "the data of this tool_call chunk (assistant): 'arguments' must be an object, not a string",
    ),
    (4, {"data": {"call_id": "c", "name": "", "arguments": {}}}, "a tool call without a tool name"),
    (
        6,
        {"data": {"call_id": "c", "name": "shell", "is_error": "no"}},
        "the data of this tool_result chunk (tool): 'is_error' must be a boolean, not a string",
    ),
    (
        15,
        {"data": {"message": "x", "status_code": "529"}},
        "the data of this error chunk (assistant): 'status_code' must be an integer, not a string",
    ),
    (
        2,
        {"data": {"text": "t", "duration_ms": True}},
        "the data of this thinking chunk (assistant): 'duration_ms' must be an integer, "
        "not a boolean",
    ),
]


@pytest.mark.parametrize(("index", "change", "problem"), CHUNK_CASES)
def test_a_chunk_of_the_wrong_shape_is_refused_with_its_line(alice, index, change, problem):
    lines = good_lines(alice)
    lines[index].update(change)
    error = refused(alice, to_bytes(lines))
    assert error.line == index + 1
    assert error.problem.startswith(problem)


def test_a_second_header_is_refused(alice):
    lines = good_lines(alice)
    lines.insert(3, dict(lines[0]))
    assert str(refused(alice, to_bytes(lines))) == "line 4: a second header: a file holds one tab"


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_a_truncated_thinking_signature_is_refused(alice, cut):
    lines = good_lines(alice)
    assert lines[2]["data"]["signature"] == SIGNATURE
    lines[2]["data"]["signature"] = SIGNATURE[:-cut]
    error = refused(alice, to_bytes(lines))
    assert error.line == 3
    assert error.problem.startswith(
        "the thinking signature is not valid base64 (a truncated or edited signature?)"
    )


def test_truncated_redacted_reasoning_is_refused(alice):
    lines = good_lines(alice)
    assert lines[10]["data"]["redacted_data"] == REDACTED
    lines[10]["data"]["redacted_data"] = REDACTED[:-2]
    error = refused(alice, to_bytes(lines))
    assert error.line == 11
    assert error.problem.startswith("the thinking redacted_data is not valid base64")


def test_a_tool_result_without_its_call_is_kept_and_left_out_of_the_request_as_history_does(
    alice,
):
    """Normalised, not refused: the original tab's request drops it the same way."""
    blocks = [
        b("user", "text", {"text": "hi"}, None, 0),
        b("tool", "tool_result", {"call_id": "nobody", "name": "shell", "result": "x"}, None),
    ]
    original = make_tab(alice, blocks)
    copy = import_bytes(alice, export_bytes(original))
    assert log.count(copy.pk) == 2
    assert request_json(copy) == request_json(original)
    assert "nobody" not in request_json(copy)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"", "line 3: an empty line; every line must be one JSON object"),
        (b"[1, 2]", "line 3: a chunk line must be a JSON object, not an array"),
        (b'{"seq": NaN}', "line 3: not valid JSON: NaN is not a JSON number"),
        (
            b'{"seq": 2, "seq": 2}',
            "line 3: not valid JSON: the key 'seq' appears twice in one object",
        ),
    ],
)
def test_lines_that_are_not_chunk_objects_are_refused(alice, line, message):
    raw = export_bytes(make_tab(alice, rich_log())).split(b"\n")
    raw[2] = line
    assert str(refused(alice, b"\n".join(raw))) == message


def test_non_utf8_bytes_are_refused_with_line_and_column(alice):
    raw = export_bytes(make_tab(alice, rich_log())).split(b"\n")
    raw[3] = raw[3].replace(b"Running", b"Runn\xffng")
    error = refused(alice, b"\n".join(raw))
    assert error.line == 4
    assert error.problem.startswith("not UTF-8 text (byte 0xff at column ")


def test_a_header_of_the_wrong_type_is_refused(alice):
    assert str(refused(alice, b'"dispatch-tab"\n')) == (
        "line 1: the header must be a JSON object, not a string"
    )


class Endless(io.RawIOBase):
    """`size` bytes made up as they are read: a header line, then one line with no end."""

    def __init__(self, size: int, head: bytes) -> None:
        self.left = size
        self.head = head
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.left)
        if n <= 0:
            return 0
        piece = (self.head + b"x" * n)[:n]
        self.head = self.head[n:]
        buffer[:n] = piece
        self.left -= n
        self.read_bytes += n
        return n


def test_a_100_mb_line_is_refused_at_the_line_limit_not_read_to_its_end(alice):
    head = to_bytes(good_lines(alice)[:1])
    stream = io.BufferedReader(Endless(100 * 1024 * 1024, head))
    tabs = Tab.objects.count()
    with pytest.raises(transfer.ImportRefused) as info:
        transfer.import_jsonl(alice, stream)
    assert str(info.value) == (
        "line 2: the line is longer than 4 MB, the most one chunk of an export may be"
    )
    bound = len(head) + transfer.MAX_LINE_BYTES + 2 * io.DEFAULT_BUFFER_SIZE
    assert stream.raw.read_bytes <= bound
    assert Tab.objects.count() == tabs


def test_a_file_past_the_limit_after_good_lines_writes_nothing(alice):
    data = export_bytes(make_tab(alice, rich_log()))
    error = refused(alice, data, max_bytes=len(data) - 1)
    assert isinstance(error, transfer.ImportTooLarge)
    assert import_bytes(alice, data, max_bytes=len(data)).last_seq == len(rich_log())


def test_a_chunk_history_cannot_send_is_refused_with_its_line(alice, monkeypatch):
    """Whatever the shape checks let through, the request builder has the last word."""
    lines = good_lines(alice)
    lines[1]["data"] = {"text": "hi"}

    def refuse(self, chunk):
        raise ValueError("not today")

    monkeypatch.setattr(History, "add", refuse)
    error = refused(alice, to_bytes(lines))
    assert str(error) == "line 2: the request builder refuses this chunk: not today"


def test_a_nul_character_is_refused_where_the_database_cannot_hold_it(alice):
    """PostgreSQL's jsonb refuses U+0000 (a database error, after the lines before were
    written); SQLite keeps it, so there the chunk goes in as it is."""
    lines = good_lines(alice)
    lines[1]["data"]["text"] = "nul \x00 here"
    data = to_bytes(lines)
    if connection.vendor == "postgresql":
        error = refused(alice, data)
        assert str(error) == "line 2: the data holds a NUL character (\\u0000)"
    else:
        copy = import_bytes(alice, data)
        assert log.tail(copy.pk, limit=1)[0].data["text"] == "nul \x00 here"
