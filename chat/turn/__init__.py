"""One turn: the runner of a tab's turns and everything it is made of.

Read in this order: `loop` (TurnRunner: a turn from lease to release), `driver` (what
produces a turn's events; the provider-plus-tools loop is one driver), `step` (one
streamed request, its retries and watchdog), `compaction`, `calls` (tool runs and
approvals), `agents` (sub-agents), `messages` (the queue into the log), `outbox`
(coalescing, checkpoints, the fenced append), `state` (the one state object), and
`ending` (the one way a turn ends, also used by lease recovery and Stop).

This file imports nothing: each module has its own layer in `.importlinter`.
"""
