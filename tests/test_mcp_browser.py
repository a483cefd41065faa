"""An MCP server in Chromium, end to end: a superuser adds a streamable-HTTP server (the SDK's
MCPServer, tests/mcp_servers/tools.py) in Settings, a rule allows its tools, and a turn of
the real Anthropic adapter (against the fake provider) calls one: the model is offered
it, the rule lets it run unasked (the log says so), its progress and result show in the
tool card, and the model gets the result; other staff see the servers and no form.
Screenshots at 1280 and 375 px, light and dark."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from chat.models import McpServer
from harness.login import session_for
from harness.servers import Proc, clean_env
from tests.live import (
    anthropic_env,
    anthropic_reply,
    make_tab,
    make_user,
    open_page,
    rows,
    send_message,
    set_setting,
    shots_resized,
    synced,
    turn_ended,
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

MODEL = "anthropic/claude-sonnet-4-5"
TOOLS = str(Path(__file__).parent / "mcp_servers" / "tools.py")


async def test_a_superuser_adds_a_server_and_a_turn_uses_its_tool_allowed_by_a_rule(
    browser, serve, fake_server, tmp_path
):
    mcp_server = Proc("mcp", [sys.executable, TOOLS, "http"], clean_env(), tmp_path / "mcp.log")
    mcp_server.start().listening()
    try:
        await run(browser, serve, fake_server, f"http://127.0.0.1:{mcp_server.port}/mcp")
    finally:
        mcp_server.stop()


async def run(browser, serve, fake_server, url: str) -> None:
    fake_server.add(
        anthropic_reply(
            [("tool_use", ("toolu_1", "mcp__web__slow", {"steps": 3}))], stop_reason="tool_use"
        ),
        anthropic_reply([("text", ["It said slow done."])], stop_reason="end_turn"),
    )
    server = await serve(**anthropic_env(fake_server))
    await sync_to_async(set_setting)("approve_tools", True)
    user = await sync_to_async(make_user)()
    # A stdio server is a program run here: only superusers add servers.
    user.is_superuser = True
    await user.asave()
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/settings/tools/#mcp", session=session, width=1280)
    page = live.page

    await page.fill("#id_name", "web")
    await page.select_option("#id_transport", "http")
    await page.fill("#id_url", "http://127.0.0.1:9/")
    await page.fill("#id_headers", "Authorization=Bearer s3cret-token")
    await page.click("#mcp button.primary")
    await page.wait_for_selector("#mcp .mcp-servers >> text=web")
    # A server that is down: Test says why.
    await page.click("#mcp .mcp-servers button:has-text('Test')")
    assert "server web: not reachable (" in await page.text_content(".messages")
    # Fixed through Edit: the masked header is kept.
    await page.click("#mcp .mcp-servers a:has-text('Edit')")
    assert await page.input_value("#id_headers") == "Authorization=••••••••"
    await page.fill("#id_url", url)
    await page.click("#mcp button.primary")
    await page.click("#mcp .mcp-servers button:has-text('Test')")
    assert "Server web offers 9 tools: echo, add" in await page.text_content(".messages")
    assert "s3cret-token" not in await page.content()
    row = await McpServer.objects.aget(name="web")
    assert row.get_headers() == {"Authorization": "Bearer s3cret-token"}
    await page.locator("#mcp").evaluate("section => section.scrollIntoView()")
    await shots_resized(page, "mcp-settings", height=900)

    await page.goto(server.url + "/account/rules/")
    await page.select_option("#rule-action", "allow")
    await page.fill("#rule-pattern", "mcp__web__*")
    await page.click("button:has-text('Add rule')")
    await page.wait_for_selector("#rule-list >> text=mcp__web__*")

    tab = await sync_to_async(make_tab)(user, MODEL)
    await page.goto(f"{server.url}/t/{tab.id}/")
    await synced(page)
    await send_message(page, "use the slow tool")
    await turn_ended(tab.id)
    result = page.locator("#log .t-tool-call .t-tool-result.has-result")
    await result.wait_for()
    assert "slow done" in await result.text_content()
    assert "Allowed by rule mcp__web__*" in await page.text_content("#log .kind-rule")
    await page.wait_for_selector("#log >> text=It said slow done.")

    first, second = (json.loads(request.body) for request in fake_server.requests)
    offered = [tool["name"] for tool in first["tools"]]
    assert "mcp__web__slow" in offered
    assert offered == sorted(offered)
    answered = second["messages"][-1]["content"][0]
    assert (answered["type"], answered["tool_use_id"]) == ("tool_result", "toolu_1")
    assert "slow done" in json.dumps(answered["content"])
    logged = await sync_to_async(rows)(tab.id)
    kinds = [(r.type, r.data.get("kind")) for r in logged if r.type == "system"]
    assert ("system", "rule") in kinds
    await shots_resized(page, "mcp-turn", height=900)
    live.assert_clean()


async def test_other_staff_see_the_servers_and_no_form(browser, serve):
    row = McpServer(name="github", transport="stdio", command="npx")
    row.args = ["-y", "@modelcontextprotocol/server-github"]
    row.set_env({"GITHUB_TOKEN": "ghp_s3cret"})
    await row.asave()
    server = await serve()
    user = await sync_to_async(make_user)()
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, "/settings/tools/#mcp", session=session, width=1280)
    page = live.page
    await page.locator("#mcp").evaluate("section => section.scrollIntoView()")
    section = await page.text_content("#mcp")
    assert "Only a superuser can add, change or remove MCP servers" in section
    assert "GITHUB_TOKEN=" in section and "ghp_s3cret" not in await page.content()
    assert await page.locator("#mcp form.mcp-form").count() == 0
    assert await page.locator("#mcp .mcp-servers button:has-text('Test')").count() == 1
    await shots_resized(page, "mcp-settings-staff", height=900)
    live.assert_clean()
