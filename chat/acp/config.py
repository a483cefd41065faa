"""STUB of part B's chat/acp/config.py (issue 30), so the driver and the model picker can
be written against it: at the merge, part B's module replaces this file whole.

Which agents exist: part B reads DISPATCH_ACP_AGENTS and the presets found on PATH.
"""

from __future__ import annotations

from chat.acp.seam import AgentConfig


def agents() -> dict[str, AgentConfig]:
    """The configured agents, by name (`acp/<name>` in the model picker)."""
    return {}
