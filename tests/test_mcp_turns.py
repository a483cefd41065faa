"""MCP servers seen from a tab's turns (the real runner, the Anthropic SDK against the
fake provider, tests/mcp_servers/tools.py over streamable HTTP): a server down at a
turn's start keeps its tools in the tab's frozen list, with a notice, instead of
changing the list (a cache miss of the whole conversation, tools gone mid-task)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chat.models import McpServer
from chat.tools import mcp
from harness.servers import Proc, clean_env
from tests.anthropic_wire import MODEL, reply, text, use_anthropic
from tests.engine import chunks, make_tab, running_worker
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
