"""The shapes the agent process (process.py) and the turn's ACP driver agree on.

The process owns everything about the program: its sandbox, its endpoint relay, the
JSON-RPC connection, `session/load` replay (never handed on: a replayed update is
already in the log), graceful close and the kill. The driver owns everything about the
turn: updates through the reducer and the outbox, permissions through Dispatch's
approvals, usage, the ending. Types of the ACP schema are the SDK's (`acp.schema`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from acp.schema import PermissionOption, PromptResponse, ToolCallUpdate


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """One configured agent: `acp/<name>` in the model picker."""

    name: str
    # The program and its arguments, the first resolved on PATH when not absolute.
    command: tuple[str, ...]
    # Its own variables (never the server's environment), as configured.
    env: tuple[tuple[str, str], ...] = ()
    # Whose key and base URL it is given: "anthropic" (Claude Code), "openai" (Codex),
    # or "" (none: a configured agent that brings its own).
    provider: str = ""
    # A built-in preset found on PATH, not configured by the operator.
    preset: bool = False


class AgentError(Exception):
    """The agent cannot be started, died, or broke the protocol: the message is for
    the user (what happened and the tail of its stderr), never a traceback."""


class Handler(Protocol):
    """The driver's side of the ACP client, for the prompt under way."""

    async def update(self, update: object) -> None:
        """One `session/update` of the live turn (an `acp.schema` update model)."""
        ...

    async def permission(
        self, tool_call: ToolCallUpdate, options: list[PermissionOption]
    ) -> str | None:
        """The option id chosen for `session/request_permission`, or None when the turn
        was stopped meanwhile (answered as cancelled)."""
        ...


class AgentSession(Protocol):
    """One running agent with one ACP session, kept per tab between turns."""

    session_id: str
    # Whether the agent advertised `loadSession` (a restart can restore its context).
    supports_load: bool
    # True when this session was restored by `session/load` (else new: context lost).
    restored: bool

    async def prompt(self, blocks: list[object], handler: Handler) -> PromptResponse:
        """Send `session/prompt` with these content blocks; updates and permission
        requests go to `handler` until the response. Raises AgentError."""
        ...

    async def cancel(self) -> None:
        """`session/cancel`, and every process the prompt started ended (the sandbox's
        processes other than the agent itself)."""
        ...

    def stderr_tail(self) -> str: ...

    async def close(self) -> None:
        """Gracefully (the agent may still be writing its session file), then killed
        with its whole sandbox."""
        ...
