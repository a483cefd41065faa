"""Which external agents exist: `acp/<name>` in the model picker.

Three sources, a later one winning by name: the built-in presets whose program is on the
server's PATH, the enabled agents saved on Settings (chat.models.AcpAgent), and
DISPATCH_ACP_AGENTS (parsed and checked at start-up by chat.envcheck.acp_agents through
dispatch.settings: the operator's deployment). Reading them queries the database: sync.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from django.conf import settings

from chat.acp.seam import AgentConfig
from chat.envcheck import AcpAgents
from chat.models import AcpAgent

logger = logging.getLogger(__name__)

# name -> (program, whose credentials it is given). Found on PATH when the server
# starts a process (installed by `npm install -g`, see the README).
PRESETS: dict[str, tuple[str, str]] = {
    "claude-code": ("claude-code-acp", "anthropic"),
    "codex": ("codex-acp", "openai"),
}


def presets() -> list[AgentConfig]:
    """The presets whose program is installed (on PATH)."""
    return [
        AgentConfig(name=name, command=(program,), provider=provider, preset=True)
        for name, (program, provider) in PRESETS.items()
        if shutil.which(program) is not None
    ]


def configured(parsed: AcpAgents) -> list[AgentConfig]:
    """The agents of DISPATCH_ACP_AGENTS as parsed; one named as a preset keeps the
    preset's provider unless it names its own."""
    return [
        AgentConfig(
            name=name,
            command=command,
            env=env,
            provider=provider if provider is not None else PRESETS.get(name, ("", ""))[1],
        )
        for name, (command, env, provider) in parsed.items()
    ]


def stored() -> list[AgentConfig]:
    """The enabled agents saved on Settings."""
    agents = []
    for row in AcpAgent.objects.filter(enabled=True):
        env = row.get_env()
        if env is None:
            # Encrypted under another SECRET_KEY: started without them, it would fail in
            # ways that do not say why.
            logger.warning("agent %s: its saved variables cannot be read; left out", row.name)
            continue
        agents.append(
            AgentConfig(
                name=row.name,
                command=tuple(row.command),
                env=tuple(sorted(env.items())),
                provider=row.provider,
            )
        )
    return agents


def merged(*sources: Iterable[AgentConfig]) -> dict[str, AgentConfig]:
    """The agents by name, a later source's replacing an earlier one's of that name."""
    agents: dict[str, AgentConfig] = {}
    for source in sources:
        for agent in source:
            agents[agent.name] = agent
    return dict(sorted(agents.items()))


def agents(
    parsed: Mapping[str, tuple] | None = None, *, saved: bool = True
) -> dict[str, AgentConfig]:
    """Every agent a tab may use, by name: the installed presets, the saved ones (unless
    `saved` is False: no database), then the variable's."""
    if parsed is None:
        parsed = settings.DISPATCH_ACP_AGENTS
    return merged(presets(), stored() if saved else (), configured(dict(parsed)))


def home_of(name: str, owner_id: int | None) -> Path:
    """An agent's HOME for one user, under the data directory: its sessions (for
    `session/load`) and settings persist there, never in a workspace, and never shared
    between users (a session holds its user's conversation)."""
    return Path(settings.DATA_DIR) / "acp" / name / "users" / str(owner_id or 0) / "home"
