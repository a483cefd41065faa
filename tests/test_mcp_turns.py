"""MCP servers seen from a tab's turns (the real runner, the Anthropic SDK against the
fake provider, tests/mcp_servers/tools.py over streamable HTTP): a server down at a
turn's start keeps its tools in the tab's frozen list, with a notice, instead of
changing the list (a cache miss of the whole conversation, tools gone mid-task)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from chat import turns
from chat.models import McpServer, Tab
from chat.providers.base import Finish, TextDelta
from chat.tools import mcp
from harness.servers import Proc, clean_env
from tests.anthropic_wire import MODEL, reply, text, use_anthropic
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.test_tool_cache import names, run_one, tools_bytes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

TOOLS = str(Path(__file__).parent / "mcp_servers" / "tools.py")
TIMEOUT = 20.0


def web_server(log: Path, port: int = 0) -> Proc:
    argv = [sys.executable, TOOLS, "http", str(port)]
    return Proc("mcp-web", argv, clean_env(), log).start().listening()


async def test_a_server_down_at_a_turn_start_keeps_its_tools_and_says_so(
    fake_server, monkeypatch, tmp_path, settings
):
    use_anthropic(monkeypatch, fake_server)
    settings.DISPATCH_WORKSPACE = tmp_path / "workspace"
    web = web_server(tmp_path / "web.log")
    port = web.port
    try:
        await McpServer.objects.acreate(
            name="web", transport="http", url=f"{web.url}/mcp", timeout=TIMEOUT
        )
        fake_server.add(reply(text("One.")), reply(text("Two.")), reply(text("Three.")))
        async with running_worker():
            tab = await make_tab(MODEL)
            await run_one(tab, "first")
            web.stop()
            # Its connection gone (idle, or dropped by a failed call): the next turn's
            # listing must reach the server, and cannot.
            await mcp.close_idle(float("inf"))
            await run_one(tab, "second")
            down = await mcp.call("mcp__web__echo", {"text": "x"})
            web = web_server(tmp_path / "web-again.log", port)
            back = await mcp.call("mcp__web__echo", {"text": "back"})
            await run_one(tab, "third")
    finally:
        web.stop()
    raw = [r.body for r in fake_server.requests]
    assert len(raw) == 3
    assert "mcp__web__echo" in names(raw[0])
    assert tools_bytes(raw[1]) == tools_bytes(raw[0])
    assert tools_bytes(raw[2]) == tools_bytes(raw[0])
    rows = await chunks(tab.pk)
    notices = [c.data["text"] for c in rows if c.type == "system" and c.data.get("kind")]
    assert len(notices) == 1, notices
    assert notices[0].startswith("MCP servers not listed: server web: not reachable (")
    assert notices[0].endswith("; kept its last known tools, calls to them fail until it answers.")
    assert down.is_error
    assert down.result.startswith(
        "mcp__web__echo cannot be called now: server web: not reachable ("
    )
    assert (back.result, back.is_error) == ("echo: back", False)


async def test_a_tool_no_provider_takes_is_left_out_with_a_notice_and_the_rest_offered(
    fake_server, monkeypatch, tmp_path, settings
):
    use_anthropic(monkeypatch, fake_server)
    settings.DISPATCH_WORKSPACE = tmp_path / "workspace"
    settings.DISPATCH_SHELL_UNSANDBOXED = True
    await McpServer.objects.acreate(
        name="odd",
        transport="stdio",
        command=sys.executable,
        args=[str(Path(__file__).parent / "mcp_servers" / "bare.py"), "broken"],
    )
    fake_server.add(reply(text("One.")))
    async with running_worker():
        tab = await make_tab(MODEL)
        await run_one(tab, "first")
    offered = [name for name in names(fake_server.requests[0].body) if name.startswith("mcp__")]
    assert offered == ["mcp__odd__fine", "mcp__odd__where"]
    notices = [c.data["text"] for c in await chunks(tab.pk) if c.type == "system"]
    assert len(notices) == 1
    assert notices[0].startswith(
        "Some tools are not available: server odd: tool 'broken' is left out: it is not valid MCP"
    )
    assert "server odd: tool 'typo' is left out: its input schema is not valid JSON" in notices[0]


# --- a hung server ---------------------------------------------------------------------


@pytest.fixture
def stuck(tmp_path):
    """An MCP server that takes connections and never answers, its handshake included."""
    argv = [sys.executable, TOOLS, "http", "--hang"]
    proc = Proc("mcp-hang", argv, clean_env(), tmp_path / "hang.log").start()
    yield f"http://127.0.0.1:{proc.listening().port}/mcp"
    proc.kill()


@pytest.fixture
def scripted(script, tmp_path, settings):
    """The scripted provider answering each turn with the steps given, in a workspace."""
    settings.DISPATCH_WORKSPACE = tmp_path / "workspace"
    return script


async def notices_of(tab) -> list[str]:
    return [c.data["text"] for c in await chunks(tab.pk) if c.type == "system"]


async def answers(tab) -> list[str]:
    rows = await chunks(tab.pk)
    return [c.data["text"] for c in rows if c.type == "text" and c.role == "assistant"]


async def test_a_tab_whose_tools_cannot_come_from_a_hung_server_never_waits_for_it(scripted, stuck):
    """A turn's start lists only the servers the tab's allow-list could take tools from:
    a tab of built-ins only does not wait for a hung server (which would cost the
    server's whole timeout at every turn)."""
    await McpServer.objects.acreate(name="stuck", transport="http", url=stuck, timeout=TIMEOUT)
    scripted([TextDelta("hi"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await Tab.objects.filter(pk=tab.pk).aupdate(tool_allow=["read_file", "mcp__other__*"])
        await run_one(tab, "go")
        pool = mcp._pool()
        assert ("stuck", None) not in pool.listings and ("stuck", None) not in pool.failed
    assert await notices_of(tab) == []
    assert await answers(tab) == ["hi"]


async def test_a_hung_server_holds_a_turn_start_a_few_seconds_then_is_not_asked_again(
    scripted, stuck, monkeypatch
):
    """A server that does not list its tools in TURN_LIST_SECONDS is left out of the turn
    (its last known tools kept, none here) with a notice, and remembered as failed: the
    next turn does not wait for it again."""
    monkeypatch.setattr(mcp, "TURN_LIST_SECONDS", 0.5)
    await McpServer.objects.acreate(name="stuck", transport="http", url=stuck, timeout=60)
    scripted([TextDelta("one"), Finish()], [TextDelta("two"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_one(tab, "first")
        assert ("stuck", None) in mcp._pool().failed
        await run_one(tab, "second")
        await mcp.close_all()
    assert await notices_of(tab) == [
        "Some tools are not available: server stuck: did not list its tools within 0.5 s.",
        "MCP servers not listed: server stuck: did not list its tools within 0.5 s.",
    ]
    assert await answers(tab) == ["one", "two"]


async def test_stop_ends_a_turn_waiting_for_a_hung_servers_tools_at_once(
    scripted, stuck, monkeypatch
):
    """Stop while the turn's start waits for a server's listing ends the turn at once,
    not when the wait or the server's timeout runs out."""
    monkeypatch.setattr(mcp, "TURN_LIST_SECONDS", 600.0)
    await McpServer.objects.acreate(name="stuck", transport="http", url=stuck, timeout=600)
    scripted([TextDelta("never"), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            async with asyncio.timeout(TIMEOUT):
                while ("stuck", None) not in mcp._pool().listings:
                    await asyncio.sleep(0.01)
            assert await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
        await mcp.close_all()
    kinds = [(c.type, c.data.get("kind")) for c in await chunks(tab.pk) if c.type != "user"]
    assert ("system", "cancelled") in kinds
    assert await answers(tab) == []
