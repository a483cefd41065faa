"""The ACP driver: a tab whose model is `acp/<name>` runs an external agent (Claude Code,
Codex, any ACP agent) instead of the model's own loop (ARCHITECTURE.md, "External agents").

A turn is one `session/prompt`: the turn's messages (taken through Messages, so they are in
the log first) sent as content blocks; every `session/update` mapped by chat.acp.updates
into the reducer's events and applied through the outbox, as a provider's stream is; each
`session/request_permission` judged by the tab's rules and answered through Dispatch's own
approvals (calls.gate, Approvals.ask); the response's usage recorded. The prompt runs as the
state's producer task (Stepper.produced): Stop cancels it, and the agent is told
`session/cancel`.

The agent session is kept per tab (`Sessions`, one per event loop): started at the tab's
first turn, reused by the next, closed gracefully once idle for ACP_IDLE_SECONDS or when the
worker stops. Its ACP session id is kept on the tab (`Tab.acp_session`), so after a restart
the agent is started with `resume` and restores its context by `session/load`.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from channels.db import database_sync_to_async

from chat import blobs, rules
from chat.acp import config as acp_config
from chat.acp.seam import AgentConfig, AgentError, AgentSession
from chat.chunks import Kind, Role, SystemKind, UserText
from chat.models import Chunk, Tab
from chat.providers.base import Event, upload_path
from chat.turn import lease
from chat.turn.calls import (
    Approvals,
    Gate,
    Repeats,
    audit,
    gate,
    git_repository,
    load_rules,
    resolve_in_tab,
)
from chat.turn.ending import NOT_RUN_ERROR, End, Ending, end_ops
from chat.turn.messages import Messages
from chat.turn.outbox import Outbox
from chat.turn.state import TurnCancelled, TurnConfig, TurnState
from chat.turn.step import STOP_NOTICES, Stepper

# The ACP SDK (its schema: half a second of pydantic models) is imported by the turns that
# run an agent, not by every process that imports the turn package
# (tests/test_lazy_imports.py).
if TYPE_CHECKING:
    from acp.schema import PermissionOption, PromptResponse

    from chat.acp import updates

logger = logging.getLogger(__name__)

PREFIX: Final = "acp/"
# An agent session unused this long is closed (gracefully: its session file stays, and
# the next turn restores it with session/load).
ACP_IDLE_SECONDS: Final = 300.0
SWEEP_SECONDS: Final = 30.0
# Stop: how long `session/cancel` may take before the turn ends anyway.
CANCEL_WAIT_SECONDS: Final = 1.0

FRESH: Final = (
    "The agent's earlier session could not be restored: it starts fresh, without this "
    "tab's earlier context."
)
NO_COMPACTION: Final = "An external agent keeps its own context: there is nothing to compact."
CODEX_CANCELLED: Final = (
    "The agent ended its turn as cancelled after the refusal (Codex ends its turn when a "
    "permission is refused)."
)
AGENT_CANCELLED: Final = "The agent ended its turn as cancelled."
MAX_TURN_REQUESTS: Final = "The agent stopped at its limit of requests for one turn."
REFUSAL: Final = "The agent refused to go on."
NO_OPTION: Final = "The agent offered no option to {what} this call: it was cancelled."


def is_agent(model: str) -> bool:
    return model.startswith(PREFIX)


def agent_name(model: str) -> str:
    return model.removeprefix(PREFIX)


async def start_agent(
    config: AgentConfig, *, workspace: Path, cwd: str, home: Path, resume: str | None
) -> AgentSession:
    """Start `config`'s agent in the folder `cwd` of the owner's `workspace`, confined to
    it: the folder is bound by a descriptor opened without following links, never by its
    path (tests replace this function)."""
    # Imported here for the startup cost: the ACP SDK's schema is half a second of
    # pydantic models, paid by the processes that run an agent only.
    from chat.acp import process

    return await process.start(config, workspace=workspace, cwd=cwd, home=home, resume=resume)


# --- the sessions of this loop's tabs ---------------------------------------------------


@dataclass
class _Entry:
    agent: str
    session: AgentSession
    last_used: float
    busy: bool = False


class Sessions:
    """One event loop's agent sessions, by tab."""

    def __init__(self) -> None:
        self.entries: dict[uuid.UUID, _Entry] = {}
        self.sweeper: asyncio.Task[None] | None = None
        # Sessions closing in the background (a Stop the agent did not confirm, an idle
        # one), awaited by close_all.
        self.closing: set[asyncio.Task[None]] = set()

    def take(self, tab_id: uuid.UUID, agent: str) -> AgentSession | None:
        entry = self.entries.get(tab_id)
        if entry is None or entry.agent != agent:
            return None
        entry.busy = True
        return entry.session

    def keep(self, tab_id: uuid.UUID, agent: str, session: AgentSession) -> None:
        loop = asyncio.get_running_loop()
        self.entries[tab_id] = _Entry(agent, session, loop.time(), busy=True)
        if self.sweeper is None or self.sweeper.done():
            self.sweeper = loop.create_task(self._sweep(), name="acp idle sweep")

    def release(self, tab_id: uuid.UUID) -> None:
        entry = self.entries.get(tab_id)
        if entry is not None:
            entry.busy = False
            entry.last_used = asyncio.get_running_loop().time()

    async def drop(self, tab_id: uuid.UUID, *, wait: bool = True) -> None:
        """Forget the tab's session and close it (`wait` False: in the background, for a
        turn that must end now)."""
        entry = self.entries.pop(tab_id, None)
        if entry is None:
            return
        if wait:
            await _close(entry.session)
            return
        self._close_later(entry.session)

    async def close_idle(self, now: float) -> None:
        closes = []
        for tab_id, entry in list(self.entries.items()):
            if not entry.busy and now - entry.last_used >= ACP_IDLE_SECONDS:
                del self.entries[tab_id]
                closes.append(self._close_later(entry.session))
        if closes:
            # Awaited, not owned: close_all cancels this sweep, never a close under way
            # (it awaits `closing`; a close cut short would leak the sandbox).
            await asyncio.wait(closes)

    async def close_all(self) -> None:
        entries, self.entries = list(self.entries.values()), {}
        if self.sweeper is not None:
            self.sweeper.cancel()
        await asyncio.gather(*(_close(e.session) for e in entries), *self.closing)

    def _close_later(self, session: AgentSession) -> asyncio.Task[None]:
        closing = asyncio.get_running_loop().create_task(_close(session))
        self.closing.add(closing)
        closing.add_done_callback(self.closing.discard)
        return closing

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self.entries:
            await asyncio.sleep(SWEEP_SECONDS)
            await self.close_idle(loop.time())


async def _close(session: AgentSession) -> None:
    try:
        await session.close()
    except Exception:
        logger.exception("could not close an agent session")


_SESSIONS: dict[asyncio.AbstractEventLoop, Sessions] = {}


def sessions() -> Sessions:
    loop = asyncio.get_running_loop()
    found = _SESSIONS.get(loop)
    if found is None:
        found = _SESSIONS[loop] = Sessions()
    return found


async def close_all() -> None:
    """Close this loop's agent sessions (a worker stopping; tests)."""
    found = _SESSIONS.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close_all()


# --- what the prompt's producer hands the driver ------------------------------------------


@dataclass
class _Ask:
    """A permission request: answered by the driver (gate, approvals), awaited by the
    agent's request."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    options: list[PermissionOption]
    answer: asyncio.Future[str | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


@dataclass(frozen=True)
class _Done:
    response: PromptResponse


class _Handler:
    """The agent's side of the prompt: updates mapped at once (what is queued is already
    bounded), permission requests queued behind them, in order."""

    def __init__(self, mapper: updates.Updates, queue: asyncio.Queue[Any]) -> None:
        self.mapper = mapper
        self.queue = queue
        self.asks: list[_Ask] = []

    async def update(self, update: object) -> None:
        for event in self.mapper.feed(update):
            self.queue.put_nowait(event)

    async def permission(self, tool_call: Any, options: list[PermissionOption]) -> str | None:
        events, call_id, name, arguments = self.mapper.call(tool_call)
        for event in events:
            self.queue.put_nowait(event)
        ask = _Ask(call_id, name, arguments, list(options))
        self.asks.append(ask)
        self.queue.put_nowait(ask)
        try:
            return await ask.answer
        except asyncio.CancelledError:
            return None

    def cancel_asks(self) -> None:
        """The prompt ended (a Stop, an error): a request still waiting is cancelled."""
        for ask in self.asks:
            if not ask.answer.done():
                ask.answer.set_result(None)


class AcpDriver:
    """Runs a tab's turns on its external agent (see the module docstring)."""

    def __init__(self, state: TurnState, outbox: Outbox, messages: Messages) -> None:
        self.state = state
        self.outbox = outbox
        self.messages = messages
        self.stepper = Stepper(state, outbox)
        self.approvals = Approvals(state, outbox)
        self.repeats = Repeats()
        self._rules: list[rules.Rule] | None = None
        # No call of an agent's is run by Dispatch: nothing to note before it is sealed.
        outbox.on_call = None
        # A permission was refused in this prompt (Codex then ends its turn cancelled).
        self._refused = False

    def answer(self, call_id: str, approved: bool, rule: dict[str, Any] | None) -> bool:
        return self.approvals.answer(call_id, approved, rule)

    def next_turn(self) -> None:
        self._rules = None
        self.repeats = Repeats()
        self._refused = False

    async def run_turn(self, tab: Tab) -> None:
        state = self.state
        name = agent_name(state.turn_config.model)
        while await self.messages.take_compaction() is not None:
            await self.outbox.system(SystemKind.COMPACTION_FAILED, NO_COMPACTION)
        if not await self.messages.take_queued():
            return
        state.reducer.step = state.status.step = 1
        await database_sync_to_async(lease.set_step)(state.tab_id, state.turn_id, 1)
        await self.outbox.status()
        known = await database_sync_to_async(acp_config.agents)()
        config = known.get(name)
        if config is None:
            names = ", ".join(sorted(known)) or "none"
            await self._error(f"No agent named {name!r} is configured (configured: {names}).")
            return
        try:
            session = await self._session(tab, config)
            blocks = await self._blocks(session)
            if blocks:
                await self._prompt(session, blocks)
        except AgentError as exc:
            await sessions().drop(state.tab_id)
            await self._error(str(exc))
        finally:
            # However the turn ends, the session may be closed once idle (a dropped one
            # is gone already).
            sessions().release(state.tab_id)
        await self._reload_if_changed()

    async def _reload_if_changed(self) -> None:
        """Settings changed during the turn: said at its end, as ProviderDriver says it
        (the idle-tab notice skips a tab whose turn runs)."""
        state = self.state
        tab = await Tab.objects.aget(pk=state.tab_id)
        fresh = await database_sync_to_async(TurnConfig.load)(tab)
        if fresh != state.config:
            await self.outbox.system(
                SystemKind.CONFIG_RELOAD, state.turn_config.describe_change(fresh)
            )
            state.config = fresh

    async def _error(self, message: str) -> None:
        await self.outbox.apply(end_ops(self.state.reducer, End.error(message, NOT_RUN_ERROR)))

    # --- the session ----------------------------------------------------------------

    async def _session(self, tab: Tab, config: AgentConfig) -> AgentSession:
        """The tab's running agent, else one started (restoring the tab's session if it
        has one of this agent); Stop ends the wait for a start."""
        state = self.state
        pool = sessions()
        session = pool.take(state.tab_id, config.name)
        if session is not None:
            return session
        await pool.drop(state.tab_id)  # another agent's, since the model changed
        kept = tab.acp_session if isinstance(tab.acp_session, dict) else {}
        resume = kept.get("session_id") if kept.get("agent") == config.name else None
        home = acp_config.home_of(config.name, state.owner_id)
        started: list[AgentSession] = []

        async def produce(queue: asyncio.Queue[Any]) -> None:
            started.append(
                await start_agent(
                    config, workspace=state.workspace, cwd=state.cwd, home=home, resume=resume
                )
            )

        async with aclosing(self.stepper.produced(produce)) as items:
            async for _ in items:
                pass
        (session,) = started
        pool.keep(state.tab_id, config.name, session)
        if resume and not session.restored:
            await self.outbox.system(SystemKind.NOTICE, FRESH)
        if kept != {"agent": config.name, "session_id": session.session_id}:
            value = {"agent": config.name, "session_id": session.session_id}
            await Tab.objects.filter(pk=state.tab_id).aupdate(acp_session=value)
        return session

    async def _blocks(self, session: AgentSession) -> list[object]:
        """This turn's messages as the prompt's content blocks: their text, their images
        when the agent takes images, and a line naming each other file where the
        agent's tools find it (blobs placed it in the workspace)."""
        from acp.schema import TextContentBlock

        rows = await database_sync_to_async(self._messages)()
        blocks: list[object] = []
        for data in rows:
            for ref in data.get("attachments") or []:
                blocks.append(await self._file(session, ref))
            if data.get("text"):
                blocks.append(TextContentBlock(type="text", text=data["text"]))
        return blocks

    def _messages(self) -> list[UserText]:
        """This turn's messages; a turn with none of its own (a rerun: a regenerated or
        retried branch) answers the tab's last one again."""
        state = self.state
        users = Chunk.objects.filter(tab_id=state.tab_id, role=Role.USER, type=Kind.TEXT)
        rows = list(users.filter(turn_id=state.turn_id).order_by("seq"))
        if not rows:
            rows = list(users.order_by("-seq")[:1])
        return [cast(UserText, row.data) for row in rows]

    async def _file(self, session: AgentSession, ref: Any) -> object:
        from acp.schema import ImageContentBlock, TextContentBlock

        where = upload_path(str(ref.get("sha256", "")), str(ref.get("name", "")))
        if session.images and str(ref.get("mime", "")).startswith("image/"):
            data = await asyncio.to_thread(blobs.READER.data, str(ref.get("sha256", "")))
            if data is not None:
                encoded = base64.b64encode(data).decode("ascii")
                return ImageContentBlock(type="image", data=encoded, mime_type=ref["mime"])
        return TextContentBlock(type="text", text=f"[Attached file: {where}]")

    # --- the prompt -----------------------------------------------------------------

    async def _prompt(self, session: AgentSession, blocks: list[object]) -> None:
        from chat.acp import updates

        state = self.state
        mapper = updates.Updates()
        done: list[PromptResponse] = []
        handler: _Handler | None = None

        async def produce(queue: asyncio.Queue[Any]) -> None:
            nonlocal handler
            handler = _Handler(mapper, queue)
            queue.put_nowait(_Done(await session.prompt(blocks, handler)))

        try:
            async with aclosing(self.stepper.produced(produce)) as items:
                async for item in items:
                    await self._item(item, done)
        except TurnCancelled:
            await self._cancel(session)
            raise
        except BaseException as exc:
            # Abandoned unanswered (the lease lost, the outbox failing, the worker
            # stopping): the agent is told to stop as at a Stop, not left running a turn
            # nobody logs, and its session is not reused before it answered.
            if not done and not isinstance(exc, AgentError):
                await self._cancel(session)
            raise
        finally:
            if handler is not None:
                handler.cancel_asks()
        for event in mapper.finish():
            await self.outbox.apply(state.reducer.feed(event))
        await self.outbox.apply(state.reducer.seal())
        if done:
            await self._finished(done[0], mapper)

    async def _item(self, item: Any, done: list[PromptResponse]) -> None:
        match item:
            case _Ask():
                option = await self._permission(item)
                if not item.answer.done():
                    item.answer.set_result(option)
            case _Done(response=response):
                done.append(response)
            case _:
                await self.stepper.progress()
                await self.outbox.apply(self.state.reducer.feed(cast(Event, item)))

    async def _cancel(self, session: AgentSession) -> None:
        """Stop: `session/cancel` (the agent and what it started stop), within a second.
        The session is kept only once the stopped prompt answered (session.cancel()
        returned): the agent's late updates for it then never reach the next turn."""
        try:
            await asyncio.wait_for(session.cancel(), CANCEL_WAIT_SECONDS)
        except Exception:
            # Timed out, died, or broke: the turn ends cancelled all the same, and this
            # agent is not reused.
            logger.warning("tab %s: the agent did not confirm the cancel", self.state.tab_id)
            await sessions().drop(self.state.tab_id, wait=False)

    async def _finished(self, response: PromptResponse, mapper: updates.Updates) -> None:
        """The prompt's usage, and what its stop reason says."""
        from chat.acp import updates

        state = self.state
        used = updates.usage(response, mapper.context)
        if used is not None:
            await self.stepper.record_usage(state.turn_config.model, used)
        reason = response.stop_reason
        if notice := STOP_NOTICES.get(reason):
            await self.outbox.system(*notice, stop_reason=reason)
        elif reason == "max_turn_requests":
            end = End.limit(SystemKind.STEP_LIMIT, MAX_TURN_REQUESTS)
            await self.outbox.apply(end_ops(state.reducer, end))
        elif reason == "refusal":
            await self.outbox.system(SystemKind.NOTICE, REFUSAL)
        elif reason == "cancelled":
            # Not a Stop (that raised TurnCancelled): the agent's own choice, such as
            # Codex's after a refused permission.
            text = CODEX_CANCELLED if self._refused else AGENT_CANCELLED
            end = End(Ending.CANCELLED, text, kind=SystemKind.CANCELLED)
            await self.outbox.apply(end_ops(state.reducer, end))

    # --- permissions ----------------------------------------------------------------

    async def _permission(self, ask: _Ask) -> str | None:
        """Dispatch's answer to the agent's permission request, as its option id."""
        from chat.acp import updates

        approved = await self._approved(ask)
        option = updates.choose(ask.options, approved)
        if option is None:
            what = "allow" if approved else "refuse"
            await self.outbox.system(
                SystemKind.NOTICE, NO_OPTION.format(what=what), call_id=ask.call_id
            )
        if not approved:
            self._refused = True
        return option

    async def _approved(self, ask: _Ask) -> bool:
        """The tab's rules first (audited), then the approval setting, the unattended
        policy and the doom-loop guard, as for a native call (calls.gate)."""
        state = self.state
        config = state.turn_config
        if self._rules is None:
            self._rules = await load_rules(self.state, self.outbox)
        repeated = self.repeats.see(ask.name, ask.arguments)
        decision = await asyncio.to_thread(
            rules.decide,
            self._rules or [],
            ask.name,
            ask.arguments,
            resolve=functools.partial(resolve_in_tab, self.state),
            repository=functools.partial(git_repository, self.state),
        )
        if decision is not None:
            await audit(self.outbox, ask.call_id, decision)
        verdict = gate(
            decision,
            ask.name,
            approve_tools=config.approve_tools,
            auto_approve=state.auto_approve,
            unattended=state.unattended,
            repeated=repeated,
            needs_approval=True,
        )
        if verdict == Gate.RUN:
            return True
        if verdict == Gate.UNATTENDED:
            await self.outbox.system(
                SystemKind.NOTICE, "Not approved: unattended wake turn.", call_id=ask.call_id
            )
            return False
        if verdict == Gate.DENY:
            return False
        if repeated:
            await self.outbox.system(
                SystemKind.REPEATED_CALL,
                f"The agent asked for the same {ask.name} call {self.repeats.count} times in a "
                "row: approve to run it again, deny to refuse it.",
                call_id=ask.call_id,
            )
        approved = await self.approvals.ask(ask.call_id, ask.name, ask.arguments, repeated=repeated)
        if added := self.approvals.rule_added(ask.call_id):
            await self.outbox.system(
                SystemKind.RULE, added["text"], call_id=ask.call_id, **added["rule"]
            )
            self._rules = await load_rules(self.state, self.outbox)
        if not approved:
            await self.outbox.system(SystemKind.NOTICE, "Denied by the user.", call_id=ask.call_id)
        return approved
