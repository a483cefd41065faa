"""Sub-agents: the `agent` tool's child tabs, made, watched, read and stopped; and the
runner's side of an `agent` call (`Agents`: start, follow, answer, re-attach).

A child is a normal tab (`parent_tab`, `parent_call_id`) whose id is
`uuid5(parent tab id, "call id@seq of the call's chunk")`: `ensure` finds the child a call
made before (a parent whose worker died and whose turn was resumed) instead of making a
second, and a later call that repeats an id (providers do) makes its own. Its prompt
goes through the QueuedMessage table like any message, with
`origin = {kind: agent, parent_tab, call_id}`, so the child runs under its own lease
on any worker, with its own log, page and admin view.

A child can do no more than its parent: the model chose its `profile`, so the profile
narrows the parent tab's tools and adds its deny and ask rules to the parent's rules,
never its allow rules (`inherited_rules`); it works in the parent's folder; a child of an
unattended (deny) wake turn is unattended too; trees stop at DISPATCH_CHILD_MAX_DEPTH.

`wait` follows the child's turn until it ends: the child's tab group on the channel
layer for its live status (step, approval), and the database every POLL_SECONDS, so a
lost message can delay the parent by that much, never hang it. What the turn ended
with is read from the child's log (`read`), the one source of truth, so a parent that
re-attaches after a crash reads a finished child's result the same way.

Sync functions are ORM code (call them with database_sync_to_async); `wait` is async.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from chat import bus, log, preferences, resume, rules
from chat import usage as chat_usage
from chat.chunks import Kind, OriginKind, Role, SystemKind
from chat.models import (
    Chunk,
    Profile,
    QueuedMessage,
    RunningTurn,
    Tab,
    UsageRecord,
    agent_child_id,
    agent_children,
)
from chat.providers.base import ToolResultEvent
from chat.stream import Block, Reducer
from chat.tools import shell, toolset
from chat.tools.registry import AGENT, AGENT_SCHEMA, check_arguments
from chat.tools.workdir import BadWorkdir
from chat.turn import lease
from chat.turn.ending import End, end_ops, last_sealed, sealed
from chat.turn.outbox import Outbox
from chat.turn.state import TurnState, unattended_message

logger = logging.getLogger(__name__)

# How often a waiting parent reads its child's state from the database, whatever the
# channel layer says: the bound on how late a lost "idle" makes the parent.
POLL_SECONDS = 2.0
# How long a parent that stops a child (a cap, its own Stop) waits for the child's
# turn to end, so the usage it reports is the child's whole: the child's runner ends
# within a heartbeat of the cancel (lease.HEARTBEAT_SECONDS) even if the control
# message is lost.
CANCEL_WAIT_SECONDS = 15.0
# What a child that finished without a word returns: said, not an empty result the
# model could take for a failure to run.
NO_TEXT = "(the sub-agent returned no text)"
# A child's title is its call's description, cut to what a tab's title holds.
TITLE_CHARS = 200
# The ways a child's turn ends that are not a finished task, and what the parent is told.
FAILURES = {
    SystemKind.CANCELLED: "it was stopped",
    SystemKind.INTERRUPTED: "its server stopped in the middle of its turn",
    SystemKind.STEP_LIMIT: "it stopped at its step limit ({steps} steps)",
    SystemKind.OUTPUT_LIMIT: "its answer was cut off at the model's output limit",
    SystemKind.CONTEXT_LIMIT: "it filled its model's context window",
}


def child_id(parent_id: uuid.UUID | str, call_id: str, call_seq: int) -> uuid.UUID:
    """The id of the child the `agent` call at `call_seq` of that tab's log makes: the same
    on every try, another for each call however the provider names them."""
    return agent_child_id(parent_id, call_id, call_seq)


def is_child(tab: Tab) -> bool:
    """A sub-agent's tab (made by an `agent` call; kept if its parent is deleted)."""
    return bool(tab.parent_call_id)


def may_nest(tab: Tab) -> bool:
    """Whether the tab is offered the `agent` tool: every tab but a child, unless the
    child's profile allows nesting (a tree of agents is a profile's deliberate choice)."""
    if not is_child(tab):
        return True
    return bool(
        tab.profile_id and Profile.objects.filter(pk=tab.profile_id, allow_nesting=True).exists()
    )


def call_arguments(tab_id: uuid.UUID, call_ids: list[str]) -> dict[str, tuple[int, Any]]:
    """The seq and arguments of these calls in the tab's log, by call id (the last call of
    an id: an open call is in the log's last answer)."""
    rows = Chunk.objects.filter(
        tab_id=tab_id, type=Kind.TOOL_CALL, data__call_id__in=call_ids
    ).order_by("seq")
    return {row.data["call_id"]: (row.seq, row.data.get("arguments") or {}) for row in rows}


def made(tab_id: uuid.UUID, calls: list[tuple[str, int]]) -> set[str]:
    """Which of these calls (call id, seq of its chunk) of the tab made a child."""
    return {call_id for call_id, _ in agent_children(tab_id, calls)}


def depth(tab: Tab) -> int:
    """How many tabs up its tree of sub-agents the tab is (0: not a sub-agent)."""
    levels, parent = 0, tab.parent_tab_id
    while parent is not None and levels <= settings.DISPATCH_CHILD_MAX_DEPTH:
        levels += 1
        parent = Tab.objects.filter(pk=parent).values_list("parent_tab_id", flat=True).first()
    return levels


def resume_later(tab_id: uuid.UUID) -> None:
    """Have the tab's next turn start without a message, to answer its open `agent` calls
    (the runner re-attaches to their children at a turn's start)."""
    QueuedMessage.objects.create(tab_id=tab_id, rerun=True)


def bad_arguments(arguments: Any) -> str | None:
    """What is wrong with an `agent` call's arguments, for the model; None when fine."""
    problem = check_arguments(AGENT_SCHEMA, arguments)
    if problem is not None:
        return f"invalid arguments for {AGENT}: {problem}"
    for key in ("description", "prompt"):
        if not arguments[key].strip():
            return f"invalid arguments for {AGENT}: argument '{key}' must not be blank"
    profile = arguments.get("profile")
    if profile is not None and not profile.strip():
        return f"invalid arguments for {AGENT}: argument 'profile' must not be blank"
    return None


def ensure(
    parent_id: uuid.UUID,
    call_id: str,
    arguments: dict[str, Any],
    *,
    call_seq: int,
    unattended: bool = False,
    turn_id: uuid.UUID | None = None,
) -> tuple[Tab, bool]:
    """The child of this call (the `agent` call at `call_seq` of the parent's log), made
    and given its prompt if it does not exist yet, and whether it was made now. Its
    prompt and model are its profile's (the `profile` argument), or else its parent's;
    its tools and rules are its parent's, narrowed by that profile; its folder is its
    parent's. `unattended`: the
    parent's turn has no one to answer an approval (a deny wake's), nor has the child's.
    ValueError (for the model) for an unknown profile, one that shares no tool with the
    parent, a tree too deep or a folder that cannot be used."""
    with transaction.atomic():
        if turn_id is not None:
            # The parent's turn (its runner stalled past its heartbeat) may have been
            # recovered, its call answered: no child for a call no one waits for.
            log.fence(parent_id, turn_id)
        parent = Tab.objects.select_for_update().get(pk=parent_id)
        made = agent_children(parent_id, [(call_id, call_seq)]).get((call_id, call_seq))
        if made is not None:
            return Tab.objects.get(pk=made), False
        pk = child_id(parent_id, call_id, call_seq)
        limit = settings.DISPATCH_CHILD_MAX_DEPTH
        if depth(parent) + 1 > limit:
            raise ValueError(
                f"sub-agents nest at most {limit} deep (the limit DISPATCH_CHILD_MAX_DEPTH), "
                f"and this tab is already {depth(parent)} deep"
            )
        title = " ".join(arguments["description"].split())[:TITLE_CHARS]
        family = {"id": pk, "parent_tab": parent, "parent_call_id": call_id}
        child = _new_child(parent, (arguments.get("profile") or "").strip(), title, family)
        origin = {"kind": OriginKind.AGENT, "parent_tab": str(parent_id), "call_id": call_id}
        if unattended:
            origin["approval"] = "deny"
        queued = QueuedMessage.objects.create(
            tab=child, text=arguments["prompt"].strip(), origin=origin
        )

        # As turns.submit does: the page of the child, if open, sees it queued, and a
        # worker is asked once the row is there to take.
        def tell() -> None:
            bus.publish(child.pk, {"op": "queued", "id": queued.pk, "text": queued.text})
            bus.request_run(child.pk)

        transaction.on_commit(tell)
    return child, True


def _new_child(parent: Tab, profile_name: str, title: str, family: dict[str, Any]) -> Tab:
    """The child tab: with `profile_name`'s prompt, model and narrowed tools and rules, or
    else as its parent's own copy."""
    if profile_name:
        profile = preferences.profile_named(profile_name)
        allow = confined(parent, list(profile.tools), profile_name)
        try:
            child = preferences.new_tab(
                parent.owner,
                profile.model or parent.model,
                profile=profile,
                workdir=parent.workdir,
                title=title,
                profile_by_model=True,
                **family,
            )
        except BadWorkdir as exc:
            raise ValueError(str(exc)) from exc
        child.tool_allow, child.rules = allow, inherited_rules(parent, profile)
        child.save(update_fields=["tool_allow", "rules"])
        return child
    # The parent's own copy (what a branch keeps): its prompt already holds AGENTS.md,
    # and its profile may have changed since it was made.
    return Tab.objects.create(
        owner_id=parent.owner_id,
        title=title,
        model=parent.model,
        system_prompt=parent.system_prompt,
        tool_allow=parent.tool_allow,
        rules=inherited_rules(parent, None),
        workdir=parent.workdir,
        profile_id=parent.profile_id,
        profile_by_model=parent.profile_by_model,
        **family,
    )


def inherited_rules(parent: Tab, profile: Profile | None) -> list[dict[str, Any]]:
    """A child's rules: the deny and ask rules of the profile the model chose for it, then
    every rule of its parent tab, each marked with where it came from (the audit names
    it). The profile's allow rules are left out: a person never chose that profile for
    this tab, so they would let the model give its child what the parent's tab would have
    asked about. The parent's allow rules hold (the child may do what its parent may),
    and its deny and ask rules too, so the child's decisions are at most the parent's."""
    own: list[dict[str, Any]] = [
        {"action": r.action, "pattern": r.pattern, "source": rules.PROFILE}
        for r in (profile.rules.all() if profile is not None else [])
        if r.action != rules.ALLOW
    ]
    kept = [
        {"action": r.get("action"), "pattern": r.get("pattern"), "source": rules.PARENT}
        for r in parent.rules or []
        if isinstance(r, dict)
    ]
    return own + kept


def confined(parent: Tab, allow: list[str], name: str) -> list[str]:
    """The allow-list of a child with a profile whose allow-list is `allow`: at most its
    parent tab's tools (by name, as the parent has them now). ValueError when they share
    none: a child with nothing to call would only talk."""
    if not parent.tool_allow:
        return allow  # the parent may use every tool: the profile's list holds alone
    entries = (
        parent.tools
        if parent.tools is not None
        else toolset.freeze(toolset.builtin_entries(), parent.tool_allow)
    )
    kept = [e["name"] for e in entries if toolset.allowed(e["name"], allow)]
    if not [n for n in kept if n != AGENT]:
        raise ValueError(f"profile “{name}” allows none of this tab's tools")
    return kept


@dataclass
class Outcome:
    """A child's turn as its log and lease say. `state`: queued, running, waiting (for
    an approval), done, or gone (the tab, or its message, was deleted)."""

    state: str
    title: str = ""
    step: int = 0
    # Once done: how the turn ended (completed, error, or a key of FAILURES), the text
    # of its final step, the error's message, and its usage (chat.usage Totals as_dict).
    status: str = ""
    text: str = ""
    error: str = ""
    usage: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.state in ("done", "gone")


def read(tab_id: uuid.UUID, call_id: str) -> Outcome:
    """Where the child's turn started by this call is, from the database."""
    title = Tab.objects.filter(pk=tab_id).values_list("title", flat=True).first()
    if title is None:
        return Outcome("gone", status="gone")
    if QueuedMessage.objects.filter(tab_id=tab_id, origin__call_id=call_id).exists():
        return Outcome("queued", title)
    start = (
        Chunk.objects.filter(tab_id=tab_id, role=Role.USER, data__origin__call_id=call_id)
        .values_list("turn_id", flat=True)
        .first()
    )
    if start is None:
        return Outcome("gone", title, status="gone")
    running = (
        RunningTurn.objects.filter(tab_id=tab_id, turn_id=start)
        .exclude(status=RunningTurn.Status.FINISHING)
        .first()
    )
    if running is not None:
        return Outcome(running.status, title, running.step)
    turn = list(Chunk.objects.filter(tab_id=tab_id, turn_id=start).order_by("seq"))
    ending = resume.ending(turn)
    if ending is None:
        status, error = "completed", ""
    elif ending.type == Kind.ERROR:
        status, error = "error", str(ending.data.get("message") or "")
    else:
        status, error = ending.data["kind"], str(ending.data.get("text") or "")
    totals = chat_usage.turn_totals(tab_id, [start]).get(start, chat_usage.Totals())
    # A last step that answered nothing left no chunk: its request's usage says it was.
    asked = UsageRecord.objects.filter(
        tab_id=tab_id, turn_id=start, kind=UsageRecord.Kind.STEP
    ).aggregate(last=Max("step"))["last"]
    step = max([c.step for c in turn] + [asked or 0])
    return Outcome("done", title, step, status, final_text(turn, step), error, totals.as_dict())


def final_text(turn: list[Chunk], last_step: int | None = None) -> str:
    """Every text block of the turn's last step, joined: a model often writes its result in
    several blocks around its thinking or its last calls. An attempt cut off and retried
    (a `retry` notice) is left out, as history leaves it out. `last_step`: the turn's
    last step when known (an empty one has no chunk): "" when it answered nothing, not
    the step before's preamble to its calls."""
    answered = [c for c in turn if c.role == Role.ASSISTANT]
    if not answered:
        return ""
    step = answered[-1].step if last_step is None else last_step
    texts: list[str] = []
    for chunk in turn:
        if chunk.step != step:
            continue
        if chunk.type == Kind.SYSTEM and chunk.data.get("retry"):
            texts = []
        elif chunk.role == Role.ASSISTANT and chunk.type == Kind.TEXT and chunk.data.get("text"):
            texts.append(chunk.data["text"].strip())
    return "\n\n".join(text for text in texts if text)


@dataclass(frozen=True)
class Result:
    """The `agent` call's result: the tool result's text and whether it is an error."""

    text: str
    is_error: bool
    child_tab: str
    status: str
    # Bytes of the child's text left out (capped as a shell command's output is).
    truncated_bytes: int = 0


def capped(text: str) -> tuple[str, int]:
    """The child's text within the shell's output cap (the model's context pays for it):
    past it, its start and its end with the shell's note of what was dropped between;
    and how many bytes were."""
    data = text.encode()
    if len(data) <= shell.OUTPUT_CAP:
        return text, 0
    head = data[: shell.OUTPUT_HEAD].decode(errors="ignore")
    tail = data[-shell.OUTPUT_TAIL :].decode(errors="ignore")
    dropped = len(data) - len(head.encode()) - len(tail.encode())
    return head + shell.DROP_MARKER.format(dropped=dropped) + tail, dropped


def result(tab_id: uuid.UUID, title: str, outcome: Outcome, *, why: str = "") -> Result:
    """The call's result for a child's turn that ended (or was ended by a cap: `why`,
    which makes it an error whatever the child's own ending): the final step's text,
    then `{child_tab, status, usage}` as JSON on the last line."""
    name = f"Sub-agent “{title}” (tab {tab_id})"
    status = outcome.status
    if why:
        head, is_error = f"{name} {why}.", True
    elif status == "completed":
        head, is_error = "", False
    elif status == "gone":
        head, is_error = f"{name} was deleted before it finished: no result.", True
    elif status == "error":
        head, is_error = f"{name} stopped on an error: {outcome.error.rstrip('.')}.", True
    else:
        reason = FAILURES.get(status, status).format(steps=outcome.step)
        head, is_error = f"{name} did not finish: {reason}.", True
    text, dropped = capped(outcome.text or ("" if is_error else NO_TEXT))
    if is_error and text:
        text = f"Its last text:\n\n{text}"
    tail = json.dumps(
        {"child_tab": str(tab_id), "status": status or "stopped", "usage": outcome.usage},
        sort_keys=True,
    )
    body = "\n\n".join(part for part in (head, text, tail) if part)
    return Result(body, is_error, str(tab_id), status, dropped)


def cancel(tab_id: uuid.UUID, call_id: str | None = None, why: str = "") -> bool:
    """Stop the child's running turn, as its own Stop button does. `why`: what its log says
    stopped it (its parent's Stop, a cap); "" for its user's own Stop (turns.cancel, when
    no turn runs). A child whose prompt (the one `call_id` sent; for its user, any) no
    worker took yet is stopped before it starts: under the tab's lock (a worker takes the
    lease under it), the prompt goes into its log as a turn of its own that ends
    `cancelled`, so read() says so and nothing runs it."""
    with transaction.atomic():
        if not Tab.objects.select_for_update().filter(pk=tab_id).exists():
            return False
        if lease.request_cancel(tab_id, why=why):
            message = {"type": "turn.cancel", "tab_id": str(tab_id), "why": why}
            transaction.on_commit(lambda: bus.group_send(bus.control_group(tab_id), message))
            return True
        waiting = QueuedMessage.objects.filter(tab_id=tab_id, origin__kind=OriginKind.AGENT)
        if call_id is not None:
            waiting = waiting.filter(origin__call_id=call_id)
        queued = list(waiting)
        if not queued:
            return False
        turn_id = uuid.uuid4()
        blocks = [
            Block(uuid.uuid4(), turn_id, 0, Role.USER, Kind.TEXT, q.chunk_data()) for q in queued
        ]
        blocks += sealed(end_ops(Reducer(turn_id), End.stopped_before_start(why)))
        log.append(tab_id, blocks)
        ids = [q.pk for q in queued]
        QueuedMessage.objects.filter(pk__in=ids).delete()

        def tell() -> None:
            for block in blocks:
                bus.publish(tab_id, {"op": "seal", "block": block.to_dict()})
            bus.publish(tab_id, {"op": "taken", "ids": ids})

        transaction.on_commit(tell)
    return True


# What a child stopped by its parent's Stop says in its own log.
STOPPED_TEXT = "its parent was stopped"


# `wait`'s word that the parent's turn is stopping.
STOPPED = "stopped"

OnStatus = Callable[[dict[str, Any]], Awaitable[None]]


async def wait(
    tab_id: uuid.UUID,
    call_id: str,
    on_status: OnStatus,
    *,
    timeout: float,
    cancelled: asyncio.Event,
    limit: float | None = None,
) -> tuple[Outcome, str]:
    """Follow the child's turn until it ends, `timeout` passes (the child is stopped), or
    `cancelled` is set (STOPPED: the caller decides whether the child stops too); returns
    what the log says then and why the parent stopped waiting ("" when the child's turn
    ended by itself). `on_status` gets the child's live status: {state, step, approval,
    children} (the database poll's only {state, step}, and approval None once the child
    no longer waits)."""
    layer = get_channel_layer()
    inbox = _ChildInbox()
    # The snapshot's answer comes to `channel`, the child's ops to `ops_channel`: one
    # channel unless the tab group is on a layer of its own (bus.layer_for).
    channel = await layer.new_channel()
    group = bus.tab_group(tab_id)
    ops = bus.layer_for(group)
    ops_channel = channel if ops is layer else await ops.new_channel()
    await ops.group_add(group, ops_channel)
    listeners = [asyncio.create_task(inbox.listen(layer, channel))]
    if ops_channel != channel:
        listeners.append(asyncio.create_task(inbox.listen(ops, ops_channel)))
    # The child's runner says what it waits for now (its approval, its own children), which
    # a parent that starts following late (re-attached after a crash) has no other way to
    # learn: the runner publishes a status only when it changes.
    await layer.group_send(
        bus.control_group(tab_id),
        {"type": "turn.snapshot", "reply_to": channel, "tab_id": str(tab_id)},
    )
    deadline = asyncio.get_running_loop().time() + timeout
    stopping = asyncio.create_task(cancelled.wait())
    seconds = f"{timeout if limit is None else limit:g} s"
    try:
        while True:
            outcome = await database_sync_to_async(read)(tab_id, call_id)
            if outcome.done:
                return outcome, ""
            # The database knows the state and step, not what a waiting child asks: its
            # approval stays as the child's last status said, until the state changes.
            polled: dict[str, Any] = {"state": outcome.state, "step": outcome.step}
            if outcome.state != "waiting":
                polled["approval"] = None
            await on_status(polled)
            why = await _listen_a_while(inbox.queue, stopping, deadline, on_status)
            if why == _TIMED_OUT:
                return await stop(
                    tab_id,
                    call_id,
                    f"ran out of time ({seconds})",
                    f"its parent's time limit for it ({seconds}) ran out",
                )
            if why == STOPPED:
                return outcome, STOPPED
    finally:
        stopping.cancel()
        for listener in listeners:
            listener.cancel()
            with suppress(BaseException):
                await listener
        with suppress(Exception):
            await ops.group_discard(group, ops_channel)


class _ChildInbox:
    """The child's ops and its snapshot's answer, in the order they come. Once a status op
    has come, the runner's ops say all: a snapshot answered before it may arrive after it
    (the two travel on two layers) and would show a stale approval."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.heard_status = False

    async def listen(self, layer: Any, channel: str) -> None:
        while True:
            message = await layer.receive(channel)
            if message.get("op") == "status":
                self.heard_status = True
            elif message.get("type") == "tab.snapshot" and self.heard_status:
                continue
            self.queue.put_nowait(message)


# `_listen_a_while`'s word that the parent's time limit for the child ran out.
_TIMED_OUT = "timed out"


async def _listen_a_while(
    inbox: asyncio.Queue[dict[str, Any]],
    stopping: asyncio.Task[Any],
    deadline: float,
    on_status: OnStatus,
) -> str:
    """Pass the child's live statuses on for up to POLL_SECONDS: "" when it is time to
    read the database again (the child went idle, or the time is up), STOPPED when the
    parent stops, _TIMED_OUT at the deadline."""
    loop = asyncio.get_running_loop()
    polled_at = loop.time()
    while loop.time() - polled_at < POLL_SECONDS:
        left = deadline - loop.time()
        if left <= 0:
            return _TIMED_OUT
        getting = asyncio.ensure_future(inbox.get())
        done, _ = await asyncio.wait(
            {getting, stopping},
            timeout=min(left, POLL_SECONDS - (loop.time() - polled_at)),
            return_when=asyncio.FIRST_COMPLETED,
        )
        if stopping in done:
            getting.cancel()
            return STOPPED
        if getting not in done:
            getting.cancel()
            continue
        message = getting.result()
        if message.get("op") != "status" and message.get("type") != "tab.snapshot":
            continue
        status = message.get("status") or {}
        if not status:
            continue  # a snapshot from a runner without a turn
        if status.get("state") == "idle":
            return ""  # read its ending from the log
        await on_status(live_status(status))
    return ""


def live_status(status: dict[str, Any]) -> dict[str, Any]:
    """What the parent shows of its child's runner status: its state, step and approval,
    and, when a profile lets the child have children of its own, theirs (each with its
    own approval and children: a tree's every approval reaches the top tab)."""
    return {
        "state": status.get("state", "running"),
        "step": status.get("step", 0),
        "approval": status.get("approval"),
        "children": [
            {k: entry.get(k) for k in CHILD_KEYS if k in entry}
            for entry in status.get("children") or []
            if isinstance(entry, dict)
        ],
    }


# What an entry of a status's `children` holds (chat.turn.state.TurnStatus.children).
CHILD_KEYS = ("tab", "title", "call_id", "state", "step", "approval", "children")


async def stop(
    tab_id: uuid.UUID, call_id: str, why: str, child_why: str = STOPPED_TEXT
) -> tuple[Outcome, str]:
    """Stop the child (it writes its own `cancelled` chunk, saying `child_why`) and wait a
    little for its turn to end, so what it wrote and used is in the result. `why`: what
    the parent is told."""
    await database_sync_to_async(cancel)(tab_id, call_id, child_why)
    loop = asyncio.get_running_loop()
    until = loop.time() + CANCEL_WAIT_SECONDS
    outcome = await database_sync_to_async(read)(tab_id, call_id)
    while not outcome.done and loop.time() < until:
        await asyncio.sleep(min(POLL_SECONDS, 0.2))
        outcome = await database_sync_to_async(read)(tab_id, call_id)
    return outcome, why


# --- the runner's side of `agent` calls ---------------------------------------------

Tasks = dict[str, "asyncio.Task[Result | None]"]


class Agents:
    """One runner's `agent` calls: each child started (or found) and followed side by
    side with the step's other calls, its result into the log as it ends."""

    def __init__(self, state: TurnState, outbox: Outbox) -> None:
        self.state = state
        self.outbox = outbox
        # Calls of this step refused for repeating an `agent` call's id, by that id: their
        # results go into the log right after its (a result answers the first open call
        # of its id).
        self.repeats: dict[str, list[str]] = {}
        # Run when a step's calls are done (or cut short): its other bookkeeping goes.
        self.on_step_end: Callable[[], None] | None = None

    async def with_agents(self, start: Callable[[Tasks], Awaitable[None]]) -> None:
        """Run `start`, which may start `agent` calls, then answer those as they end."""
        agents: Tasks = {}
        try:
            await start(agents)
            await self._results(agents)
        finally:
            if any(not task.done() for task in agents.values()):
                # Cut short (a Stop, a crash): the children are stopped (or, when this
                # worker stops, left running for the resumed turn) before the turn ends.
                self.state.agents_stop.set()
                await asyncio.gather(*agents.values(), return_exceptions=True)
            self.state.status.children.clear()
            self.repeats.clear()
            if self.on_step_end is not None:
                self.on_step_end()

    async def start(self, agents: Tasks, call_id: str, call: Any) -> None:
        """Start waiting for the call's child (made now, or found: a resumed turn's); a
        call that cannot start one is answered at once."""
        problem = bad_arguments(call)
        if problem is None and len(agents) >= settings.DISPATCH_CHILD_CONCURRENCY:
            problem = (
                f"Not run: too many sub-agents at once (at most "
                f"{settings.DISPATCH_CHILD_CONCURRENCY} in one step). Call it again "
                "once these have returned."
            )
        if problem is not None:
            event = ToolResultEvent(call_id, AGENT, problem, True)
            await self.outbox.apply(self.state.reducer.feed(event))
            return
        seq = self.state.seqs.get(call_id)
        if seq is None:  # never: every call is sealed, or read back, before it runs
            raise RuntimeError(f"agent call {call_id!r} is not in the log")
        agents[call_id] = asyncio.create_task(self._agent(call_id, call, seq))

    async def _agent(self, call_id: str, call: dict[str, Any], seq: int) -> Result | None:
        """Run one `agent` call (its chunk at `seq`): its child made (or found), followed
        until its turn ends or a cap stops it; its result. None when this worker stops:
        the call stays open for the resumed turn, the child running on."""
        state = self.state
        try:
            child, _ = await database_sync_to_async(ensure)(
                state.tab_id,
                call_id,
                call,
                call_seq=seq,
                unattended=state.unattended,
                turn_id=state.turn_id,
            )
        except log.LeaseLost as exc:
            state.lose_lease(gone=exc.gone)
            return None
        except ValueError as exc:
            return Result(f"Not run: {exc}", True, "", "not-started")
        entry: dict[str, Any] = {
            "tab": str(child.pk),
            "title": child.title,
            "call_id": call_id,
            "state": "queued",
            "step": 0,
            "approval": None,
        }
        state.status.children[call_id] = entry

        async def on_status(live: dict[str, Any]) -> None:
            if {k: entry.get(k) for k in live} != live:
                entry.update(live)
                await self.outbox.status()

        limit = settings.DISPATCH_CHILD_TIMEOUT
        outcome, why = await wait(
            child.pk,
            call_id,
            on_status,
            timeout=max(limit - await self._spent(seq), 0.0),
            limit=limit,
            cancelled=state.agents_stop,
        )
        if why == STOPPED:
            if state.stopping and not state.tab_gone:
                return None
            outcome, why = await stop(
                child.pk,
                call_id,
                "was stopped with its parent",
                "its parent was deleted" if state.tab_gone else STOPPED_TEXT,
            )
            if state.tab_gone:
                return None  # no log to answer in
        return result(child.pk, child.title, outcome, why=why)

    async def _spent(self, seq: int) -> float:
        """Seconds since the call at `seq` was made. The limit runs from the call, not
        from this wait: a turn resumed after a crash (or several) gives its child no more
        time than the first."""
        called = (
            await Chunk.objects.filter(tab_id=self.state.tab_id, seq=seq)
            .values_list("created_at", flat=True)
            .afirst()
        )
        if called is None:
            return 0.0
        return max((timezone.now() - called).total_seconds(), 0.0)

    async def reattach(self) -> None:
        """Answer the `agent` calls a stopped turn left open (its worker died or shut down
        while their children ran on): each waits for the child it made, never a new one."""
        state = self.state
        open_calls = [c for c in state.history_built.open_calls() if c[1] == AGENT]
        if not open_calls:
            return
        ids = [call_id for call_id, _ in open_calls]
        found = await database_sync_to_async(call_arguments)(state.tab_id, ids)
        for call_id, (seq, arguments) in found.items():
            state.seqs[call_id], state.args[call_id] = seq, arguments
        if not state.unattended:
            seqs = [seq for seq, _ in found.values()]
            state.unattended = await database_sync_to_async(self._resumes_unattended)(seqs)
        state.reducer.pending_calls.extend(open_calls)

        async def start(agents: Tasks) -> None:
            for call_id in ids:
                await self.start(agents, call_id, state.args.get(call_id, {}))

        await self.with_agents(start)

    def _resumes_unattended(self, seqs: list[int]) -> bool:
        """Whether this turn, which took no message (a rerun after a recovery or a
        shutdown), goes on with a turn no one attends: the messages of the turn that made
        the calls at `seqs` all come from a deny wake (or a child of one), whose policy
        holds for the rest of that work, its new children's too."""
        state = self.state
        users = Chunk.objects.filter(tab_id=state.tab_id, role=Role.USER)
        if users.filter(turn_id=state.turn_id).exists():
            return False  # someone sent a message since: they attend it
        started = Chunk.objects.filter(tab_id=state.tab_id, seq__in=seqs).values("turn_id")
        messages = list(users.filter(turn_id__in=started).values_list("data", flat=True))
        return bool(messages) and all(unattended_message(data) for data in messages)

    async def _results(self, agents: Tasks) -> None:
        """The step's children's results, each into the log as it comes."""
        state = self.state
        waiting = set(agents.values())
        by_task = {task: call_id for call_id, task in agents.items()}
        while waiting:
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                call_id = by_task[task]
                outcome = task.result()
                state.status.children.pop(call_id, None)
                if outcome is None or state.lease_lost:
                    continue  # this worker stops: answered by the interrupt, or resumed
                ops = state.reducer.feed(
                    ToolResultEvent(
                        call_id,
                        AGENT,
                        outcome.text,
                        outcome.is_error,
                        bool(outcome.truncated_bytes),
                        truncated_bytes=outcome.truncated_bytes,
                    )
                )
                if outcome.child_tab:
                    block = last_sealed(ops)
                    block.data["child_tab"] = outcome.child_tab
                    block.data["child_status"] = outcome.status
                await self.outbox.apply(ops)
                for why in self.repeats.pop(call_id, []):
                    event = ToolResultEvent(call_id, AGENT, why, True)
                    await self.outbox.apply(state.reducer.feed(event))
                await self.outbox.status()
        state.check_cancel()
