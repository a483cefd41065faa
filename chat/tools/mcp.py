"""MCP servers' tools: connections, listing, calling, results.

Staff configure servers (chat.models.McpServer): a program run over stdio, confined as
the shell is (chat.tools.sandbox: bubblewrap, a fresh /proc, no data directory, the
shell's scrubbed environment plus the server's own variables, seccomp, the shell's
private network), with a home of its own under the data directory, and the workspace
of the tab's owner only when the server is configured to mount it (then one connection
per user); or a streamable-HTTP URL with headers. The public interface:

- specs(): every enabled server's tools as provider-safe McpToolSpecs, and problems
  ("server x: not reachable (...)"); never raises for a broken server.
- refresh(known, wanted=, turn=) -> Listing: the same, a server that cannot be listed
  keeping its tools in `known` (a tab's frozen list), and which servers failed; for a
  turn's start, only the servers `wanted`, each waited for TURN_LIST_SECONDS at most, one
  that failed not asked again for FAILED_SECONDS.
- call(name, arguments, *, on_output, timeout=None, owner_id=None) -> ToolOutcome: one
  call, an `is_error` outcome naming the server for every failure.

`owner_id` (refresh's and call's) is the tab's owner: a server that mounts the
workspace gets that user's, in a connection of that user's alone.

Connections live per event loop (a worker has one; each test its own): opened on first
use, reused by every turn and tab after it (a handshake per message costs seconds), and
closed once unused for MCP_IDLE_SECONDS, an HTTP session with its DELETE (a server keeps
a session's state until then). A connection is a task of its own that enters the SDK's
transport and session and leaves them when told to: anyio's scopes must be left by the
task that entered them, and a call comes from whichever turn needs it. A tool listing is
kept per connection until the server says `notifications/tools/list_changed`; the
frozen per-tab tool set picks the change up at a turn boundary.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
from channels.db import database_sync_to_async
from django.conf import settings

from chat.models import McpServer
from chat.tools import files, mcp_names, sandbox, shell, workdir
from chat.tools.base import MAX_RESULT_IMAGES, ImageFile, ToolOutcome, clean_text

# The MCP SDK (mcp, mcp_types, with pydantic, anyio, starlette, ...) and jsonschema are
# imported by the functions that use them, which run only once a server is configured:
# importing them takes a large share of every Django process's start, and most never
# reach an MCP server (tests/test_lazy_imports.py).
if TYPE_CHECKING:
    import mcp_types as types
    from mcp.client.session import ClientSession
    from mcp.shared.message import SessionMessage
    from pydantic import ValidationError

logger = logging.getLogger(__name__)

# Imported on a thread before the first connection: importing them takes about half a
# second, which would stall the event loop (every tab's turn) that once.
SDK_MODULES = (
    "anyio",
    "jsonschema",
    "mcp.client.session",
    "mcp.client.streamable_http",
    "mcp.shared.exceptions",
    "mcp.shared.message",
    "mcp_types",
    "pydantic",
)


def _import_sdk() -> None:
    for name in SDK_MODULES:
        importlib.import_module(name)


# An unused connection is closed after this: long enough that a conversation's pauses
# (reading an answer, typing the next question) keep it, short enough that a server is
# not held (a process, an HTTP session's state) for tabs nobody uses.
MCP_IDLE_SECONDS = 300.0
# How often idle connections are looked for; a connection lives at most this longer.
SWEEP_SECONDS = 30.0

# Tools offered per server: each costs its definition's tokens in every request, and
# peers' users lost 50-150k tokens of context to servers offering hundreds.
MAX_TOOLS_PER_SERVER = 100
# Pages of tools/list read per server: a server whose cursor never ends stops here.
MAX_LIST_PAGES = 50
# A tool's description is sent with every request; past this it is cut.
MAX_DESCRIPTION_CHARS = 2000
# One tool's input schema, as sorted-key JSON: a bigger one is left out. Real tools' take
# a few hundred bytes to a few KiB; each byte goes with every request of every tab.
MAX_SCHEMA_BYTES = 16 * 1024
# All of one server's tool definitions (name, description, schema as sorted-key JSON),
# about 16k tokens: the tools past it are left out. Peers' users lost 50-150k tokens of
# context to a few servers' definitions.
MAX_SERVER_TOOLS_BYTES = 64 * 1024
# Keywords a provider refuses at the top of a tool's input schema (Anthropic and OpenAI
# alike: it must be a plain object schema); a tool offering one would make every request
# of every tab that has it fail.
TOP_LEVEL_REFUSED = ("oneOf", "anyOf", "allOf", "not", "enum")

# The HTTP transport's read timeout: a tool may stream progress or think for long, and
# the server's own timeout bounds each call; the SDK's default would cut calls short.
HTTP_READ_TIMEOUT = 3600.0

# One message over HTTP (a result): the SDK's 1 MiB default would fail a big result,
# which is to be cut to the shell's cap instead. Past this the call fails.
MAX_HTTP_EVENT_BYTES = 32 * 1024 * 1024

# Closing an HTTP connection waits for its DELETE, a stdio one for STDIO_EXIT_GRACE and
# the kill after it. Past this the connection's task is cancelled.
CLOSE_GRACE = 10.0

# A stdio server whose stdin closed may take this long to exit on its own (the spec's
# first step, the SDK's 2 s); then its whole sandbox is killed.
STDIO_EXIT_GRACE = 2.0

# Where a stdio server that mounts the workspace finds it (its tab owner's): one path for
# every user, so its arguments can name it (`server-filesystem /workspace`).
MCP_WORKSPACE = Path("/workspace")

# One message from a stdio server is one line of its stdout, kept whole until it ends:
# as big as an HTTP message may be. A longer one ends the connection.
MAX_STDIO_LINE_BYTES = MAX_HTTP_EVENT_BYTES

# Kept of a failed server's stderr (and of output that was not MCP) for its message.
DETAIL_CHARS = 300
# What is kept of a stdio server's stderr: its end, for the message when it fails to
# start (room for a secret to be redacted whole before the cut). Never more: a server
# may write without end.
STDERR_TAIL_BYTES = 64 * 1024

# How long a turn's start waits for a server's tools: a server slower than that (hung,
# restarting) keeps its last known tools for the turn, and the listing goes on in the
# background (bounded by the server's own timeout) for the next turn. A healthy server's
# listing is cached per connection, so this is a handshake at most.
TURN_LIST_SECONDS = 3.0
# A server whose listing failed or was too slow is not asked again at a turn's start for
# this long (unless it is edited, or a call reaches it): every turn of every tab would
# wait for it again.
FAILED_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class McpToolSpec:
    """One MCP tool as the model sees it (`name`, `description`, `input_schema` with
    sorted keys) and where it comes from (`server`, and `tool`, the name it is called by)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    server: str
    tool: str


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """A McpServer row as a connection needs it; equal configs share a connection, so
    an edit (any field) opens a new one."""

    name: str
    transport: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    url: str
    headers: tuple[tuple[str, str], ...]
    timeout: float
    # Set when the row cannot be used as it is (secrets saved under another SECRET_KEY).
    problem: str = ""
    # The row's id (its home's folder) and whether it mounts the tab owner's workspace.
    id: int = 0
    mount_workspace: bool = False

    @classmethod
    def from_row(cls, row: McpServer) -> ServerConfig:
        env, headers = row.get_env(), row.get_headers()
        problem = ""
        if env is None or headers is None:
            problem = "its env or headers cannot be decrypted (SECRET_KEY changed): save them again"
        return cls(
            name=row.name,
            transport=row.transport,
            command=row.command,
            args=tuple(str(arg) for arg in row.args or ()),
            env=tuple(sorted((env or {}).items())),
            url=row.url,
            headers=tuple(sorted((headers or {}).items())),
            timeout=row.timeout,
            problem=problem,
            id=row.pk,
            mount_workspace=row.mount_workspace,
        )

    def key(self, owner_id: int | None) -> Key:
        """Which connection serves a call of `owner_id`'s tab: one per user for a server
        that mounts the workspace (one user's server never sees another's files), else
        one for all."""
        return (self.name, owner_id if self.mount_workspace else None)

    def redact(self, text: str) -> str:
        """`text` (a problem or an error, shown in every tab that has the server's tools)
        without the server's secrets: its env and header values, its URL's query and
        password. A server quoting its token in an error must not show it to users."""
        parts = urlsplit(self.url) if self.url else None
        secrets = [value for _, value in (*self.env, *self.headers)]
        if parts is not None:
            secrets += [parts.query, parts.password or ""]
        for secret in sorted(secrets, key=len, reverse=True):
            if len(secret) >= MIN_SECRET_CHARS:
                text = text.replace(secret, REDACTED)
        return text


# What a secret is replaced by in problems and errors, and the shortest value taken for
# one (shorter ones, "1" or "on", would blank out ordinary words).
REDACTED = "•••"
MIN_SECRET_CHARS = 4


def shown_url(url: str) -> str:
    """A server's URL as staff who may not see its secrets see it (Settings, the admin's
    list): its password and its query's values (a ?token=) masked, names kept."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:{REDACTED}@{host}"
    query = "&".join(
        f"{piece.partition('=')[0]}={REDACTED}" if "=" in piece else REDACTED
        for piece in parts.query.split("&")
        if piece
    )
    fragment = REDACTED if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


# A connection's place in its pool: the server's name, and the user whose workspace it
# mounts (None: no workspace).
Key = tuple[str, int | None]


class Unreachable(Exception):
    """A server that could not be connected to; the message says why, for people."""


# --- Connections ------------------------------------------------------------------------


class Connection:
    """One server's transport and session, held open by a task of its own."""

    def __init__(
        self,
        config: ServerConfig,
        policy: sandbox.Policy,
        *,
        home: Path,
        key: Key | None = None,
    ) -> None:
        self.config = config
        self.policy = policy
        # A stdio server's $HOME.
        self.home = home
        self.key = key or config.key(None)
        self.session: ClientSession | None = None
        self.tools: list[types.Tool] | None = None
        # Bumped by tools/list_changed: a listing read across a change is not kept.
        self.generation = 0
        self.busy = 0
        self.last_used = asyncio.get_running_loop().time()
        self.closed = False
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stderr = bytearray()
        self._not_mcp = ""
        # Why the server's stream ended, when it was not the server's doing.
        self.lost = ""
        self.screen = _Screen()
        # Tools the listing (self.tools) left out, and why; how many past the cap.
        self.refused: list[str] = []
        self.beyond = 0
        self._listing = asyncio.Lock()

    async def open(self) -> None:
        """Start the server (or reach it) and shake hands, within the server's timeout."""
        if any(name not in sys.modules for name in SDK_MODULES):
            await asyncio.to_thread(_import_sdk)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Stopped while connecting, nobody awaits it when the connection's task fails it:
        # taken here, or asyncio logs an error for every such Stop.
        ready.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp {self.config.name}")
        try:
            async with asyncio.timeout(self.config.timeout):
                await asyncio.shield(ready)
        except TimeoutError:
            detail = self._detail()
            await self.close()
            raise Unreachable(f"no answer within {self.config.timeout:g} s{detail}") from None
        except BaseException as exc:
            detail = self._detail()
            await self.close()
            if isinstance(exc, Exception):
                raise Unreachable(f"{_reason(exc)}{detail}") from exc
            raise

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        # Imported here for the startup cost (see the imports at the top).
        from mcp.client.session import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport(stack))
                session = await stack.enter_async_context(
                    ClientSession(
                        _ScreenedRead(read, self.screen),
                        _ListingsNoted(write, self.screen),
                        message_handler=self._on_message,
                    )
                )
                started = await session.initialize()
                self.screen.version = started.protocol_version
                self.session = session
                ready.set_result(None)
                await self._stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.warning("MCP server %s: connection ended: %s", self.config.name, exc)
        finally:
            self.closed = True
            self.session = None
            if not ready.done():
                ready.set_exception(Unreachable("closed while connecting"))

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        # Imported here for the startup cost (see the imports at the top).
        from mcp.client.streamable_http import streamable_http_client

        if self.config.transport == McpServer.Transport.HTTP:
            client = httpx2.AsyncClient(
                headers=dict(self.config.headers),
                timeout=httpx2.Timeout(self.config.timeout, read=HTTP_READ_TIMEOUT),
            )
            stack.push_async_callback(client.aclose)
            return streamable_http_client(
                self.config.url, http_client=client, max_sse_event_size=MAX_HTTP_EVENT_BYTES
            )
        return self._stdio()

    @contextlib.asynccontextmanager
    async def _stdio(self) -> AsyncIterator[tuple[Any, Any]]:
        """The server run as the shell's commands are (bwrap, seccomp, the private network
        through slirp4netns), its JSON-RPC lines bridged to the session's streams; when
        left, the whole sandbox killed. Not the SDK's stdio_client: it spawns the process
        itself and passes no descriptors, which bwrap's seccomp program and the private
        network need."""
        argv, env, cwd, binds = await asyncio.to_thread(self._stdio_launch)
        network: sandbox.Network | None = None
        seccomp: int | None = None
        variables: int | None = None
        if not self.policy.unsandboxed:
            argv, network, seccomp = sandbox.wrapped(self.policy, cwd, argv, binds=binds)
            # The server's own variables are set inside the sandbox, never in bwrap's
            # environment: there LD_PRELOAD (say) would run code on the host, before any
            # namespace. Read from a descriptor, so no other user's `ps` shows them.
            variables = _setenv_args(self.config.env)
            argv = [argv[0], "--args", str(variables), *argv[1:]]
        shell.become_subreaper()
        try:
            try:
                # From the connection's task, on the event loop's thread, which lives as
                # long as the server: bwrap's parent-death signal follows that thread.
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    pass_fds=tuple(
                        fd
                        for fd in (
                            *(network.child_fds() if network is not None else ()),
                            seccomp,
                            variables,
                        )
                        if fd is not None
                    ),
                    limit=MAX_STDIO_LINE_BYTES,
                )
            finally:
                if network is not None:
                    network.started()
                for fd in (seccomp, variables):
                    if fd is not None:
                        os.close(fd)
            leader = _Leader(proc, group=self.policy.unsandboxed)
            assert proc.stderr is not None
            tail = asyncio.create_task(_keep_tail(proc.stderr, self._stderr))
            try:
                if network is not None and (problem := await network.start()) is not None:
                    raise Unreachable(problem)
                async with _lines(proc, self._lose) as streams:
                    yield streams
            finally:
                await leader.end()
                # What it wrote last, for the message, before the failure is reported.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(tail), CLOSE_GRACE)
                tail.cancel()
        finally:
            if network is not None:
                # Not awaited: a second cancellation must not skip it (slirp4netns would
                # stay until this process ends).
                network.close()

    def _stdio_launch(
        self,
    ) -> tuple[list[str], dict[str, str], Path, tuple[tuple[Path, Path], ...]]:
        """The server's argv, environment, working directory (its home, made) and the
        workspace it mounts, if any, at MCP_WORKSPACE. Home and working directory are
        never the workspace: what a tab's shell plants there would run in the server at
        its next start (a .pth or usercustomize in ~/.local, an .npmrc or node_modules
        where npx starts)."""
        files.make_private(home := self.home)
        binds: tuple[tuple[Path, Path], ...] = ()
        # The user whose workspace it mounts (config.key), if any.
        if (mounted := self.key[1]) is not None:
            workspace = files.ensure_workspace(workdir.user_workspace(mounted))
            if home.resolve().is_relative_to(workspace):
                raise Unreachable(f"its home {home} is inside the workspace it would mount")
            binds = ((workspace, MCP_WORKSPACE),)
        env = shell.shell_env(home, sandboxed=not self.policy.unsandboxed)
        if self.policy.unsandboxed:
            env.update(self.config.env)  # sandboxed, bwrap sets them inside (_stdio)
        env["HOME"] = str(home)
        argv = [self.config.command, *self.config.args]
        if not self.policy.unsandboxed:
            verdict = sandbox.check(self.policy)
            if not verdict.available:
                raise Unreachable(
                    f"not started, since stdio servers run in the shell's sandbox: "
                    f"{verdict.problem}"
                )
        return argv, env, home, binds

    async def _on_message(self, message: Any) -> None:
        # Imported here for the startup cost (see the imports at the top).
        import mcp_types as types

        if isinstance(message, types.ToolListChangedNotification):
            self.generation += 1
            self.tools = None
        elif isinstance(message, Exception):
            # A line on stdout that is not JSON-RPC: kept for the message if the
            # handshake never completes. Redacted before it is cut: a secret the cut
            # went through would no longer be found, and show in part.
            self._not_mcp = self.config.redact(str(message))[:DETAIL_CHARS]

    def _lose(self, why: str) -> None:
        logger.warning("MCP server %s: connection ended: %s", self.config.name, why)
        self.lost = why

    def _detail(self) -> str:
        parts = []
        if self._not_mcp:
            parts.append(f"it wrote something that is not MCP: {self._not_mcp}")
        text = self._stderr.decode("utf-8", "replace").strip()
        if said := self.config.redact(text)[-DETAIL_CHARS:]:
            parts.append(f"its stderr ends: {said}")
        return "".join(f"; {part}" for part in parts)

    async def list_tools(self) -> tuple[list[types.Tool], list[str], int]:
        """The server's tools, the ones left out (a problem each, without the server's
        name), and how many it listed past MAX_TOOLS_PER_SERVER; read once per connection
        until the server says its list changed."""
        # One listing at a time: they share the screen's counts, and a second one waiting
        # takes what the first kept.
        async with self._listing:
            if self.tools is not None:
                return self.tools, self.refused, self.beyond
            generation = self.generation
            self.screen.start()
            tools = await self._pages()
            listed = tools, self.screen.refused, self.screen.beyond
            if generation == self.generation:
                self.tools, self.refused, self.beyond = listed
            return listed

    async def _pages(self) -> list[types.Tool]:
        # Imported here for the startup cost (see the imports at the top).
        import mcp_types as types

        session = self._session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        async with asyncio.timeout(self.config.timeout):
            for _ in range(MAX_LIST_PAGES):
                params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    break
        return tools

    def _session(self) -> ClientSession:
        if self.session is None or self.closed:
            raise Unreachable("the connection has closed")
        return self.session

    async def close(self) -> None:
        self.closed = True
        self._stop.set()
        task = self._task
        if task is not None and not task.done():
            if self.session is None:
                # Still connecting: nothing to end politely.
                task.cancel()
            _, pending = await asyncio.wait({task}, timeout=CLOSE_GRACE)
            if pending:
                logger.warning(
                    "MCP server %s did not close within %g s", self.config.name, CLOSE_GRACE
                )
                task.cancel()
                await asyncio.wait({task}, timeout=CLOSE_GRACE)


async def _keep_tail(stream: asyncio.StreamReader, tail: bytearray) -> None:
    """Read `stream` to its end, keeping its last STDERR_TAIL_BYTES in `tail`."""
    while chunk := await stream.read(STDERR_TAIL_BYTES):
        tail += chunk
        del tail[:-STDERR_TAIL_BYTES]


def _setenv_args(variables: Iterable[tuple[str, str]]) -> int:
    """A descriptor (a memfd, read from its start) holding bwrap's --setenv arguments for
    `variables` (name, value), NUL-separated as bwrap's --args reads them."""
    words: list[str] = []
    for name, value in variables:
        if "\0" in name or "\0" in value or "=" in name or not name:
            raise Unreachable(f"its variable {name!r} cannot be set: a NUL, '=' or no name")
        words += ["--setenv", name, value]
    fd = os.memfd_create("bwrap-setenv")
    try:
        os.write(fd, b"".join(os.fsencode(word) + b"\0" for word in words))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Screen:
    """What the streams below share: the ids of tools/list requests sent, the protocol
    version (which the SDK checks answers against), and the tools left out."""

    def __init__(self) -> None:
        self.listings: set[types.RequestId] = set()
        self.version = ""
        self.refused: list[str] = []
        # Of the listing being read: tools kept, and tools past the cap, never looked at
        # (checking a schema takes time, and a server may list thousands).
        self.kept = 0
        self.beyond = 0

    def start(self) -> None:
        self.refused, self.kept, self.beyond = [], 0, 0

    def screened(self, item: SessionMessage | Exception) -> SessionMessage | Exception:
        """A tools/list answer without the tools that must not be offered. The SDK checks
        a listing as a whole: one tool's bad schema would refuse all the server's tools."""
        # Imported here for the startup cost (see the imports at the top).
        import mcp_types as types
        from mcp.shared.message import SessionMessage

        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if not isinstance(message, types.JSONRPCResponse) or message.id not in self.listings:
            return item
        self.listings.discard(message.id)
        tools = message.result.get("tools")
        if not isinstance(tools, list):
            return item
        kept = []
        for tool in tools:
            if self.kept >= MAX_TOOLS_PER_SERVER:
                self.beyond += 1
            elif why := _refused(tool, self.version):
                name = tool.get("name") if isinstance(tool, dict) else None
                self.refused.append(f"tool {name!r} is left out: {why}")
            else:
                self.kept += 1
                kept.append(tool)
        result = {**message.result, "tools": kept}
        answer = types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)
        return SessionMessage(message=answer, metadata=item.metadata)


class _ScreenedRead:
    """The transport's read stream, tools/list answers screened."""

    def __init__(self, stream: Any, screen: _Screen) -> None:
        self._stream = stream
        self._screen = screen

    async def receive(self) -> SessionMessage | Exception:
        return self._screen.screened(await self._stream.receive())

    def __aiter__(self) -> _ScreenedRead:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return self._screen.screened(await self._stream.__anext__())

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _ScreenedRead:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._stream.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        # `last_context`, which the SDK reads when a transport has it.
        return getattr(self._stream, name)


class _ListingsNoted:
    """The transport's write stream, noting which requests are tools/list."""

    def __init__(self, stream: Any, screen: _Screen) -> None:
        self._stream = stream
        self._screen = screen

    async def send(self, item: SessionMessage) -> None:
        # Imported here for the startup cost (see the imports at the top).
        import mcp_types as types

        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method == "tools/list":
            self._screen.listings.add(message.id)
        await self._stream.send(item)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> _ListingsNoted:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return await self._stream.__aexit__(*exc)


def _refused(tool: Any, version: str) -> str:
    """Why a listed tool is not offered: a definition the SDK refuses, or an input
    schema that is no JSON Schema (a provider refuses every request offering it).
    "" when it is fine."""
    # Imported here for the startup cost (see the imports at the top).
    import jsonschema
    import mcp_types as types
    from mcp_types import methods as mcp_methods
    from pydantic import ValidationError

    if not isinstance(tool, dict):
        return "it is not a JSON object"
    page = {"tools": [tool]}
    try:
        with contextlib.suppress(KeyError):  # a version the SDK's table lacks
            mcp_methods.validate_server_result("tools/list", version, page)
        types.ListToolsResult.model_validate(page, by_name=False)
    except ValidationError as exc:
        return f"it is not valid MCP ({_where(exc, skip=2)})"
    except ValueError:
        pass  # a protocol version the SDK does not know: its own check decides
    schema = tool["inputSchema"]
    try:
        jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator).check_schema(
            schema
        )
    except jsonschema.SchemaError as exc:
        at = "/".join(map(str, exc.absolute_path)) or "its top"
        return f"its input schema is not valid JSON Schema (at {at}: {exc.message})"
    refused = [key for key in TOP_LEVEL_REFUSED if key in schema]
    if refused:
        keys = ", ".join(refused)
        return f"its input schema has {keys} at its top, which providers refuse"
    size = _size(schema)
    if size > MAX_SCHEMA_BYTES:
        return f"its input schema takes {size} bytes, more than {MAX_SCHEMA_BYTES}"
    return ""


def _size(value: Any) -> int:
    """The bytes `value` takes as sent: sorted-key JSON."""
    return len(json.dumps(value, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace"))


def _where(exc: ValidationError, skip: int = 0) -> str:
    """A validation error's first three places and messages."""
    return "; ".join(
        f"{'.'.join(map(str, error['loc'][skip:]))}: {error['msg']}" for error in exc.errors()[:3]
    )


@contextlib.asynccontextmanager
async def _lines(
    proc: asyncio.subprocess.Process, lose: Callable[[str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The session's streams over a stdio server's pipes: a JSON-RPC message a line each
    way. A line that is not a message goes to the session as its error (the SDK's way:
    the session hands it to the message handler); one past MAX_STDIO_LINE_BYTES (said to
    `lose`), the end of stdout or a broken stdin end the read stream, so waiting requests
    fail."""
    # Imported here for the startup cost (see the imports at the top).
    import anyio
    from mcp.shared.message import SessionMessage

    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    got_send, got = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    put, put_receive = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        async with got_send:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError:
                    lose(f"it sent a message of more than {MAX_STDIO_LINE_BYTES} bytes")
                    return
                if not line:
                    return
                if line.strip():
                    try:
                        await got_send.send(_message(line))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return  # the session is gone, or stdin broke (write)

    async def write() -> None:
        try:
            async with put_receive:
                async for item in put_receive:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    stdin.write(data.encode() + b"\n")
                    await stdin.drain()
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await got_send.aclose()

    async with anyio.create_task_group() as tasks, got, put:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield got, put
        finally:
            tasks.cancel_scope.cancel()


def _message(line: bytes) -> SessionMessage | Exception:
    # Imported here for the startup cost (see the imports at the top).
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


class _Leader:
    """A stdio server's first process (bwrap, or the server unsandboxed), held by a pidfd:
    a signal through it reaches that process or none, never one that got its number since
    it was reaped (pid numbers are reused, by anyone's processes, and a kill by number
    after the reap could hit them)."""

    def __init__(self, proc: asyncio.subprocess.Process, *, group: bool) -> None:
        self.proc = proc
        # Unsandboxed, its process group is killed too: nothing else ends what it started.
        self.group = group
        self.pidfd: int | None = None
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(proc.pid)

    async def end(self) -> None:
        """The spec's end (stdin closed, STDIO_EXIT_GRACE to exit), then SIGKILL: bwrap's
        PID 1 dies with bwrap (--die-with-parent), and the whole sandbox with it. Shielded,
        and a second cancellation (close() past CLOSE_GRACE) still kills."""
        # Imported here for the startup cost (see the imports at the top).
        import anyio

        proc = self.proc
        try:
            with anyio.CancelScope(shield=True):
                if proc.stdin is not None:
                    proc.stdin.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), STDIO_EXIT_GRACE)
                self.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), shell.GROUP_EXIT_GRACE)
                    await self._reap()
        finally:
            self.kill()
            if self.pidfd is not None:
                os.close(self.pidfd)
                self.pidfd = None

    def kill(self) -> None:
        if self.pidfd is None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                # Not reaped yet (the pidfd says), so its group's number is still its own.
                signal.pidfd_send_signal(self.pidfd, 0)
                os.killpg(self.proc.pid, signal.SIGKILL)
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    async def _reap(self) -> None:
        """Reap its group's members orphaned onto this process (a child subreaper:
        bwrap's PID 1 outlives bwrap by a moment), or they stay zombies."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + shell.GROUP_EXIT_GRACE
        while loop.time() < deadline:
            try:
                pid, _ = os.waitpid(-self.proc.pid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                await asyncio.sleep(shell.GROUP_POLL_INTERVAL)


def home_of(config: ServerConfig, owner_id: int | None) -> Path:
    """A stdio server's $HOME under the data directory: never in a workspace, one per
    server, and per user for one that mounts the workspace (its files may hold theirs)."""
    base = McpServer.homes(config.id)
    if config.key(owner_id)[1] is None:
        return base / "home"
    return base / "users" / str(owner_id) / "home"


class _Pool:
    """One event loop's connections, by Key (server name, and user for a server that
    mounts the workspace)."""

    def __init__(self) -> None:
        self.connections: dict[Key, Connection] = {}
        # Replaced by an edit while a call ran on them: closed once free.
        self.retired: list[Connection] = []
        self.locks: dict[Key, asyncio.Lock] = {}
        self.sweeper: asyncio.Task[None] | None = None
        # Servers whose listing at a turn's start failed or was too slow: the config, when
        # (the loop's clock) and the failure; and listings still running.
        self.failed: dict[Key, tuple[ServerConfig, float, str]] = {}
        self.listings: dict[Key, asyncio.Task[tuple[list[types.Tool], list[str], str]]] = {}

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    async def retire(self, connection: Connection) -> None:
        if connection.busy:
            self.retired.append(connection)
        else:
            await connection.close()

    async def close_idle(self, now: float) -> None:
        for key, connection in list(self.connections.items()):
            idle = not connection.busy and now - connection.last_used >= MCP_IDLE_SECONDS
            if idle or connection.closed:
                del self.connections[key]
                await connection.close()
        for connection in [c for c in self.retired if not c.busy]:
            self.retired.remove(connection)
            await connection.close()

    def watch(self) -> None:
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = asyncio.create_task(self._sweep(), name="mcp idle sweep")

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self.connections or self.retired:
            await asyncio.sleep(SWEEP_SECONDS)
            await self.close_idle(loop.time())


_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()


def _pool() -> _Pool:
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        pool = _POOLS[loop] = _Pool()
    return pool


def _new_connection(config: ServerConfig, owner_id: int | None = None) -> Connection:
    return Connection(
        config,
        sandbox.policy_from(settings),
        home=home_of(config, owner_id),
        key=config.key(owner_id),
    )


async def _connect(config: ServerConfig, owner_id: int | None = None) -> Connection:
    """The running loop's connection to this server for `owner_id`'s tabs (config.key),
    opened if there is none (or the one there is was closed, or made for a config since
    edited)."""
    if config.problem:
        raise Unreachable(config.problem)
    pool = _pool()
    key = config.key(owner_id)
    async with pool.lock(key):
        connection = pool.connections.get(key)
        if connection is not None and (connection.closed or connection.config != config):
            del pool.connections[key]
            await pool.retire(connection)
            connection = None
        if connection is None:
            connection = _new_connection(config, owner_id)
            await connection.open()
            pool.connections[key] = connection
            pool.failed.pop(key, None)
            pool.watch()
        connection.last_used = asyncio.get_running_loop().time()
        return connection


@contextlib.asynccontextmanager
async def _using(connection: Connection) -> AsyncIterator[Connection]:
    connection.busy += 1
    try:
        yield connection
    finally:
        connection.busy -= 1
        connection.last_used = asyncio.get_running_loop().time()


async def close_idle(now: float | None = None) -> None:
    """Close this loop's connections unused for MCP_IDLE_SECONDS as of `now` (the
    loop's clock; the sweep calls this every SWEEP_SECONDS)."""
    await _pool().close_idle(asyncio.get_running_loop().time() if now is None else now)


async def close_all() -> None:
    """Close every connection of this loop (a worker stopping; tests)."""
    pool = _POOLS.pop(asyncio.get_running_loop(), None)
    if pool is None:
        return
    if pool.sweeper is not None:
        pool.sweeper.cancel()
    for task in pool.listings.values():
        task.cancel()
    for connection in [*pool.connections.values(), *pool.retired]:
        await connection.close()


# --- Listing ----------------------------------------------------------------------------


async def enabled_servers() -> list[ServerConfig]:
    return await database_sync_to_async(_enabled)()


def _enabled() -> list[ServerConfig]:
    return [ServerConfig.from_row(row) for row in McpServer.objects.filter(enabled=True)]


async def specs() -> tuple[list[McpToolSpec], list[str]]:
    """Every enabled server's tools (sorted by name) and what went wrong, for people."""
    listing = await refresh()
    return listing.specs, listing.problems


@dataclass(frozen=True, slots=True)
class Listing:
    """What refresh() found: the tools (sorted by name), what went wrong (for people),
    and the servers whose listing failed, each with its message (also in `problems`)."""

    specs: list[McpToolSpec]
    problems: list[str]
    failed: dict[str, str]


async def refresh(
    known: Iterable[McpToolSpec] = (),
    wanted: Callable[[str], bool] | None = None,
    *,
    turn: bool = False,
    owner_id: int | None = None,
) -> Listing:
    """Every enabled server's tools, a server whose listing fails keeping its tools in
    `known` (a tab's frozen list): a server down for a moment at a turn's start must not
    change the tab's tools (a cache miss of the whole conversation, tools gone mid-task).

    Only the servers whose names `wanted` takes (a tab's allow-list: a server none of its
    tools could pass is never waited for). With `turn` (a turn's start), each server is
    waited for TURN_LIST_SECONDS at most, and one that failed or was too slow is not
    asked again for FAILED_SECONDS: a hung server must not hold up every turn.
    `owner_id`: the tab's owner (ServerConfig.key)."""
    configs = await enabled_servers()
    await _forget_others({config.name for config in configs})
    if wanted is not None:
        configs = [config for config in configs if wanted(config.name)]
    lister = _turn_tools if turn else _server_tools
    return await _specs(configs, known, lambda config: lister(config, owner_id=owner_id))


async def _turn_tools(
    config: ServerConfig, *, owner_id: int | None = None
) -> tuple[list[types.Tool], list[str], str]:
    """_server_tools for a turn's start: bounded, failures remembered (refresh)."""
    pool = _pool()
    loop = asyncio.get_running_loop()
    key = config.key(owner_id)
    remembered = pool.failed.get(key)
    if remembered is not None:
        failed_config, when, failure = remembered
        if failed_config == config and loop.time() - when < FAILED_SECONDS:
            return [], [], failure
        del pool.failed[key]
    task = pool.listings.get(key)
    if task is None:
        task = asyncio.create_task(
            _server_tools(config, owner_id=owner_id), name=f"mcp list {config.name}"
        )
        pool.listings[key] = task

        def done(task: asyncio.Task[tuple[list[types.Tool], list[str], str]]) -> None:
            if pool.listings.get(key) is task:
                del pool.listings[key]
            if task.cancelled() or task.exception() is not None:
                return
            failure = task.result()[2]
            if failure:
                pool.failed[key] = (config, loop.time(), failure)
            elif (pool.failed.get(key) or (None,))[0] == config:
                # Answered after all: the next turn takes its tools.
                del pool.failed[key]

        task.add_done_callback(done)
    # Shielded: a turn stopped (or past its wait) leaves the listing to finish for the
    # next turn, within the server's own timeout.
    finished, _ = await asyncio.wait({task}, timeout=TURN_LIST_SECONDS)
    if finished:
        return task.result()
    failure = f"server {config.name}: did not list its tools within {TURN_LIST_SECONDS:g} s"
    pool.failed[key] = (config, loop.time(), failure)
    return [], [], failure


async def _specs(
    configs: list[ServerConfig],
    known: Iterable[McpToolSpec] = (),
    lister: Callable[[ServerConfig], Awaitable[tuple[list[types.Tool], list[str], str]]]
    | None = None,
) -> Listing:
    listed = await asyncio.gather(*(((lister or _server_tools)(config)) for config in configs))
    problems: list[str] = []
    failed: dict[str, str] = {}
    kept: list[McpToolSpec] = []
    last_known = list(known)
    for config, (_, server_problems, failure) in zip(configs, listed, strict=True):
        if failure:
            keeping = [spec for spec in last_known if spec.server == config.name]
            if keeping:
                failure += "; kept its last known tools, calls to them fail until it answers"
                kept += keeping
            failed[config.name] = config.redact(failure)
            server_problems = [failure]
        problems += [config.redact(problem) for problem in server_problems]
    offered = [
        (config.name, tool)
        for config, (tools, _, _) in zip(configs, listed, strict=True)
        for tool in tools
    ]
    pairs = [(server, tool.name) for server, tool in offered] + [(s.server, s.tool) for s in kept]
    names, clashes = mcp_names.assign(pairs)
    problems += clashes
    found = [
        McpToolSpec(
            names[(server, tool.name)],
            _description(tool),
            _sorted(tool.input_schema),
            server,
            tool.name,
        )
        for server, tool in offered
        if (server, tool.name) in names
    ]
    found += [
        dataclasses.replace(spec, name=names[(spec.server, spec.tool)])
        for spec in kept
        if (spec.server, spec.tool) in names
    ]
    return Listing(sorted(found, key=lambda spec: spec.name), problems, failed)


async def _server_tools(
    config: ServerConfig,
    connect: Callable[[ServerConfig], Awaitable[Connection]] | None = None,
    *,
    owner_id: int | None = None,
) -> tuple[list[types.Tool], list[str], str]:
    """A server's usable tools, what is wrong with some of them, and why listing them
    failed ("" when it did not); through `connect`, else `owner_id`'s connection."""
    label = f"server {config.name}"
    try:
        connection = await (connect(config) if connect else _connect(config, owner_id))
        async with _using(connection):
            tools, refused, beyond = await connection.list_tools()
    except Unreachable as exc:
        return [], [], f"{label}: not reachable ({exc})"
    except TimeoutError:
        return [], [], f"{label}: did not list its tools within {config.timeout:g} s"
    except Exception as exc:
        logger.warning("MCP %s: listing failed", label, exc_info=True)
        return [], [], f"{label}: listing its tools failed ({_reason(exc)})"
    problems = [f"{label}: {why}" for why in refused]
    usable = []
    seen: set[str] = set()
    total = 0
    past: list[str] = []
    for tool in tools:
        if tool.name in seen:
            problems.append(f"{label}: tool {tool.name!r} is listed twice; the first is kept")
            continue
        if why := _unstorable(tool):
            problems.append(f"{label}: tool {tool.name!r} is left out: {why}")
            continue
        seen.add(tool.name)
        size = _size([tool.name, _description(tool), tool.input_schema])
        if past or total + size > MAX_SERVER_TOOLS_BYTES:
            past.append(tool.name)
            continue
        total += size
        usable.append(tool)
    if past:
        names = ", ".join(repr(name) for name in past)
        problems.append(
            f"{label}: {len(past)} tools are left out ({names}): its tools' definitions "
            f"may take {MAX_SERVER_TOOLS_BYTES} bytes in all, and go with every request"
        )
    if beyond:
        listed = len(usable) + len(past) + beyond
        problems.append(
            f"{label}: {listed} tools, only the first {MAX_TOOLS_PER_SERVER} are offered"
        )
    return usable, problems, ""


def _unstorable(tool: types.Tool) -> str:
    """Why a tool cannot go into a tab's frozen list (JSON in the database, sent as
    is): a number JSON has not (NaN, Infinity), or a NUL character, which PostgreSQL
    refuses in text and SQLite's JSON check refuses too. "" when it can."""
    try:
        text = json.dumps([tool.name, tool.description, tool.title, tool.input_schema])
        json.dumps(tool.input_schema, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"its schema is not plain JSON ({exc})"
    if "\\u0000" in text:
        return "its name, description or schema holds a NUL character"
    return ""


def _description(tool: types.Tool) -> str:
    text = tool.description or tool.title or ""
    if len(text) > MAX_DESCRIPTION_CHARS:
        text = text[: MAX_DESCRIPTION_CHARS - 1] + "…"
    return text


def _sorted(schema: Any) -> dict[str, Any]:
    return json.loads(json.dumps(schema, sort_keys=True))


async def _drop(connection: Connection) -> None:
    pool = _pool()
    if pool.connections.get(connection.key) is connection:
        del pool.connections[connection.key]
    await pool.retire(connection)


async def _forget_others(names: set[str]) -> None:
    """Close connections to servers removed or disabled since they opened."""
    pool = _pool()
    for key in [key for key in pool.connections if key[0] not in names]:
        await pool.retire(pool.connections.pop(key))


async def test(config: ServerConfig, owner_id: int | None = None) -> tuple[list[str], list[str]]:
    """Settings' Test: the server's tool names as they would be offered, and its
    problems, through a connection of its own (closed after: the server may be
    disabled, and a page's event loop is not a worker's); a server that mounts the
    workspace gets `owner_id`'s (none without)."""
    connection = _new_connection(config, owner_id)

    async def fresh(_: ServerConfig) -> Connection:
        if config.problem:
            raise Unreachable(config.problem)
        await connection.open()
        return connection

    try:
        tools, problems, failure = await _server_tools(config, fresh)
    finally:
        await connection.close()
    return [tool.name for tool in tools], [config.redact(p) for p in [failure, *problems] if p]


# --- Calling ----------------------------------------------------------------------------


async def call(
    name: str,
    arguments: Any,
    *,
    on_output: Callable[[str], None] | None = None,
    timeout: float | None = None,
    owner_id: int | None = None,
) -> ToolOutcome:
    """Call the MCP tool offered as `name` for a tab of `owner_id` (ServerConfig.key);
    `timeout` (seconds) overrides the server's.

    Every failure is an `is_error` outcome naming the server; cancelling the awaiting
    task (Stop) cancels the call at the server and leaves the connection open.
    """
    # Imported here for the startup cost (see the imports at the top).
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    if not isinstance(arguments, Mapping):
        return ToolOutcome(f"the arguments of {name} must be a JSON object", is_error=True)
    configs = await enabled_servers()
    # Only servers whose names the tool's name can start with need listing.
    likely = [c for c in configs if name.startswith(mcp_names.plain(c.name, ""))]
    listing = await _specs(likely, lister=lambda config: _server_tools(config, owner_id=owner_id))
    spec = next((spec for spec in listing.specs if spec.name == name), None)
    if spec is None and listing.failed:
        return ToolOutcome(
            f"{name} cannot be called now: " + "; ".join(listing.failed.values()), is_error=True
        )
    if spec is None:
        return ToolOutcome(
            f"there is no MCP tool {name} now: its server is disabled, removed or not "
            "reachable, or no longer offers it",
            is_error=True,
        )
    config = next(c for c in likely if c.name == spec.server)
    label = f"server {config.name}"
    limit = timeout or config.timeout
    live = shell._Output(on_output)

    # mcp's ProgressFnT names its parameters: these names are part of the type.
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        counted = f"{progress:g}/{total:g}" if total else f"{progress:g}"
        live.feed(f"[{counted}] {message or ''}".rstrip().encode() + b"\n")

    try:
        connection = await _connect(config, owner_id)
    except Unreachable as exc:
        return ToolOutcome(config.redact(f"{label} is not reachable: {exc}"), is_error=True)
    try:
        async with _using(connection), asyncio.timeout(limit):
            result = await connection._session().call_tool(
                spec.tool, dict(arguments), progress_callback=on_progress
            )
    except TimeoutError:
        # The server may be stuck: the next call starts it (or its session) afresh.
        await _drop(connection)
        return ToolOutcome(f"{label}: {spec.tool} did not answer within {limit:g} s", is_error=True)
    except Exception as exc:
        detail = ""
        if not isinstance(exc, MCPError | Unreachable) or _lost(exc):
            logger.warning("MCP %s: %s failed", label, spec.tool, exc_info=True)
            # Closed first: the server's last words are read to their end.
            await _drop(connection)
            detail = connection._detail()
        failed = f"{label}: {spec.tool} failed: {connection.lost or _reason(exc)}{detail}"
        return ToolOutcome(config.redact(failed), is_error=True)
    finally:
        live.finish()
    if not isinstance(result, types.CallToolResult):
        return ToolOutcome(f"{label}: {spec.tool} gave no tool result", is_error=True)
    return outcome(spec.tool, result)


def _lost(exc: Exception) -> bool:
    # Imported here for the startup cost (see the imports at the top).
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    return isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED


def _reason(exc: BaseException) -> str:
    # Imported here for the startup cost (see the imports at the top).
    import mcp_types as types
    from mcp.shared.exceptions import MCPError
    from pydantic import ValidationError

    if isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED:
        return "the server closed the connection (it may have exited)"
    if isinstance(exc, httpx2.HTTPError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ValidationError):
        return f"its answer is not valid MCP ({_where(exc)})"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_reason(inner) for inner in exc.exceptions)
    return str(exc) or type(exc).__name__


# --- Results ----------------------------------------------------------------------------


def outcome(tool: str, result: types.CallToolResult) -> ToolOutcome:
    """A tool result as the model and the log see it: text as it is, structured content
    as sorted-key JSON (instead of a text block holding the same data), its images for
    the blob store (at most MAX_RESULT_IMAGES), other content as a marker; capped as the
    shell's output is. A block left out is named in the text, with why: the model and
    the page see what it missed, and every other block is kept."""
    # Imported here for the startup cost (see the imports at the top).
    import mcp_types as types

    texts: list[str] = []
    notes: list[str] = []
    images: list[ImageFile] = []
    many = sum(isinstance(item, types.ImageContent) for item in result.content) > 1
    for number, item in enumerate(result.content, 1):
        if isinstance(item, types.TextContent):
            texts.append(item.text)
        elif isinstance(item, types.ImageContent):
            # No extension: the blob store adds the one of what the bytes are, whatever
            # type the server says they are.
            image = _image(item, f"{tool}-{number}" if many else tool)
            if isinstance(image, str):
                notes.append(f"[content block {number}, an image, left out: {image}]")
            elif len(images) == MAX_RESULT_IMAGES:
                notes.append(
                    f"[content block {number}, an image, left out: a result carries at "
                    f"most {MAX_RESULT_IMAGES} images]"
                )
            else:
                images.append(image)
        elif isinstance(item, types.EmbeddedResource) and isinstance(
            item.resource, types.TextResourceContents
        ):
            texts.append(item.resource.text)
        else:
            notes.append(f"[{item.type} content not shown]")
    structured = result.structured_content
    if structured is not None:
        dumped = json.dumps(structured, sort_keys=True, ensure_ascii=False)
        copies = [text for text in texts if _same_json(text, structured)]
        if copies or not texts:
            texts = [dumped if text in copies else text for text in texts] or [dumped]
    # Never empty: providers refuse an empty text block.
    shown = "(an image)" if len(images) == 1 else f"({len(images)} images)" if images else ""
    text = "\n".join([*texts, *notes]) or shown or "(no output)"
    capped = shell._Output(None)
    capped.feed(clean_text(text).encode("utf-8", "replace"))
    dropped_bytes, dropped_lines = capped.dropped()
    return ToolOutcome(
        capped.text(),
        is_error=bool(result.is_error),
        truncated=capped.truncated,
        truncated_bytes=dropped_bytes,
        truncated_lines=dropped_lines,
        images=tuple(images),
    )


def _image(item: types.ImageContent, name: str) -> ImageFile | str:
    """An image block's file (no workspace path: the runner stores it, and checks it),
    or why it cannot be one."""
    try:
        return ImageFile("", base64.b64decode(item.data, validate=True), name=name)
    except (binascii.Error, ValueError):
        return "its data is not valid base64"


def _same_json(text: str, value: Any) -> bool:
    try:
        return json.loads(text) == value
    except ValueError:
        return False
