"""Who runs turns: the lease, and the messages that start, cancel and steer them.

Every user message goes through the QueuedMessage table first: it survives a
refresh or a restart the moment it is accepted, and the turn that holds the
tab's lease moves it into the log at its next step (or starts with it). The
tab row lock orders "queue a message" against "release the lease", so a
message is never left behind by a turn that was just ending.

Messages between processes go through the channel layer:
- `WORKER_CHANNEL`: "turn.start" — some worker should run this tab.
- `control_group(tab_id)`: "turn.cancel", "turn.approve", "turn.snapshot" — only
  the worker holding the tab's lease is in this group, wherever it runs.
- `tab_group(tab_id)`: "tab.op" — every op of the tab, for the sockets watching it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import unicodedata
import uuid
from collections import Counter
from contextlib import suppress
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from chat.models import QueuedMessage, RunningTurn, Tab, UsageRecord

logger = logging.getLogger(__name__)

WORKER_CHANNEL = "dispatch-turns"
# A worker refreshes its lease at least this often while a turn runs.
HEARTBEAT_SECONDS = 5.0
# A lease whose heartbeat is older than this belongs to a dead worker: three
# missed heartbeats, so a busy event loop is not mistaken for a crash.
LEASE_STALE_SECONDS = 15.0


def tab_group(tab_id: uuid.UUID | str) -> str:
    return f"tab.{tab_id}"


def control_group(tab_id: uuid.UUID | str) -> str:
    return f"tabctl.{tab_id}"


def _send(channel: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().send)(channel, message)


def _group_send(group: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().group_send)(group, message)


# Characters that show nothing on their own: controls, format characters (zero
# width spaces and joiners, the BOM, direction marks), separators, and marks,
# which only decorate a base character (a variation selector is one). A message
# needs one character outside these; emoji, and letters with marks, have one.
# Unassigned code points count as visible: they may be a newer emoji.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp", "Mn", "Me"})
# Letters and symbols that are drawn blank (Hangul fillers, the braille blank).
BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def visible(text: str) -> bool:
    return any(
        ch not in BLANK_CHARACTERS and unicodedata.category(ch) not in INVISIBLE_CATEGORIES
        for ch in text
    )


def submit(tab: Tab, text: str, *, auto_approve: bool = False) -> QueuedMessage:
    """Accept a user message: persist it, show it as queued, and make sure a turn takes it.

    Sync (ORM + channel layer); from async code wrap it in database_sync_to_async.
    """
    text = text.strip()
    if not visible(text):
        raise ValueError("The message is empty.")
    with transaction.atomic():
        Tab.objects.select_for_update().filter(pk=tab.pk).values_list("pk").get()
        queued = QueuedMessage.objects.create(tab=tab, text=text)
        if not tab.title:
            tab.title = _title_from(text)
            Tab.objects.filter(pk=tab.pk).update(title=tab.title)
        # Before the commit: a runner cannot take the row (and send "taken")
        # until then, so "queued" always reaches the pages first.
        _group_send(
            tab_group(tab.pk),
            {"type": "tab.op", "op": "queued", "id": queued.pk, "text": queued.text},
        )
    request_run(tab.pk, auto_approve=auto_approve)
    return queued


def request_run(tab_id: uuid.UUID, *, auto_approve: bool = False) -> None:
    """Ask the workers to run this tab's queued messages."""
    start = {"type": "turn.start", "tab_id": str(tab_id)}
    if auto_approve:
        start["auto_approve"] = True
    _send(WORKER_CHANNEL, start)


# A title is a label, not the message: the first line, cut at a word.
TITLE_LENGTH = 60


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0]
    if len(line) <= TITLE_LENGTH:
        return line
    return line[:TITLE_LENGTH].rsplit(" ", 1)[0] + "…"


def cancel(tab_id: uuid.UUID, turn_id: uuid.UUID | None = None) -> bool:
    """Ask the turn running on this tab to stop. False when none is running.

    With `turn_id` (what the page showed when Stop was pressed), only that turn:
    a Stop that lands as one turn ends must not stop the next one.
    """
    running = RunningTurn.objects.filter(tab_id=tab_id)
    if turn_id is not None:
        running = running.filter(turn_id=turn_id)
    updated = running.update(cancel_requested=True)
    if updated:
        message = {"type": "turn.cancel", "tab_id": str(tab_id)}
        if turn_id is not None:
            message["turn_id"] = str(turn_id)
        _group_send(control_group(tab_id), message)
    return bool(updated)


def notice(tab_id: uuid.UUID, kind: str, text: str) -> None:
    """A system event on a tab: in the log at once when idle; a running turn reports
    the change itself at its next step (a config-reload chunk in the turn)."""
    from chat import log
    from chat.stream import Block, Kind, Role

    with transaction.atomic():
        Tab.objects.select_for_update().filter(pk=tab_id).values_list("pk").get()
        if RunningTurn.objects.filter(tab_id=tab_id).exists():
            return
        block = Block(uuid.uuid4(), None, 0, Role.SYSTEM, Kind.SYSTEM, {"kind": kind, "text": text})
        log.append(tab_id, [block])
    _group_send(tab_group(tab_id), {"type": "tab.op", "op": "seal", "block": block.to_dict()})


def approve(tab_id: uuid.UUID, call_id: str, approved: bool) -> None:
    """Answer the approval the running turn waits for on `call_id`."""
    _group_send(
        control_group(tab_id),
        {"type": "turn.approve", "tab_id": str(tab_id), "call_id": call_id, "approved": approved},
    )


def is_stale(running: RunningTurn) -> bool:
    return running.heartbeat_at < timezone.now() - timedelta(seconds=LEASE_STALE_SECONDS)


def turn_usage(turn_id: uuid.UUID) -> dict[str, int]:
    totals = UsageRecord.objects.filter(turn_id=turn_id).aggregate(
        input=Sum("input_tokens"),
        output=Sum("output_tokens"),
        cache_read=Sum("cache_read_tokens"),
        cache_write=Sum("cache_write_tokens"),
    )
    return {k: v or 0 for k, v in totals.items()}


def status(tab_id: uuid.UUID) -> dict[str, Any]:
    """The tab's turn status as the UI shows it, read from the database."""
    running = RunningTurn.objects.filter(tab_id=tab_id).first()
    queued = list(QueuedMessage.objects.filter(tab_id=tab_id).values("id", "text"))
    if running is None:
        return {"state": "idle", "queued": queued}
    return {
        "state": running.status,
        "turn_id": str(running.turn_id),
        "step": running.step,
        "started_at": running.started_at.isoformat(),
        "usage": turn_usage(running.turn_id),
        "queued": queued,
        "stale": is_stale(running),
    }


# --- The lease --------------------------------------------------------------------


def _host_id() -> str:
    """This host as worker ids name it: the host name and, where there is one, the
    PID namespace. Containers that share a host name (host networking, a fixed
    hostname on replicas) each have their own pids, which must never be checked
    against one another; with the namespace in the name they are other hosts,
    recognised as dead by the heartbeat alone."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return socket.gethostname()
    return f"{socket.gethostname()}/pidns-{namespace}"


HOST_ID = _host_id()


def worker_id(channel_name: str) -> str:
    """Names a worker so that a dead one on this host is recognised at once."""
    return f"{HOST_ID}:{os.getpid()}:{channel_name}"


# Tabs whose lease this process holds or is taking, counted: a claim is made
# before acquire() commits the lease row and dropped only after the runner has
# released it, so the recovery scan (another thread) never sees a lease of this
# process that no claim covers. A count, not a set: a runner that has just
# released a tab still holds its claim while a new turn.start claims it again.
_claims: Counter[uuid.UUID] = Counter()


def claim(tab_id: uuid.UUID) -> None:
    """Say this process is taking (or holds) the tab's lease. Call before acquire()."""
    _claims[tab_id] += 1


def unclaim(tab_id: uuid.UUID) -> None:
    """Drop one claim: acquire() took nothing, or the runner has released the lease."""
    _claims[tab_id] -= 1
    if _claims[tab_id] <= 0:
        del _claims[tab_id]


def is_dead(running: RunningTurn) -> bool:
    """The lease's worker is gone: its heartbeat is stale, or it ran on this host and
    its process is gone (or a zombie), or it is this process and no claim covers it."""
    if is_stale(running):
        return True
    host, _, rest = running.worker.partition(":")
    pid_text = rest.partition(":")[0]
    if host != HOST_ID or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        # A previous process with the same pid (a restarted container) left it.
        return _claims[running.tab_id] <= 0
    return not _process_alive(pid)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    # A killed worker whose parent has not reaped it yet still answers kill(0).
    try:
        stat = f"/proc/{pid}/stat"
        with open(stat) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (not Linux): kill(0) is all there is
    return state not in ("Z", "X")


def acquire(tab_id: uuid.UUID, worker: str) -> uuid.UUID | None:
    """Take the tab's lease for a new turn, or None when another worker holds it
    or there is nothing to run. A dead worker's lease is recovered first.
    """
    recovered: list = []
    with transaction.atomic():
        if not Tab.objects.select_for_update().filter(pk=tab_id).exists():
            return None
        running = RunningTurn.objects.filter(tab_id=tab_id).first()
        if running is not None:
            if not is_dead(running):
                return None
            recovered = _recover(running)
        turn_id = None
        if QueuedMessage.objects.filter(tab_id=tab_id).exists():
            turn_id = uuid.uuid4()
            RunningTurn.objects.create(
                tab_id=tab_id, turn_id=turn_id, worker=worker, heartbeat_at=timezone.now()
            )
    _broadcast_recovered(tab_id, recovered)
    return turn_id


def release(tab_id: uuid.UUID, turn_id: uuid.UUID) -> None:
    """Give up this turn's lease (and only it: a recovered lease is another's)."""
    RunningTurn.objects.filter(tab_id=tab_id, turn_id=turn_id).delete()


def hand_back(tab_id: uuid.UUID, turn_id: uuid.UUID) -> None:
    """Give up a lease whose turn this worker will not run: the queued messages
    go to another worker (or to this process's next start)."""
    release(tab_id, turn_id)
    request_run(tab_id)


def recover_stale(*, everything: bool = False) -> list[uuid.UUID]:
    """Recover turns whose worker died; returns their tab ids.

    `everything` also takes leases whose worker looks alive: for tests and for
    an operator who knows no worker runs.
    Tabs with messages still queued are sent to the workers to run.
    """
    recovered = []
    for running in RunningTurn.objects.all():
        with transaction.atomic():
            Tab.objects.select_for_update().filter(pk=running.tab_id).exists()
            current = RunningTurn.objects.filter(tab_id=running.tab_id).first()
            if current is None or not (everything or is_dead(current)):
                continue
            blocks = _recover(current)
        _broadcast_recovered(running.tab_id, blocks)
        recovered.append(running.tab_id)
        logger.warning("recovered interrupted turn %s on tab %s", running.turn_id, running.tab_id)
    for tab_id in QueuedMessage.objects.values_list("tab_id", flat=True).distinct():
        if not RunningTurn.objects.filter(tab_id=tab_id).exists():
            request_run(tab_id)
    return recovered


def _broadcast_recovered(tab_id: uuid.UUID, blocks: list) -> None:
    if not blocks:
        return
    for block in blocks:
        _group_send(tab_group(tab_id), {"type": "tab.op", "op": "seal", "block": block.to_dict()})
    _group_send(tab_group(tab_id), {"type": "tab.op", "op": "status", "status": status(tab_id)})


def _recover(running: RunningTurn) -> list:
    """Close a turn whose worker is gone, so the log is a valid history again.

    Seals the checkpointed open block marked interrupted, answers the calls
    left without a result, and says so in a system chunk. Runs inside the
    caller's transaction, holding the tab lock.
    """
    from chat import log
    from chat.models import Chunk
    from chat.stream import Block, Kind, Role

    turn_id, tab_id = running.turn_id, running.tab_id
    blocks: list[Block] = []
    lost = ""
    if running.open_chunk:
        block = Block.from_dict(running.open_chunk)
        # The seal may have reached the log just before the crash.
        if not Chunk.objects.filter(pk=block.id).exists():
            block.data["interrupted"] = True
            blocks.append(block)
            lost = " The last block was saved up to its last checkpoint (at most a second lost)."
    calls = {
        row["call_id"]: (row["name"], step)
        for row, step in (
            (c.data, c.step)
            for c in Chunk.objects.filter(tab_id=tab_id, turn_id=turn_id, type=Kind.TOOL_CALL)
        )
    }
    answered = set(
        Chunk.objects.filter(tab_id=tab_id, turn_id=turn_id, type=Kind.TOOL_RESULT).values_list(
            "data__call_id", flat=True
        )
    )
    answered.update(b.data.get("call_id") for b in blocks if b.type == Kind.TOOL_RESULT)
    for call_id, (name, step) in calls.items():
        if call_id in answered:
            continue
        blocks.append(
            Block(
                uuid.uuid4(),
                turn_id,
                step,
                Role.TOOL,
                Kind.TOOL_RESULT,
                {
                    "call_id": call_id,
                    "name": name,
                    "is_error": True,
                    "result": "Not run to completion: the server stopped during this call.",
                },
            )
        )
    for block in blocks:
        if block.type == Kind.TOOL_RESULT and "result" not in block.data:
            block.data.update(
                result="Interrupted: the server stopped while this call ran.", is_error=True
            )
    blocks.append(
        Block(
            uuid.uuid4(),
            turn_id,
            running.step,
            Role.SYSTEM,
            Kind.SYSTEM,
            {
                "kind": "interrupted",
                "text": "The server stopped in the middle of this turn." + lost,
            },
        )
    )
    log.append(tab_id, blocks)
    running.delete()
    return blocks


# --- Worker processes ---------------------------------------------------------------

# How often a worker looks for turns whose worker died. With LEASE_STALE_SECONDS
# this bounds recovery of a SIGKILLed worker on another host to about 20 s; on
# the same host a dead pid is seen at the next scan.
SCAN_SECONDS = 5.0


async def run_worker() -> None:
    """Run turns until cancelled: the TurnWorker on WORKER_CHANNEL, plus the recovery scan.

    Cancelling it drains: see _shut_down."""
    from channels.db import database_sync_to_async
    from channels.routing import ChannelNameRouter
    from channels.worker import Worker

    from chat.routing import channel_routes

    global accepting_turns
    accepting_turns = True

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

    layer = get_channel_layer()
    worker = StoppableWorker(ChannelNameRouter(channel_routes), [WORKER_CHANNEL], layer)

    async def scan() -> None:
        while True:
            try:
                await database_sync_to_async(recover_stale)()
            except Exception:
                logger.exception("recovery scan failed")
            await asyncio.sleep(SCAN_SECONDS)

    scanner = asyncio.create_task(scan())
    listening = asyncio.create_task(worker.arun())
    try:
        await listening
    finally:
        # At once: a turn.start whose lease is being taken right now must see it.
        accepting_turns = False
        scanner.cancel()
        listening.cancel()
        # Stop listening before anything else: a turn.start taken now would be lost.
        await asyncio.gather(scanner, listening, return_exceptions=True)
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
    from chat.agent import RUNNING

    for runner in list(RUNNING.values()):
        runner.cancel(stopping=True)


async def _shut_down(worker) -> None:
    from chat.agent import RUNNING

    global accepting_turns
    accepting_turns = False

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
