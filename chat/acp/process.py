"""An external agent's process and its ACP connection: chat.acp.seam's AgentSession.

start() runs the agent in its sandbox (chat.acp.launch), relays its endpoint
(chat.acp.relay), speaks ACP to it over its stdin and stdout with the SDK
(`agent-client-protocol`, a ClientSideConnection over a bounded line transport of
ours), and makes or restores its session. What the agent asks of the client:

- `session/update`: to the prompt's Handler, one at a time and in order (the SDK
  handles each notification in a task of its own); outside a prompt (a
  `session/load`'s replay, a late update) to nobody: a replayed update is in the log;
- `session/request_permission`: to the Handler, after the updates before it; outside a
  prompt, cancelled;
- `fs/read_text_file`: served in the workspace by Dispatch's file tools
  (chat.tools.files: no path out of it, links included). Writing is not offered: the
  agent writes with its own tools in the sandbox, asking first (see session_meta);
- `terminal/*`: not offered (the agents run their commands themselves, in the sandbox).

Bounds: a line of stdout past MAX_LINE_BYTES, anything on stdout that is not JSON-RPC,
or the end of stdout ends the connection with an AgentError saying so, with the end
of the agent's stderr (of which STDERR_TAIL_BYTES are kept, however much it writes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from acp import PROTOCOL_VERSION, Client, RequestError
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    PermissionOption,
    PromptResponse,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ToolCallUpdate,
)
from django.conf import settings
from pydantic import ValidationError

from chat.acp import launch
from chat.acp.relay import Relay
from chat.acp.seam import AgentConfig, AgentError, AgentSession, Handler
from chat.tools import files, sandbox, shell
from chat.tools.base import ToolError

logger = logging.getLogger(__name__)

# One JSON-RPC message is one line of stdout. A tool call's whole input or output can
# be big (a file written), so lines up to this are taken; a longer one ends the
# connection (memory stays bounded by it).
MAX_LINE_BYTES = 16 * 1024 * 1024
# Updates waiting for the handler (the SDK makes a task of each) before stdout is no
# longer read: a turn's updates come a few at a time, each handled in microseconds to
# milliseconds; only a flood reaches this, and then waits.
MAX_WAITING = 1000
# Kept of the agent's stderr (its end) for error messages, however much it writes.
STDERR_TAIL_BYTES = 64 * 1024
# Shown of it in a message.
DETAIL_CHARS = 600
# initialize and session/new (or load): Claude Code takes 2-4 s on a quiet machine; a
# loaded one or a long replay takes more. Past this the start fails.
START_TIMEOUT = 60.0
# Closing: the agent's stdin is closed and it gets this long to exit on its own (neither
# Claude Code nor Codex does), then SIGTERM and TERM_GRACE, then the whole sandbox is
# killed. Claude Code writes its session file after a turn, asynchronously: SIGTERM right
# after a turn loses the session (`session/load` then fails), 0.5 s later it does not, on
# a quiet machine; this is four times that.
CLOSE_GRACE = 2.0
TERM_GRACE = 1.0
# The sandbox's side answers a control word in milliseconds.
CONTROL_TIMEOUT = 5.0
# How much of a line that is not ACP a message quotes.
QUOTE_CHARS = 200
# The workspace's instructions for Claude Code (session_meta).
PROJECT_MEMORY = "CLAUDE.md"


async def start(
    config: AgentConfig,
    *,
    workspace: Path,
    home: Path,
    resume: str | None,
    policy: sandbox.Policy | None = None,
    cwd: str | None = None,
) -> AgentSession:
    """The agent running in its sandbox with one ACP session: `resume`'s restored by
    `session/load` where the agent can (its replay handed to nobody), else a new one.
    `policy` is the shell's (settings) unless given, always without network. With
    `cwd` (a tab's working directory), `workspace` is the user's whole workspace and the
    agent runs in that folder of it, bound by a descriptor opened without following a
    link (launch.prepare), never by its path."""
    if policy is None:
        policy = sandbox.policy_from(settings)
    policy = replace(policy, network=False)
    prepared = await asyncio.to_thread(launch.prepare, config, workspace, home, policy, cwd)
    agent = _Agent(config, prepared)
    try:
        async with asyncio.timeout(START_TIMEOUT):
            await agent.open(policy)
            await agent.begin(resume)
    except TimeoutError:
        await agent.kill()
        raise AgentError(agent.failure(f"did not start within {START_TIMEOUT:g} s")) from None
    except BaseException:
        await agent.kill()
        raise
    finally:
        prepared.release()
    return agent


def session_meta(workspace: Path) -> dict[str, Any]:
    """The `_meta` of session/new and session/load. Claude Code (claude-code-acp) would
    load permission rules from settings files — its home's `.claude/settings.json` and
    the workspace's `.claude/settings*.json`, files the agent itself can write — and a
    call they allow never asks Dispatch: with no setting sources every call asks, so the
    tab's rules and approval decide. That also skips the workspace's CLAUDE.md, which
    Dispatch hands over itself, read as the agent's file reads are (in the workspace, no
    link out). Other agents ignore a `_meta` they do not know."""
    meta: dict[str, Any] = {"claudeCode": {"options": {"settingSources": []}}}
    memory = _project_memory(workspace)
    if memory:
        meta["systemPrompt"] = {"append": memory}
    return meta


def _project_memory(workspace: Path) -> str:
    try:
        read = files.read_file(workspace, PROJECT_MEMORY)
    except ToolError as exc:
        if not str(exc).endswith("no such file"):
            logger.info("%s not handed to the agent: %s", PROJECT_MEMORY, exc)
        return ""
    return "" if read.images or read.result == "(empty file)" else read.result


class _Lines:
    """The SDK's Transport over the agent's pipes: a JSON-RPC message a line each way.
    receive() returns None (the end) at end of stdout or at the first line that is too
    long or not a JSON-RPC message, which `problem` then names."""

    def __init__(self, proc: asyncio.subprocess.Process, room: asyncio.Event) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self._stdin = proc.stdin
        self._stdout = proc.stdout
        # Set while fewer than MAX_WAITING updates wait for the handler (_Client).
        self._room = room
        self.problem = ""

    async def send(self, message: dict[str, Any]) -> None:
        self._stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        await self._stdin.drain()

    async def receive(self) -> dict[str, Any] | None:
        # The SDK handles each message in a task it makes once this returns: one turn of
        # the loop lets the last one start (and count itself), and no line is read while
        # the handler is MAX_WAITING updates behind, so an agent that floods waits on its
        # full pipe instead of filling memory.
        await asyncio.sleep(0)
        await self._room.wait()
        while True:
            try:
                line = await self._stdout.readline()
            except ValueError:
                self.problem = f"it sent a line of more than {MAX_LINE_BYTES} bytes"
                return None
            if not line:
                return None
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                message = None
            if isinstance(message, dict) and message.get("jsonrpc") == "2.0":
                return message
            quoted = line[:QUOTE_CHARS].decode("utf-8", "replace").strip()
            self.problem = f"it wrote something that is not ACP on its stdout: {quoted!r}"
            return None

    async def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stdin.close()


class _Client:
    """The ACP client's methods the agent calls (acp.interfaces.Client)."""

    def __init__(self, agent: _Agent) -> None:
        self.agent = agent

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        # Taken before any await: notifications run as tasks, in order up to here.
        agent = self.agent
        handler = agent.handler
        if handler is None or session_id != agent.session_id:
            return
        agent.waiting += 1
        if agent.waiting >= MAX_WAITING:
            agent.room.clear()
        try:
            async with agent.order:
                await handler.update(update)
        finally:
            agent.waiting -= 1
            if agent.waiting < MAX_WAITING:
                agent.room.set()

    async def request_permission(
        self,
        session_id: str,
        tool_call: ToolCallUpdate,
        options: list[PermissionOption],
        **_: Any,
    ) -> RequestPermissionResponse:
        handler = self.agent.handler
        chosen = None
        if handler is not None and session_id == self.agent.session_id:
            async with self.agent.order:
                chosen = await handler.permission(tool_call, options)
        if chosen is None or chosen not in {option.option_id for option in options}:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        allowed = AllowedOutcome(option_id=chosen, outcome="selected")
        return RequestPermissionResponse(outcome=allowed)

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **_: Any,
    ) -> ReadTextFileResponse:
        relative = self.agent.in_workspace(path)
        root = self.agent.launch.workspace
        args = (root, relative, max(line or 1, 1), max(limit or files.READ_DEFAULT_LINES, 1))
        try:
            outcome = await asyncio.to_thread(files.read_file, *args)
        except ToolError as exc:
            raise RequestError.invalid_params({"details": str(exc)}) from None
        if outcome.images:
            raise RequestError.invalid_params({"details": f"{path}: an image, not text"})
        text = outcome.result
        if text == "(empty file)" and (root / relative).stat().st_size == 0:
            text = ""
        return ReadTextFileResponse(content=text)


class _Agent:
    """One running agent (AgentSession): its bwrap process, relay, connection, session."""

    def __init__(self, config: AgentConfig, prepared: launch.Launch) -> None:
        self.config = config
        self.launch = prepared
        self.session_id = ""
        self.supports_load = False
        self.restored = False
        # Whether it takes images in a prompt (its promptCapabilities).
        self.images = False
        self.handler: Handler | None = None
        # Updates and permission requests reach the handler one at a time, in order
        # (asyncio.Lock wakes its waiters first come, first served).
        self.order = asyncio.Lock()
        # Updates received and not yet handled; stdout is not read while there are
        # MAX_WAITING (`room` clear).
        self.waiting = 0
        self.room = asyncio.Event()
        self.room.set()
        self._stderr = bytearray()
        self._proc: asyncio.subprocess.Process | None = None
        self._lines: _Lines | None = None
        self._conn: ClientSideConnection | None = None
        self._relay: Relay | None = None
        self._control: socket.socket | None = None
        self._control_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._pidfd: int | None = None
        self._closing = False
        # The close under way (close()), once one started.
        self._ending: asyncio.Task[None] | None = None
        # The prompt's request until the agent answers it (a stopped one's too).
        self._answering: asyncio.Task[PromptResponse] | None = None

    # --- starting ---

    async def open(self, policy: sandbox.Policy) -> None:
        """The sandbox running the agent, and the connection to it initialized."""
        prepared = self.launch
        extra = list(prepared.extra)
        if prepared.endpoint is not None:
            self._relay = Relay(prepared.endpoint, auth=prepared.auth)
            await self._relay.start()
            # Read-only: connecting to the socket needs no write to its folder, and the
            # agent can neither fill the host's folder nor leave files that keep it.
            extra += ["--ro-bind", str(self._relay.folder), launch.INSIDE_SOCKET_DIR]
        await self._spawn(policy, extra)
        self._lines = _Lines(self._require_proc(), self.room)
        # _Client has the methods of acp.interfaces.Client these agents call.
        self._conn = ClientSideConnection(cast(Client, _Client(self)), self._lines)
        try:
            started = await self._conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    # Claude Code's writes through the client (mcp__acp__Write, Edit)
                    # are allowed by its own settings files without asking (its
                    # PreToolUse hook reads them whatever the setting sources):
                    # without this capability it writes with its own tools, which ask.
                    fs=FileSystemCapabilities(read_text_file=True, write_text_file=False),
                    terminal=False,
                ),
                client_info=Implementation(name="dispatch", title="Dispatch", version="1"),
            )
        except Exception as exc:
            raise await self._error("initialize", exc) from None
        capabilities = started.agent_capabilities
        self.supports_load = bool(capabilities is not None and capabilities.load_session)
        prompts = capabilities.prompt_capabilities if capabilities is not None else None
        self.images = bool(prompts is not None and prompts.image)

    async def _spawn(self, policy: sandbox.Policy, extra: list[str]) -> None:
        prepared = self.launch
        inside = sandbox.data_fd(Path(__file__).with_name("inside.py").read_bytes(), "inside")
        ours, theirs = socket.socketpair()
        fds: list[int] = [inside]
        try:
            extra = [*extra, "--ro-bind-data", str(inside), launch.INSIDE_SCRIPT]
            variables = sandbox.setenv_fd(prepared.variables)
            fds.append(variables)
            argv, network, seccomp = sandbox.wrapped(
                policy,
                prepared.workspace,
                launch.inside_argv(prepared, theirs.fileno()),
                root_fd=prepared.root_fd,
                workspace=prepared.top,
                binds=[(prepared.home, prepared.home)],
                extra=extra,
            )
            assert network is None  # no network: nothing to relay but the endpoint
            if seccomp is not None:
                fds.append(seccomp)
            root = prepared.root_fd
            bound = root is not None and sandbox.binds_fd(policy)
            # bwrap's own environment: nothing of the server's but PATH and LANG.
            argv = [argv[0], "--clearenv", "--args", str(variables), *argv[1:]]
            shell.become_subreaper()
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # The folder opened, not its path (as the shell's commands: shell._start).
                cwd=prepared.workspace if root is None else f"/proc/self/fd/{root}",
                env={"PATH": launch.AGENT_PATH, "LANG": "C.UTF-8"},
                start_new_session=True,
                # bwrap closes the root's descriptor once bound (sandbox.command).
                pass_fds=(*fds, theirs.fileno(), *((root,) if bound else ())),
                limit=MAX_LINE_BYTES,
            )
        except ValueError as exc:
            ours.close()
            raise AgentError(f"{self.config.name} was not started: {exc}") from None
        except OSError as exc:
            ours.close()
            raise AgentError(
                f"{self.config.name} was not started: bwrap could not run ({exc.strerror or exc})"
            ) from None
        except BaseException:
            ours.close()
            raise
        finally:
            for fd in fds:
                os.close(fd)
            theirs.close()
            # bwrap has its own copy (or never will run).
            prepared.release()
        self._control = ours
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(self._proc.pid)
        assert self._proc.stderr is not None
        self._tasks.append(asyncio.create_task(self._keep_tail(self._proc.stderr)))

    async def begin(self, resume: str | None) -> None:
        """session/load of `resume` where the agent can (falling back to a new session
        when it no longer knows it), else session/new."""
        conn = self._require_conn()
        cwd = str(self.launch.workspace)
        meta = await asyncio.to_thread(session_meta, self.launch.workspace)
        if resume and self.supports_load:
            try:
                await conn.load_session(cwd=cwd, session_id=resume, mcp_servers=[], **meta)
            except RequestError as exc:
                logger.info("%s could not load session %s: %s", self.config.name, resume, exc)
            except Exception as exc:
                raise await self._error("session/load", exc) from None
            else:
                self.session_id, self.restored = resume, True
                return
        try:
            made = await conn.new_session(cwd=cwd, mcp_servers=[], **meta)
        except Exception as exc:
            raise await self._error("session/new", exc) from None
        self.session_id = made.session_id

    # --- AgentSession ---

    async def prompt(self, blocks: list[object], handler: Handler) -> PromptResponse:
        conn = self._require_conn()
        if self.handler is not None or self._answering is not None:
            # A stopped prompt the agent has not answered yet: a new one now would get
            # its late updates (Claude Code would even run both in one query).
            raise AgentError(f"{self.config.name} is still answering a prompt")
        self.handler = handler
        # The request is a task of its own: a Stop cancels the caller, and the response
        # it still awaits tells cancel() that the stopped turn is over.
        answering = self._answering = asyncio.create_task(
            conn.prompt(session_id=self.session_id, prompt=blocks)  # type: ignore[arg-type]
        )
        answering.add_done_callback(self._answered)
        try:
            return await asyncio.shield(answering)
        except Exception as exc:
            raise await self._error("session/prompt", exc) from None
        finally:
            # Whatever comes after this (a stopped prompt's late updates) goes to nobody.
            self.handler = None

    def _answered(self, task: asyncio.Task[PromptResponse]) -> None:
        if self._answering is task:
            self._answering = None
        if not task.cancelled():
            task.exception()  # retrieved: a stopped prompt's error is nobody's

    async def cancel(self) -> None:
        """`session/cancel`, what the prompt started ended, and then the prompt's answer
        awaited (however long: the caller bounds the wait, and a session whose prompt
        did not answer is not prompted again: prompt() refuses)."""
        conn = self._conn
        if conn is None or not self.session_id:
            return
        with contextlib.suppress(Exception):
            await conn.cancel(session_id=self.session_id)
        # The agent stops its turn; what the turn started (a command, in a process
        # group of its own or left running) is ended here.
        await self._tell("others")
        answering = self._answering
        if answering is not None:
            await asyncio.wait({answering})

    def stderr_tail(self) -> str:
        """The end of its stderr, its secrets (its key, its configured variables' values)
        masked: the text goes into the log and to the user."""
        text = self._stderr.decode("utf-8", "replace")
        for secret in self.launch.secrets:
            text = text.replace(secret, "***")
        return text

    async def close(self) -> None:
        """Its stdin closed and CLOSE_GRACE to exit, SIGTERM and TERM_GRACE, then the
        whole sandbox killed. The close runs as a task of its own: a caller cancelled
        meanwhile (a sweep stopping) does not stop it, and a second close() awaits it."""
        if self._ending is None:
            if self._closing:
                return  # killed already (a start or a connection that failed)
            self._closing = True
            self._ending = asyncio.create_task(self._close(), name=f"close {self.config.name}")
        await asyncio.shield(self._ending)

    async def _close(self) -> None:
        try:
            proc = self._proc
            if proc is not None and proc.returncode is None:
                if self._lines is not None:
                    await self._lines.close()
                if not await self._exited(CLOSE_GRACE):
                    await self._tell("term")
                    await self._exited(TERM_GRACE)
        finally:
            await self.kill()

    # --- ending ---

    async def kill(self) -> None:
        """The whole sandbox killed at once (its PID 1 dies with bwrap), and everything
        this agent holds released."""
        self._closing = True
        proc = self._proc
        if proc is not None:
            self._signal_group()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), shell.GROUP_EXIT_GRACE)
            await self._reap(proc.pid)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
        if self._answering is not None:
            self._answering.cancel()
        if self._relay is not None:
            await self._relay.close()
        if self._control is not None:
            self._control.close()
            self._control = None
        for task in self._tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), TERM_GRACE)
            task.cancel()

    def _signal_group(self) -> None:
        proc = self._proc
        if proc is None or self._pidfd is None:
            return
        with contextlib.suppress(ProcessLookupError):
            # Not reaped yet (the pidfd says), so its group's number is still its own.
            signal.pidfd_send_signal(self._pidfd, 0)
            os.killpg(proc.pid, signal.SIGKILL)

    async def _reap(self, group: int) -> None:
        """Reap its group's members orphaned onto this process (a child subreaper)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + shell.GROUP_EXIT_GRACE
        while loop.time() < deadline:
            try:
                pid, _ = os.waitpid(-group, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                await asyncio.sleep(shell.GROUP_POLL_INTERVAL)

    async def _exited(self, timeout: float) -> bool:
        proc = self._require_proc()
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _tell(self, word: str) -> str:
        """A control word to the sandbox's side, and its answer ("" when it is gone)."""
        control = self._control
        if control is None:
            return ""
        loop = asyncio.get_running_loop()
        async with self._control_lock:
            try:
                control.setblocking(False)
                async with asyncio.timeout(CONTROL_TIMEOUT):
                    await loop.sock_sendall(control, word.encode() + b"\n")
                    answer = await loop.sock_recv(control, 256)
            except (OSError, TimeoutError):
                return ""
        return answer.decode("utf-8", "replace").strip()

    # --- errors ---

    async def _error(self, step: str, exc: BaseException) -> AgentError:
        """What went wrong at `step`, for the user: the agent's answer, or how it broke
        (waiting a moment for its exit status; then it is killed), and the end of its
        stderr."""
        if isinstance(exc, RequestError):
            said = str(exc)
            if isinstance(exc.data, dict) and exc.data.get("details"):
                said += f": {exc.data['details']}"
            return AgentError(self.failure(f"answered {step} with an error: {said}"))
        if isinstance(exc, ValidationError):
            return AgentError(self.failure(f"answered {step} with something that is not ACP"))
        problem = self._lines.problem if self._lines is not None else ""
        if not problem:
            proc = self._proc
            if proc is not None and (proc.returncode is not None or await self._exited(1.0)):
                problem = f"it exited (status {proc.returncode})"
            else:
                problem = f"the connection broke ({exc or type(exc).__name__})"
        # Broken for good: ended, so that its stderr is read to its end for the message.
        await self.kill()
        return AgentError(self.failure(f"stopped during {step}: {problem}"))

    def failure(self, what: str) -> str:
        tail = self.stderr_tail().strip()[-DETAIL_CHARS:]
        return f"{self.config.name} {what}" + (f"; its stderr ends: {tail}" if tail else "")

    async def _keep_tail(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(STDERR_TAIL_BYTES):
            self._stderr += chunk
            del self._stderr[:-STDERR_TAIL_BYTES]

    # --- helpers ---

    def in_workspace(self, path: str) -> str:
        """`path` (absolute, as the agent sees the workspace: at its own path) relative to
        the workspace; RequestError for one outside it."""
        given = Path(path)
        root = self.launch.workspace
        if not given.is_absolute() or not given.is_relative_to(root):
            raise RequestError.invalid_params({"details": f"{path}: not in the workspace {root}"})
        return str(given.relative_to(root)) or "."

    def _require_proc(self) -> asyncio.subprocess.Process:
        if self._proc is None:
            raise AgentError(f"{self.config.name} is not running")
        return self._proc

    def _require_conn(self) -> ClientSideConnection:
        if self._conn is None or self._closing:
            raise AgentError(self.failure("is not running"))
        return self._conn
