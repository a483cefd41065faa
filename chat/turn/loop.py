"""The turn loop: a TurnRunner runs turns on one tab for as long as it holds the tab's
lease. Read this module first.

`run` runs a turn (its driver produces the events: chat.turn.driver), reports idle,
then under the tab lock releases the lease or, when a message is waiting, goes on with
the next turn. However a turn stops, it ends through chat.turn.ending: a Stop
(`cancelled`), this worker shutting down (`interrupted`), a crash (an error chunk); a
lost lease ends nothing, since the recovery that took it closed the turn.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import suppress
from typing import Any

from channels.db import database_sync_to_async

from chat import context, log
from chat import usage as chat_usage
from chat.history import History
from chat.models import Tab
from chat.stream import Reducer
from chat.tools import workdir
from chat.tools.registry import AGENT
from chat.turn import acp, agents, lease
from chat.turn.acp import AcpDriver
from chat.turn.driver import Driver, ProviderDriver
from chat.turn.ending import End, end_ops, sealed
from chat.turn.messages import Messages
from chat.turn.outbox import Outbox, Publish, appended_seq
from chat.turn.state import TurnCancelled, TurnConfig, TurnState

logger = logging.getLogger(__name__)

# The most of an exception's text a crash's error chunk quotes: enough to debug from the
# tab (the traceback is in the server log), not a wall of repr.
CRASH_MESSAGE_CHARS = 1000


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
        self.state = TurnState(tab_id, turn_id, auto_approve=auto_approve)
        self.outbox = Outbox(self.state, publish)
        self.messages = Messages(self.state, self.outbox)
        self.driver: Driver = ProviderDriver(self.state, self.outbox, self.messages)

    # --- what the worker reads and sets ---------------------------------------------

    @property
    def tab_id(self) -> uuid.UUID:
        return self.state.tab_id

    @property
    def turn_id(self) -> uuid.UUID:
        return self.state.turn_id

    @property
    def lease_lost(self) -> bool:
        return self.state.lease_lost

    @property
    def stopping(self) -> bool:
        return self.state.stopping

    @property
    def cancelled(self) -> asyncio.Event:
        return self.state.cancelled

    @property
    def draining(self) -> bool:
        return self.state.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        # The worker is shutting down: the running turn may finish, the next one (a
        # message queued meanwhile) goes to a worker that stays.
        self.state.draining = value

    # --- control (called from the worker consumer) ----------------------------------

    def cancel(self, *, stopping: bool = False, why: str = "") -> None:
        """Stop the turn: by the user, or (`stopping`) because this worker shuts down, or
        for `why` (a sub-agent's parent stopped it: its log says so, not "by the user")."""
        self.state.cancel(stopping=stopping, why=why)

    def approve(self, call_id: str, approved: bool, rule: dict[str, Any] | None = None) -> bool:
        return self.driver.answer(call_id, approved, rule)

    def snapshot(self) -> dict[str, Any]:
        """The exact state a new watcher needs: last sealed seq and the open block."""
        return self.outbox.snapshot()

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                try:
                    await self._run_turn()
                    if self.state.lease_lost:
                        break  # the tab is someone else's now: release nothing
                    await self._publish_idle()
                    next_turn = await database_sync_to_async(self._release_or_continue)()
                except log.LeaseLost:
                    break  # the tab is someone else's now (Outbox.append): release nothing
                except Exception as exc:
                    # Outside the steps (building the history, loading the settings) or
                    # closing the turn failed: the turn still ends with an error chunk,
                    # idle and a released lease. No next turn: whatever failed would
                    # likely fail it too.
                    await self.abort(exc)
                    break
                if next_turn is None:
                    break
                if self.state.stopping or self.state.draining:
                    # Shutting down (the running turn was let finish): the next turn is a
                    # new turn, so it goes to a worker that stays.
                    await database_sync_to_async(lease.hand_back)(self.tab_id, self.turn_id)
                    break
                self.state.next_turn(next_turn)
                self.driver.next_turn()
        finally:
            heartbeat.cancel()
            with suppress(asyncio.CancelledError):
                await heartbeat
            self.outbox.cancel_checkpoint()

    async def _run_turn(self) -> None:
        state = self.state
        tab = await Tab.objects.aget(pk=state.tab_id)
        state.workspace = await asyncio.to_thread(workdir.user_workspace, tab.owner_id)
        if state.history is None:
            chunks = await database_sync_to_async(log.context_tail)(state.tab_id)
            state.history = History.build(chunks)
            state.last_seq = state.history.last_seq
        config = await database_sync_to_async(TurnConfig.load)(tab)
        state.config = config
        state.cwd = tab.workdir
        state.owner_id = tab.owner_id
        state.status.model = config.model
        state.size = context.Size.from_dict(tab.context)
        state.status.context = context.meter(state.size, config.model).as_dict()
        driver = self._driver_for(config.model)
        try:
            await driver.run_turn(tab)
        except TurnCancelled:
            await self._end_stopped()
        except log.LeaseLost:
            raise  # not a crash: another runner has the tab (run() stops this one)
        except Exception as exc:  # a bug must not leave the tab stuck "running"
            await self._end_with_crash(exc)

    def _driver_for(self, model: str) -> Driver:
        """An external agent's tab (`acp/<name>`) runs on its agent, any other on the
        model's own loop; a model changed between turns changes the driver."""
        wanted = AcpDriver if acp.is_agent(model) else ProviderDriver
        if not isinstance(self.driver, wanted):
            self.driver = wanted(self.state, self.outbox, self.messages)
        return self.driver

    async def _publish_idle(self) -> None:
        state = self.state
        await self.outbox.flush_deltas()
        # Before idle is seen: a Continue or a branch clicked at once finds the turn
        # finished, not running (the lease is released only after idle). Not worth
        # failing over: without it, such a click is refused, no more.
        try:
            await database_sync_to_async(lease.set_finishing)(state.tab_id, state.turn_id)
        except Exception:
            logger.exception("could not mark turn %s finishing", state.turn_id)
        # Idle goes out before the lease is released: once it is, a new runner may start
        # on this tab and its "running" must come last.
        state.status.state = "idle"
        state.status.approval = None
        state.status.waiting_since = None
        # Read back from the records, as a page render reads them: the line the page shows
        # now is the one a reload shows. Without it the turn still ends.
        try:
            state.status.turn_end = await database_sync_to_async(chat_usage.turn_end)(
                state.tab_id, state.turn_id
            )
        except Exception:
            logger.exception("could not total the usage of turn %s", state.turn_id)
        await self.outbox.publish({"op": "status", "status": state.status.as_dict()})

    def _release_or_continue(self) -> uuid.UUID | None:
        """End of a turn: give the lease back, unless a message is waiting for the next turn."""
        turn_id = lease.release_or_continue(self.state.tab_id, self.state.turn_id)
        if turn_id is not None:
            # Here, on the database thread: a heartbeat queued right behind this must look
            # for the lease by its new turn id, or it would report it lost and stop the
            # runner.
            self.state.turn_id = turn_id
        return turn_id

    async def abort(self, exc: BaseException) -> None:
        """End the turn after `exc` escaped it: an error chunk saying what happened, idle,
        and this turn's lease released. Each step is tried even when the one before failed
        (the database or the channel layer may be what broke), so the tab does not look
        stuck and recovery does not later report a crash as a server that stopped."""
        state = self.state
        if state.lease_lost:
            return  # recovered by another worker, which closed the turn
        if not state.took_queued:
            # Crashed before the turn took its messages: they go into the log anyway, so
            # the error answers them (and a follower such as `manage.py send` sees its
            # message taken and the error after it).
            try:
                await self.messages.take_queued()
            except log.LeaseLost:
                return  # recovered meanwhile: the recovery closed the turn
            except Exception:
                logger.exception("could not take the messages of crashed turn %s", state.turn_id)
        try:
            await self._end_with_crash(exc)
        except log.LeaseLost:
            return
        except Exception:
            logger.exception("could not record the crash of turn %s", state.turn_id)
        if state.lease_lost:
            return  # found so above (a deleted tab): no idle to say, no lease to release
        self.outbox.discard_deltas()
        try:
            await self._publish_idle()
        except Exception:
            logger.exception("could not report turn %s idle", state.turn_id)
        try:
            await database_sync_to_async(lease.release)(state.tab_id, state.turn_id)
        except Exception:
            logger.exception("could not release the lease of tab %s", state.tab_id)

    # --- how a stopped turn ends (chat.turn.ending) ---------------------------------

    async def _end_stopped(self) -> None:
        """A Stop (the user's, or a parent's) or this worker shutting down ended the turn."""
        state = self.state
        if state.lease_lost:
            return  # the recovery that took the lease already closed this turn
        if not state.took_queued:
            # Stopped before the turn took its messages (while it compacted): they are what
            # was stopped, so they go into the log before the notice, not on to start the
            # next turn.
            await self.messages.take_queued()
        # The running call's open result (live shell output) is the first pending call:
        # answering it seals that block with its output kept.
        if not state.stopping:
            await self.outbox.apply(end_ops(state.reducer, End.stopped(state.cancel_why)))
            return
        # Calls whose children run on stay open: the turn goes on elsewhere for them.
        agent_calls = [
            (cid, state.seqs[cid])
            for cid, name in state.reducer.pending_calls
            if name == AGENT and cid in state.seqs
        ]
        waiting = await database_sync_to_async(agents.made)(state.tab_id, agent_calls)
        state.reducer.pending_calls = [
            (cid, name) for cid, name in state.reducer.pending_calls if cid not in waiting
        ]
        await self.outbox.apply(end_ops(state.reducer, End.shut_down(resuming=bool(waiting))))
        if waiting:
            await database_sync_to_async(agents.resume_later)(state.tab_id)

    async def _end_with_crash(self, exc: BaseException) -> None:
        """A bug (or a failed database or channel layer) ended the turn.

        Pending calls get results, the open block is sealed as it is and an error chunk
        says what happened: never the "interrupted" notice, which means a server that
        stopped. The blocks are written in one append and then published, each publish
        on its own: the channel layer may be what failed. When the reducer itself is what
        broke, its open block is dropped (the checkpoint has it until the append clears
        it).
        """
        state = self.state
        if not state.lease_lost and await database_sync_to_async(self._tab_gone)():
            # Deleted mid-turn (the tab page, the admin, wipe_history): its log and lease
            # went with it, so whatever failed was writing to it. Nothing to say.
            logger.info("tab %s was deleted during turn %s", state.tab_id, state.turn_id)
            state.lease_lost = True
            return
        logger.error("turn %s on tab %s crashed", state.turn_id, state.tab_id, exc_info=exc)
        if state.lease_lost or state.crash_logged:
            return
        detail = str(exc)
        if len(detail) > CRASH_MESSAGE_CHARS:
            detail = detail[: CRASH_MESSAGE_CHARS - 1] + "…"
        end = End.crashed(f"Internal error in the turn runner: {type(exc).__name__}: {detail}")
        self.outbox.cancel_checkpoint()
        # Deltas in flight go out before the seals that replace them, if the channel layer
        # still works; whatever is left is dropped.
        with suppress(Exception):
            await self.outbox.flush_deltas()
        self.outbox.discard_deltas()
        pending = list(state.reducer.pending_calls)
        try:
            ops = end_ops(state.reducer, end)
        except Exception:
            logger.exception("the reducer of turn %s cannot close it", state.turn_id)
            state.reducer = Reducer(state.turn_id, state.reducer.step)
            state.reducer.pending_calls = pending
            ops = end_ops(state.reducer, end)
        blocks = sealed(ops)
        await self.outbox.checkpoint_landed()
        await self.outbox.append(blocks, clear_checkpoint=True)
        state.crash_logged = True
        self.outbox.shown = None
        for block in blocks:
            state.last_seq = appended_seq(block)
            if state.history is not None:
                try:
                    state.history.add(block)
                except Exception:
                    # Rebuilt from the log if another turn runs.
                    state.history = None
        for block in blocks:
            try:
                await self.outbox.publish({"op": "seal", "block": block.to_dict()})
            except Exception:
                logger.exception("could not publish the end of crashed turn %s", state.turn_id)
                break

    # --- the lease ------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        state = self.state
        while True:
            await asyncio.sleep(lease.HEARTBEAT_SECONDS)
            try:
                # The turn id is read on the database thread: a next turn
                # (release_or_continue) changes it there.
                beat, why = await database_sync_to_async(self._beat)()
            except Exception:
                # A missed beat is survivable (three make the lease stale); a dead
                # heartbeat task is not noticed by anyone.
                logger.exception("heartbeat of tab %s failed", state.tab_id)
                continue
            if beat in ("lost", "gone"):
                state.lose_lease(gone=beat == "gone")
            elif beat == "cancel" and not state.cancelled.is_set():
                # Cancel requested through the database (the control message was lost or
                # is still on its way).
                self.cancel(why=why)

    def _tab_gone(self) -> bool:
        return not Tab.objects.filter(pk=self.state.tab_id).exists()

    def _beat(self) -> tuple[str, str]:
        return lease.beat(self.state.tab_id, self.state.turn_id)
