"""The driver seam: what produces a turn's events.

A driver is handed a turn whose lease is held, whose history is built and whose
settings are loaded, and produces its events until the turn is done. Everything else is
the shared runtime's, the same for every driver: the lease and its fence, the outbox
(reducer ops published, checkpointed, sealed into the log), the queue of messages,
approvals, usage, and how a turn ends (chat.turn.ending).

A driver must:
- take the turn's messages through `Messages.take_queued` (a message is in the log
  before anything answers it);
- put every event through the turn's reducer and `Outbox.apply` (or `Outbox.system`),
  never build a chunk itself;
- ask for a permission through `Approvals.ask`, after `calls.gate` (the same rules,
  approval setting, unattended policy and doom-loop guard as every call);
- let `TurnCancelled` (raised where it waits, by `TurnState.check_cancel` or a
  cancelled producer task) and `log.LeaseLost` go up: the runtime ends the turn;
- record each request's usage (`Stepper.record_usage`, or a UsageRecord of its own
  with the same fields).

A driver must not:
- write the log, the lease or the queue (`log.append`, QueuedMessage, RunningTurn but
  for the step it is on, through `lease.set_step`);
- end the turn itself with a notice or an error chunk of its own making: a provider
  error given up on ends through `ending.End.error`, anything else escapes to the
  runtime, which ends the turn as a crash;
- publish to the tab group but through the outbox (ops in order with the seals).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from channels.db import database_sync_to_async

from chat.chunks import SystemKind
from chat.models import Tab
from chat.tools import toolset
from chat.tools.registry import AGENT
from chat.turn import agents, lease
from chat.turn.agents import Agents
from chat.turn.calls import Calls
from chat.turn.compaction import Compactor
from chat.turn.ending import End, end_ops
from chat.turn.messages import Messages
from chat.turn.outbox import Outbox
from chat.turn.state import TurnConfig, TurnState
from chat.turn.step import STOP_NOTICES, Outcome, Stepper, request

logger = logging.getLogger(__name__)


class Driver(Protocol):
    """What produces one turn's events (see the module docstring for its duties)."""

    async def run_turn(self, tab: Tab) -> None:
        """Produce the turn's events until it is done."""
        ...

    def answer(self, call_id: str, approved: bool, rule: dict[str, Any] | None) -> bool:
        """The user answered an approval this driver asked for: True when one waited."""
        ...

    def next_turn(self) -> None:
        """The same runner goes on with a new turn: forget what was the last one's."""
        ...


class ProviderDriver:
    """The model's own loop: a step streams the provider, its calls run, their results
    go into the log, and the next step starts, until the model answers without a call
    (or a limit, an error or a Stop ends it)."""

    def __init__(self, state: TurnState, outbox: Outbox, messages: Messages) -> None:
        self.state = state
        self.outbox = outbox
        self.messages = messages
        self.stepper = Stepper(state, outbox)
        self.compactor = Compactor(state, outbox, self.stepper)
        self.agents = Agents(state, outbox)
        self.calls = Calls(state, outbox, self.stepper, self.agents)

    def answer(self, call_id: str, approved: bool, rule: dict[str, Any] | None) -> bool:
        return self.calls.approvals.answer(call_id, approved, rule)

    def next_turn(self) -> None:
        self.calls.next_turn()

    async def run_turn(self, tab: Tab) -> None:
        config = self.state.turn_config
        # Before any request of the turn (a compaction's too): they all send the tools.
        await self.refresh_tools(tab)
        await self._compact_at_start(tab, config.model)
        if await self.messages.take_queued():
            await self.agents.reattach()
            await self._steps(tab, config)
        await self.reload_if_changed()

    async def _compact_at_start(self, tab: Tab, model: str) -> None:
        """Compactions asked for first (each a turn of its own), else the automatic one
        when the context has grown past its mark."""
        compacted = False
        while (asked := await self.messages.take_compaction()) is not None:
            through, instructions = asked
            compacted = (
                await self.compactor.compact(tab, model, "manual", through, instructions)
                or compacted
            )
        if not compacted and self.messages.message_waiting:
            await self.compactor.fit_at_turn_start(tab, model)

    async def _steps(self, tab: Tab, config: TurnConfig) -> None:
        state = self.state
        model = config.model
        step = 0
        while True:
            state.check_cancel()
            if step >= config.max_steps:
                end = End.limit(
                    SystemKind.STEP_LIMIT,
                    f"Stopped after {config.max_steps} steps (the step limit).",
                )
                await self.outbox.apply(end_ops(state.reducer, end))
                return
            step += 1
            state.reducer.step = step
            state.status.step = step
            await self._set_step(step)
            if step > 1 and await self.reload_if_changed():
                old, config = config, state.turn_config
                if config.model != old.model:
                    model = config.model
            if step > 1 and self.compactor.overflowing(model):
                await self.compactor.compact_before_turn(tab, model)
            await self.outbox.status()
            result = await self.stepper.run(request(state, tab), model, config)
            if result.outcome == Outcome.OVERFLOW:
                # Refused as too long for the window: everything before this turn is
                # summarised and the step asked again, once.
                model = result.model
                if not await self.compactor.compact_before_turn(tab, model):
                    assert result.error is not None
                    await self.stepper.give_up(result.error, model, result.tries)
                    return
                result = await self.stepper.run(request(state, tab), model, config, overflow=False)
            if result.outcome != Outcome.FINISHED or result.finish is None:
                return  # an error chunk ended the turn
            model = result.model
            state.status.model = model
            stop_reason = result.finish.stop_reason
            if notice := STOP_NOTICES.get(stop_reason or ""):
                # A cut answer must not pass for a complete one.
                await self.outbox.system(*notice, stop_reason=stop_reason)
            if not state.reducer.pending_calls:
                # The model is done. A message queued meanwhile starts the next turn
                # (the loop's release_or_continue picks it up).
                return
            await self.calls.run_step(config)
            # Mid-turn messages go right after this step's results, so the next step
            # sees them.
            await self.messages.take_queued()

    async def _set_step(self, step: int) -> None:
        await database_sync_to_async(lease.set_step)(self.state.tab_id, self.state.turn_id, step)

    async def reload_if_changed(self) -> bool:
        """Settings changed since the last step: say so in the log, at this point.

        Also run at the end of every turn, so a change made during a one-step turn is
        not lost (the idle-tab notice skips tabs with a running turn).
        """
        state = self.state
        # What TurnConfig reads of the tab, not its tool list and prompt.
        tab = await Tab.objects.only("id", "model", "parent_call_id").aget(pk=state.tab_id)
        fresh = await database_sync_to_async(TurnConfig.load)(tab)
        if fresh == state.config:
            return False
        await self.outbox.system(SystemKind.CONFIG_RELOAD, state.turn_config.describe_change(fresh))
        state.config = fresh
        return True

    async def refresh_tools(self, tab: Tab) -> None:
        """Freeze the tab's tool set at its first turn; at a later turn's start, take a
        changed one (an MCP server's new tools, an admin's edit) with a config-reload
        chunk saying what changed. Never within a turn: each change costs the cache.
        Stop ends the wait for the MCP servers' listings at once."""
        state = self.state
        listing = asyncio.ensure_future(toolset.current(tab.tool_allow, tab.tools, tab.owner_id))
        stopped = asyncio.ensure_future(state.cancelled.wait())
        try:
            await asyncio.wait({listing, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            listing.cancel()
        state.check_cancel()
        fresh, problems, failed = listing.result()
        if not await database_sync_to_async(agents.may_nest)(tab):
            fresh = [entry for entry in fresh if entry["name"] != AGENT]
        for problem in problems:
            logger.warning("tab %s: %s", state.tab_id, problem)
        self.calls.tool_names = frozenset(entry["name"] for entry in fresh)
        if fresh == tab.tools:
            # A server down keeps its tools; each turn it is down says so.
            if failed:
                listed = "".join(f" {f}." for f in failed)
                await self.outbox.system(
                    SystemKind.TOOL_PROBLEM, "MCP servers not listed:" + listed
                )
            return
        trouble = "".join(f" {p}." for p in problems)
        if tab.tools is not None:
            await self.outbox.system(
                SystemKind.CONFIG_RELOAD, toolset.describe(tab.tools, fresh) + trouble
            )
        elif problems:
            await self.outbox.system(
                SystemKind.TOOL_PROBLEM, "Some tools are not available:" + trouble
            )
        tab.tools = fresh
        await Tab.objects.filter(pk=tab.pk).aupdate(tools=fresh)
