"""The state of the turn a runner is on: its ids, reducer, history, status and settings.

Every part of the package (the loop, a step, compaction, calls, sub-agents, the outbox)
reads and changes this one object; none keeps a second copy of what it holds. A runner
keeps it across turns (the history, the workspace) and `next_turn` resets what belongs
to one turn.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.utils import timezone

from chat import context, preferences
from chat.chunks import OriginKind
from chat.history import History
from chat.models import Tab
from chat.providers.base import Usage
from chat.stream import Reducer

logger = logging.getLogger(__name__)

# The status line's state while a summary is written.
COMPACTING = "compacting"


class TurnCancelled(Exception):
    """The turn was stopped (Stop, a shutdown, a lost lease): raised where it waits."""


@dataclass(frozen=True)
class TurnConfig:
    """What a step needs from the settings; compared between steps to spot a reload."""

    model: str
    fallback_model: str
    approve_tools: bool
    max_steps: int

    @classmethod
    def load(cls, tab: Tab) -> TurnConfig:
        prefs = preferences.load()
        max_steps = prefs.max_steps
        if tab.parent_call_id:  # a sub-agent (chat.turn.agents.is_child)
            max_steps = min(max_steps, django_settings.DISPATCH_CHILD_MAX_STEPS)
        return cls(
            model=tab.model or prefs.new_tab_model,
            fallback_model=prefs.effective_fallback_model,
            approve_tools=prefs.approve_tools,
            max_steps=max_steps,
        )

    def describe_change(self, new: TurnConfig) -> str:
        """The config-reload chunk's text for a change from this to `new`."""
        changes = []
        if self.model != new.model:
            changes.append(f"model {self.model} → {new.model}")
        if self.fallback_model != new.fallback_model:
            changes.append(
                f"fallback model {self.fallback_model or 'none'} → {new.fallback_model or 'none'}"
            )
        if self.approve_tools != new.approve_tools:
            changes.append("tool approval " + ("on" if new.approve_tools else "off"))
        if self.max_steps != new.max_steps:
            changes.append(f"step limit {self.max_steps} → {new.max_steps}")
        return "Settings changed: " + ", ".join(changes) + "."


def _now_iso() -> str:
    return timezone.now().isoformat()


@dataclass
class TurnStatus:
    state: str = "running"
    turn_id: str = ""
    step: int = 0
    model: str = ""
    started_at: str = field(default_factory=_now_iso)
    usage: Usage = field(default_factory=Usage)
    approval: dict[str, Any] | None = None
    # When the stream last showed something (ISO time), while it has been
    # silent for step.WAITING_STATUS_AFTER: the page counts the seconds from it.
    waiting_since: str | None = None
    # At the turn's end: its tokens and cost and the tab's (chat.usage.turn_end).
    turn_end: dict[str, Any] | None = None
    # The context meter (chat.context.Meter.as_dict), after each request.
    context: dict[str, Any] | None = None
    # The sub-agents this step waits for, by call id: {tab, title, call_id, state,
    # step, approval, children} (the child's own approval request, answered on the
    # child's tab or from this tab's approval bar; its own sub-agents, when it may nest).
    children: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        usage = self.usage
        extra: dict[str, Any] = {"turn_end": self.turn_end} if self.turn_end is not None else {}
        if self.context is not None:
            extra["context"] = self.context
        if self.children:
            extra["children"] = list(self.children.values())
        return {
            "state": self.state,
            "turn_id": self.turn_id,
            "step": self.step,
            "model": self.model,
            "started_at": self.started_at,
            "usage": {
                "input": usage.input_tokens,
                "output": usage.output_tokens,
                "cache_read": usage.cache_read_tokens,
                "cache_write": usage.cache_write_tokens,
            },
            "approval": self.approval,
            "waiting_since": self.waiting_since,
            **extra,
        }


@dataclass(eq=False)
class TurnState:
    """One tab's runner state. The first group lives as long as the runner; the rest is
    the current turn's (`next_turn` resets it)."""

    tab_id: uuid.UUID
    turn_id: uuid.UUID
    # Auto-approval was asked for the message that started the first turn only.
    auto_approve: bool = False
    history: History | None = None
    last_seq: int = 0
    # The tab owner's workspace (workdir.user_workspace), known once a turn has read its
    # tab: no other user's files are ever in reach of this tab's tools.
    workspace: Any = None
    # The tab's working directory (Tab.workdir): its tools' root under the workspace.
    cwd: str = ""
    # The tab's owner: an MCP server that mounts the workspace mounts theirs.
    owner_id: int | None = None
    # The tab's context size after its last request (chat.context).
    size: context.Size = field(default_factory=context.Size)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    # The step's sub-agents stop waiting (agents.wait): set by cancel, and when the step
    # ends early.
    agents_stop: asyncio.Event = field(default_factory=asyncio.Event)
    # The worker shuts down: the running turn is interrupted (or may finish, when only
    # `draining`), and the next one goes to a worker that stays.
    stopping: bool = False
    draining: bool = False
    # Another worker recovered the tab (or it was deleted): write nothing more.
    lease_lost: bool = False
    # The heartbeat found the tab deleted: its sub-agents are stopped, not left to run on
    # for a resumed turn that will never come.
    tab_gone: bool = False
    # What produces events now (a tool, an agent): cancel cancels it.
    producer: asyncio.Task[None] | None = None
    # The runner's task while it waits for the provider's next event (step.Stepper.stream):
    # cancel interrupts that wait, never the ops being applied.
    waiting: asyncio.Task[Any] | None = None
    # Why that wait was interrupted: raised where it waited.
    interrupted: BaseException | None = None
    # Calls waiting for the user's answer, by call id.
    approvals: dict[str, asyncio.Future[bool]] = field(default_factory=dict)

    reducer: Reducer = field(init=False)
    status: TurnStatus = field(init=False)
    config: TurnConfig | None = None
    # Why the turn was stopped, when not by the user (agents.cancel).
    cancel_why: str = ""
    # This turn moved its queued messages into the log.
    took_queued: bool = False
    # Every message of this turn came from a wake whose approval policy is "deny" (or a
    # sub-agent of one); a turn that only resumes one goes on as it was.
    unattended: bool = False
    # This turn's crash is in the log: a later failure (publishing idle on the same broken
    # channel layer) adds no second error chunk.
    crash_logged: bool = False
    # A compaction was tried in this turn for an overflow: once a turn.
    overflow_tried: bool = False
    # Arguments of this turn's calls, by call id, for running them, and the seq of each
    # call's chunk (a sub-agent's child is keyed on it: agents.child_id).
    args: dict[str, dict[str, Any]] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reducer = Reducer(self.turn_id)
        self.status = TurnStatus(turn_id=str(self.turn_id))

    def next_turn(self, turn_id: uuid.UUID) -> None:
        """The same lease goes on as a new turn: what belonged to the last one goes."""
        self.turn_id = turn_id
        self.reducer = Reducer(turn_id)
        self.status = TurnStatus(turn_id=str(turn_id))
        self.crash_logged = False
        self.took_queued = False
        self.overflow_tried = False
        self.unattended = False
        self.cancel_why = ""
        self.cancelled.clear()
        self.agents_stop.clear()
        self.auto_approve = False

    @property
    def history_built(self) -> History:
        """The history, which every step has (the loop builds it before the first)."""
        if self.history is None:
            raise RuntimeError(f"turn {self.turn_id}: no history built")
        return self.history

    @property
    def turn_config(self) -> TurnConfig:
        if self.config is None:
            raise RuntimeError(f"turn {self.turn_id}: no settings loaded")
        return self.config

    def check_cancel(self) -> None:
        if self.cancelled.is_set():
            raise TurnCancelled()

    async def sleep(self, seconds: float) -> None:
        """Wait, unless the turn is stopped meanwhile (then TurnCancelled)."""
        with suppress(TimeoutError):
            await asyncio.wait_for(self.cancelled.wait(), seconds)
        self.check_cancel()

    def cancel(self, *, stopping: bool = False, why: str = "") -> None:
        """Stop the turn: by the user, or (`stopping`) because this worker shuts down, or
        for `why` (a sub-agent's parent stopped it: its log says so, not "by the user")."""
        self.stopping = self.stopping or stopping
        if why and not self.cancelled.is_set():
            self.cancel_why = why
        self.cancelled.set()
        self.agents_stop.set()
        if self.producer is not None:
            self.producer.cancel()
        if self.waiting is not None:
            self.interrupt(TurnCancelled())
        for future in self.approvals.values():
            if not future.done():
                future.set_exception(TurnCancelled())

    def interrupt(self, why: BaseException) -> None:
        """Raise `why` where the runner waits for the provider's next event (now, or at
        its next wait): its task is cancelled while it waits there, nowhere else."""
        if self.interrupted is None:
            self.interrupted = why
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()

    def lose_lease(self, *, gone: bool = False) -> None:
        """Another worker recovered the tab (its runner looked dead): this one stops and
        writes nothing more; sub-agents run on for the turn the recovery resumes. Or the
        tab was deleted, the lease with it: no one to tell, and its sub-agents stop."""
        if not self.lease_lost and gone:
            logger.info("tab %s was deleted; stopping its runner", self.tab_id)
        elif not self.lease_lost:
            logger.error("lease of tab %s was lost; stopping this runner", self.tab_id)
        self.tab_gone = self.tab_gone or gone
        self.lease_lost = True
        self.cancel(stopping=True)


def unattended_message(data: dict[str, Any]) -> bool:
    """A message no one is there to approve for: a deny wake's, or the prompt of a
    sub-agent that such a turn started (agents.ensure marks it so)."""
    origin = data.get("origin") or {}
    kind = origin.get("kind")
    return kind in (OriginKind.WAKE, OriginKind.AGENT) and origin.get("approval") == "deny"
