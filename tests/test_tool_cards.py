"""Tool cards (issue 15.5): what the shell's cap records about a cut."""

from __future__ import annotations

import io
import uuid
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from chat import agent, log, transfer
from chat.models import Tab
from chat.providers.base import Finish, ToolCallEvent, ToolResultEvent, ToolResultPart
from chat.providers.replay import ScriptedProvider
from chat.stream import Block, Kind, Reducer, Role
from chat.tools import run_tool
from chat.tools.shell import OUTPUT_CAP, OUTPUT_HEAD, OUTPUT_TAIL
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.test_transfer import export_bytes, request_json

User = get_user_model()
TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")

# A command whose output is past the cap, and that output as the test computes it.
BIG_COMMAND = "yes 'é-line' | head -n 50000"
BIG_OUTPUT = "é-line\n" * 50000


def expected_cut(output: str) -> tuple[int, int]:
    """(bytes, line ends) the cap drops: all but the first and last halves of the cap,
    a character cut at either edge dropped whole (computed here without the tool's code)."""
    data = output.encode()
    head = data[:OUTPUT_HEAD].decode("utf-8", "ignore")
    tail = data[-OUTPUT_TAIL:].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    return cut, output.count("\n") - head.count("\n") - tail.count("\n")


# --- The shell's cap records what it cut ---------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


async def test_a_capped_shell_output_records_the_bytes_and_lines_it_cut(ws):
    """Past the cap, the outcome counts the dropped bytes (the number its marker gives the
    model) and the line ends among them; multi-byte characters cut at an edge count whole."""
    assert len(BIG_OUTPUT.encode()) > OUTPUT_CAP
    outcome = await run_tool("shell", {"command": BIG_COMMAND}, ws, timeout=20)
    assert outcome.truncated and not outcome.is_error
    cut, lines = expected_cut(BIG_OUTPUT)
    assert (outcome.truncated_bytes, outcome.truncated_lines) == (cut, lines)
    assert f"\n[... {cut} bytes of output dropped ...]\n" in outcome.result
    assert 40000 < lines < 50000


async def test_an_output_within_the_cap_records_nothing_cut(ws):
    outcome = await run_tool("shell", {"command": "seq 1 400"}, ws, timeout=20)
    assert not outcome.truncated
    assert (outcome.truncated_bytes, outcome.truncated_lines) == (0, 0)


def test_the_reducer_keeps_the_cut_in_the_result_only_when_there_is_one():
    """A result with a cut carries truncated_bytes and truncated_lines; one without has the
    shape results always had (no new keys in old-style data)."""
    reducer = Reducer(TURN, 1)
    reducer.feed(ToolCallEvent("c1", "shell", {"command": "x"}))
    [seal] = reducer.feed(ToolResultEvent("c1", "shell", "r", False, True, None, 1234, 56))
    assert seal.block.data == {
        "call_id": "c1",
        "name": "shell",
        "result": "r",
        "is_error": False,
        "truncated": True,
        "truncated_bytes": 1234,
        "truncated_lines": 56,
    }
    reducer.feed(ToolCallEvent("c2", "shell", {"command": "y"}))
    [seal] = reducer.feed(ToolResultEvent("c2", "shell", "r", False))
    assert set(seal.block.data) == {"call_id", "name", "result", "is_error"}


@pytest.fixture
def workspace(tmp_path, settings):
    settings.DISPATCH_WORKSPACE = tmp_path
    return tmp_path


@pytest.mark.django_db(transaction=True)
async def test_the_runner_records_the_cut_and_sends_the_model_the_result_alone(
    workspace, monkeypatch
):
    """Through the real runner and shell: the sealed result holds the cut, and the next
    request's tool result is the result text, byte for byte (the counts are the page's)."""
    provider = ScriptedProvider(
        [
            [
                ToolCallEvent("s1", "shell", {"command": BIG_COMMAND}),
                Finish(stop_reason="tool_use"),
            ],
            [Finish(stop_reason="end_turn")],
        ]
    )

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(agent, "provider_for", provider_for)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "print a lot")
            await watcher.until_idle()
    result = next(c for c in await chunks(tab.pk) if c.type == Kind.TOOL_RESULT)
    assert result.data["truncated"] is True
    assert (result.data["truncated_bytes"], result.data["truncated_lines"]) == expected_cut(
        BIG_OUTPUT
    )
    [sent] = [
        part
        for message in provider.requests[1].messages
        for part in message.parts
        if isinstance(part, ToolResultPart)
    ]
    assert sent.result == result.data["result"]
    assert "truncated_bytes" not in repr(provider.requests[1])


@pytest.mark.django_db
def test_the_cut_survives_export_and_import_and_changes_no_request_byte():
    """An export holding the new keys imports (transfer checks every key of a result), and
    the request built from such a log is the one built without them."""
    owner = User.objects.create_user("alice")
    data = {"call_id": "c1", "name": "shell", "result": "out\n[exit code 0]", "is_error": False}
    cut = {**data, "truncated": True, "truncated_bytes": 99, "truncated_lines": 3}

    def tab_with(result: dict) -> Tab:
        tab = Tab.objects.create(owner=owner, model="offline/demo")
        log.append(
            tab.pk,
            [
                Block(uuid.uuid4(), TURN, 0, Role.USER, Kind.TEXT, {"text": "go"}),
                Block(uuid.uuid4(), TURN, 1, Role.ASSISTANT, Kind.TOOL_CALL,
                      {"call_id": "c1", "name": "shell", "arguments": {"command": "x"}}),
                Block(uuid.uuid4(), TURN, 1, Role.TOOL, Kind.TOOL_RESULT, result),
            ],
        )  # fmt: skip
        return tab

    tab = tab_with(cut)
    copy = transfer.import_jsonl(owner, io.BytesIO(export_bytes(tab)))
    assert log.tail(copy.pk)[-1].data == cut
    assert request_json(tab) == request_json(tab_with({**data, "truncated": True}))
