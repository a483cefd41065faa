"""The tab's tool set is frozen (ARCHITECTURE.md, Tool sets, profiles and working
directories): every request of a tab sends the same tools, byte for byte, through the real
turn runner and the official Anthropic SDK against the fake server; a change (an admin's
edit of the tab's allowed tools, as an MCP server's new list would be) takes effect at the
next turn's start with a config-reload chunk, never within a turn."""

from __future__ import annotations

import json

import pytest

from chat.models import Tab
from chat.tools import TOOLS, toolset
from chat.turn import calls
from tests.anthropic_wire import MARKER, MODEL, reply, text, tool_use, use_anthropic
from tests.engine import Watcher, chunks, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "notes.txt").write_text("hello\n")
    return workspace


def tools_bytes(raw: bytes) -> str:
    """The request's `"tools":[…]` as sent (cache markers removed)."""
    body = raw.decode().replace(MARKER, "")
    start = body.index('"tools":[')
    _, end = json.JSONDecoder().raw_decode(body, start + len('"tools":'))
    return body[start:end]


def names(raw: bytes) -> list[str]:
    return [tool["name"] for tool in json.loads(raw)["tools"]]


async def run_one(tab: Tab, message: str) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, message)
        await watcher.until_idle()


async def test_tools_are_byte_stable_across_turns_and_change_only_at_a_turn_start(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    real_run_tool = calls.tools.run_tool

    async def edited_meanwhile(*args, **kwargs):
        # An admin narrows the tab's tools while its turn runs.
        await Tab.objects.filter(pk=tab.pk).aupdate(tool_allow=["read_file"])
        return await real_run_tool(*args, **kwargs)

    fake_server.add(
        reply(text("One.")),
        reply(text("Two.")),
        reply(tool_use("toolu_1", "list_files", path="."), stop="tool_use"),
        reply(text("Three.")),
        reply(text("Four.")),
    )
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "first")
        await run_one(tab, "second")
        await Tab.objects.filter(pk=tab.pk).aupdate(tool_allow=["list_files", "read_file"])
        monkeypatch.setattr(calls.tools, "run_tool", edited_meanwhile)
        await run_one(tab, "third")
        monkeypatch.setattr(calls.tools, "run_tool", real_run_tool)
        await run_one(tab, "fourth")
    raw = [r.body for r in fake_server.requests]
    assert len(raw) == 5
    assert names(raw[0]) == sorted(tool.name for tool in TOOLS)
    assert tools_bytes(raw[1]) == tools_bytes(raw[0])
    # Turn 3 (two steps) has the narrowed list in both, though it changed again mid-turn.
    assert names(raw[2]) == ["list_files", "read_file"]
    assert tools_bytes(raw[3]) == tools_bytes(raw[2])
    assert names(raw[4]) == ["read_file"]
    reloads = [
        (c.seq, c.data["text"])
        for c in await chunks(tab.pk)
        if c.type == "system" and c.data.get("kind") == "config-reload"
    ]
    assert [text for _, text in reloads] == [
        "Tools changed: "
        + ", ".join(
            f"-{n}" for n in sorted(t.name for t in TOOLS) if n not in ("list_files", "read_file")
        )
        + ".",
        "Tools changed: -list_files.",
    ]
    rows = await chunks(tab.pk)
    by_seq = {c.seq: c for c in rows}
    # Each reload opens its turn, before the turn's message.
    for seq, _ in reloads:
        assert by_seq[seq + 1].role == "user"
        assert by_seq[seq + 1].turn_id == by_seq[seq].turn_id
    await tab.arefresh_from_db()
    assert [e["name"] for e in tab.tools] == ["read_file"]


async def test_a_frozen_list_reads_back_from_the_database_as_it_was_stored():
    """PostgreSQL's jsonb gives `1e+300` back as an integer: frozen so already, the list
    a later turn reads is equal (no spurious config-reload) and sends the same bytes."""
    schema = {"type": "object", "properties": {"a": {"maximum": 1e16, "minimum": 1e300}}}
    schema["properties"]["b"] = {"multipleOf": 1.5, "maximum": 1.0, "minimum": 1e-7}
    entry = {"name": "mcp__s__t", "description": "d", "input_schema": schema, "server": "s"}
    frozen = toolset.freeze([entry], [])
    tab = await make_tab()
    await Tab.objects.filter(pk=tab.pk).aupdate(tools=frozen)
    stored = (await Tab.objects.aget(pk=tab.pk)).tools
    assert stored == frozen
    assert json.dumps(stored, sort_keys=True) == json.dumps(frozen, sort_keys=True)
