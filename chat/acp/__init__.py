"""External agents over the Agent Client Protocol (ACP): Claude Code, Codex and any
program that speaks it, run in a tab as the model `acp/<name>`.

seam.py     the agreed shapes between the agent process and the turn's driver
config.py   which agents exist (DISPATCH_ACP_AGENTS, presets found on PATH)
process.py  one agent process with its ACP session: started confined, spoken to with the
            `agent-client-protocol` SDK, closed gracefully, killed with its sandbox
updates.py  PURE: ACP session updates -> the reducer's events (bounded)
"""
