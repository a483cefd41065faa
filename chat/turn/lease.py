"""The lease: the RunningTurn row that says which worker runs a tab's turn.

Every write to RunningTurn goes through here, except the open block's
checkpoint (its header, and its body's CheckpointPiece rows), which `log`
writes and clears with the seal that replaces it. The
primary key is the tab, so one turn per tab is a database fact; the heartbeat
is the lease's fence (an update that finds the lease gone means another worker
recovered it). A worker *claims* a tab in process memory before its lease
commits and drops the claim after the runner released it, so the recovery scan
never mistakes a lease being taken for a dead one's.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet, Sum
from django.utils import timezone

from chat import bus, context, log, sidebar
from chat.chunks import Kind
from chat.history import History
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab, UsageRecord, agent_children
from chat.providers import registry
from chat.stream import Block, Reducer
from chat.tools.registry import AGENT
from chat.turn import ending
from chat.turn.ending import RESUMING  # noqa: F401 (tests and the runner's notice)

logger = logging.getLogger(__name__)

# A worker refreshes its lease at least this often while a turn runs.
HEARTBEAT_SECONDS = 5.0
# A lease whose heartbeat is older than this belongs to a dead worker: three
# missed heartbeats, so a busy event loop is not mistaken for a crash.
LEASE_STALE_SECONDS = 15.0
# This process's own claimed lease is taken only after this long without a heartbeat: a
# loaded machine must not lose a live turn, but a runner wedged for minutes must not hold
# its tab until a restart either.
OWN_LEASE_STUCK_SECONDS = 300.0


def is_stale(running: RunningTurn) -> bool:
    return _stale_since(running.heartbeat_at)


def _stale_since(heartbeat_at: datetime) -> bool:
    return heartbeat_at < timezone.now() - timedelta(seconds=LEASE_STALE_SECONDS)


def turn_usage(turn_id: uuid.UUID) -> dict[str, int]:
    totals = UsageRecord.objects.filter(turn_id=turn_id).aggregate(
        input=Sum("input_tokens"),
        output=Sum("output_tokens"),
        cache_read=Sum("cache_read_tokens"),
        cache_write=Sum("cache_write_tokens"),
    )
    return {k: v or 0 for k, v in totals.items()}


def status(tab_id: uuid.UUID) -> dict[str, Any]:
    """The tab's turn status as the UI shows it, read from the database: the tab's meter
    and its lease in one read, its queue in another (a page and each socket's catch-up
    read it)."""
    row = (
        Tab.objects.filter(pk=tab_id)
        .values(
            "context",
            "model",
            "runningturn__turn_id",
            "runningturn__status",
            "runningturn__step",
            "runningturn__started_at",
            "runningturn__heartbeat_at",
        )
        .first()
    )
    queued = [
        {"id": q.pk, "text": q.label, "compact": q.compact}
        for q in QueuedMessage.objects.filter(tab_id=tab_id, rerun=False).only(
            "id", "text", "compact", "compact_through"
        )
    ]
    if row is None:
        return {"state": "idle", "queued": queued, "context": None}
    context_meter = _meter_of(row["context"], row["model"])
    state = row["runningturn__status"]
    if state is None or state == RunningTurn.Status.FINISHING:
        return {"state": "idle", "queued": queued, "context": context_meter}
    return {
        "context": context_meter,
        "state": state,
        "turn_id": str(row["runningturn__turn_id"]),
        "step": row["runningturn__step"],
        "started_at": row["runningturn__started_at"].isoformat(),
        "usage": turn_usage(row["runningturn__turn_id"]),
        "queued": queued,
        "stale": _stale_since(row["runningturn__heartbeat_at"]),
    }


def meter(tab_id: uuid.UUID) -> dict[str, Any] | None:
    """The tab's context meter (chat.context.Meter) from its last request."""
    row = Tab.objects.filter(pk=tab_id).values_list("context", "model").first()
    return None if row is None else _meter_of(*row)


def _meter_of(size: Any, model: str) -> dict[str, Any]:
    """A context meter from a tab's stored size (Tab.context) and model."""
    return context.meter(context.Size.from_dict(size), model or registry.default_model()).as_dict()


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
    host, _, rest = running.worker.partition(":")
    pid_text = rest.partition(":")[0]
    mine = host == HOST_ID and pid_text == str(os.getpid())
    if mine:
        # This process knows its own runners better than a heartbeat does: a machine so
        # loaded that a heartbeat lags 15 s must not have its scan take a live turn.
        # Without a claim, a previous process with the same pid (a restarted container)
        # left it.
        stuck = timezone.now() - timedelta(seconds=OWN_LEASE_STUCK_SECONDS)
        return _claims[running.tab_id] <= 0 or running.heartbeat_at < stuck
    if is_stale(running):
        return True
    if host != HOST_ID or not pid_text.isdigit():
        return False
    return not _process_alive(int(pid_text))


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
    recovered: list[Block] = []
    with transaction.atomic():
        found = _locked(tab_id, running=True)
        if found is None:
            return None
        has_running, queued = found
        running = RunningTurn.objects.filter(tab_id=tab_id).first() if has_running else None
        if running is not None:
            if not is_dead(running):
                return None
            recovered = _recover(running)
            # The recovery may queue a rerun for a sub-agent that runs on.
            queued = QueuedMessage.objects.filter(tab_id=tab_id).exists()
        turn_id = None
        if queued:
            turn_id = uuid.uuid4()
            RunningTurn.objects.create(
                tab_id=tab_id, turn_id=turn_id, worker=worker, heartbeat_at=timezone.now()
            )
    _broadcast_recovered(tab_id, recovered)
    return turn_id


def _locked(tab_id: uuid.UUID, *, running: bool = False) -> tuple[bool, bool] | None:
    """Inside the caller's transaction: the tab row's lock (which every writer of its
    lease and queue takes), then whether it has a lease (`running`) and a message queued,
    in one read. None when the tab is gone.

    Two statements, not one: on PostgreSQL a statement that waited for the lock reads the
    other tables as they were when it began, before the commit it waited for (a message
    queued, a lease taken); the next statement sees that commit
    (tests/test_lease_lock_snapshot.py)."""
    if not Tab.objects.select_for_update().filter(pk=tab_id).values_list("pk").exists():
        return None
    checks = {"has_queued": Exists(QueuedMessage.objects.filter(tab_id=OuterRef("pk")))}
    if running:
        checks["has_lease"] = Exists(RunningTurn.objects.filter(tab_id=OuterRef("pk")))
    row = Tab.objects.filter(pk=tab_id).annotate(**checks).values(*checks).get()
    return bool(row.get("has_lease")), bool(row["has_queued"])


def release(tab_id: uuid.UUID, turn_id: uuid.UUID) -> None:
    """Give up this turn's lease (and only it: a recovered lease is another's)."""
    _mine(tab_id, turn_id).delete()


def hand_back(tab_id: uuid.UUID, turn_id: uuid.UUID) -> None:
    """Give up a lease whose turn this worker will not run: the queued messages
    go to another worker (or to this process's next start)."""
    release(tab_id, turn_id)
    bus.request_run(tab_id)


def recover_stale(*, everything: bool = False) -> list[uuid.UUID]:
    """Recover turns whose worker died; returns their tab ids.

    `everything` also takes leases whose worker looks alive: for tests and for
    an operator who knows no worker runs.
    Tabs with messages still queued are sent to the workers to run.
    """
    recovered = []
    for running in RunningTurn.objects.all():
        if not (everything or is_dead(running)):
            continue  # the common case, checked again under the lock before anything is taken
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
            bus.request_run(tab_id)
    return recovered


def _broadcast_recovered(tab_id: uuid.UUID, blocks: list[Block]) -> None:
    if not blocks:
        return
    for block in blocks:
        bus.publish(tab_id, {"op": "seal", "block": block.to_dict()})
    now = status(tab_id)
    bus.publish(tab_id, {"op": "status", "status": now})
    # The dead worker never said so: the owner's sidebars still mark the tab running.
    sidebar.announce(tab_id, sidebar.state_of(now))


def _recover(running: RunningTurn) -> list[Block]:
    """Close a turn whose worker is gone, so the log is a valid history again: as its
    runner would have closed it (chat.turn.ending), with the turn's reducer rebuilt from
    the log and the checkpoint. Runs inside the caller's transaction, holding the tab
    lock."""
    if running.status == RunningTurn.Status.FINISHING:
        # Its end is in the log: only the release was lost. A message queued
        # meanwhile is sent to the workers by the caller.
        running.delete()
        return []
    tab_id = running.tab_id
    reducer, checkpoint_lost = _dead_reducer(running)
    # A sub-agent runs on under its own lease: its call stays open, and the turn goes on
    # (a rerun message) to wait for it and take its result (chat.turn.agents).
    has_children = Tab.objects.filter(parent_tab_id=tab_id).exists()
    # Read before the ending's results go in: they answer every call but those.
    waiting = open_children(tab_id, has_children)
    end = ending.End.recovered(checkpoint_lost=checkpoint_lost, resuming=bool(waiting))
    blocks = ending.sealed(ending.end_ops(reducer, end))
    log.append(tab_id, blocks)
    running.delete()
    if waiting:
        QueuedMessage.objects.create(tab_id=tab_id, rerun=True)
    return blocks


def _dead_reducer(running: RunningTurn) -> tuple[Reducer, bool]:
    """The dead turn's reducer as its runner had it: the checkpointed block open (unless
    its seal reached the log just before the crash), and its calls without a result
    pending, but for `agent` calls whose child runs on. And whether a block was open."""
    turn_id, tab_id = running.turn_id, running.tab_id
    block = log.checkpointed(tab_id)
    if block is not None and Chunk.objects.filter(pk=block.id).exists():
        block = None  # its seal reached the log just before the crash
    # The open block goes in as the reducer's own, as its runner had it.
    reducer = Reducer(turn_id, running.step, _open=block)
    calls = {
        c.data["call_id"]: (c.data["name"], c.seq)
        for c in Chunk.objects.filter(tab_id=tab_id, turn_id=turn_id, type=Kind.TOOL_CALL)
    }
    answered = set(
        Chunk.objects.filter(tab_id=tab_id, turn_id=turn_id, type=Kind.TOOL_RESULT).values_list(
            "data__call_id", flat=True
        )
    )
    made = agent_children(
        tab_id, [(call_id, seq) for call_id, (name, seq) in calls.items() if name == AGENT]
    )
    reducer.pending_calls = [
        (call_id, name)
        for call_id, (name, seq) in calls.items()
        if call_id not in answered and not (name == AGENT and (call_id, seq) in made)
    ]
    return reducer, block is not None


def open_children(tab_id: uuid.UUID, has_children: bool) -> list[str]:
    """The call ids of the tab's open `agent` calls (as the resumed turn's runner finds
    them: History.open_calls) whose child exists. Not only the dying turn's: a resumed
    turn's re-attached call is in the turn before it."""
    if not has_children:
        return []
    try:
        history = History.build(log.context_tail(tab_id))
        open_calls = history.open_calls()
    except ValueError:
        # A log no request can be built from fails the resumed turn anyway: the recovery
        # itself must not fail, or the tab stays stuck running.
        logger.exception("tab %s: its log does not read as a history", tab_id)
        return []
    calls = []
    for call_id, name in open_calls:
        if name != AGENT:
            continue
        seq = (
            Chunk.objects.filter(tab_id=tab_id, type=Kind.TOOL_CALL, data__call_id=call_id)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
        )
        if seq is not None:
            calls.append((call_id, seq))
    made = agent_children(tab_id, calls)
    return [call_id for call_id, seq in calls if (call_id, seq) in made]


# --- The running turn's own writes (from its runner, on the database thread) --------


def _mine(tab_id: uuid.UUID, turn_id: uuid.UUID) -> QuerySet[RunningTurn]:
    """This turn's lease row: after a recovery the tab's lease may be another's."""
    return RunningTurn.objects.filter(tab_id=tab_id, turn_id=turn_id)


def beat(tab_id: uuid.UUID, turn_id: uuid.UUID) -> tuple[str, str]:
    """Refresh the heartbeat. ("ok", ""); ("cancel", why) when a Stop is recorded (why ""
    for the user's own); ("lost", "") when another worker recovered the lease; ("gone", "")
    when the tab was deleted."""
    rows = _mine(tab_id, turn_id)
    if not rows.update(heartbeat_at=timezone.now()):
        return ("lost" if Tab.objects.filter(pk=tab_id).exists() else "gone"), ""
    stop = rows.filter(cancel_requested=True).values_list("cancel_why", flat=True).first()
    return ("ok", "") if stop is None else ("cancel", stop)


def set_step(tab_id: uuid.UUID, turn_id: uuid.UUID, step: int) -> None:
    _mine(tab_id, turn_id).update(step=step)


def running_turn(tab_id: uuid.UUID) -> uuid.UUID | None:
    """The turn still writing the tab's log (None when none is, or it is finishing)."""
    return (
        RunningTurn.objects.filter(tab_id=tab_id)
        .exclude(status=RunningTurn.Status.FINISHING)
        .values_list("turn_id", flat=True)
        .first()
    )


def set_finishing(tab_id: uuid.UUID, turn_id: uuid.UUID) -> None:
    """The turn wrote its last chunk: from now on its log may be branched and continued."""
    _mine(tab_id, turn_id).update(status=RunningTurn.Status.FINISHING)


def set_waiting(tab_id: uuid.UUID, turn_id: uuid.UUID, waiting: bool) -> None:
    """The turn waits for the user to approve a call (or runs again)."""
    status = RunningTurn.Status.WAITING if waiting else RunningTurn.Status.RUNNING
    _mine(tab_id, turn_id).update(status=status)


def request_cancel(tab_id: uuid.UUID, turn_id: uuid.UUID | None = None, why: str = "") -> bool:
    """Record a Stop on the tab's lease (of `turn_id` only, when given), with `why` when
    it is not the user's, for the heartbeat to find if the control message is lost or
    slower. False when none runs."""
    running = RunningTurn.objects.filter(tab_id=tab_id)
    if turn_id is not None:
        running = running.filter(turn_id=turn_id)
    # The first Stop's reason stands, as in the runner (TurnRunner.cancel).
    if running.filter(cancel_requested=False).update(cancel_requested=True, cancel_why=why[:200]):
        return True
    return running.exists()


def release_or_continue(tab_id: uuid.UUID, turn_id: uuid.UUID) -> uuid.UUID | None:
    """End of a turn: give the lease back, unless a message is waiting; then the
    same lease goes on as a new turn, whose id is returned. Under the tab lock,
    so a message queued meanwhile is never left behind."""
    with transaction.atomic():
        found = _locked(tab_id)
        if found is None:
            raise Tab.DoesNotExist(f"tab {tab_id} does not exist")
        mine = _mine(tab_id, turn_id)
        if found[1]:
            new_id = uuid.uuid4()
            if mine.update(
                turn_id=new_id, step=0, cancel_requested=False, cancel_why="", status="running"
            ):
                return new_id
            return None
        mine.delete()
        return None
