"""A step's tool calls: each checked (this tab's tools, the permission rules, the
approval setting, the doom-loop guard), approved or refused, then run in order; `agent`
calls start their sub-agents, which run side by side (chat.turn.agents).

Whether a call runs, is refused or waits for the user is `gate`, a pure function of the
rules' decision, the tool, the settings and who is watching; everything else here is
doing what it says.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from contextlib import aclosing
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from django.db import transaction

from chat import blobs, rules, tools
from chat.chunks import SystemKind
from chat.models import PermissionRule, Tab
from chat.providers.base import ShellOutput, ToolResultEvent
from chat.stream import Block
from chat.tools import files, gitrepo, sandbox, workdir
from chat.tools.base import ImageFile
from chat.tools.registry import AGENT
from chat.turn import lease
from chat.turn.agents import Agents, Tasks
from chat.turn.outbox import Outbox
from chat.turn.state import TurnConfig, TurnState
from chat.turn.step import Stepper

logger = logging.getLogger(__name__)

# The same call (name and arguments) this many times in a row in one turn stops and asks
# the user: a model that repeats itself is likely stuck, and each repeat costs a step.
REPEATS_TO_ASK = 3
# What an unattended turn's calls get when they would need an answer.
UNATTENDED = "Not approved: unattended wake turn."
REPEAT_UNATTENDED = (
    "Not run: the same call three times in a row, and no one is there to approve it "
    "(unattended wake turn)."
)
REPEAT_DENIED = "Not run: the same call three times in a row; the user refused to run it again."


class Gate(StrEnum):
    RUN = "run"
    DENY = "deny"  # a deny rule: its text is the result
    ASK = "ask"  # wait for the user's answer
    UNATTENDED = "unattended"  # it would ask, and no one is there: refused


def gate(
    decision: rules.Decision | None,
    tool: str,
    *,
    approve_tools: bool,
    auto_approve: bool,
    unattended: bool,
    repeated: bool = False,
    needs_approval: bool | None = None,
) -> Gate:
    """Whether a call runs. A deny rule refuses it; an ask rule, a tool that always asks
    (unless the message was sent with auto-approval), a tool that needs approval when no
    rule matched and the approval setting is on, or the same call again (`repeated`,
    unless auto-approved) wait for the user, or are refused when no one is there.
    `needs_approval` says it for a tool Dispatch does not know (an external agent's, which
    asked): else the tool registry does."""
    if decision is not None and decision.action == rules.DENY:
        return Gate.DENY
    needs = tools.needs_approval(tool) if needs_approval is None else needs_approval
    asks = (
        (decision is not None and decision.action == rules.ASK)
        or (tools.always_asks(tool) and not auto_approve)
        or (decision is None and approve_tools and not auto_approve and needs)
        or (repeated and not auto_approve)
    )
    if not asks:
        return Gate.RUN
    return Gate.UNATTENDED if unattended else Gate.ASK


@dataclass
class Repeats:
    """The doom-loop guard's count: how many times in a row this turn made its last call
    (same name, same arguments)."""

    last: str = ""
    count: int = 0

    def see(self, name: str, arguments: Any) -> bool:
        """Count this call; True when it is the REPEATS_TO_ASK-th (or later) in a row."""
        key = name + "\0" + json.dumps(arguments, sort_keys=True, default=str)
        self.count = self.count + 1 if key == self.last else 1
        self.last = key
        return self.count >= REPEATS_TO_ASK


async def load_rules(state: TurnState, outbox: Outbox) -> list[rules.Rule]:
    """The tab's rules (read_rules); each problem with them logged and said in the tab."""
    found: list[rules.Rule]
    found, problems = await database_sync_to_async(read_rules)(state.tab_id)
    for problem in problems:
        logger.warning("tab %s: %s", state.tab_id, problem)
        await outbox.system(SystemKind.RULE, problem)
    return found


async def audit(outbox: Outbox, call_id: str, decision: rules.Decision) -> None:
    """A rule decided a call: the log says which (the audit trail)."""
    rule = decision.rule
    await outbox.system(
        SystemKind.RULE,
        decision.text,
        call_id=call_id,
        action=decision.action,
        pattern=rule.pattern,
        source=rule.source,
    )


def resolve_in_tab(state: TurnState, path: str) -> str:
    """Where `path` leads, links followed as the tools follow them: rules judge both."""
    return files.resolve(workdir.ensure(state.workspace, state.cwd), path)


def git_repository(state: TurnState, folder: str) -> rules.GitRepository:
    """What git run in `folder` reads that may name a command: rules judge it."""
    root = workdir.ensure(state.workspace, state.cwd)
    return rules.GitRepository(*gitrepo.read(state.workspace, root, folder))


def read_rules(tab_id: Any) -> tuple[list[rules.Rule], list[str]]:
    """The rules that decide a tab's calls (its own, then its owner's), and why any of
    them cannot be read."""
    tab_rules, owner_id = Tab.objects.values_list("rules", "owner_id").get(pk=tab_id)
    own, problems = rules.parse_all(tab_rules or [], source=rules.TAB)
    rows = PermissionRule.objects.filter(user_id=owner_id).values("action", "pattern")
    users, more = rules.parse_all(rows, source=rules.USER)
    return own + users, problems + more


class Approvals:
    """The one way a call waits for the user: the status says what is asked (the page's
    approval bar, the owner's other pages through the user channel), the lease says
    `waiting`, and Approve or Deny (or Stop) answers. Every driver asks through it."""

    def __init__(self, state: TurnState, outbox: Outbox) -> None:
        self.state = state
        self.outbox = outbox
        # What "always allow" did with an approval, by call id (chat.views.tab_approve).
        self._rules: dict[str, dict[str, Any]] = {}

    def answer(self, call_id: str, approved: bool, rule: dict[str, Any] | None = None) -> bool:
        future = self.state.approvals.get(call_id)
        if future is None or future.done():
            return False
        if rule is not None:
            self._rules[call_id] = rule
        future.set_result(approved)
        return True

    def rule_added(self, call_id: str) -> dict[str, Any] | None:
        """The rule "always allow" added with the answer to this call, if it did."""
        return self._rules.pop(call_id, None)

    async def ask(
        self, call_id: str, name: str, arguments: dict[str, Any], *, repeated: bool = False
    ) -> bool:
        state = self.state
        # A Stop that came while the call was being judged (rules read, notices written)
        # found no future to answer: it would wait for nobody.
        state.check_cancel()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        state.approvals[call_id] = future
        state.status.state = "waiting"
        state.status.approval = {"call_id": call_id, "name": name, "arguments": arguments}
        if repeated:
            state.status.approval["repeated"] = True
        await database_sync_to_async(lease.set_waiting)(state.tab_id, state.turn_id, True)
        await self.outbox.status()
        try:
            return await future
        finally:
            state.approvals.pop(call_id, None)
            state.status.state = "running"
            state.status.approval = None
            await database_sync_to_async(lease.set_waiting)(state.tab_id, state.turn_id, False)
            await self.outbox.status()


class Calls:
    """Runs one runner's tool calls."""

    def __init__(self, state: TurnState, outbox: Outbox, stepper: Stepper, agents: Agents) -> None:
        self.state = state
        self.outbox = outbox
        self.stepper = stepper
        self.agents = agents
        # The names of the tools this turn offered: a call of any other is not run (a
        # profile's allow-list holds for calls, not only for the list sent).
        self.tool_names: frozenset[str] | None = None
        # The permission rules of this turn (the tab's, then its owner's): read at its
        # first tool call, again after "always allow" added one.
        self._rules: list[rules.Rule] | None = None
        self.approvals = Approvals(state, outbox)
        # The arguments of the later calls of this step that repeat an id (some servers
        # repeat ids), in order: each runs with its own.
        self._repeat_args: dict[str, list[dict[str, Any]]] = {}
        self.repeats = Repeats()
        outbox.on_call = self._note_call
        agents.on_step_end = self._repeat_args.clear

    def next_turn(self) -> None:
        self._rules = None
        self.repeats = Repeats()

    def _note_call(self, block: Block) -> bool:
        """A call about to be sealed: its arguments kept for running it. An id repeated
        within a step keeps its first call's arguments; the repeat runs with its own
        (`_run_calls`) or is refused, never run with the first's."""
        call_id = block.data["call_id"]
        first = [c for c, _ in self.state.reducer.pending_calls].count(call_id) <= 1
        if first:
            self.state.args[call_id] = block.data["arguments"]
        else:
            self._repeat_args.setdefault(call_id, []).append(block.data["arguments"])
        return first

    async def run_step(self, config: TurnConfig) -> None:
        """Run the step's calls. Its sub-agents run side by side while its other calls run
        in order; their results go into the log once those are done (no block is open
        then)."""
        if self._rules is None:
            self._rules = await load_rules(self.state, self.outbox)
        await self.agents.with_agents(lambda agents: self._run_calls(config, agents))

    async def _run_calls(self, config: TurnConfig, agents: Tasks) -> None:
        state = self.state
        seen: dict[str, str] = {}
        for call_id, name in list(state.reducer.pending_calls):
            state.check_cancel()
            if call_id in seen:
                # Another call with the id of one before it in this step: run in its turn
                # with its own arguments (its result answers it, the earlier one's being
                # in already), unless either is an `agent` call, whose result comes later.
                repeats = self._repeat_args.get(call_id)
                if AGENT in (name, seen[call_id]) or not repeats:
                    await self._refuse_repeat(agents, call_id, name)
                    continue
                call = repeats.pop(0)
            else:
                seen[call_id] = name
                call = state.args.get(call_id, {})
            if await self._allowed(config, call_id, name, call):
                # A recovery since the last heartbeat may have answered this call already
                # ("not run to completion"): then it is not run. (A stall from here to the
                # tool's start is still possible; the result's append is refused then.)
                await self.outbox.fence()
                if name == AGENT:
                    await self.agents.start(agents, call_id, call)
                else:
                    await self._run_tool(call_id, name, call)

    async def _answer(self, call_id: str, name: str, result: str) -> None:
        event = ToolResultEvent(call_id, name, result, is_error=True)
        await self.outbox.apply(self.state.reducer.feed(event))

    async def _allowed(
        self, config: TurnConfig, call_id: str, name: str, call: dict[str, Any]
    ) -> bool:
        """Whether the call may run now: refused calls are answered here."""
        state = self.state
        repeated = self.repeats.see(name, call)
        if self.tool_names is not None and name not in self.tool_names:
            await self._answer(call_id, name, f"Not run: {name} is not one of this tab's tools.")
            return False
        decision = await asyncio.to_thread(
            rules.decide,
            self._rules or [],
            name,
            call,
            resolve=functools.partial(resolve_in_tab, self.state),
            repository=functools.partial(git_repository, self.state),
        )
        if decision is not None:
            await audit(self.outbox, call_id, decision)
        verdict = gate(
            decision,
            name,
            approve_tools=config.approve_tools,
            auto_approve=state.auto_approve,
            unattended=state.unattended,
            repeated=repeated,
        )
        if verdict == Gate.DENY and decision is not None:
            await self._answer(call_id, name, f"{decision.text}.")
            return False
        if verdict == Gate.UNATTENDED:
            # A wake's turn whose wake says so (or a sub-agent of one): nobody is there to
            # answer.
            asked_only_for_repeat = (
                repeated
                and gate(
                    decision,
                    name,
                    approve_tools=config.approve_tools,
                    auto_approve=state.auto_approve,
                    unattended=True,
                )
                == Gate.RUN
            )
            await self._answer(
                call_id, name, REPEAT_UNATTENDED if asked_only_for_repeat else UNATTENDED
            )
            return False
        if verdict == Gate.ASK:
            if repeated:
                await self.outbox.system(
                    SystemKind.REPEATED_CALL,
                    f"The model made the same {name} call {self.repeats.count} times in a "
                    "row: approve to run it again, deny to refuse it.",
                    call_id=call_id,
                )
            approved = await self.approvals.ask(call_id, name, call, repeated=repeated)
            if added := self.approvals.rule_added(call_id):
                await self.outbox.system(
                    SystemKind.RULE, added["text"], call_id=call_id, **added["rule"]
                )
                self._rules = await load_rules(self.state, self.outbox)
            if not approved:
                await self._answer(
                    call_id, name, REPEAT_DENIED if repeated else "Denied by the user."
                )
                return False
        return True

    async def _refuse_repeat(self, agents: Tasks, call_id: str, name: str) -> None:
        """A call of the step with the id of an `agent` call before it (or an `agent` call
        with an earlier call's id) is not run: the agent's result comes after the step's
        other calls', and a result answers the first open call of its id. Its refusal goes
        after the first call's result (now, unless that is an `agent` call still running)."""
        why = (
            f"Not run: duplicate call id {call_id!r} in this step (an earlier call has it); "
            "each call needs its own id."
        )
        if call_id in agents:
            self.agents.repeats.setdefault(call_id, []).append(why)
            return
        await self._answer(call_id, name, why)

    # --- rules ----------------------------------------------------------------------

    async def _run_tool(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        state = self.state
        if tools.streams_output(name):
            await self._open_output(call_id)

        async def produce(queue: asyncio.Queue[Any]) -> None:
            def on_output(text: str) -> None:
                queue.put_nowait(ShellOutput(call_id, text))

            outcome = await tools.run_tool(
                name,
                arguments,
                state.workspace,
                on_output=on_output,
                policy=sandbox.policy_from(django_settings),
                cwd=state.cwd,
                tab_id=state.tab_id,
                owner_id=state.owner_id,
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

        async with aclosing(self.stepper.produced(produce)) as events:
            async for event in events:
                await self.outbox.apply(state.reducer.feed(event))

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
            blobs.attach(self.state.tab_id, blob, normalised.name, sent=True)
        if not image.path:
            # In no file (an MCP tool's): placed where a message's file would be, so a
            # model that cannot see images is told the truth about where it is.
            blobs.place(self.state.workspace, normalised.ref())
            return normalised.ref()
        return {**normalised.ref(), "path": image.path}

    async def _open_output(self, call_id: str) -> None:
        """Open the shell call's output block before the command starts, and
        checkpoint it at once. A command that has printed nothing yet is still
        running: a Stop or a server that dies then must leave a result that says
        so (its output key, even empty), not one of a call never run, which
        Continue would tell the model it can run again."""
        await self.outbox.apply(self.state.reducer.feed(ShellOutput(call_id, "")))
        await self.outbox.checkpoint_now()
