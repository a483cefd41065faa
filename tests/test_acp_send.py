"""The real agents end to end, as issue 30 says it is done: `manage.py send --new --model
acp/claude-code --json "…"` (and `acp/codex`) runs the installed agent (`make agents`)
in its sandbox against the fake Anthropic (Claude Code) or Responses (Codex) endpoint, and
streams thinking, text, a plan and a tool call with its output into the log, exiting 0.
The agents' own behaviour (sandbox, cancel, session/load, bad agents) is
tests/test_acp_process.py's; the mapping and the driver are test_acp_updates and
test_acp_driver's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness.fakeprovider import (
    ClaudeCodeEndpoint,
    FakeProviderServer,
    Recorded,
    Reply,
    ResponsesStream,
    anthropic_blocks,
)
from tests.test_acp_process import AGENTS_BIN, _needs
from tests.test_send import send, unowned

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.agents]


def sealed(stdout: str) -> list[tuple[str, dict[str, Any]]]:
    """The (type, data) of every chunk `send --json` printed sealed, in order."""
    ops = [json.loads(line) for line in stdout.splitlines()]
    return [(op["block"]["type"], op["block"]["data"]) for op in ops if op["op"] == "seal"]


def run(workspace: Path, model: str, message: str, **env: str) -> list[tuple[str, dict]]:
    path = f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}"
    done = send(
        workspace, "--new", "--model", model, "--yes-to-tools", "--json", message,
        PATH=path, **env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
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
