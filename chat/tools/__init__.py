"""The agent's tools: workspace files and a shell, confined to one directory, and
the tools of MCP servers (mcp.py).

Pure asyncio and the standard library, no Django, but for MCP, which reads its
servers from McpServer rows. Callers pass the workspace path. The public interface:

- TOOLS: the fixed, ordered tool table (its order is part of the prompt cache).
- tool_specs(): the same as provider ToolSpecs, in that order.
- tab_specs(tab): a tab's frozen tool set as ToolSpecs (toolset.py: computed at a
  turn's start from the built-ins and the MCP servers' tools).
- needs_approval(name): whether a call waits for the user.
- streams_output(name): whether a call's output streams live (shell, MCP progress).
- run_tool(name, arguments, workspace, *, on_output=None, timeout=None, cwd="") -> ToolOutcome.
- workdir: a tab's working directory (a subfolder of the workspace), checked and made.
"""

from __future__ import annotations

from chat.tools.base import ToolOutcome
from chat.tools.registry import (
    TOOLS,
    Tool,
    always_asks,
    needs_approval,
    run_tool,
    streams_output,
    tool_specs,
)
from chat.tools.toolset import tab_specs

__all__ = [
    "TOOLS",
    "Tool",
    "ToolOutcome",
    "always_asks",
    "needs_approval",
    "run_tool",
    "streams_output",
    "tab_specs",
    "tool_specs",
]
