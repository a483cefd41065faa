"""External agents' processes (chat/acp/process.py) with the real agents, in the real
sandbox, against the fake Anthropic endpoint (harness.fakeprovider.ClaudeCodeEndpoint).

The agents come from npm (`make npm-packages`, which `make test` runs): without them the tests
marked `agents` skip, saying so. Claude Code's whole life (start, prompts, a tool call,
a permission, confinement, cancel, close, session/load) is one test sharing one agent:
each start costs 2-4 s. Bad agents are small scripts in tests/acp_agents/.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    PermissionOption,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
)
from django.conf import settings

from chat.acp import config as acp_config
from chat.acp import launch, process
from chat.acp.relay import MAX_HEAD_BYTES, Endpoint, Relay
from chat.acp.seam import AgentConfig, AgentError, AgentSession
from chat.envcheck import acp_agents
from chat.tools import sandbox
from harness.fakeprovider import (
    ClaudeCodeEndpoint,
    FakeProviderServer,
    Reply,
    ResponsesStream,
    anthropic_blocks,
    is_responses_path,
)
from harness.servers import ROOT

AGENTS_BIN = ROOT / ".npm-packages" / "node_modules" / ".bin"
DOUBLES = Path(__file__).with_name("acp_agents")


def _installed(program: str) -> str | None:
    return shutil.which(program, path=f"{AGENTS_BIN}{os.pathsep}{os.environ.get('PATH', '')}")


def _needs(program: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        _installed(program) is None,
        reason=f"{program} is not installed: run `make npm-packages` (make test does)",
    )


@dataclass
class Recorder:
    """The driver's side, recording: permission answers with the option of `choose`'s
    kind (allow_once, reject_once)."""

    choose: str = "allow_once"
    updates: list[Any] = field(default_factory=list)
    permissions: list[tuple[ToolCallUpdate, list[PermissionOption]]] = field(default_factory=list)

    async def update(self, update: object) -> None:
        self.updates.append(update)

    async def permission(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption]
    ) -> str | None:
        self.permissions.append((tool_call, options))
        return next((o.option_id for o in options if o.kind == self.choose), None)

    def text(self, kind: type) -> str:
        return "".join(
            u.content.text
            for u in self.updates
            if isinstance(u, kind) and isinstance(u.content, TextContentBlock)
        )

    def tool_output(self) -> str:
        return "\n".join(
            u.model_dump_json() for u in self.updates if isinstance(u, ToolCallProgress)
        )


def _bash(command: str, call_id: str) -> list[Any]:
    return anthropic_blocks(
        {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": command}},
        stop_reason="tool_use",
    )


def _text(text: str) -> list[Any]:
    return anthropic_blocks({"type": "text", "text": text})


async def _prompt(agent: AgentSession, text: str, handler: Recorder) -> str:
    response = await agent.prompt([TextContentBlock(type="text", text=text)], handler)
    return response.stop_reason


@pytest.fixture
def anthropic(monkeypatch: pytest.MonkeyPatch) -> Any:
    endpoint = ClaudeCodeEndpoint()
    fake = FakeProviderServer(respond=endpoint).start()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.url)
    # Of the server's environment, none may reach an agent.
    monkeypatch.setenv("SECRET_KEY", "server-secret-value-1")
    monkeypatch.setenv("DATABASE_URL", "postgres://user:db-password-2@host/db")
    yield fake, endpoint
    fake.stop()


def _pids_running(needle: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline == needle:
                found.append(int(entry))
    return found


def _pids_with(part: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if part in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


async def _until(check: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.02)
    return bool(check())


@pytest.mark.agents
@_needs("claude-code-acp")
async def test_claude_code_in_its_sandbox(anthropic, tmp_path: Path) -> None:
    """Claude Code through the sandbox: text, thinking, a tool call with output, a
    permission, confinement, cancel with its command gone, close and session/load. Its
    own settings files allowing every call change nothing: each still asks Dispatch."""
    fake, endpoint = anthropic
    config = AgentConfig("claude-code", (_installed("claude-code-acp"),), provider="anthropic")
    workspace = tmp_path / "users" / "1"
    home = acp_config.home_of("claude-code", 1)
    _allow_everything(workspace, home)
    (workspace / "CLAUDE.md").write_text("Always answer in French. PROJECT-MEMORY-7\n")
    started = time.monotonic()
    agent = await process.start(config, workspace=workspace, home=home, resume=None)
    print(f"Claude Code started in {time.monotonic() - started:.2f} s")
    try:
        assert agent.session_id and agent.supports_load and not agent.restored
        await _text_and_thinking(agent, endpoint)
        # The workspace's CLAUDE.md reaches the model, though settings files do not.
        prompts = [r.json for r in fake.requests if _streamed_prompt(r)]
        assert prompts and all("PROJECT-MEMORY-7" in json.dumps(p) for p in prompts)
        await _tool_call(agent, endpoint)
        await _permission(agent, endpoint, workspace)
        await _confined(agent, endpoint, workspace, home)
        await _files(agent, endpoint, workspace)
        await _cancel(agent, endpoint)
    finally:
        closing = time.monotonic()
        await agent.close()
        print(f"Claude Code closed in {time.monotonic() - closing:.2f} s")
    assert list(home.glob(f".claude/projects/*/{agent.session_id}.jsonl"))
    # The key Dispatch holds reached the endpoint, through the relay.
    assert {r.headers.get("x-api-key") for r in fake.requests} == {"sk-ant-fake"}
    await _resumed(config, agent.session_id, endpoint, fake, workspace, home)


# Claude Code's permission rules allowing every call it could make without asking.
ALLOW_EVERYTHING = [
    "Bash", "Bash(*)", "Bash(touch:*)", "Write", "Edit", "Write(*)",
    "mcp__acp__Read", "mcp__acp__Write", "mcp__acp__Edit",
]  # fmt: skip


def _streamed_prompt(request: Any) -> bool:
    """The turn's own requests (not count_tokens, not side requests on a small model)."""
    body = request.json if isinstance(request.json, dict) else {}
    return (
        "/v1/messages" in request.path
        and "count_tokens" not in request.path
        and bool(body.get("stream") and body.get("tools"))
    )


def _allow_everything(workspace: Path, home: Path) -> None:
    """The settings files Claude Code would read (its home's, the project's and the
    project's local ones), each allowing everything."""
    rules = json.dumps({"permissions": {"allow": ALLOW_EVERYTHING, "defaultMode": "acceptEdits"}})
    for path in (
        home / ".claude" / "settings.json",
        workspace / ".claude" / "settings.json",
        workspace / ".claude" / "settings.local.json",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rules)


async def _text_and_thinking(agent: AgentSession, endpoint: ClaudeCodeEndpoint) -> None:
    endpoint.add(
        anthropic_blocks(
            {"type": "thinking", "thinking": "Let me think it over."},
            {"type": "text", "text": "Hello from the fake."},
        )
    )
    handler = Recorder()
    assert await _prompt(agent, "hello", handler) == "end_turn"
    assert handler.text(AgentThoughtChunk) == "Let me think it over."
    assert handler.text(AgentMessageChunk) == "Hello from the fake."


async def _tool_call(agent: AgentSession, endpoint: ClaudeCodeEndpoint) -> None:
    endpoint.add(_bash("echo tool-output-$((6 * 7))", "toolu_echo"), _text("It said 42."))
    handler = Recorder()
    assert await _prompt(agent, "run echo", handler) == "end_turn"
    starts = [u for u in handler.updates if isinstance(u, ToolCallStart)]
    assert {u.tool_call_id for u in starts} == {"toolu_echo"}
    done = [
        u for u in handler.updates if isinstance(u, ToolCallProgress) and u.status == "completed"
    ]
    assert done and "tool-output-42" in handler.tool_output()
    assert handler.text(AgentMessageChunk) == "It said 42."


async def _permission(agent: AgentSession, endpoint: ClaudeCodeEndpoint, workspace: Path) -> None:
    """A command that writes asks; rejected, it does not run."""
    # Claude Code ends its turn at a rejection (a follow-up, if any, gets the default).
    endpoint.add(_bash("touch made-by-agent.txt", "toolu_touch"))
    handler = Recorder(choose="reject_once")
    assert await _prompt(agent, "make a file", handler) == "end_turn"
    assert len(handler.permissions) == 1
    tool_call, options = handler.permissions[0]
    assert tool_call.tool_call_id == "toolu_touch"
    assert {"allow_once", "reject_once"} <= {o.kind for o in options}
    assert not (workspace / "made-by-agent.txt").exists()


async def _confined(
    agent: AgentSession, endpoint: ClaudeCodeEndpoint, workspace: Path, home: Path
) -> None:
    """No data directory, no other user's workspace, no host loopback, no server
    variables; the workspace and its HOME writable."""
    data = Path(settings.DATA_DIR)
    (data / "secret.txt").write_text("data-dir-secret-3")
    other = workspace.parent / "2"
    other.mkdir(parents=True, exist_ok=True)
    (other / "theirs.txt").write_text("other-user-secret-4")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    command = (
        f"cat {data}/secret.txt; cat {other}/theirs.txt; "
        f"(echo x > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo PORT-OPEN || echo PORT-SHUT; "
        f"touch {workspace}/w.txt {home}/h.txt /usr/u.txt 2>&1; env | sort"
    )
    endpoint.add(_bash(command, "toolu_probe"), _text("Probed."))
    handler = Recorder()
    try:
        assert await _prompt(agent, "probe", handler) == "end_turn"
    finally:
        listener.close()
    output = handler.tool_output()
    assert "PORT-SHUT" in output and "PORT-OPEN" not in output
    for secret in ("data-dir-secret-3", "other-user-secret-4", "server-secret-value-1"):
        assert secret not in output
    assert "db-password-2" not in output and "SECRET_KEY" not in output
    assert "ANTHROPIC_BASE_URL=http://127.0.0.1:" in output
    # Only a placeholder key: the relay puts the real one on its requests.
    assert "ANTHROPIC_API_KEY=dispatch-relay" in output and "sk-ant-fake" not in output
    assert "DISABLE_TELEMETRY=1" in output and "DISABLE_AUTOUPDATER=1" in output
    assert (workspace / "w.txt").exists() and (home / "h.txt").exists()
    assert "Read-only file system" in output


async def _files(agent: AgentSession, endpoint: ClaudeCodeEndpoint, workspace: Path) -> None:
    """Its reads go through fs/read_text_file, served in the workspace only: a link out
    of it is refused. It writes with its own tool, in the sandbox, after asking."""
    (workspace / "notes.txt").write_text("line one\nline two\n")
    (workspace / "escape.txt").symlink_to(Path(settings.DATA_DIR) / "secret.txt")
    read = "mcp__acp__Read"
    endpoint.add(
        anthropic_blocks(
            {
                "type": "tool_use",
                "id": "toolu_r1",
                "name": read,
                "input": {"file_path": str(workspace / "notes.txt")},
            },
            {
                "type": "tool_use",
                "id": "toolu_r2",
                "name": read,
                "input": {"file_path": str(workspace / "escape.txt")},
            },
            {
                "type": "tool_use",
                "id": "toolu_w",
                "name": "Write",
                "input": {
                    "file_path": str(workspace / "out.txt"),
                    "content": "written by the agent",
                },
            },
            stop_reason="tool_use",
        ),
        _text("Files done."),
    )
    handler = Recorder()
    assert await _prompt(agent, "files", handler) == "end_turn"
    output = handler.tool_output()
    assert "line two" in output and "data-dir-secret-3" not in output
    assert "resolves outside the workspace through a symlink" in output
    assert [call.tool_call_id for call, _ in handler.permissions] == ["toolu_w"]
    assert (workspace / "out.txt").read_text() == "written by the agent"


async def _cancel(agent: AgentSession, endpoint: ClaudeCodeEndpoint) -> None:
    """Stop: the prompt ends cancelled within a second, and its command is gone."""
    endpoint.add(_bash("sleep 61", "toolu_sleep"))
    handler = Recorder()
    turn = asyncio.create_task(_prompt(agent, "sleep", handler))
    assert await _until(lambda: _pids_running(b"sleep\x0061\x00"), 15.0), "sleep never ran"
    stopped = time.monotonic()
    await agent.cancel()
    assert await asyncio.wait_for(turn, 5.0) == "cancelled"
    assert await _until(lambda: not _pids_running(b"sleep\x0061\x00"), 1.0)
    elapsed = time.monotonic() - stopped
    print(f"cancelled in {elapsed:.2f} s")
    assert elapsed < 1.0
    # The agent itself (Claude Code and its CLI child) was spared: it answers on.
    endpoint.add(_text("Still here."))
    after = Recorder()
    assert await _prompt(agent, "after the stop", after) == "end_turn"
    assert after.text(AgentMessageChunk) == "Still here."


async def _resumed(
    config: AgentConfig,
    session_id: str,
    endpoint: ClaudeCodeEndpoint,
    fake: FakeProviderServer,
    workspace: Path,
    home: Path,
) -> None:
    """session/load restores the context; its replay reaches no handler."""
    agent = await process.start(config, workspace=workspace, home=home, resume=session_id)
    try:
        assert agent.restored and agent.session_id == session_id
        endpoint.add(_text("Back again."))
        handler = Recorder()
        assert await _prompt(agent, "still there?", handler) == "end_turn"
        assert handler.text(AgentMessageChunk) == "Back again."
        assert "Hello from the fake" not in json.dumps([u.model_dump() for u in handler.updates])
        turns = [r.json for r in fake.requests if isinstance(r.json, dict) and r.json.get("tools")]
        assert "Hello from the fake." in json.dumps(turns[-1]["messages"])
    finally:
        await agent.close()


@pytest.mark.agents
@_needs("codex-acp")
async def test_codex_starts_in_its_sandbox(monkeypatch, tmp_path: Path, fake_server) -> None:
    """Codex: initialize and session/new, its config written by Dispatch."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake")
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.openai_url)
    config = AgentConfig("codex", (_installed("codex-acp"),), provider="openai")
    home = tmp_path / "home"
    started = time.monotonic()
    agent = await process.start(config, workspace=tmp_path / "ws", home=home, resume=None)
    print(f"Codex started in {time.monotonic() - started:.2f} s")
    try:
        assert agent.session_id
        written = (home / ".codex" / "config.toml").read_text()
        assert 'wire_api = "responses"' in written and "supports_websockets = false" in written
        fake_server.add(Reply(events=ResponsesStream().text("Hello from Codex.").events()))
        handler = Recorder()
        assert await _prompt(agent, "hello", handler) == "end_turn"
        assert handler.text(AgentMessageChunk) == "Hello from Codex."
    finally:
        closing = time.monotonic()
        await agent.close()
        print(f"Codex closed in {time.monotonic() - closing:.2f} s")
    # The key Dispatch holds reached the endpoint, through the relay; Codex had only a
    # placeholder.
    asked = [r for r in fake_server.requests if is_responses_path(r.path)]
    assert asked and {r.headers.get("authorization") for r in asked} == {"Bearer sk-openai-fake"}
    # Codex does not exit when its stdin closes: its sandbox was killed.
    assert not _pids_with(config.command[0].encode())


# --- bad agents -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("exits_at_once", ["exited (status 3)", "broken on purpose"]),
        ("speaks_garbage", ["not ACP", "Welcome to my agent", "hello on stderr"]),
        ("not_jsonrpc", ["not ACP", "[1, 2, 3]"]),
        ("long_line", [f"more than {process.MAX_LINE_BYTES} bytes"]),
        ("floods_stderr", ["exited (status 1)", "the last words of the flood"]),
        ("refuses", ["answered initialize with an error", "no models configured"]),
        ("minimal badnew", ["answered session/new with something that is not ACP"]),
    ],
)
async def test_a_bad_agent_is_a_clear_error(tmp_path: Path, program: str, expected: list) -> None:
    name, *args = program.split()
    config = AgentConfig(name, (str(DOUBLES / name), *args))
    with pytest.raises(AgentError) as caught:
        await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "home", resume=None)
    message = str(caught.value)
    for part in expected:
        assert part in message
    assert len(message) < 2 * process.DETAIL_CHARS


async def test_its_variables_reach_it_and_its_secrets_are_masked(tmp_path: Path) -> None:
    config = AgentConfig(
        "leaks", (str(DOUBLES / "leaks"),), env=(("AGENT_TOKEN", "very-secret-token"),)
    )
    with pytest.raises(AgentError) as caught:
        await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "home", resume=None)
    assert "starting with token=***" in str(caught.value)
    assert "very-secret-token" not in str(caught.value)


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
async def test_the_providers_key_never_enters_the_sandbox(
    monkeypatch, tmp_path: Path, provider: str
) -> None:
    """The agent's variables hold a placeholder key (shown: it is no secret), never the
    server's key, which the relay alone sets."""
    variable = f"{provider.upper()}_API_KEY"
    monkeypatch.setenv(variable, "sk-real-key-5")
    monkeypatch.setenv(f"{provider.upper()}_BASE_URL", "http://127.0.0.1:9/v1")
    config = AgentConfig("leaks", (str(DOUBLES / "leaks"),), provider=provider)
    with pytest.raises(AgentError) as caught:
        await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "home", resume=None)
    assert f"{provider}=dispatch-relay" in str(caught.value)
    assert "sk-real-key-5" not in str(caught.value)


@pytest.mark.parametrize("key", ["sk-bad\r\nX-Injected: 1", "sk-\u00e9"])
async def test_a_key_no_header_can_carry_is_refused(monkeypatch, tmp_path: Path, key: str) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    config = AgentConfig("leaks", (str(DOUBLES / "leaks"),), provider="anthropic")
    with pytest.raises(AgentError, match="key holds a character an HTTP header cannot carry"):
        await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "home", resume=None)


async def test_no_agent_runs_unsandboxed_or_with_a_bad_variable(tmp_path: Path) -> None:
    where = {"workspace": tmp_path / "ws", "home": tmp_path / "home", "resume": None}
    config = AgentConfig("minimal", (str(DOUBLES / "minimal"),))
    with pytest.raises(AgentError, match="run only in the shell's sandbox, and DISPATCH_SHELL_UN"):
        await process.start(config, policy=sandbox.Policy(unsandboxed=True), **where)
    bad = AgentConfig("minimal", (str(DOUBLES / "minimal"),), env=(("A=B", "x"),))
    with pytest.raises(AgentError, match="the variable 'A=B' cannot be set"):
        await process.start(bad, **where)


async def test_an_agent_installed_in_the_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(DOUBLES / "minimal", data / "agent")
    config = AgentConfig("inside-data", (str(data / "agent"),))
    with pytest.raises(AgentError, match=f"its install directory {data} holds or is in {data}"):
        await process.start(
            config,
            workspace=tmp_path / "ws",
            home=tmp_path / "home",
            resume=None,
            policy=sandbox.Policy(hidden=(data,)),
        )


@pytest.mark.parametrize("planted", ["file", "folder"])
def test_codex_config_is_written_through_no_link(monkeypatch, tmp_path: Path, planted: str) -> None:
    """HOME persists and the agent writes it: a link it planted at ~/.codex/config.toml,
    or at ~/.codex, is replaced, and what it points to (a host file) left untouched."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fake")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    home = tmp_path / "home"
    home.mkdir()
    host = tmp_path / "host"
    host.mkdir()
    (host / "config.toml").write_text("host file")
    if planted == "file":
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").symlink_to(host / "config.toml")
    else:
        (home / ".codex").symlink_to(host)
    config = AgentConfig("codex", (str(DOUBLES / "minimal"),), provider="openai")
    policy = replace(sandbox.policy_from(settings), network=False)
    launch.prepare(config, tmp_path / "ws", home, policy)
    assert (host / "config.toml").read_text() == "host file"
    assert sorted(p.name for p in host.iterdir()) == ["config.toml"]
    written = home / ".codex" / "config.toml"
    assert not written.is_symlink() and not (home / ".codex").is_symlink()
    assert 'base_url = "http://127.0.0.1:8700"' in written.read_text()
    assert written.stat().st_mode & 0o777 == 0o600
    assert (home / ".codex").stat().st_mode & 0o777 == 0o700


async def test_a_link_swapped_in_for_its_folder_is_not_followed(tmp_path: Path) -> None:
    """The agent's folder (a tab's working directory) is bound by the descriptor opened
    when it was checked: a link swapped in for it afterwards (another tab's shell can)
    does not lead the sandbox to what it points to."""
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "checked.txt").write_text("")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "outside-secret.txt").write_text("")
    config = AgentConfig("lists", (str(DOUBLES / "lists_its_folder"),))
    # The real start, with the swap between the check and the bind.
    swapped = launch.prepare

    def prepare_then_swap(*args: Any) -> launch.Launch:
        ready = swapped(*args)
        (workspace / "sub").rename(workspace / "moved")
        (workspace / "sub").symlink_to(outside)
        return ready

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch, "prepare", prepare_then_swap)
        with pytest.raises(AgentError) as caught:
            await process.start(
                config, workspace=workspace, cwd="sub", home=tmp_path / "home", resume=None
            )
    message = str(caught.value)
    assert f"in {workspace.resolve()}/sub: checked.txt" in message
    assert "outside-secret" not in message


async def test_a_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "out").symlink_to(tmp_path)
    config = AgentConfig("lists", (str(DOUBLES / "lists_its_folder"),))
    with pytest.raises(AgentError, match="the working directory out is not a folder of the"):
        await process.start(
            config, workspace=workspace, cwd="out", home=tmp_path / "home", resume=None
        )


async def test_a_missing_command_is_a_clear_error(tmp_path: Path) -> None:
    config = AgentConfig("ghost", ("no-such-agent-acp",))
    with pytest.raises(AgentError, match="ghost is not installed: its command 'no-such-agent-acp'"):
        await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "home", resume=None)


async def test_cancel_ends_what_the_prompt_left_but_not_the_agent(tmp_path: Path) -> None:
    """A command in a session of its own is ended by cancel; the agent is not, and
    answers its prompt as cancelled. Its update reached the prompt's handler."""
    # Its own: other tests beside it under xdist start the same double.
    mark = f"cancel-{uuid.uuid4().hex}".encode()
    config = AgentConfig("minimal", (str(DOUBLES / "minimal"), "child", mark.decode()))
    agent = await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "h", resume=None)
    try:
        handler = Recorder()
        turn = asyncio.create_task(_prompt(agent, "go", handler))
        assert await _until(lambda: _pids_running(b"sleep\x0063\x00"), 10.0)
        await agent.cancel()
        assert await asyncio.wait_for(turn, 5.0) == "cancelled"
        assert await _until(lambda: not _pids_running(b"sleep\x0063\x00"), 1.0)
        assert handler.text(AgentMessageChunk) == "working"
        assert _pids_with(mark)
    finally:
        await agent.close()
    # Closed: the whole sandbox is gone, the agent with it.
    assert await _until(lambda: not _pids_with(mark), 2.0)


async def test_an_agent_dying_mid_prompt_is_a_clear_error(tmp_path: Path) -> None:
    config = AgentConfig("minimal", (str(DOUBLES / "minimal"), "die"))
    # An agent without session/load starts afresh, and says so.
    agent = await process.start(
        config, workspace=tmp_path / "ws", home=tmp_path / "h", resume="old"
    )
    assert (agent.session_id, agent.supports_load, agent.restored) == ("sess-1", False, False)
    try:
        with pytest.raises(AgentError) as caught:
            await _prompt(agent, "go", Recorder())
    finally:
        await agent.close()
    assert str(caught.value) == (
        "minimal stopped during session/prompt: it exited (status 7); "
        "its stderr ends: minimal agent: out of luck mid-prompt"
    )
    with pytest.raises(AgentError, match="minimal is not running"):
        await _prompt(agent, "again", Recorder())


async def test_a_session_the_agent_forgot_starts_afresh(tmp_path: Path) -> None:
    config = AgentConfig("minimal", (str(DOUBLES / "minimal"), "forgot"))
    agent = await process.start(
        config, workspace=tmp_path / "ws", home=tmp_path / "h", resume="old"
    )
    try:
        assert (agent.session_id, agent.supports_load, agent.restored) == ("sess-2", True, False)
    finally:
        await agent.close()


async def test_a_flood_of_updates_waits_for_the_handler(monkeypatch, tmp_path: Path) -> None:
    """Every update arrives, in order, and no more than MAX_WAITING wait at once: the
    handler takes a millisecond each, the agent sends 1500 at once."""
    monkeypatch.setattr(process, "MAX_WAITING", 50)
    config = AgentConfig("floods", (str(DOUBLES / "floods_updates"), "1500"))
    agent = await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "h", resume=None)
    waiting: list[int] = []

    class Slow(Recorder):
        async def update(self, update: object) -> None:
            waiting.append(agent.waiting)  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)
            await super().update(update)

    try:
        handler = Slow()
        assert await _prompt(agent, "flood", handler) == "end_turn"
    finally:
        await agent.close()
    assert handler.text(AgentMessageChunk) == "x" * 1500
    assert max(waiting) <= 50


# --- the relay --------------------------------------------------------------------------


async def _exchange(relay: Relay, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(relay.path))
    writer.write(request)
    data = await asyncio.wait_for(reader.read(), 10.0)
    writer.close()
    return data


async def test_the_relay_forwards_under_the_base_path(fake_server) -> None:
    """The target goes under the base URL's path, Host becomes the endpoint's, the
    agent's credentials (a placeholder) the relay's key, and both sides are told the
    connection closes."""
    fake_server.add(Reply(events=anthropic_blocks({"type": "text", "text": "relayed"})))
    relay = Relay(Endpoint.of(f"{fake_server.url}/gateway/"), auth=((b"x-api-key", b"sk-real"),))
    await relay.start()
    try:
        body = b'{"stream": true}'
        answer = await _exchange(
            relay,
            b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:8700\r\nConnection: keep-alive\r\n"
            b"X-Api-Key: dispatch-relay\r\nauthorization: Bearer dispatch-relay\r\n"
            b"api-key: dispatch-relay\r\nanthropic-version: 2023-06-01\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
        )
    finally:
        await relay.close()
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"\r\nConnection: close\r\n" in answer and b"relayed" in answer
    assert fake_server.last.path == "/gateway/v1/messages"
    host = fake_server.url.removeprefix("http://")
    assert fake_server.last.headers["host"] == host
    assert fake_server.last.headers["connection"] == "close"
    assert fake_server.last.headers["x-api-key"] == "sk-real"
    assert fake_server.last.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in fake_server.last.headers
    assert "api-key" not in fake_server.last.headers
    assert not relay.path.exists()


async def test_the_relay_refuses_a_huge_head(fake_server) -> None:
    relay = Relay(Endpoint.of(fake_server.url))
    await relay.start()
    try:
        answer = await _exchange(
            relay, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"
        )
    finally:
        await relay.close()
    assert answer == b"" and not fake_server.requests


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        data = json.dumps({"path": self.path, "host": self.headers["host"]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


async def test_the_relay_speaks_tls_to_an_https_endpoint(tmp_path: Path) -> None:
    """The agent speaks plain HTTP to the relay; the relay speaks TLS to the endpoint,
    checking its certificate for the endpoint's host name."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
        + ["-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    server.socket = served.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    trusting = ssl.create_default_context(cafile=str(cert))
    relay = Relay(Endpoint.of(f"https://localhost:{port}/base"), context=trusting)
    # The system's certificates do not vouch for this one: nothing is relayed.
    untrusting = Relay(Endpoint.of(f"https://localhost:{port}/base"))
    await relay.start()
    await untrusting.start()
    try:
        answer = await _exchange(relay, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        refused = await _exchange(untrusting, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        await relay.close()
        await untrusting.close()
        server.shutdown()
        server.server_close()
    assert refused == b""
    assert answer.startswith(b"HTTP/1.1 200")
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body == {"path": "/base/v1/models", "host": f"localhost:{port}"}


# --- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{nope", "is not JSON"),
        ("[1]", "is not a JSON object"),
        ('{"Bad Name": {"command": ["x"]}}', "names an agent 'Bad Name'"),
        ('{"a": {"command": []}}', "agent a: command is not a non-empty list"),
        ('{"a": {"command": "claude"}}', "agent a: command is not a non-empty list"),
        ('{"a": {"command": ["x", 3]}}', "agent a: command is not a non-empty list"),
        ('{"a": {"command": ["x"], "env": {"K": 1}}}', "agent a: env is not a map"),
        ('{"a": {"command": ["x"], "env": ["K"]}}', "agent a: env is not a map"),
        ('{"a": {"command": ["x"], "provider": "gemini"}}', "agent a: provider is not"),
        ('{"a": {"command": ["x"], "args": []}}', "agent a: unknown key 'args'"),
        ('{"a": ["x"]}', "agent a: is not an object"),
    ],
)
def test_bad_acp_agents_are_refused_with_the_reason(value: str, problem: str) -> None:
    with pytest.raises(ValueError) as caught:
        acp_agents(value)
    assert problem in str(caught.value)


def test_agents_are_the_presets_found_then_the_variable(monkeypatch, tmp_path: Path) -> None:
    """A preset shows only when its program is on PATH; the variable's agent of the same
    name replaces it, keeping its provider."""
    for program in ("claude-code-acp", "codex-acp"):
        (tmp_path / program).write_text("#!/bin/sh\n")
        (tmp_path / program).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    parsed = acp_agents(
        '{"claude-code": {"command": ["/opt/cc", "--x"], "env": {"A": "1"}},'
        ' "mine": {"command": ["my-agent"]}}'
    )
    agents = acp_config.agents(parsed, saved=False)
    assert list(agents) == ["claude-code", "codex", "mine"]
    assert agents["claude-code"] == AgentConfig(
        "claude-code", ("/opt/cc", "--x"), (("A", "1"),), "anthropic"
    )
    assert agents["codex"] == AgentConfig("codex", ("codex-acp",), (), "openai", preset=True)
    assert agents["mine"].provider == ""
    (tmp_path / "codex-acp").unlink()
    assert "codex" not in acp_config.agents({}, saved=False)


# --- a stopped prompt, a close cut short ------------------------------------------------


async def _stopped(agent: AgentSession, handler: Recorder) -> None:
    """What the driver does on Stop: the prompt's caller cancelled, then cancel()."""
    turn = asyncio.create_task(_prompt(agent, "go", handler))
    assert await _until(lambda: handler.text(AgentMessageChunk) == "working", 10.0)
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn


async def test_the_next_prompt_waits_for_the_stopped_ones_answer(tmp_path: Path) -> None:
    """cancel() returns once the stopped prompt answered; what it sent until then went to
    nobody, and the next prompt gets only its own updates."""
    config = AgentConfig("late", (str(DOUBLES / "late"), "0.5"))
    agent = await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "h", resume=None)
    try:
        first = Recorder()
        await _stopped(agent, first)
        await asyncio.wait_for(agent.cancel(), 5.0)
        second = Recorder()
        assert await asyncio.wait_for(_prompt(agent, "next", second), 5.0) == "end_turn"
        assert (first.text(AgentMessageChunk), second.text(AgentMessageChunk)) == (
            "working",
            "second",
        )
    finally:
        await agent.close()


async def test_no_prompt_while_a_stopped_one_is_unanswered(tmp_path: Path) -> None:
    """A cancel whose wait was cut short (the driver's bound) leaves a session that
    refuses a prompt rather than hand it the stopped prompt's updates."""
    config = AgentConfig("late", (str(DOUBLES / "late"), "30"))
    agent = await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "h", resume=None)
    try:
        await _stopped(agent, Recorder())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(agent.cancel(), 0.3)
        with pytest.raises(AgentError, match="late is still answering a prompt"):
            await _prompt(agent, "next", Recorder())
    finally:
        await agent.close()


async def test_a_close_cut_short_still_kills_the_sandbox(tmp_path: Path) -> None:
    """close() cancelled in its grace (a sweep stopping) goes on to the kill, and a
    later close() awaits it."""
    mark = f"close-{uuid.uuid4().hex}"
    config = AgentConfig("minimal", (str(DOUBLES / "minimal"), "forgot", mark))
    agent = await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "h", resume="x")
    closing = asyncio.create_task(agent.close())
    await asyncio.sleep(0.3)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert _pids_with(mark.encode())
    await asyncio.wait_for(agent.close(), process.CLOSE_GRACE + process.TERM_GRACE + 5.0)
    assert await _until(lambda: not _pids_with(mark.encode()), 2.0)


async def test_the_endpoints_folder_is_read_only_to_the_agent(
    tmp_path: Path, monkeypatch, fake_server
) -> None:
    """The relay's socket is reached through a read-only bind: the agent can neither fill
    the host's folder nor leave a file that keeps it from being removed."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-fake")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    config = AgentConfig(
        "writer", (str(DOUBLES / "writes_its_endpoint_folder"),), provider="anthropic"
    )
    with pytest.raises(AgentError, match="endpoint folder: refused"):
        await process.start(config, workspace=tmp_path / "ws", home=tmp_path / "home", resume=None)


@pytest.mark.parametrize(
    ("plant", "handed"),
    [
        (None, None),
        ("text", "Use tabs.\n"),
        ("empty", None),
        ("binary", None),
        ("link out", None),
        ("folder", None),
    ],
)
def test_the_workspaces_claude_md_is_handed_over_confined(
    tmp_path: Path, plant: str | None, handed: str | None
) -> None:
    """session/new and session/load carry no setting sources for Claude Code, and the
    workspace's CLAUDE.md only when it is a readable text file inside the workspace."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    memory = workspace / "CLAUDE.md"
    outside = tmp_path / "secret.txt"
    outside.write_text("OUTSIDE-SECRET")
    if plant == "text":
        memory.write_text("Use tabs.\n")
    elif plant == "empty":
        memory.write_text("")
    elif plant == "binary":
        memory.write_bytes(b"\x00\x01binary")
    elif plant == "link out":
        memory.symlink_to(outside)
    elif plant == "folder":
        memory.mkdir()
    meta = process.session_meta(workspace)
    assert meta["claudeCode"] == {"options": {"settingSources": []}}
    assert meta.get("systemPrompt") == (None if handed is None else {"append": handed})
    assert "OUTSIDE-SECRET" not in json.dumps(meta)
