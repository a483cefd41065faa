"""The turn worker: runs turns on the worker channel, in the web process
(embedded mode) or in `manage.py runworker` (scaled mode), the same way.

One registry of runners (`RUNNING`), one shutdown path (`run_worker`'s drain):
a worker told to stop takes no new turns, lets the running ones finish for
settings.DISPATCH_SHUTDOWN_GRACE seconds, then interrupts them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from contextlib import suppress
from typing import Any

from channels.consumer import AsyncConsumer
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import ChannelNameRouter
from channels.worker import Worker
from django.conf import settings

from chat import bus, sidebar, wakes
from chat.providers import aclose_clients
from chat.tools import mcp
from chat.turn import acp, lease
from chat.turn.loop import TurnRunner

logger = logging.getLogger(__name__)

# The runners of this process, by tab: the drain waits for them, control
# messages find them here.
RUNNING: dict[uuid.UUID, TurnRunner] = {}


class TurnWorker(AsyncConsumer):
    """Runs turns, on the worker channel: in the web process (embedded) or in runworker."""

    async def __call__(self, scope, receive, send):
        self.tasks: set[asyncio.Task] = set()
        # This consumer's runners (a test may run two workers in one process).
        self.runners: set[TurnRunner] = set()
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The consumer is going away (shutdown, or the channel layer failed):
            # its turns are interrupted, not cancelled by anyone.
            for runner in list(self.runners):
                runner.cancel(stopping=True)
            if self.tasks:
                # Let interrupted turns write their notice and release their lease.
                await asyncio.wait(list(self.tasks), timeout=INTERRUPT_WAIT_SECONDS)
            for task in list(self.tasks):
                task.cancel()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # One bad message must not take down the consumer and every turn it runs.
        try:
            await super().dispatch(message)
        except Exception:
            logger.exception("turn worker could not handle %r", message.get("type"))

    async def turn_start(self, message: dict[str, Any]) -> None:
        if not accepting_turns:
            return
        tab_id = uuid.UUID(message["tab_id"])
        # Claimed before the lease commits: the recovery scan must never find
        # this process's fresh lease unclaimed and take it for a dead one's.
        lease.claim(tab_id)
        started = False
        try:
            acquire = database_sync_to_async(lease.acquire)
            turn_id, cancelled = await _to_the_end(
                acquire(tab_id, lease.worker_id(self.channel_name))
            )
            if turn_id is not None:
                # Not when stopping, even if the drain began just now: no new turns.
                if not cancelled and accepting_turns:
                    started = await self._start(tab_id, turn_id, bool(message.get("auto_approve")))
                if not started:
                    # The message waits for a worker that stays, instead of being
                    # reported as interrupted by the next start.
                    hand_back = database_sync_to_async(lease.hand_back)
                    cancelled |= (await _to_the_end(hand_back(tab_id, turn_id)))[1]
        finally:
            if not started:
                lease.unclaim(tab_id)
        if cancelled:
            raise asyncio.CancelledError

    async def _start(self, tab_id: uuid.UUID, turn_id: uuid.UUID, auto_approve: bool) -> bool:
        group = bus.tab_group(tab_id)
        # The state the owner's pages were last told (chat.sidebar): a frame per change of
        # state, not per status (a status goes out at every step and approval).
        # Another call's approval is a change too: it is worth a notification.
        announced: dict[str, Any] = {}
        # The latest announcement: each waits for the one before (the pages see the states
        # in order), and the runner waits for none: with many turns starting at once, their
        # entry reads would queue on the one database thread ahead of the turns' own writes
        # and delay every token.
        last: list[asyncio.Task[None]] = []

        async def announce(message: dict[str, Any], before: asyncio.Task[None] | None) -> None:
            if before is not None:
                await asyncio.wait([before])
            owner_id = runner.state.owner_id
            if owner_id is not None and not bus.listened(
                bus.layer_for(bus.user_group(owner_id)), bus.user_group(owner_id)
            ):
                # No page of the owner's is open: each reads its entries when it opens.
                return
            try:
                # The owner comes with the entry: no read before the runner exists.
                read = database_sync_to_async(sidebar.with_entries, thread_sensitive=False)
                told = await read(message)
                if told is not None:
                    owner_id, sent = told
                    group = bus.user_group(owner_id)
                    await bus.layer_for(group).group_send(group, sent)
            except Exception:
                # The pages catch up at their next (re)connect or load.
                logger.exception("could not tell the owner's pages of tab %s", tab_id)

        ops = bus.layer_for(group)

        async def publish(op: dict[str, Any]) -> None:
            await ops.group_send(group, {"type": "tab.op", **op})
            if op.get("op") != "status":
                return
            message = sidebar.message(
                tab_id, sidebar.state_of(op["status"]), op["status"].get("approval")
            )
            if message != announced:
                announced.clear()
                announced.update(message)
                task = asyncio.create_task(announce(dict(message), last[0] if last else None))
                last[:] = [task]
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

        try:
            await self.channel_layer.group_add(bus.control_group(tab_id), self.channel_name)
        except Exception:
            # Without the control group the turn could not be stopped or approved.
            logger.exception("could not join the control group of tab %s", tab_id)
            return False
        runner = TurnRunner(tab_id, turn_id, publish, auto_approve=auto_approve)
        RUNNING[tab_id] = runner
        self.runners.add(runner)
        # With no await since it was registered: a stop that began while the
        # control group was being joined (a Redis round trip) is not missed.
        runner.draining = not accepting_turns
        task = asyncio.create_task(self._run(runner))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _run(self, runner: TurnRunner) -> None:
        try:
            await runner.run()
        except Exception as exc:
            # run() ends its own crashes; one that still escapes (handing a
            # turn back failed) gets the same ending, not a stuck tab whose
            # lease recovery would later call a server that stopped.
            logger.exception("runner for tab %s crashed", runner.tab_id)
            await runner.abort(exc)
        finally:
            # After run(): the lease is released (or recovered by someone else).
            lease.unclaim(runner.tab_id)
            self.runners.discard(runner)
            if RUNNING.get(runner.tab_id) is runner:
                del RUNNING[runner.tab_id]
                await self.channel_layer.group_discard(
                    bus.control_group(runner.tab_id), self.channel_name
                )

    async def wakes_changed(self, message: dict[str, Any]) -> None:
        wakes.nudge()

    def _runner(self, message: dict[str, Any]) -> TurnRunner | None:
        return RUNNING.get(uuid.UUID(message["tab_id"]))

    async def turn_cancel(self, message: dict[str, Any]) -> None:
        runner = self._runner(message)
        if runner is None or message.get("turn_id") not in (None, str(runner.turn_id)):
            return
        runner.cancel(why=str(message.get("why") or ""))

    async def turn_approve(self, message: dict[str, Any]) -> None:
        if runner := self._runner(message):
            runner.approve(message["call_id"], bool(message["approved"]), message.get("rule"))

    async def turn_snapshot(self, message: dict[str, Any]) -> None:
        runner = self._runner(message)
        if runner is None:
            return  # the asker falls back to the checkpoint after its timeout
        await self.channel_layer.send(
            message["reply_to"], {"type": "tab.snapshot", **runner.snapshot()}
        )


async def _to_the_end(work: Awaitable[Any]) -> tuple[Any, bool]:
    """Await `work` to its end even if cancelled meanwhile: a database call runs on
    in its thread whatever happens here, and what it did (a lease taken or given
    back) must be known. Returns its result and whether a cancel came, which the
    caller raises once it has dealt with the result."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task), False
    except asyncio.CancelledError:
        return await task, True


# --- Worker processes ---------------------------------------------------------------

# How often a worker looks for turns whose worker died. With LEASE_STALE_SECONDS
# this bounds recovery of a SIGKILLed worker on another host to about 20 s; on
# the same host a dead pid is seen at the next scan.
SCAN_SECONDS = 5.0


class StoppableWorker(Worker):
    """Channels' Worker leaves its listeners running when cancelled; a listener
    left blocked in Redis would still take (and lose) the next turn.start."""

    async def handle(self) -> None:
        listeners = [asyncio.ensure_future(self.listener(c)) for c in self.channels]
        try:
            await asyncio.gather(*listeners)
        finally:
            for listener in listeners:
                listener.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)


async def run_worker() -> None:
    """Run turns until cancelled: the TurnWorker on WORKER_CHANNEL, plus the recovery scan
    and the wake scheduler (chat.wakes).

    Cancelling it drains: see _shut_down."""
    global accepting_turns
    accepting_turns = True
    layer = get_channel_layer()
    routes = ChannelNameRouter({bus.WORKER_CHANNEL: TurnWorker.as_asgi()})
    worker = StoppableWorker(routes, [bus.WORKER_CHANNEL], layer)

    async def scan() -> None:
        while True:
            try:
                await database_sync_to_async(lease.recover_stale)()
            except Exception:
                logger.exception("recovery scan failed")
            await asyncio.sleep(SCAN_SECONDS)

    scanner = asyncio.create_task(scan())
    scheduler = asyncio.create_task(wakes.run_scheduler())
    listening = asyncio.create_task(worker.arun())
    try:
        await listening
    finally:
        # At once: a turn.start whose lease is being taken right now must see it.
        _stop_accepting()
        scanner.cancel()
        scheduler.cancel()
        listening.cancel()
        # Stop listening before anything else: a turn.start taken now would be lost.
        await asyncio.gather(scanner, scheduler, listening, return_exceptions=True)
        await _shut_down(worker)


# A worker told to stop lets its turns finish for settings.DISPATCH_SHUTDOWN_GRACE
# seconds, then interrupts them (each says so in its log) rather than be killed
# in the middle of a write; it gives interrupted turns this long to write their
# notice, seal what they streamed and release their lease.
INTERRUPT_WAIT_SECONDS = 5.0
# How often the drain looks whether the turns have ended.
DRAIN_POLL_SECONDS = 0.1


# False once this process's worker is shutting down: it takes no new turns
# (another worker's recovery scan asks for them again).
accepting_turns = True


def interrupt_turns() -> None:
    """Interrupt every turn this process runs: the open block is sealed as it is,
    running tools (and their sandboxes) are killed, the log says the server shut
    down, and the lease is released."""
    for runner in list(RUNNING.values()):
        runner.cancel(stopping=True)


def _stop_accepting() -> None:
    global accepting_turns
    accepting_turns = False
    # Runners let finish hand their next turn to a worker that stays.
    for runner in RUNNING.values():
        runner.draining = True


async def _shut_down(worker: Worker) -> None:
    _stop_accepting()

    async def drain() -> None:
        while RUNNING:
            await asyncio.sleep(DRAIN_POLL_SECONDS)

    if RUNNING:
        grace = settings.DISPATCH_SHUTDOWN_GRACE
        logger.warning(
            "stopping: waiting up to %gs for %d running turn(s) to finish", grace, len(RUNNING)
        )
        try:
            await asyncio.wait_for(asyncio.shield(drain()), grace)
        except TimeoutError:
            logger.warning("interrupting %d turn(s) still running", len(RUNNING))
            interrupt_turns()
            # A runner stuck in a call must not keep the process from exiting:
            # its lease goes stale and another worker recovers the turn.
            with suppress(TimeoutError):
                await asyncio.wait_for(drain(), INTERRUPT_WAIT_SECONDS)
    consumers = [instance["future"] for instance in worker.application_instances.values()]
    for future in consumers:
        future.cancel()
    if consumers:
        # Each hands back a lease it was taking just then (see TurnWorker.turn_start).
        await asyncio.wait(consumers, timeout=INTERRUPT_WAIT_SECONDS)
    # The providers' pooled connections, closed by this loop while it still runs
    # (daphne's loop may never get to close them after it).
    try:
        await aclose_clients()
    except Exception:
        logger.exception("could not close the providers' connections")
    # MCP sessions end with their DELETE, and stdio servers with this process.
    try:
        await mcp.close_all()
    except Exception:
        logger.exception("could not close the MCP connections")
    # External agents are closed gracefully: they write their sessions (session/load's).
    try:
        await acp.close_all()
    except Exception:
        logger.exception("could not close the agent sessions")


_embedded_task: asyncio.Task | None = None


def start_embedded_worker() -> None:
    """Start the turn worker inside this (web) process, once. Embedded mode only.

    Once: a request during (or after) the drain must not start a second worker
    that would take turns again."""
    global _embedded_task
    if settings.REDIS_URL or _embedded_task is not None:
        return
    # Called from a running loop (first request) or just before one starts (serve).
    _embedded_task = asyncio.get_event_loop().create_task(run_worker())


async def stop_embedded_worker() -> None:
    """Stop the embedded worker the way runworker stops: take no new turns, let the
    running ones finish within the grace period, then interrupt them."""
    task = _embedded_task
    if task is None:
        return
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
