"""The real agents end to end, as issue 30 says it is done: `manage.py send --new --model
acp/claude-code --json "…"` (and `acp/codex`) runs the installed agent (`make npm-packages`)
in its sandbox against the fake Anthropic (Claude Code) or Responses (Codex) endpoint, and
streams thinking, text, a plan and a tool call with its output into the log, exiting 0;
and through the worker, Stop ends a real agent's command and a restarted worker continues
its session. The agents' own behaviour (sandbox, cancel, session/load, bad agents) is
tests/test_acp_process.py's; the mapping and the driver's paths are test_acp_updates and
test_acp_driver's, with a double of the agent."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async

from chat import turns
from chat.turn import acp
from harness.fakeprovider import (
    ClaudeCodeEndpoint,
    FakeProviderServer,
    Recorded,
    Reply,
    ResponsesStream,
    anthropic_blocks,
)
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit
from tests.test_acp_process import AGENTS_BIN, _needs
from tests.test_sandbox import host_processes_with, marker
from tests.test_send import send, unowned

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.agents]


def sealed(stdout: str) -> list[tuple[str, dict[str, Any]]]:
    """The (type, data) of every chunk `send --json` printed sealed, in order."""
    ops = [json.loads(line) for line in stdout.splitlines()]
    return [(op["block"]["type"], op["block"]["data"]) for op in ops if op["op"] == "seal"]


def run(
    workspace: Path, model: str, message: str, *, yes: bool = True, exit: int = 0, **env: str
) -> list[tuple[str, dict]]:
    path = f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}"
    answer = ["--yes-to-tools"] if yes else []
    done = send(workspace, "--new", "--model", model, *answer, "--json", message, PATH=path, **env)
    assert done.returncode == exit, done.stderr[-3000:]
    return sealed(done.stdout)


@_needs("claude-code-acp")
def test_claude_code_streams_thinking_a_plan_a_command_with_its_output_and_text(tmp_path):
    endpoint = ClaudeCodeEndpoint(
        anthropic_blocks(
            {"type": "thinking", "thinking": "A plan first."},
            {
                "type": "tool_use",
                "id": "toolu_plan",
                "name": "TodoWrite",
                "input": {
                    "todos": [
                        {"content": "Say hi", "status": "in_progress", "activeForm": "Saying hi"},
                        {"content": "Report", "status": "pending", "activeForm": "Reporting"},
                    ]
                },
            },
            stop_reason="tool_use",
        ),
        anthropic_blocks(
            {"type": "text", "text": "Running it."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo hi"}},
            stop_reason="tool_use",
        ),
        anthropic_blocks({"type": "text", "text": "It said hi."}),
    )
    fake = FakeProviderServer(respond=endpoint).start()
    try:
        log = run(
            tmp_path / "ws",
            "acp/claude-code",
            "say hi",
            ANTHROPIC_API_KEY="sk-ant-fake",
            ANTHROPIC_BASE_URL=fake.url,
        )
    finally:
        fake.stop()
    kinds = [kind for kind, _ in log]
    assert kinds[:2] == ["thinking", "plan"], kinds
    assert log[0][1]["text"] == "A plan first."
    assert [e["content"] for e in log[1][1]["entries"]] == ["Say hi", "Report"]
    calls = [data for kind, data in log if kind == "tool_call"]
    assert {"name": "shell", "arguments": {"command": "echo hi"}}.items() <= calls[-1].items()
    [result] = [data for kind, data in log if kind == "tool_result" and data["name"] == "shell"]
    assert result["result"].strip() == "hi" and not result["is_error"]
    assert log[-1] == ("text", {"text": "It said hi."})
    assert unowned(tmp_path / "ws").is_dir()


@_needs("codex-acp")
def test_codex_streams_reasoning_a_plan_a_command_with_its_output_and_text(tmp_path):
    """Codex speaks the Responses API only; its reasoning shows as thinking."""

    def respond(request: Recorded) -> Reply:
        body = request.json if isinstance(request.json, dict) else {}
        answered = any(
            isinstance(item, dict) and item.get("type") == "function_call_output"
            for item in body.get("input", [])
        )
        if answered:
            return Reply(events=ResponsesStream().text("It said hi.").events())
        plan = {"plan": [{"step": "Say hi", "status": "in_progress"}]}
        stream = (
            ResponsesStream()
            .reasoning("rs_1", ["Planning it."], "enc-1")
            .call("call_p", "update_plan", plan)
            .call("call_1", "exec_command", {"cmd": "echo hi"})
        )
        return Reply(events=stream.events())

    fake = FakeProviderServer(respond=respond).start()
    try:
        log = run(
            tmp_path / "ws",
            "acp/codex",
            "say hi",
            OPENAI_API_KEY="sk-fake",
            OPENAI_BASE_URL=f"{fake.url}/v1",
        )
    finally:
        fake.stop()
    assert [kind for kind, _ in log] == ["thinking", "plan", "tool_call", "tool_result", "text"]
    assert log[0][1]["text"].strip() == "Planning it."
    assert [e["content"] for e in log[1][1]["entries"]] == ["Say hi"]
    assert log[2][1]["arguments"] == {"command": "echo hi"}
    assert log[3][1]["result"] == "hi\n"
    assert log[4] == ("text", {"text": "It said hi."})


@_needs("codex-acp")
def test_a_refused_codex_command_does_not_run_and_its_turn_ends_cancelled_saying_why(tmp_path):
    """Codex asks before `touch` (its request ids are strings, its options
    approved/abort); refused (send without a terminal refuses), the command does not run
    and Codex ends its turn cancelled, which the log says."""

    def respond(request: Recorded) -> Reply:
        call = ResponsesStream().call("call_1", "exec_command", {"cmd": "touch made.txt"})
        return Reply(events=call.events())

    fake = FakeProviderServer(respond=respond).start()
    try:
        log = run(
            tmp_path / "ws",
            "acp/codex",
            "make a file",
            yes=False,
            exit=1,
            OPENAI_API_KEY="sk-fake",
            OPENAI_BASE_URL=f"{fake.url}/v1",
        )
    finally:
        fake.stop()
    kinds = [kind for kind, _ in log]
    assert kinds == ["tool_call", "system", "tool_result", "system"], log
    assert log[1][1]["text"] == "Denied by the user."
    assert log[2][1]["is_error"]
    assert log[3][1]["kind"] == "cancelled" and "Codex ends its turn" in log[3][1]["text"]
    assert not list((tmp_path / "ws").rglob("made.txt"))


@_needs("claude-code-acp")
@pytest.mark.asyncio
async def test_stop_ends_a_real_agents_command_and_a_restart_continues_its_session(
    monkeypatch, settings, tmp_path
):
    """Claude Code through the worker: Stop ends its running command (the process gone)
    and the turn, cancelled, within a second or so; the worker's agents closed as at a
    restart, the next turn restores the agent's session (it sends the earlier messages to
    the model again) without logging its replay."""
    m = marker()
    # A command that runs until it is killed, found by its marker.
    command = f"exec -a {m} sleep 300"
    endpoint = ClaudeCodeEndpoint(
        anthropic_blocks({"type": "text", "text": "Noted: banana."}),
        anthropic_blocks(
            {"type": "tool_use", "id": "toolu_s", "name": "Bash", "input": {"command": command}},
            stop_reason="tool_use",
        ),
        anthropic_blocks({"type": "text", "text": "The word was banana."}),
    )
    fake = FakeProviderServer(respond=endpoint).start()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    monkeypatch.setenv("PATH", f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}")
    await database_sync_to_async(owner_workspace)(settings, tmp_path / "ws")
    try:
        async with running_worker():
            tab = await make_tab("acp/claude-code")
            async with Watcher(tab.pk) as watcher:
                await submit(tab, "remember banana")
                await watcher.until_idle(timeout=60)
                await submit(tab, "now wait")
                await watcher.until(lambda op: op["op"] == "seal" and _is_call(op), 60)
                await _until(lambda: host_processes_with(m), "the command to run")
                stopped_at = time.monotonic()
                await database_sync_to_async(turns.cancel)(tab.pk)
                await watcher.until_idle()
                took = time.monotonic() - stopped_at
                await _until(lambda: not host_processes_with(m), "the command to end")
                # What a restart does to the agents: closed gracefully.
                await acp.close_all()
                await submit(tab, "what was the word?")
                await watcher.until_idle(timeout=60)
    finally:
        fake.stop()
    assert took < 2.0
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/text",
        "user/text",
        "assistant/tool_call",
        "tool/tool_result",
        "system/system",
        "user/text",
        "assistant/text",
    ]
    assert rows[5].data["kind"] == "cancelled"
    assert rows[-1].data["text"] == "The word was banana."
    last = next(
        r for r in reversed(fake.requests) if isinstance(r.json, dict) and r.json.get("tools")
    )
    assert "remember banana" in json.dumps(last.json["messages"])


@_needs("codex-acp")
@pytest.mark.asyncio
async def test_stop_ends_a_real_codex_command_and_the_next_message_gets_its_answer(
    monkeypatch, settings, tmp_path
):
    """Codex leaves a running command alive on session/cancel: Stop ends it all the same
    (the process gone), the turn ends cancelled within a second or so, and a message
    sent right after is answered by the same agent."""
    m = marker()
    first = True

    def respond(request: Recorded) -> Reply:
        nonlocal first
        if first:
            first = False
            command = {"cmd": f"exec -a {m} sleep 300"}
            return Reply(events=ResponsesStream().call("call_1", "exec_command", command).events())
        return Reply(events=ResponsesStream().text("Here again.").events())

    fake = FakeProviderServer(respond=respond).start()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{fake.url}/v1")
    monkeypatch.setenv("PATH", f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}")
    await database_sync_to_async(owner_workspace)(settings, tmp_path / "ws")
    try:
        async with running_worker():
            tab = await make_tab("acp/codex")
            async with Watcher(tab.pk) as watcher:
                await submit(tab, "wait")
                await watcher.until(lambda op: op["op"] == "seal" and _is_call(op), 60)
                await _until(lambda: host_processes_with(m), "the command to run")
                stopped_at = time.monotonic()
                await database_sync_to_async(turns.cancel)(tab.pk)
                await watcher.until_idle()
                took = time.monotonic() - stopped_at
                await _until(lambda: not host_processes_with(m), "the command to end", 5.0)
                await submit(tab, "still there?")
                await watcher.until_idle(timeout=60)
    finally:
        fake.stop()
    assert took < 2.0
    rows = await chunks(tab.pk)
    assert kinds(rows)[-2:] == ["user/text", "assistant/text"]
    assert rows[-1].data["text"] == "Here again."
    assert "system/system" in kinds(rows)


def _is_call(op: dict[str, Any]) -> bool:
    return op["block"]["type"] == "tool_call"


async def _until(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
