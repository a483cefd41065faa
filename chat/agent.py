"""One turn: the step loop over provider, reducer, tools and log.

A TurnRunner owns a tab's lease while it runs. Everything that produces events
(the provider stream, a running tool) runs in a *producer* task that feeds one
queue; the runner's own coroutine consumes the queue and applies the reducer's
ops (persist, checkpoint, broadcast). Cancel cancels producers only, so an op is
never half-applied: a seal is either in the log and broadcast, or neither.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import timedelta
from itertools import takewhile
from pathlib import PurePosixPath
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone

from chat import blobs, children, context, lease, log, preferences, retry, rules, tools
from chat import usage as chat_usage
from chat.history import History
from chat.models import Chunk, PermissionRule, QueuedMessage, Tab, UsageRecord
from chat.pacing import Coalescer, Debouncer, check_silence
from chat.providers import aget_provider
from chat.providers.base import (
    ErrorEvent,
    Event,
    Finish,
    ProviderError,
    Request,
    ShellOutput,
    SystemEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
)
from chat.providers.errors import STREAM_IDLE, explain
from chat.providers.registry import STREAM_IDLE_TIMEOUT
from chat.stream import Block, Delta, Kind, Op, Open, Reducer, Role, Seal
from chat.tools import files, gitrepo, sandbox, toolset, workdir
from chat.tools.base import ImageFile, ToolError

logger = logging.getLogger(__name__)

# After this long with nothing new to show, the status line says "waiting for
# the model · N s": shorter pauses are normal before a first token.
WAITING_STATUS_AFTER = 10.0
# Bytes that make no event (pings) keep an attempt alive past the idle timeout,
# since a model may think silently, but not for longer than this without a
# single event: a server that only pings still ends within a bounded total.
# Ten minutes is past the longest silent thinking seen from a real model.
STREAM_SILENT_MAX = 600.0
# The error type of an attempt given up by the idle watchdog.
STALLED = STREAM_IDLE
# Stop reasons that cut the answer short, and the notice written after it.
STOP_NOTICES = {
    "max_tokens": (
        "output-limit",
        "The model stopped at its output limit: the answer is cut short.",
    ),
    "model_context_window_exceeded": (
        "context-limit",
        "The model stopped because the conversation filled its context window.",
    ),
}
# The result of calls a crashed turn never ran, and of the one it was running.
NOT_RUN_CRASHED = "Not run: the turn stopped on an internal error."
CRASHED_WHILE_RUNNING = "Interrupted: the turn stopped on an internal error while this call ran."
# A summary request answered with a tool call, or failing on a retryable error,
# is asked once more.
SUMMARY_ATTEMPTS = 2
# The status line's state while a summary is written.
COMPACTING = "compacting"
# The most of an exception's text a crash's error chunk quotes: enough to debug
# from the tab (the traceback is in the server log), not a wall of repr.
CRASH_MESSAGE_CHARS = 1000


def interrupt_ops(reducer: Reducer, why: str, *, running_why: str | None = None) -> list[Op]:
    """Close a step cut short (a Stop, a shutdown, an error, a crash): the open
    block sealed as it is and marked `interrupted` (history does not send unsigned
    thinking cut off so; Continue says where it stopped), unless it is the running
    call's output, which its result completes; every call without a result
    answered with `why` (the running one with `running_why`), marked too. An
    interrupted call is never run again by itself."""
    ops: list[Op] = []
    block = reducer.open
    running = None
    if block is not None and block.type == Kind.TOOL_RESULT:
        running = block.data.get("call_id")
    elif block is not None:
        ops += reducer.seal(interrupted=True)
    for call_id, name in list(reducer.pending_calls):
        ran = call_id == running
        result = reducer.feed(ToolResultEvent(call_id, name, (ran and running_why) or why, True))
        result[-1].block.data["interrupted"] = True
        if ran:
            # The reducer drops an empty output; kept, it says the call ran.
            result[-1].block.data.setdefault("shell_output", "")
            running = None  # ids may repeat: only the first such call ran
        ops += result
    return ops + reducer.seal(interrupted=True)


async def provider_for(model: str):
    """The provider for a model id. Tests replace this function."""
    return await aget_provider(model)


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
        if children.is_child(tab):
            max_steps = min(max_steps, django_settings.DISPATCH_CHILD_MAX_STEPS)
        return cls(
            model=tab.model or prefs.new_tab_model,
            fallback_model=prefs.effective_fallback_model,
            approve_tools=prefs.approve_tools,
            max_steps=max_steps,
        )


@dataclass
class _ProducerDone:
    error: BaseException | None = None


@dataclass(frozen=True)
class _Summary:
    text: str


@dataclass(frozen=True)
class _Overflow:
    """A step refused because its request does not fit the context window."""

    error: ProviderError
    tries: int
    model: str  # the fallback's, when the turn had switched to it


@dataclass(frozen=True)
class _Stalled:
    """The watchdog gave up on the stream."""

    message: str


# The watchdog's word that the model has been silent for WAITING_STATUS_AFTER.
_SILENT = object()


@dataclass(frozen=True)
class _Watch:
    """The idle watchdog of one stream: its timeout, when the provider last
    received bytes (loop time, None if it cannot tell), and the model's name."""

    idle: float
    alive_at: Callable[[], float | None]
    model: str


@dataclass
class TurnStatus:
    state: str = "running"
    turn_id: str = ""
    step: int = 0
    model: str = ""
    started_at: str = field(default_factory=lambda: timezone.now().isoformat())
    usage: Usage = field(default_factory=Usage)
    approval: dict[str, Any] | None = None
    # When the stream last showed something (ISO time), while it has been
    # silent for WAITING_STATUS_AFTER: the page counts the seconds from it.
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


class TurnCancelled(Exception):
    pass


Publish = Callable[[dict[str, Any]], Awaitable[None]]


class TurnRunner:
    """Runs turns on one tab for as long as it holds the tab's lease."""

    def __init__(
        self,
        tab_id: uuid.UUID,
        turn_id: uuid.UUID,
        publish: Publish,
        *,
        auto_approve: bool = False,
    ) -> None:
        self.tab_id = tab_id
        self.turn_id = turn_id
        self.publish = publish
        self.auto_approve = auto_approve
        # The tab owner's workspace (workdir.user_workspace), known once a turn has
        # read its tab: no other user's files are ever in reach of this tab's tools.
        self.workspace: Any = None
        self.reducer = Reducer(turn_id)
        self.history: History | None = None
        self.status = TurnStatus(turn_id=str(turn_id))
        self.last_seq = 0
        self.cancelled = asyncio.Event()
        # The step's sub-agents stop waiting (chat.children.wait): set by cancel, and
        # when the step ends early.
        self._agents_stop = asyncio.Event()
        self._producer: asyncio.Task | None = None
        self._approvals: dict[str, asyncio.Future[bool]] = {}
        # What "always allow" did with an approval, by call id (chat.views.tab_approve).
        self._approval_rules: dict[str, dict[str, Any]] = {}
        # The permission rules of this turn (the tab's, then its owner's): read at its
        # first tool call, again after "always allow" added one.
        self._rules: list[rules.Rule] | None = None
        self._thinking_since: float | None = None
        # Arguments of this turn's calls, by call id, for running them, and the seq of
        # each call's chunk (a sub-agent's child is keyed on it: chat.children.child_id).
        self._args: dict[str, dict[str, Any]] = {}
        self._seqs: dict[str, int] = {}
        # Calls of this step refused for repeating an `agent` call's id, by that id: their
        # results go into the log right after its (a result answers the first open call
        # of its id).
        self._repeats: dict[str, list[str]] = {}
        # The arguments of the later calls of this step that repeat an id (some servers
        # repeat ids), in order: each runs with its own.
        self._repeat_args: dict[str, list[dict[str, Any]]] = {}
        # The heartbeat found the tab deleted: its sub-agents are stopped, not left to
        # run on for a resumed turn that will never come.
        self.tab_gone = False
        self._debouncer = Debouncer()
        self._cp_timer: asyncio.TimerHandle | None = None
        self._cp_write: asyncio.Task | None = None
        # The block the checkpoint holds and how much of its body: the next
        # checkpoint writes the rest (chat.log.checkpoint).
        self._cp_block: uuid.UUID | None = None
        self._cp_stored = 0
        self._coalescer = Coalescer()
        self._delta_timer: asyncio.TimerHandle | None = None
        # The last delta op being published: the next one waits for it (order).
        self._flushing: asyncio.Task | None = None
        self.stopping = False
        # The worker is shutting down: the running turn may finish, the next
        # one (a message queued meanwhile) goes to a worker that stays.
        self.draining = False
        self.lease_lost = False
        self.config: TurnConfig | None = None
        # The open block the watchers were told about (its open op published).
        self._shown: uuid.UUID | None = None
        # Loop time of the stream's last event (or of its start).
        self._last_event_at = 0.0
        # Loop time since when the runner waits for the stream's next event;
        # None while it is busy with one (that is not the stream's silence).
        self._wait_start: float | None = None
        # This turn's crash is in the log: a later failure (publishing idle
        # on the same broken channel layer) adds no second error chunk.
        self._crash_logged = False
        # This turn moved its queued messages into the log.
        self._took_queued = False
        # The tab's context size after its last request (chat.context).
        self.size = context.Size()
        # The names of the tools this turn offered: a call of any other is not run
        # (a profile's allow-list holds for calls, not only for the list sent).
        self._tool_names: frozenset[str] | None = None
        # A compaction was tried in this turn for an overflow: once a turn.
        self._overflow_tried = False
        # The tab's working directory (Tab.workdir): its tools' root under the workspace.
        self.cwd = ""
        # The tab's owner: an MCP server that mounts the workspace mounts theirs.
        self.owner_id: int | None = None
        # Every message of this turn came from a wake whose approval policy is "deny" (or
        # a sub-agent of one); a turn that only resumes one goes on as it was.
        self._unattended = False
        # Why the turn was stopped, when not by the user (chat.children.cancel).
        self._cancel_why = ""

    # --- control (called from the worker consumer) --------------------------

    def cancel(self, *, stopping: bool = False, why: str = "") -> None:
        """Stop the turn: by the user, or (`stopping`) because this worker shuts down, or
        for `why` (a sub-agent's parent stopped it: its log says so, not "by the user")."""
        self.stopping = self.stopping or stopping
        if why and not self.cancelled.is_set():
            self._cancel_why = why
        self.cancelled.set()
        self._agents_stop.set()
        if self._producer is not None:
            self._producer.cancel()
        for future in self._approvals.values():
            if not future.done():
                future.set_exception(TurnCancelled())

    def approve(self, call_id: str, approved: bool, rule: dict[str, Any] | None = None) -> bool:
        future = self._approvals.get(call_id)
        if future is None or future.done():
            return False
        if rule is not None:
            self._approval_rules[call_id] = rule
        future.set_result(approved)
        return True

    def snapshot(self) -> dict[str, Any]:
        """The exact state a new watcher needs: last sealed seq and the open block."""
        block = self.reducer.open
        if block is not None and block.id != self._shown:
            # Opened in the reducer but not yet announced (a seal before it is
            # still being written): the watcher gets it from the ops, in order.
            block = None
        return {
            "last_seq": self.last_seq,
            "open": block.to_dict() if block is not None else None,
            "status": self.status.as_dict(),
        }

    # --- the loop ----------------------------------------------------------

    async def run(self) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                try:
                    await self._run_turn()
                    if self.lease_lost:
                        break  # the tab is someone else's now: release nothing
                    await self._publish_idle()
                    next_turn = await database_sync_to_async(self._release_or_continue)()
                except log.LeaseLost:
                    break  # the tab is someone else's now (_append): release nothing
                except Exception as exc:
                    # Outside the steps (building the history, loading the
                    # settings) or closing the turn failed: the turn still ends
                    # with an error chunk, idle and a released lease. No next
                    # turn: whatever failed would likely fail it too.
                    await self.abort(exc)
                    break
                if next_turn is None:
                    break
                if self.stopping or self.draining:
                    # Shutting down (the running turn was let finish): the next
                    # turn is a new turn, so it goes to a worker that stays.
                    await database_sync_to_async(lease.hand_back)(self.tab_id, self.turn_id)
                    break
                self._start_turn(next_turn)
        finally:
            heartbeat.cancel()
            with suppress(asyncio.CancelledError):
                await heartbeat
            self._cancel_checkpoint()

    async def _publish_idle(self) -> None:
        await self._flush_deltas()
        # Before idle is seen: a Continue or a branch clicked at once finds the
        # turn finished, not running (the lease is released only after idle).
        # Not worth failing over: without it, such a click is refused, no more.
        try:
            await database_sync_to_async(lease.set_finishing)(self.tab_id, self.turn_id)
        except Exception:
            logger.exception("could not mark turn %s finishing", self.turn_id)
        # Idle goes out before the lease is released: once it is, a new
        # runner may start on this tab and its "running" must come last.
        self.status.state = "idle"
        self.status.approval = None
        self.status.waiting_since = None
        # Read back from the records, as a page render reads them: the line the page
        # shows now is the one a reload shows. Without it the turn still ends.
        try:
            self.status.turn_end = await database_sync_to_async(chat_usage.turn_end)(
                self.tab_id, self.turn_id
            )
        except Exception:
            logger.exception("could not total the usage of turn %s", self.turn_id)
        await self.publish({"op": "status", "status": self.status.as_dict()})

    async def abort(self, exc: BaseException) -> None:
        """End the turn after `exc` escaped it: an error chunk saying what
        happened, idle, and this turn's lease released. Each step is tried even
        when the one before failed (the database or the channel layer may be
        what broke), so the tab does not look stuck and recovery does not
        later report a crash as a server that stopped."""
        if self.lease_lost:
            return  # recovered by another worker, which closed the turn
        if not self._took_queued:
            # Crashed before the turn took its messages: they go into the log
            # anyway, so the error answers them (and a follower such as
            # `manage.py send` sees its message taken and the error after it).
            try:
                await self._take_queued()
            except log.LeaseLost:
                return  # recovered meanwhile: the recovery closed the turn
            except Exception:
                logger.exception("could not take the messages of crashed turn %s", self.turn_id)
        try:
            await self._end_with_crash(exc)
        except log.LeaseLost:
            return
        except Exception:
            logger.exception("could not record the crash of turn %s", self.turn_id)
        if self.lease_lost:
            return  # found so above (a deleted tab): no idle to say, no lease to release
        self._discard_deltas()
        try:
            await self._publish_idle()
        except Exception:
            logger.exception("could not report turn %s idle", self.turn_id)
        try:
            await database_sync_to_async(lease.release)(self.tab_id, self.turn_id)
        except Exception:
            logger.exception("could not release the lease of tab %s", self.tab_id)

    def _start_turn(self, turn_id: uuid.UUID) -> None:
        self.turn_id = turn_id
        self.reducer = Reducer(turn_id)
        self.status = TurnStatus(turn_id=str(turn_id))
        self._crash_logged = False
        self._took_queued = False
        self._overflow_tried = False
        self._rules = None
        self._unattended = False
        self._cancel_why = ""
        self.cancelled.clear()
        self._agents_stop.clear()
        # Auto-approval was asked for the message that started the first turn only.
        self.auto_approve = False

    def _release_or_continue(self) -> uuid.UUID | None:
        """End of a turn: give the lease back, unless a message is waiting for the next turn."""
        turn_id = lease.release_or_continue(self.tab_id, self.turn_id)
        if turn_id is not None:
            # Here, on the database thread: a heartbeat queued right behind
            # this must look for the lease by its new turn id, or it would
            # report it lost and stop the runner.
            self.turn_id = turn_id
        return turn_id

    async def _reload_if_changed(self) -> bool:
        """Settings changed since the last step: say so in the log, at this point.

        Also run at the end of every turn, so a change made during a one-step
        turn is not lost (the idle-tab notice skips tabs with a running turn).
        """
        tab = await Tab.objects.aget(pk=self.tab_id)
        fresh = await database_sync_to_async(TurnConfig.load)(tab)
        if fresh == self.config:
            return False
        await self._system("config-reload", _describe_reload(self.config, fresh))
        self.config = fresh
        return True

    async def _run_turn(self) -> None:
        tab = await Tab.objects.aget(pk=self.tab_id)
        self.workspace = await asyncio.to_thread(workdir.user_workspace, tab.owner_id)
        if self.history is None:
            await self._rebuild_history()
            self.last_seq = self.history.last_seq
        config = await database_sync_to_async(TurnConfig.load)(tab)
        self.config = config
        self.cwd = tab.workdir
        self.owner_id = tab.owner_id
        self.status.model = config.model
        self.size = context.Size.from_dict(tab.context)
        self.status.context = context.meter(self.size, config.model).as_dict()
        try:
            await self._steps(tab, config)
            await self._reload_if_changed()
        except TurnCancelled:
            await self._finish_cancel()
        except log.LeaseLost:
            raise  # not a crash: another runner has the tab (run() stops this one)
        except Exception as exc:  # a bug must not leave the tab stuck "running"
            await self._end_with_crash(exc)

    async def _steps(self, tab: Tab, config: TurnConfig) -> None:
        model = config.model
        step = 0
        compacted = False
        # Before any request of the turn (a compaction's too): they all send the tools.
        await self._refresh_tools(tab)
        while (asked := await self._take_compaction()) is not None:
            through, instructions = asked
            compacted = (
                await self._compact(tab, model, "manual", through, instructions) or compacted
            )
        if not compacted and await QueuedMessage.objects.filter(tab_id=self.tab_id).aexists():
            await self._fit_at_turn_start(tab, model)
        took = await self._take_queued()
        if not took:
            return
        await self._reattach()
        while True:
            self._check_cancel()
            if step >= config.max_steps:
                await self._system(
                    "step-limit", f"Stopped after {config.max_steps} steps (the step limit)."
                )
                return
            step += 1
            self.reducer.step = step
            self.status.step = step
            await self._set_step(step)
            if step > 1 and await self._reload_if_changed():
                if self.config.model != config.model:
                    model = self.config.model
                config = self.config
            if step > 1 and context.overflowing(self.size, self._window(model)):
                await self._compact_before_turn(tab, model)
            await self._status()
            finish = await self._stream_with_retries(self._request(tab), model, config)
            if isinstance(finish, _Overflow):
                # Refused as too long for the window: everything before this turn is
                # summarised and the step asked again, once.
                model = finish.model
                if not await self._compact_before_turn(tab, model):
                    await self._give_up(finish.error, model, finish.tries)
                    return
                finish = await self._stream_with_retries(
                    self._request(tab), model, config, overflow=False
                )
            if not isinstance(finish, tuple):
                return  # an error chunk ended the turn
            model = finish[1]
            self.status.model = model
            if notice := STOP_NOTICES.get(finish[0].stop_reason):
                # A cut answer must not pass for a complete one.
                await self._system(*notice, stop_reason=finish[0].stop_reason)
            if not self.reducer.pending_calls:
                # The model is done. A message queued meanwhile starts the next
                # turn (DESIGN §4.1): _release_or_continue picks it up.
                return
            await self._run_tools(config)
            # Mid-turn messages go right after this step's results, so the
            # next step sees them.
            await self._take_queued()

    async def _refresh_tools(self, tab: Tab) -> None:
        """Freeze the tab's tool set at its first turn; at a later turn's start, take a
        changed one (an MCP server's new tools, an admin's edit) with a config-reload
        chunk saying what changed. Never within a turn: each change costs the cache.
        Stop ends the wait for the MCP servers' listings at once."""
        listing = asyncio.ensure_future(toolset.current(tab.tool_allow, tab.tools, tab.owner_id))
        stopped = asyncio.ensure_future(self.cancelled.wait())
        try:
            await asyncio.wait({listing, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            listing.cancel()
        self._check_cancel()
        fresh, problems, failed = listing.result()
        if not await database_sync_to_async(children.may_nest)(tab):
            fresh = [entry for entry in fresh if entry["name"] != children.AGENT]
        for problem in problems:
            logger.warning("tab %s: %s", self.tab_id, problem)
        self._tool_names = frozenset(entry["name"] for entry in fresh)
        if fresh == tab.tools:
            # A server down keeps its tools; each turn it is down says so.
            if failed:
                listed = "".join(f" {f}." for f in failed)
                await self._system("tool-problem", "MCP servers not listed:" + listed)
            return
        trouble = "".join(f" {p}." for p in problems)
        if tab.tools is not None:
            await self._system("config-reload", toolset.describe(tab.tools, fresh) + trouble)
        elif problems:
            await self._system("tool-problem", "Some tools are not available:" + trouble)
        tab.tools = fresh
        await Tab.objects.filter(pk=tab.pk).aupdate(tools=fresh)

    # --- streaming ---------------------------------------------------------

    async def _stream_with_retries(
        self, request: Request, model: str, config: TurnConfig, *, overflow: bool = True
    ) -> tuple[Finish, str] | _Overflow | None:
        """Stream one step, retrying as chat.retry decides: (finish, the model that
        answered), or None after an error chunk ended the turn. With `overflow`, a
        refusal for the context window comes back as _Overflow instead, the log
        untouched (nothing streamed before a 400), for the caller to compact."""
        attempt = 0
        switched = False
        tries = 0
        while True:
            self._check_cancel()
            try:
                finish = await self._stream(request, model)
                await self._record_usage(model, finish.usage)
                return finish, model
            except ProviderError as exc:
                tries += 1
                if overflow and context.is_overflow(exc) and self.reducer.open is None:
                    return _Overflow(exc, tries, model)
                decision = retry.decide(
                    exc,
                    attempt,
                    model=model,
                    fallback=config.fallback_model,
                    switched=switched,
                    rand=random.random(),
                )
                if isinstance(decision, retry.GiveUp):
                    await self._give_up(exc, model, tries, attempt)
                    return None
                # The cut-off attempt stays in the log; the retry notice tells
                # history not to send it, and its calls are never run.
                self.reducer.pending_calls.clear()
                await self._apply(self.reducer.seal())
                await self._status()  # a "waiting" count ends with the attempt
                if isinstance(decision, retry.Retry):
                    attempt += 1
                    await self._system(
                        "notice",
                        f"{_reason(exc)}; retrying in {decision.delay:g} s "
                        f"(attempt {attempt + 1} of {len(retry.RETRY_DELAYS) + 1}).",
                        retry=True,
                    )
                    await self._sleep(decision.delay)
                    continue
                switched = True
                attempt = 0
                await self._system(
                    "model-changed",
                    f"Switched to {decision.model} ({_reason(exc).lower()}).",
                    retry=True,
                )
                model = decision.model
                continue
            except (ValueError, LookupError) as exc:
                # A misconfigured model (unknown provider, missing key), or a
                # response that could not be read.
                await self._interrupt("Not run: the response could not be read.")
                await self._apply(self.reducer.feed(ErrorEvent(str(exc))))
                return None

    async def _give_up(self, exc: ProviderError, model: str, tries: int, attempt: int = 0) -> None:
        """End the step on `exc`: the open block and calls closed, the error chunk."""
        message = exc.message
        if exc.error_type == STALLED and attempt:
            message += (
                f", on each of {attempt + 1} attempts: the provider seems stalled. "
                "Try again later or pick another model."
            )
        await self._interrupt("Not run: the response was cut off by an error.")
        details = explain(exc, model=model, attempts=tries).data()
        await self._apply(self.reducer.feed(ErrorEvent(message, exc.status_code, details)))

    def _request(self, tab: Tab) -> Request:
        return Request(
            system=tab.system_prompt,
            tools=tools.tab_specs(tab),
            messages=self.history.messages(),
            blobs=blobs.READER,
        )

    async def _stream(self, request: Request, model: str) -> Finish:
        provider = await provider_for(model)
        idle = getattr(provider, "idle_timeout", STREAM_IDLE_TIMEOUT)

        async def produce(queue: asyncio.Queue) -> None:
            async with aclosing(provider.stream(request)) as events:
                async for event in events:
                    await queue.put(event)

        watch = _Watch(idle, lambda: getattr(provider, "alive_at", None), model)
        finish = Finish()
        self._last_event_at = asyncio.get_running_loop().time()
        try:
            async with aclosing(self._produced(produce, watch)) as events:
                async for event in events:
                    await self._progress()
                    if isinstance(event, Finish):
                        finish = event
                    await self._apply(self.reducer.feed(event))
        finally:
            self.status.waiting_since = None
        await self._apply(self.reducer.seal())
        return finish

    async def _progress(self) -> None:
        """An event came: the "waiting for the model" count ends."""
        self._last_event_at = asyncio.get_running_loop().time()
        if self.status.waiting_since is not None:
            self.status.waiting_since = None
            await self._status()

    async def _produced(
        self,
        produce: Callable[[asyncio.Queue], Awaitable[None]],
        watch: _Watch | None = None,
    ) -> AsyncIterator[Event]:
        """Run `produce` as a cancellable producer; yield what it queues, in
        order. With `watch`, a timer looks at the silence now and then
        (pacing.check_silence): the status says since when the model is silent,
        and a stream silent past its idle timeout fails as a retryable
        ProviderError (the finally cancels the producer). A timer, not a
        timeout around each wait: that was a timer made and cancelled per token."""
        # A cancel that came while no producer ran (between steps, during a DB
        # call) must stop the turn before the next producer starts.
        self._check_cancel()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        timer: asyncio.TimerHandle | None = None

        def done(task: asyncio.Task) -> None:
            # From the task's outside: a task cancelled before its first step
            # never runs its body, so the body could not report it.
            error = asyncio.CancelledError() if task.cancelled() else task.exception()
            queue.put_nowait(_ProducerDone(error))

        def look(watch: _Watch) -> None:
            nonlocal timer
            now = loop.time()
            silence = check_silence(
                now,
                last_event=self._last_event_at,
                wait_start=self._wait_start,
                alive_at=watch.alive_at(),
                idle=watch.idle,
                waiting_shown=self.status.waiting_since is not None,
                waiting_after=WAITING_STATUS_AFTER,
                silent_max=STREAM_SILENT_MAX,
            )
            if silence.show_waiting:
                queue.put_nowait(_SILENT)
            if silence.stalled == "keep-alives":
                silent_for = now - self._last_event_at
                queue.put_nowait(
                    _Stalled(f"{watch.model} sent only keep-alives for {silent_for:.0f} s")
                )
            elif silence.stalled:
                queue.put_nowait(_Stalled(f"{watch.model} sent nothing for {watch.idle:g} s"))
            timer = None if silence.wake_at is None else loop.call_at(silence.wake_at, look, watch)

        self._producer = asyncio.create_task(produce(queue))
        self._producer.add_done_callback(done)
        if watch is not None:
            timer = loop.call_at(loop.time() + min(watch.idle, WAITING_STATUS_AFTER), look, watch)
        try:
            while True:
                if self._wait_start is None and queue.empty():
                    self._wait_start = loop.time()
                item = await queue.get()
                if item is _SILENT:
                    silent = timedelta(seconds=loop.time() - self._last_event_at)
                    self.status.waiting_since = (timezone.now() - silent).isoformat()
                    await self._status()
                    continue  # still waiting: the silence goes on counting
                self._wait_start = None
                if isinstance(item, _Stalled):
                    raise ProviderError(item.message, error_type=STALLED, retryable=True)
                if isinstance(item, _ProducerDone):
                    if isinstance(item.error, asyncio.CancelledError):
                        raise TurnCancelled()
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            if timer is not None:
                timer.cancel()
            self._wait_start = None
            self._producer.cancel()
            with suppress(BaseException):
                await self._producer
            self._producer = None

    # --- the context window (chat/context.py) -----------------------------------

    async def _rebuild_history(self) -> None:
        chunks = await database_sync_to_async(log.context_tail)(self.tab_id)
        self.history = History.build(chunks)

    def _window(self, model: str) -> int:
        return context.window(model)[0]

    async def _fit_at_turn_start(self, tab: Tab, model: str) -> None:
        """Before a turn's messages go in: compact when the context is past
        COMPACT_AT of the window; else, when the cache has expired anyway, elide old
        bulky tool results (never step by step: each elision is a cache miss)."""
        size = self.size
        if not size.known:
            # Never measured (a new branch, an import): the builder's estimate.
            request = self._request(tab)
            size = context.Size(
                context.estimate(request.system, request.tools, request.messages),
                estimated=True,
            )
        win = self._window(model)
        if context.due_at_turn_start(size, win):
            await self._compact(tab, model, "auto", None, "", tokens_before=size.next)
        elif size.next >= win * context.COMPACT_TO and context.cache_cold(size, timezone.now()):
            chunks = await database_sync_to_async(log.context_tail)(self.tab_id)
            seqs = context.plan_elision(chunks, self.history.elided)
            if context.elided_chars(chunks, seqs) >= context.ELIDE_MIN_TOTAL:
                await self._append_context([self._elide_block(chunks, seqs)])

    async def _compact_before_turn(self, tab: Tab, model: str) -> bool:
        """A turn too big for the window on its own: everything before it is
        summarised, the turn stays verbatim (its signed thinking and calls intact).
        False when there is nothing before it to summarise (said once)."""
        if self._overflow_tried:
            return False  # one try a turn: what failed once would fail again
        self._overflow_tried = True
        chunks = await database_sync_to_async(log.context_tail)(self.tab_id)
        through = context.plan_through(chunks, self._window(model), keep_current=True)
        if through is None:
            await self._system(
                "compaction-failed",
                "This turn alone fills the model's context window: there is nothing "
                "before it left to summarise. Stop it, or start a new tab.",
            )
            return False
        return await self._compact(
            tab, model, "auto", through, "", tokens_before=self.size.next, keep_current=True
        )

    async def _compact(
        self,
        tab: Tab,
        model: str,
        trigger: str,
        through: int | None,
        instructions: str,
        *,
        tokens_before: int = 0,
        keep_current: bool = False,
    ) -> bool:
        """Summarise the log through `through` (None: as planned for an automatic
        compaction, or everything for a manual one) and append the compaction chunk
        the builder starts from. The summary request is the live request plus one
        user message: a cache read of the whole conversation. With `keep_current` (a
        turn too big for the window) the live request would not fit either, so it is the
        log through `through` (the previous turn's last request and answer, cached too)
        plus the message. A failure leaves the log as it was, with a notice saying why;
        True when compacted."""
        chunks = await database_sync_to_async(log.context_tail)(self.tab_id)
        win = self._window(model)
        if through is None and trigger == "auto":
            through = context.plan_through(chunks, win)
        elif through is None:
            through = context.last_sendable(chunks)
        else:
            through = context.turn_end(chunks, through)
        if through is None:
            await self._system(
                "compaction-failed",
                "Nothing to compact: no message since the last compaction reaches that far."
                if chunks
                else "Nothing to compact yet.",
            )
            return False
        if keep_current:
            history = History.build([c for c in chunks if c.seq is not None and c.seq <= through])
            question = context.ask(instructions)
        else:
            history = self.history
            question = context.ask(instructions, context.kept_from(chunks, through))
        request = Request(
            system=tab.system_prompt,
            tools=tools.tab_specs(tab),
            messages=history.with_ask(question),
            blobs=blobs.READER,
        )
        self.status.state = COMPACTING
        await self._status()
        try:
            summary = await self._summarise(request, model)
        finally:
            self.status.state = "running"
        if isinstance(summary, str):
            await self._system("compaction-failed", summary)
            await self._status()
            return False
        data: dict[str, Any] = {
            "summary": summary.text,
            "through_seq": through,
            "model": model,
            "trigger": trigger,
            "tokens_before": tokens_before or self.size.next,
        }
        if instructions.strip():
            data["instructions"] = instructions.strip()
        blocks = [
            Block(uuid.uuid4(), self.turn_id, self.reducer.step, Role.SYSTEM, Kind.COMPACTION, data)
        ]
        kept = [c for c in chunks if c.seq is not None and c.seq > through]
        if seqs := context.plan_elision(kept, self.history.elided):
            blocks.append(self._elide_block(kept, seqs))
        await self._append_context(blocks)
        request = self._request(tab)
        estimate = context.estimate(request.system, request.tools, request.messages)
        await self._set_size(context.Size(estimate, at=self.size.at, estimated=True), model)
        await self._status()
        return True

    def _elide_block(self, chunks: list[Any], seqs: list[int]) -> Block:
        chars = context.elided_chars(chunks, seqs)
        text = (
            f"Removed {len(seqs)} old tool output{'s' if len(seqs) != 1 else ''} "
            f"({chars:,} characters) from what the model is sent, to save context; "
            "they stay in the log."
        )
        data = {"kind": context.ELIDE, "text": text, "seqs": seqs, "chars": chars}
        return Block(uuid.uuid4(), self.turn_id, self.reducer.step, Role.SYSTEM, Kind.SYSTEM, data)

    async def _append_context(self, blocks: list[Block]) -> None:
        """Append compaction/elide chunks and build the history again from the log
        (they change what earlier chunks send)."""
        await self._flush_deltas()
        await self._append(blocks)
        for block in blocks:
            self.last_seq = block.seq
            await self.publish({"op": "seal", "block": block.to_dict()})
        await self._rebuild_history()

    async def _summarise(self, request: Request, model: str) -> _Summary | str:
        """The summary's text, or why there is none. A stray tool call is ignored and
        the request asked again (the same bytes: the cache holds them), once; so is
        a retryable error."""
        why = ""
        for attempt in range(SUMMARY_ATTEMPTS):
            self._check_cancel()
            try:
                text, finish, called = await self._summary_stream(request, model)
            except ProviderError as exc:
                why = explain(exc, model=model, attempts=attempt + 1).summary or exc.message
                if context.is_overflow(exc) and request.max_tokens is None:
                    # Some models refuse input + max_tokens past the window: a summary
                    # needs far less room than an answer (the cache ignores max_tokens).
                    request = replace(request, max_tokens=context.SUMMARY_MAX_TOKENS)
                    continue
                if not exc.retryable:
                    break
                decision = retry.decide(
                    exc, attempt, model=model, fallback="", switched=True, rand=random.random()
                )
                if isinstance(decision, retry.Retry):
                    await self._sleep(decision.delay)
                continue
            await self._record_usage(model, finish.usage, UsageRecord.Kind.SUMMARY)
            if finish.stop_reason in STOP_NOTICES:
                why = "the summary was cut off at the model's output limit"
                break
            if text.strip():
                return _Summary(text.strip())
            if not called:
                why = "the summary came back empty"
                break
            why = "the model called a tool instead of writing the summary"
        return f"Could not compact the conversation: {why}. It goes on uncompacted."

    async def _summary_stream(self, request: Request, model: str) -> tuple[str, Finish, bool]:
        """One summary request: its text (thinking is not kept), how it ended, and
        whether it called a tool. Nothing goes to the log while it streams."""
        provider = await provider_for(model)
        idle = getattr(provider, "idle_timeout", STREAM_IDLE_TIMEOUT)

        async def produce(queue: asyncio.Queue) -> None:
            async with aclosing(provider.stream(request)) as events:
                async for event in events:
                    await queue.put(event)

        watch = _Watch(idle, lambda: getattr(provider, "alive_at", None), model)
        pieces: list[str] = []
        called = False
        finish = Finish()
        self._last_event_at = asyncio.get_running_loop().time()
        try:
            async with aclosing(self._produced(produce, watch)) as events:
                async for event in events:
                    await self._progress()
                    match event:
                        case TextDelta(text=text):
                            pieces.append(text)
                        case ToolCallEvent():
                            called = True
                        case Finish():
                            finish = event
        finally:
            self.status.waiting_since = None
        return "".join(pieces), finish, called

    # --- tools ---------------------------------------------------------------

    async def _run_tools(self, config: TurnConfig) -> None:
        if self._rules is None:
            await self._load_rules()
        # The step's sub-agents run side by side while its other calls run in order;
        # their results go into the log once those are done (no block is open then).
        await self._with_agents(lambda agents: self._run_calls(config, agents))

    async def _with_agents(
        self, start: Callable[[dict[str, asyncio.Task[children.Result | None]]], Awaitable[None]]
    ) -> None:
        """Run `start`, which may start `agent` calls, then answer those as they end."""
        agents: dict[str, asyncio.Task[children.Result | None]] = {}
        try:
            await start(agents)
            await self._agent_results(agents)
        finally:
            if any(not task.done() for task in agents.values()):
                # Cut short (a Stop, a crash): the children are stopped (or, when this
                # worker stops, left running for the resumed turn) before the turn ends.
                self._agents_stop.set()
                await asyncio.gather(*agents.values(), return_exceptions=True)
            self.status.children.clear()
            self._repeats.clear()
            self._repeat_args.clear()

    async def _run_calls(
        self, config: TurnConfig, agents: dict[str, asyncio.Task[children.Result | None]]
    ) -> None:
        seen: dict[str, str] = {}
        for call_id, name in list(self.reducer.pending_calls):
            self._check_cancel()
            if call_id in seen:
                # Another call with the id of one before it in this step: run in its turn
                # with its own arguments (its result answers it, the earlier one's being
                # in already), unless either is an `agent` call, whose result comes later.
                repeats = self._repeat_args.get(call_id)
                if children.AGENT in (name, seen[call_id]) or not repeats:
                    await self._refuse_repeat(agents, call_id, name)
                    continue
                call = repeats.pop(0)
            else:
                seen[call_id] = name
                call = self._args.get(call_id, {})
            if self._tool_names is not None and name not in self._tool_names:
                why = f"Not run: {name} is not one of this tab's tools."
                await self._apply(self.reducer.feed(ToolResultEvent(call_id, name, why, True)))
                continue
            decision = await asyncio.to_thread(
                rules.decide,
                self._rules,
                name,
                call,
                resolve=self._resolve,
                repository=self._git_repository,
            )
            if decision is not None:
                await self._audit(call_id, decision)
                if decision.action == rules.DENY:
                    await self._apply(
                        self.reducer.feed(
                            ToolResultEvent(call_id, name, f"{decision.text}.", is_error=True)
                        )
                    )
                    continue
            if (
                (decision is not None and decision.action == rules.ASK)
                or (tools.always_asks(name) and not self.auto_approve)
                or (
                    decision is None
                    and config.approve_tools
                    and not self.auto_approve
                    and tools.needs_approval(name)
                )
            ):
                if self._unattended:
                    # A wake's turn whose wake says so (or a sub-agent of one): nobody is
                    # there to answer.
                    why = "Not approved: unattended wake turn."
                    await self._apply(self.reducer.feed(ToolResultEvent(call_id, name, why, True)))
                    continue
                approved = await self._wait_for_approval(call_id, name, call)
                if added := self._approval_rules.pop(call_id, None):
                    await self._system("rule", added["text"], call_id=call_id, **added["rule"])
                    await self._load_rules()
                if not approved:
                    await self._apply(
                        self.reducer.feed(
                            ToolResultEvent(call_id, name, "Denied by the user.", is_error=True)
                        )
                    )
                    continue
            # A recovery since the last heartbeat may have answered this call already
            # ("not run to completion"): then it is not run. (A stall from here to the
            # tool's start is still possible; the result's append is refused then.)
            await self._fence()
            if name == children.AGENT:
                await self._start_agent(agents, call_id, call)
                continue
            await self._run_tool(call_id, name, call)

    async def _refuse_repeat(
        self, agents: dict[str, asyncio.Task[children.Result | None]], call_id: str, name: str
    ) -> None:
        """A call of the step with the id of an `agent` call before it (or an `agent` call
        with an earlier call's id) is not run: the agent's result comes after the step's
        other calls', and a result answers the first open call of its id. Its refusal goes
        after the first call's result (now, unless that is an `agent` call still running)."""
        why = (
            f"Not run: duplicate call id {call_id!r} in this step (an earlier call has it); "
            "each call needs its own id."
        )
        if call_id in agents:
            self._repeats.setdefault(call_id, []).append(why)
            return
        await self._apply(self.reducer.feed(ToolResultEvent(call_id, name, why, True)))

    # --- sub-agents (chat.children) ------------------------------------------------

    async def _start_agent(
        self, agents: dict[str, asyncio.Task[children.Result | None]], call_id: str, call: Any
    ) -> None:
        """Start waiting for the call's child (made now, or found: a resumed turn's); a
        call that cannot start one is answered at once."""
        problem = children.bad_arguments(call)
        if problem is None and len(agents) >= django_settings.DISPATCH_CHILD_CONCURRENCY:
            problem = (
                f"Not run: too many sub-agents at once (at most "
                f"{django_settings.DISPATCH_CHILD_CONCURRENCY} in one step). Call it again "
                "once these have returned."
            )
        if problem is not None:
            event = ToolResultEvent(call_id, children.AGENT, problem, True)
            await self._apply(self.reducer.feed(event))
            return
        seq = self._seqs.get(call_id)
        if seq is None:  # never: every call is sealed, or read back, before it runs
            raise RuntimeError(f"agent call {call_id!r} is not in the log")
        agents[call_id] = asyncio.create_task(self._agent(call_id, call, seq))

    async def _agent(self, call_id: str, call: dict[str, Any], seq: int) -> children.Result | None:
        """Run one `agent` call (its chunk at `seq`): its child made (or found), followed
        until its turn ends or a cap stops it; its result. None when this worker stops: the
        call stays open for the resumed turn, the child running on."""
        try:
            child, _ = await database_sync_to_async(children.ensure)(
                self.tab_id,
                call_id,
                call,
                call_seq=seq,
                unattended=self._unattended,
                turn_id=self.turn_id,
            )
        except log.LeaseLost as exc:
            self._lose_lease(exc)
            return None
        except ValueError as exc:
            return children.Result(f"Not run: {exc}", True, "", "not-started")
        entry = {
            "tab": str(child.pk),
            "title": child.title,
            "call_id": call_id,
            "state": "queued",
            "step": 0,
            "approval": None,
        }
        self.status.children[call_id] = entry

        async def on_status(live: dict[str, Any]) -> None:
            if {k: entry.get(k) for k in live} != live:
                entry.update(live)
                await self._status()

        # The limit runs from the call, not from this wait: a turn resumed after a crash
        # (or several) gives its child no more time than the first.
        called = (
            await Chunk.objects.filter(tab_id=self.tab_id, seq=seq)
            .values_list("created_at", flat=True)
            .afirst()
        )
        limit = django_settings.DISPATCH_CHILD_TIMEOUT
        spent = (timezone.now() - called).total_seconds() if called is not None else 0.0
        outcome, why = await children.wait(
            child.pk,
            call_id,
            on_status,
            timeout=max(limit - max(spent, 0.0), 0.0),
            limit=limit,
            cancelled=self._agents_stop,
        )
        if why == children.STOPPED:
            if self.stopping and not self.tab_gone:
                return None
            outcome, why = await children.stop(
                child.pk,
                call_id,
                "was stopped with its parent",
                "its parent was deleted" if self.tab_gone else children.STOPPED_TEXT,
            )
            if self.tab_gone:
                return None  # no log to answer in
        return children.result(child.pk, child.title, outcome, why=why)

    async def _reattach(self) -> None:
        """Answer the `agent` calls a stopped turn left open (its worker died or shut down
        while their children ran on): each waits for the child it made, never a new one."""
        open_calls = [c for c in self.history.open_calls() if c[1] == children.AGENT]
        if not open_calls:
            return
        ids = [call_id for call_id, _ in open_calls]
        found = await database_sync_to_async(children.call_arguments)(self.tab_id, ids)
        for call_id, (seq, arguments) in found.items():
            self._seqs[call_id], self._args[call_id] = seq, arguments
        if not self._unattended:
            seqs = [seq for seq, _ in found.values()]
            self._unattended = await database_sync_to_async(self._resumes_unattended)(seqs)
        self.reducer.pending_calls.extend(open_calls)

        async def start(agents: dict[str, asyncio.Task[children.Result | None]]) -> None:
            for call_id in ids:
                await self._start_agent(agents, call_id, self._args.get(call_id, {}))

        await self._with_agents(start)

    def _resumes_unattended(self, seqs: list[int]) -> bool:
        """Whether this turn, which took no message (a rerun after a recovery or a
        shutdown), goes on with a turn no one attends: the messages of the turn that made
        the calls at `seqs` all come from a deny wake (or a child of one), whose policy
        holds for the rest of that work, its new children's too."""
        users = Chunk.objects.filter(tab_id=self.tab_id, role=Role.USER)
        if users.filter(turn_id=self.turn_id).exists():
            return False  # someone sent a message since: they attend it
        started = Chunk.objects.filter(tab_id=self.tab_id, seq__in=seqs).values("turn_id")
        messages = list(users.filter(turn_id__in=started).values_list("data", flat=True))
        return bool(messages) and all(_deny_wake(data) for data in messages)

    async def _agent_results(self, agents: dict[str, asyncio.Task[children.Result | None]]) -> None:
        """The step's children's results, each into the log as it comes."""
        waiting = set(agents.values())
        by_task = {task: call_id for call_id, task in agents.items()}
        while waiting:
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                call_id = by_task[task]
                outcome = task.result()
                self.status.children.pop(call_id, None)
                if outcome is None or self.lease_lost:
                    continue  # this worker stops: answered by the interrupt, or resumed
                ops = self.reducer.feed(
                    ToolResultEvent(
                        call_id,
                        children.AGENT,
                        outcome.text,
                        outcome.is_error,
                        bool(outcome.truncated_bytes),
                        truncated_bytes=outcome.truncated_bytes,
                    )
                )
                if outcome.child_tab:
                    ops[-1].block.data["child_tab"] = outcome.child_tab
                    ops[-1].block.data["child_status"] = outcome.status
                await self._apply(ops)
                for why in self._repeats.pop(call_id, []):
                    event = ToolResultEvent(call_id, children.AGENT, why, True)
                    await self._apply(self.reducer.feed(event))
                await self._status()
        self._check_cancel()

    def _resolve(self, path: str) -> str:
        """Where `path` leads, links followed as the tools follow them: rules judge both."""
        return files.resolve(workdir.ensure(self.workspace, self.cwd), path)

    def _git_repository(self, folder: str) -> rules.GitRepository:
        """What git run in `folder` reads that may name a command: rules judge it."""
        root = workdir.ensure(self.workspace, self.cwd)
        return rules.GitRepository(*gitrepo.read(self.workspace, root, folder))

    async def _load_rules(self) -> None:
        self._rules, problems = await database_sync_to_async(self._read_rules)()
        for problem in problems:
            logger.warning("tab %s: %s", self.tab_id, problem)
            await self._system("rule", problem)

    def _read_rules(self) -> tuple[list[rules.Rule], list[str]]:
        tab_rules, owner_id = Tab.objects.values_list("rules", "owner_id").get(pk=self.tab_id)
        own, problems = rules.parse_all(tab_rules or [], source=rules.TAB)
        rows = PermissionRule.objects.filter(user_id=owner_id).values("action", "pattern")
        users, more = rules.parse_all(rows, source=rules.USER)
        return own + users, problems + more

    async def _audit(self, call_id: str, decision: rules.Decision) -> None:
        """A rule decided a call: the log says which (the audit trail)."""
        rule = decision.rule
        await self._system(
            "rule",
            decision.text,
            call_id=call_id,
            action=decision.action,
            pattern=rule.pattern,
            source=rule.source,
        )

    async def _run_tool(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        if tools.streams_output(name):
            await self._open_output(call_id)

        async def produce(queue: asyncio.Queue) -> None:
            def on_output(text: str) -> None:
                queue.put_nowait(ShellOutput(call_id, text))

            outcome = await tools.run_tool(
                name,
                arguments,
                self.workspace,
                on_output=on_output,
                policy=sandbox.policy_from(django_settings),
                cwd=self.cwd,
                tab_id=self.tab_id,
                owner_id=self.owner_id,
            )
            result, is_error, attachments = outcome.result, outcome.is_error, ()
            if outcome.images:
                store = database_sync_to_async(self._store_images)
                attachments, refused = await store(outcome.images)
                if refused and outcome.images[0].path:
                    # read_file's image is its whole result: refused, the call failed.
                    result, is_error = refused[0], True
                elif refused:
                    # One block of an MCP result: the rest stands, and says what is missing.
                    result = "\n".join([result, *(f"[left out: {why}]" for why in refused)])
            queue.put_nowait(
                ToolResultEvent(
                    call_id,
                    name,
                    result,
                    is_error,
                    outcome.truncated,
                    truncated_bytes=outcome.truncated_bytes,
                    truncated_lines=outcome.truncated_lines,
                    attachments=attachments,
                )
            )

        async with aclosing(self._produced(produce)) as events:
            async for event in events:
                await self._apply(self.reducer.feed(event))

    def _store_images(
        self, images: tuple[ImageFile, ...]
    ) -> tuple[tuple[dict[str, Any], ...], list[str]]:
        """The references of the images a tool read, each stored (_store_image), and
        why each of the others was refused (chat.blobs' sentence, naming the file)."""
        refs, refused = [], []
        for image in images:
            try:
                refs.append(self._store_image(image))
            except blobs.AttachmentError as exc:
                refused.append(str(exc))
        return tuple(refs), refused

    def _store_image(self, image: ImageFile) -> dict[str, Any]:
        """An image a tool read, stored as the tab's attachment (as a message's files
        are); its reference keeps the workspace path it was read from."""
        normalised = blobs.normalise(image.data, image.name or PurePosixPath(image.path).name)
        with transaction.atomic():
            blob = blobs.store(normalised)
            blobs.attach(self.tab_id, blob, normalised.name, sent=True)
        if not image.path:
            # In no file (an MCP tool's): placed where a message's file would be, so a
            # model that cannot see images is told the truth about where it is.
            blobs.place(self.workspace, normalised.ref())
            return normalised.ref()
        return {**normalised.ref(), "path": image.path}

    async def _open_output(self, call_id: str) -> None:
        """Open the shell call's output block before the command starts, and
        checkpoint it at once. A command that has printed nothing yet is still
        running: a Stop or a server that dies then must leave a result that says
        so (its output key, even empty), not one of a call never run, which
        Continue would tell the model it can run again."""
        await self._apply(self.reducer.feed(ShellOutput(call_id, "")))
        await self._write_checkpoint(self._snapshot())

    async def _wait_for_approval(self, call_id: str, name: str, arguments: dict) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._approvals[call_id] = future
        self.status.state = "waiting"
        self.status.approval = {"call_id": call_id, "name": name, "arguments": arguments}
        await database_sync_to_async(lease.set_waiting)(self.tab_id, self.turn_id, True)
        await self._status()
        try:
            return await future
        finally:
            self._approvals.pop(call_id, None)
            self.status.state = "running"
            self.status.approval = None
            await database_sync_to_async(lease.set_waiting)(self.tab_id, self.turn_id, False)
            await self._status()

    # --- cancel ----------------------------------------------------------------

    def _check_cancel(self) -> None:
        if self.cancelled.is_set():
            raise TurnCancelled()

    async def _sleep(self, seconds: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self.cancelled.wait(), seconds)
        self._check_cancel()

    async def _finish_cancel(self) -> None:
        if self.lease_lost:
            return  # the recovery that took the lease already closed this turn
        if not self._took_queued:
            # Stopped before the turn took its messages (while it compacted): they are
            # what was stopped, so they go into the log before the notice, not on to
            # start the next turn.
            await self._take_queued()
        # The running call's open result (live shell output) is the first
        # pending call: answering it seals that block with its output kept.
        if self.stopping:
            # Calls whose children run on stay open: the turn goes on elsewhere for them.
            pending = self.reducer.pending_calls
            agent_calls = [
                (cid, self._seqs[cid])
                for cid, name in pending
                if name == children.AGENT and cid in self._seqs
            ]
            waiting = await database_sync_to_async(children.made)(self.tab_id, agent_calls)
            self.reducer.pending_calls = [
                (cid, name) for cid, name in self.reducer.pending_calls if cid not in waiting
            ]
            await self._interrupt("Interrupted: the worker running this turn shut down.")
            await self._system(
                "interrupted",
                "The server shut down in the middle of this turn. "
                + (lease.RESUMING.strip() if waiting else "Send a message to go on."),
            )
            if waiting:
                await database_sync_to_async(children.resume_later)(self.tab_id)
            return
        if why := self._cancel_why:
            await self._interrupt(f"Stopped: {why}.")
            await self._system("cancelled", f"Stopped: {why}.")
            return
        await self._interrupt("Cancelled by the user.")
        await self._system("cancelled", "Stopped by the user.")

    async def _end_with_crash(self, exc: BaseException) -> None:
        """A bug (or a failed database or channel layer) ended the turn.

        Pending calls get results, the open block is sealed as it is and an
        error chunk says what happened: never the "interrupted" notice, which
        means a server that stopped. The blocks are written in one append and
        then published, each publish on its own: the channel layer may be
        what failed. When the reducer itself is what broke, its open block is
        dropped (the checkpoint has it until the append clears it).
        """
        if not self.lease_lost and await database_sync_to_async(self._tab_gone)():
            # Deleted mid-turn (the tab page, the admin, wipe_history): its log and
            # lease went with it, so whatever failed was writing to it. Nothing to say.
            logger.info("tab %s was deleted during turn %s", self.tab_id, self.turn_id)
            self.lease_lost = True
            return
        logger.error("turn %s on tab %s crashed", self.turn_id, self.tab_id, exc_info=exc)
        if self.lease_lost or self._crash_logged:
            return
        detail = str(exc)
        if len(detail) > CRASH_MESSAGE_CHARS:
            detail = detail[: CRASH_MESSAGE_CHARS - 1] + "…"
        message = f"Internal error in the turn runner: {type(exc).__name__}: {detail}"
        self._cancel_checkpoint()
        # Deltas in flight go out before the seals that replace them, if the
        # channel layer still works; whatever is left is dropped.
        with suppress(Exception):
            await self._flush_deltas()
        self._discard_deltas()
        self._thinking_since = None
        pending = list(self.reducer.pending_calls)

        def close(reducer: Reducer) -> list[Op]:
            ops = interrupt_ops(reducer, NOT_RUN_CRASHED, running_why=CRASHED_WHILE_RUNNING)
            return ops + reducer.feed(ErrorEvent(message))

        try:
            ops = close(self.reducer)
        except Exception:
            logger.exception("the reducer of turn %s cannot close it", self.turn_id)
            self.reducer = Reducer(self.turn_id, self.reducer.step)
            self.reducer.pending_calls = pending
            ops = close(self.reducer)
        blocks = [op.block for op in ops if isinstance(op, Seal)]
        if self._cp_write is not None:
            # A checkpoint write in flight must land before the append clears it.
            with suppress(Exception):
                await self._cp_write
        await self._append(blocks, clear_checkpoint=True)
        self._crash_logged = True
        self._shown = None
        for block in blocks:
            self.last_seq = block.seq
            if self.history is not None:
                try:
                    self.history.add(block)
                except Exception:
                    # Rebuilt from the log if another turn runs.
                    self.history = None
        for block in blocks:
            try:
                await self.publish({"op": "seal", "block": block.to_dict()})
            except Exception:
                logger.exception("could not publish the end of crashed turn %s", self.turn_id)
                break

    def _discard_deltas(self) -> None:
        """Forget deltas not yet broadcast: the seals that follow replace them."""
        self._cancel_delta_timer()
        self._coalescer.discard()
        self._flushing = None

    async def _interrupt(self, why: str) -> None:
        await self._apply(interrupt_ops(self.reducer, why))

    # --- applying ops -----------------------------------------------------------

    async def _apply(self, ops: list[Op]) -> None:
        for op in ops:
            match op:
                case Delta():
                    # One clock read per delta, for both the coalescer and the debouncer.
                    now = asyncio.get_running_loop().time()
                    self._queue_delta(op, now)
                    self._checkpoint_soon(now)
                case Open(block=block):
                    await self._flush_deltas()
                    if block.type == Kind.THINKING:
                        self._thinking_since = time.monotonic()
                    await self.publish({"op": "open", "block": block.to_dict()})
                    self._shown = block.id
                    self._checkpoint_soon(asyncio.get_running_loop().time())
                case Seal(block=block):
                    await self._flush_deltas()
                    await self._seal(block)

    async def _seal(self, block: Block) -> None:
        self._cancel_checkpoint()
        if block.type == Kind.THINKING and self._thinking_since is not None:
            # Shown as "thought for N s"; never sent to the model.
            block.data["duration_ms"] = round((time.monotonic() - self._thinking_since) * 1000)
            self._thinking_since = None
        if self._cp_write is not None:
            # A checkpoint write in flight must land before the seal clears it.
            with suppress(Exception):
                await self._cp_write
        first = False
        if block.type == Kind.TOOL_CALL:
            call_id = block.data["call_id"]
            # An id repeated within a step keeps its first call's arguments: the repeat
            # is refused (_run_calls), never run with them.
            first = [c for c, _ in self.reducer.pending_calls].count(call_id) <= 1
            if first:
                self._args[call_id] = block.data["arguments"]
            else:
                self._repeat_args.setdefault(call_id, []).append(block.data["arguments"])
        await self._append([block], clear_checkpoint=True)
        if first:
            self._seqs[block.data["call_id"]] = block.seq
        self.last_seq = block.seq
        self.history.add(block)
        await self.publish({"op": "seal", "block": block.to_dict()})
        if self._shown == block.id:
            self._shown = None

    async def _system(self, kind: str, text: str, **extra: Any) -> None:
        ops = self.reducer.feed(SystemEvent(kind, text))
        ops[-1].block.data.update(extra)
        await self._apply(ops)

    async def _status(self) -> None:
        await self._flush_deltas()
        await self.publish({"op": "status", "status": self.status.as_dict()})

    # Delta coalescing (chat.pacing) -------------------------------------------

    def _queue_delta(self, op: Delta, now: float) -> None:
        for message in self._coalescer.add(op.chunk_id, op.offset, op.text, now):
            self._send_delta(message)
        if self._coalescer.due_at is not None and self._delta_timer is None:
            self._delta_timer = asyncio.get_running_loop().call_at(
                self._coalescer.due_at, self._deltas_due
            )

    def _deltas_due(self) -> None:
        self._delta_timer = None
        due_at = self._coalescer.due_at
        if due_at is not None and due_at > asyncio.get_running_loop().time():
            # What this timer was for went out by size; the text waiting now is younger.
            self._delta_timer = asyncio.get_running_loop().call_at(due_at, self._deltas_due)
            return
        if message := self._coalescer.take():
            self._send_delta(message)

    def _send_delta(self, message: dict[str, Any]) -> None:
        previous = self._flushing

        async def send() -> None:
            if previous is not None:
                await previous  # keep deltas in order
            await self.publish(message)

        self._flushing = asyncio.ensure_future(send())

    def _cancel_delta_timer(self) -> None:
        if self._delta_timer is not None:
            self._delta_timer.cancel()
            self._delta_timer = None

    async def _flush_deltas(self) -> None:
        self._cancel_delta_timer()
        if message := self._coalescer.take():
            self._send_delta(message)
        if self._flushing is not None:
            await self._flushing
            self._flushing = None

    # Checkpoints (chat.pacing) ----------------------------------------------------

    def _checkpoint_soon(self, now: float) -> None:
        check_at = self._debouncer.touch(now)
        if check_at is not None:
            self._cp_timer = asyncio.get_running_loop().call_at(check_at, self._checkpoint_due)

    def _checkpoint_due(self) -> None:
        loop = asyncio.get_running_loop()
        check_at = self._debouncer.check(loop.time())
        if check_at is not None:
            self._cp_timer = loop.call_at(check_at, self._checkpoint_due)
            return
        self._cp_timer = None
        if self.reducer.open is None:
            return
        snapshot = self._snapshot()
        previous = self._cp_write

        async def write() -> None:
            if previous is not None:
                with suppress(Exception):
                    await previous
            await self._write_checkpoint(snapshot)

        self._cp_write = asyncio.ensure_future(write())

    def _snapshot(self) -> Block:
        """The open block as it is now, kept from the deltas that follow."""
        block = self.reducer.open
        return Block(block.id, block.turn_id, block.step, block.role, block.type, dict(block.data))

    async def _write_checkpoint(self, snapshot: Block) -> None:
        # Counted once written: a write that fails is sent again by the next one.
        stored = self._cp_stored if snapshot.id == self._cp_block else None
        await database_sync_to_async(log.checkpoint)(self.tab_id, snapshot, stored)
        self._cp_block, self._cp_stored = snapshot.id, len(snapshot.text)

    def _cancel_checkpoint(self) -> None:
        if self._cp_timer is not None:
            self._cp_timer.cancel()
        self._cp_timer = None
        self._debouncer.reset()

    # --- persistence helpers ------------------------------------------------------

    async def _take_queued(self) -> bool:
        """Move waiting user messages into the log, in order. True if there were any."""
        with self._stopping_on_lease_lost():
            blocks, ids = await database_sync_to_async(self._take_queued_sync)()
        if ids:
            # A message from someone present (not a deny wake) makes the turn attended.
            denied = bool(blocks) and all(_deny_wake(b.data) for b in blocks)
            self._unattended = denied and (self._unattended or not self._took_queued)
        self._took_queued = self._took_queued or bool(ids)
        for block in blocks:
            self.last_seq = block.seq
            if self.history is not None:  # None: a crash before it was built
                self.history.add(block)
            await self.publish({"op": "seal", "block": block.to_dict()})
        if ids:
            await self.publish({"op": "taken", "ids": ids})
        return bool(ids)

    def _take_queued_sync(self) -> tuple[list[Block], list[int]]:
        with transaction.atomic():
            queued = list(QueuedMessage.objects.select_for_update().filter(tab_id=self.tab_id))
            # A compaction asked for waits for the turn's end, and what was sent after
            # it for the compaction (_take_compaction).
            queued = list(takewhile(lambda q: not q.compact, queued))
            if not queued:
                return [], []
            # A rerun row (a regenerated branch) starts the turn and adds nothing.
            blocks = [
                Block(uuid.uuid4(), self.turn_id, 0, Role.USER, Kind.TEXT, q.chunk_data())
                for q in queued
                if not q.rerun
            ]
            # Rerun rows alone append nothing: the fence is still what lets this turn
            # take them (a second recovery's rerun is the next runner's), and it holds
            # for the append in this transaction.
            log.fence(self.tab_id, self.turn_id)
            log.append(self.tab_id, blocks)
            QueuedMessage.objects.filter(pk__in=[q.pk for q in queued]).delete()
        refs = [ref for q in queued for ref in q.attachments]
        if refs:
            try:
                root = workdir.ensure(self.workspace, self.cwd)
            except ToolError as exc:
                logger.warning("tab %s: files not placed: %s", self.tab_id, exc)
                refs = []
        for ref in refs:
            blobs.place(root, ref)
        return blocks, [q.pk for q in queued]

    def _take_compaction_sync(self) -> tuple[int, int | None, str] | None:
        with transaction.atomic():
            first = QueuedMessage.objects.select_for_update().filter(tab_id=self.tab_id).first()
            if first is None or not first.compact:
                return None
            log.fence(self.tab_id, self.turn_id)
            taken = (first.pk, first.compact_through, first.text)
            first.delete()
            return taken

    async def _take_compaction(self) -> tuple[int | None, str] | None:
        """A compaction asked for (`/compact`, "summarise up to here") at the head of
        the queue: taken, as (through seq or None for everything, instructions)."""
        with self._stopping_on_lease_lost():
            taken = await database_sync_to_async(self._take_compaction_sync)()
        if taken is None:
            return None
        pk, through, instructions = taken
        self._took_queued = True
        await self.publish({"op": "taken", "ids": [pk]})
        return through, instructions

    async def _set_step(self, step: int) -> None:
        await database_sync_to_async(lease.set_step)(self.tab_id, self.turn_id, step)

    async def _record_usage(
        self, model: str, usage: Usage, kind: str = UsageRecord.Kind.STEP
    ) -> None:
        """Record a request's tokens; a step's are also the tab's context size."""
        self.status.usage = self.status.usage + usage
        tab = await Tab.objects.only("owner_id").aget(pk=self.tab_id)
        await UsageRecord.objects.acreate(
            user_id=tab.owner_id,
            tab_id=self.tab_id,
            turn_id=self.turn_id,
            step=self.reducer.step,
            model=model,
            kind=kind,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
        )
        if kind == UsageRecord.Kind.STEP:
            size = context.Size(
                usage.input_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.output_tokens,
                at=timezone.now().isoformat(),
            )
            await self._set_size(size, model)

    async def _set_size(self, size: context.Size, model: str) -> None:
        self.size = size
        self.status.context = context.meter(size, model).as_dict()
        await Tab.objects.filter(pk=self.tab_id).aupdate(context=size.as_dict())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(lease.HEARTBEAT_SECONDS)
            try:
                # The turn id is read on the database thread: a next turn
                # (release_or_continue) changes it there.
                beat, why = await database_sync_to_async(self._beat)()
            except Exception:
                # A missed beat is survivable (three make the lease stale); a dead
                # heartbeat task is not noticed by anyone.
                logger.exception("heartbeat of tab %s failed", self.tab_id)
                continue
            if beat in ("lost", "gone"):
                self._lose_lease(gone=beat == "gone")
            elif beat == "cancel" and not self.cancelled.is_set():
                # Cancel requested through the database (the control message was lost
                # or is still on its way).
                self.cancel(why=why)

    def _lose_lease(self, lost: log.LeaseLost | None = None, *, gone: bool = False) -> None:
        """Another worker recovered the tab (its runner looked dead): this one stops and
        writes nothing more; sub-agents run on for the turn the recovery resumes. Or the
        tab was deleted, the lease with it: no one to tell, and its sub-agents stop."""
        gone = gone or (lost is not None and lost.gone)
        if not self.lease_lost and gone:
            logger.info("tab %s was deleted; stopping its runner", self.tab_id)
        elif not self.lease_lost:
            logger.error("lease of tab %s was lost; stopping this runner", self.tab_id)
        self.tab_gone = self.tab_gone or gone
        self.lease_lost = True
        self.cancel(stopping=True)

    @contextmanager
    def _stopping_on_lease_lost(self) -> Iterator[None]:
        """Around a fenced database call: LeaseLost stops this runner, then goes on up."""
        try:
            yield
        except log.LeaseLost as exc:
            self._lose_lease(exc)
            raise

    async def _fence(self) -> None:
        """LeaseLost (and this runner stops) unless this turn still holds the tab's lease."""
        with self._stopping_on_lease_lost():
            await database_sync_to_async(self._fence_sync)()

    def _fence_sync(self) -> None:
        with transaction.atomic():
            log.fence(self.tab_id, self.turn_id)

    async def _append(self, blocks: list[Block], *, clear_checkpoint: bool = False) -> None:
        """Into the log, only while this turn holds the tab's lease: a recovery since the
        last heartbeat (a stalled process) closed the turn, and its log is not this
        runner's to add to any more."""
        with self._stopping_on_lease_lost():
            await database_sync_to_async(log.append)(
                self.tab_id, blocks, clear_checkpoint=clear_checkpoint, turn_id=self.turn_id
            )

    def _tab_gone(self) -> bool:
        return not Tab.objects.filter(pk=self.tab_id).exists()

    def _beat(self) -> tuple[str, str]:
        return lease.beat(self.tab_id, self.turn_id)


def _deny_wake(data: dict[str, Any]) -> bool:
    """A message no one is there to approve for: a deny wake's, or the prompt of a
    sub-agent that such a turn started (chat.children.ensure marks it so)."""
    origin = data.get("origin") or {}
    return origin.get("kind") in ("wake", "agent") and origin.get("approval") == "deny"


def _reason(exc: ProviderError) -> str:
    if exc.error_type == STALLED:
        return exc.message
    if exc.status_code == 429:
        return "Rate limited (429)"
    if exc.status_code in (529, 503) or exc.error_type == "overloaded_error":
        return f"Provider overloaded ({exc.status_code or 'in-stream'})"
    if exc.status_code is None:
        return f"Connection failed: {exc.message}"
    return f"Provider error {exc.status_code}"


def _describe_reload(old: TurnConfig, new: TurnConfig) -> str:
    changes = []
    if old.model != new.model:
        changes.append(f"model {old.model} → {new.model}")
    if old.fallback_model != new.fallback_model:
        changes.append(
            f"fallback model {old.fallback_model or 'none'} → {new.fallback_model or 'none'}"
        )
    if old.approve_tools != new.approve_tools:
        changes.append("tool approval " + ("on" if new.approve_tools else "off"))
    if old.max_steps != new.max_steps:
        changes.append(f"step limit {old.max_steps} → {new.max_steps}")
    return "Settings changed: " + ", ".join(changes) + "."
