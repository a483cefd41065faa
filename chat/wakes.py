"""Wakes (ARCHITECTURE.md, Wakes): claiming a due time, firing it into a tab, recovering a firing a
crash cut short, and the scheduler every worker runs.

Exactly one firing per scheduled time, whatever the number of workers: a worker claims
a wake in ONE transaction that moves `Wake.next_run_at` on only if it still holds the
value the worker read (a compare-and-set UPDATE: on PostgreSQL the second of two
concurrent updates waits for the first and then matches nothing; SQLite runs them one
after the other) and inserts the time's `WakeRun` (unique on wake and time) as
`pending`. Only then is the prompt submitted (`turns.submit` with the wake as origin,
kept in the user chunk), in one transaction under the tab's lock with the run marked
`submitted` by a compare-and-set on its take. A crash in between leaves the pending run;
recovery takes it (a newer stamp) and submits it unless its message is already queued or
in the log; a worker whose run was taken from it does not submit it.

A time that has a run already (the clock stepped back, a Run now at the same instant)
is moved past all the same and not fired again: a claim that could not move
`next_run_at` would leave the wake due for ever.

Each wake is claimed and fired on its own: one that raises is logged (a firing counted
on its run, failed after MAX_FIRE_ATTEMPTS) and the others go on.

The times themselves are chat.schedule's (pure); this module brings in the clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from chat import bus, preferences, schedule, turns
from chat.chunks import Origin, OriginKind, Role, untyped
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab, Wake, WakeRun

logger = logging.getLogger(__name__)

# The scheduler looks at the wakes at least this often even when none is due sooner: a
# wakes.changed message can be lost (a full channel) or go to another worker, and a
# wake can be edited where nobody sends one (the database by hand).
SLEEP_CAP_SECONDS = 60.0
# A pending run this old was cut short by a crash (a firing takes milliseconds): the
# recovery submits it. Taking it moves its created_at on, so a second worker's recovery
# leaves it alone for as long again.
PENDING_STALE = timedelta(seconds=60)
# Wakes fired in one pass; the rest are due still and go in the next pass, at once.
MAX_FIRED_PER_PASS = 50
# Firings of one run (the claim's and recoveries') before it is recorded failed: an
# error that happened three times, a minute apart, is not going away by itself, and a
# run retried for ever would hide it.
MAX_FIRE_ATTEMPTS = 3
# The shortest sleep after a pass in which a claim raised (the database, most likely):
# the wake is still due, and sleeping "until it is due" would be no sleep at all.
ERROR_RETRY_SECONDS = 5.0

SKIPPED_BUSY = "A turn was running in the tab (overlap: skip)."
TAB_DELETED = "The wake's tab was deleted: the wake is disabled."
TAB_DELETED_NEW_TAB = (
    "The wake's tab was deleted (a history wipe): the wake starts a new tab each time now."
)
WAKE_DISABLED = "The wake was disabled before this run could be completed."
OWNER_INACTIVE = "The wake's owner is deactivated."

# A pass's clock: each claim and take is stamped when it happens, not when the pass
# began (a pass firing fifty wakes takes a while, and a stamp older than it is makes
# another worker's recovery take a run still being fired).
Clock = Callable[[], datetime]


def schedule_of(wake: Wake) -> schedule.Schedule:
    return schedule.parse(
        wake.kind,
        cron=wake.cron,
        timezone=wake.timezone,
        interval_seconds=wake.interval_seconds,
        once_at=wake.once_at,
    )


def reschedule(wake: Wake, now: datetime) -> None:
    """Set a new or changed wake's next time from now (None when disabled);
    ScheduleError when it would never fire. Does not save."""
    if not wake.enabled:
        wake.next_run_at = None
        return
    wake.next_run_at = schedule.first_run(schedule_of(wake), now, wake.expires_at)


# --- the Wakes page's actions ----------------------------------------------------------
# Each writes only what it changes, by a conditional UPDATE: the scheduler may claim the
# wake between the page's read and this write, and saving the row read would put back
# the `next_run_at` it just moved past.


def disable(wake: Wake, now: datetime) -> None:
    Wake.objects.filter(pk=wake.pk).update(enabled=False, next_run_at=None, updated_at=now)


def enable(wake: Wake, now: datetime) -> None:
    """Start a disabled (or stopped) wake again from now; ScheduleError when it would
    never fire. An enabled wake that still has a next time is left as it is."""
    stopped = Q(enabled=False) | Q(next_run_at__isnull=True)
    with transaction.atomic():
        fresh = Wake.objects.select_for_update().filter(stopped, pk=wake.pk).first()
        if fresh is None:
            return
        first = schedule.first_run(schedule_of(fresh), now, fresh.expires_at)
        Wake.objects.filter(stopped, pk=wake.pk).update(
            enabled=True, next_run_at=first, updated_at=now
        )


def keep(wake: Wake, now: datetime) -> None:
    """No expiry; an enabled wake that stopped (it expired) starts again from now.
    ScheduleError (nothing changed) when it would never fire again."""
    with transaction.atomic():
        Wake.objects.filter(pk=wake.pk).update(expires_at=None, updated_at=now)
        fresh = Wake.objects.select_for_update().filter(pk=wake.pk).first()
        if fresh is not None and fresh.enabled and fresh.next_run_at is None:
            first = schedule.first_run(schedule_of(fresh), now)
            Wake.objects.filter(pk=wake.pk, enabled=True, next_run_at__isnull=True).update(
                next_run_at=first
            )


def changed() -> None:
    """A wake was added or changed: some worker's scheduler looks again now."""
    bus.wakes_changed()


def origin_of(wake: Wake, scheduled_for: datetime) -> dict[str, Any]:
    """The user chunk's origin: which wake and time (the dedup key of recovery), and
    what the page and the runner need without reading the wake (its name, its approval
    policy as it was when it fired)."""
    origin = Origin(
        kind=OriginKind.WAKE,
        wake_id=wake.pk,
        scheduled_for=scheduled_for.isoformat(),
        name=str(wake),
        timezone=wake.timezone,
        approval=wake.approval,
    )
    return untyped(origin)


# --- claim ---------------------------------------------------------------------------


def claim(wake_id: int, now: datetime) -> WakeRun | None:
    """Claim the wake's due time(s) at `now`: the run to fire (pending), or None (not
    due, claimed by another worker, or nothing to run: missed slots recorded skipped,
    or the time has a run already). Whichever, a due wake's next time moves on."""
    wake = Wake.objects.filter(pk=wake_id, enabled=True, owner__is_active=True).first()
    if wake is None or wake.next_run_at is None or wake.next_run_at > now:
        return None
    due = wake.next_run_at
    try:
        plan = schedule.plan(
            schedule_of(wake), due, now, catch_up=wake.catch_up, expires_at=wake.expires_at
        )
    except (ValueError, ArithmeticError) as exc:
        # A row changed by hand (the admin, the database) into something unusable
        # (ScheduleError is a ValueError; a date past year 9999 an OverflowError).
        _disable(wake, due, now, f"The wake's schedule is invalid: {exc}")
        return None
    with transaction.atomic():
        moved = Wake.objects.filter(pk=wake.pk, enabled=True, next_run_at=due).update(
            next_run_at=plan.next_run_at, updated_at=now
        )
        if not moved:
            return None
        _record_skipped(wake, plan, now)
        if plan.run is None:
            return None
        try:
            with transaction.atomic():  # a savepoint: the move above stays
                return _pending(wake, plan.run, now)
        except IntegrityError:
            logger.warning(
                "wake %s: %s has a run already (a clock stepped back, or a Run now at that "
                "instant): moved on without firing it again",
                wake.pk,
                plan.run.isoformat(),
            )
            return None


def _record_skipped(wake: Wake, plan: schedule.Plan, now: datetime) -> None:
    why = (
        "Missed while no worker ran (catch-up: latest only)."
        if wake.catch_up == Wake.CatchUp.LATEST
        else "Missed while no worker ran (catch-up: skip)."
    )
    rows = [
        WakeRun(wake=wake, scheduled_for=slot, status=WakeRun.Status.SKIPPED, reason=why)
        for slot in plan.skipped
    ]
    if rows and plan.unrecorded:
        count = f"more than {plan.unrecorded}" if plan.more else str(plan.unrecorded)
        rows[0].reason = f"{why} {count} earlier missed times are not listed."
    for row in rows:
        row.finished_at = now
    # ignore_conflicts: a slot a "run now" took at the very same instant stays as it is.
    WakeRun.objects.bulk_create(rows, ignore_conflicts=True)


def _disable(wake: Wake, due: datetime, now: datetime, reason: str) -> None:
    """Stop a wake that cannot run, with a failed run saying why."""
    with transaction.atomic():
        if Wake.objects.filter(pk=wake.pk, next_run_at=due).update(
            enabled=False, next_run_at=None, updated_at=now
        ):
            WakeRun.objects.get_or_create(
                wake=wake,
                scheduled_for=due,
                defaults={"status": WakeRun.Status.FAILED, "reason": reason, "finished_at": now},
            )
    return None


def run_now(wake: Wake, now: datetime) -> WakeRun:
    """The wake's prompt now, once, outside its schedule (the Wakes page's Run now,
    `manage.py wake run`); its next time stays. The run, fired (or skipped, or failed,
    with the reason)."""
    return _fire_counted(_pending(wake, now, now), now)


def _pending(wake: Wake, scheduled_for: datetime, now: datetime) -> WakeRun:
    """The claimed time's run, taken for its first firing."""
    run = WakeRun.objects.create(wake=wake, scheduled_for=scheduled_for, attempts=1)
    # Recovery's clock is the caller's `now`, not auto_now_add's.
    WakeRun.objects.filter(pk=run.pk).update(created_at=now)
    run.created_at = now
    return run


# --- fire ---------------------------------------------------------------------------


def fire(run: WakeRun, now: datetime) -> WakeRun:
    """Submit a pending run's prompt to its tab (a new one if the wake says so) and
    record what happened. Safe to call again for the same run: it submits only if the
    message is neither queued nor in the log, and only while the run is still the
    caller's take (pending, with the stamp and attempt count the caller holds)."""
    wake = Wake.objects.select_related("owner", "profile", "tab").get(pk=run.wake_id)
    if not wake.owner.is_active:
        return _finish(run, WakeRun.Status.SKIPPED, now, reason=OWNER_INACTIVE)
    origin = origin_of(wake, run.scheduled_for)
    tab = run.tab
    if tab is None and wake.new_tab:
        try:
            with transaction.atomic():
                tab = preferences.new_tab(
                    wake.owner, wake.model, profile=wake.profile, title=str(wake)
                )
                # Before the submit: a recovery finds this tab, not another new one.
                WakeRun.objects.filter(pk=run.pk).update(tab=tab)
        except Exception as exc:
            logger.exception("wake %s: could not make its tab", wake.pk)
            return _finish(run, WakeRun.Status.FAILED, now, reason=f"No new tab: {exc}")
    elif tab is None:
        tab = wake.tab
        if tab is None:
            return _tab_gone(wake, run, now)
    skip = wake.overlap == Wake.Overlap.SKIP and not wake.new_tab
    try:
        # One transaction under the tab's lock: the dedup check, the run's completion
        # (a compare-and-set on the take, before the submit) and the submit. Two
        # workers firing the same run (a recovery that took it from a worker still
        # firing it) submit it once, and a crash leaves it pending with no message.
        with transaction.atomic():
            Tab.objects.select_for_update().filter(pk=tab.pk).values_list("pk").get()
            # First: a recovered run whose message went in is not skipped for its turn.
            queued_id = _already_sent(tab, origin)
            busy = queued_id is None and skip and _busy(tab)
            status = WakeRun.Status.SKIPPED if busy else WakeRun.Status.SUBMITTED
            taken = WakeRun.objects.filter(
                pk=run.pk,
                status=WakeRun.Status.PENDING,
                created_at=run.created_at,
                attempts=run.attempts,
            ).update(
                status=status,
                reason=SKIPPED_BUSY if busy else "",
                finished_at=now,
                tab=tab,
                queued_id=queued_id or None,
            )
            if not taken:
                logger.warning("wake %s: %s was taken by another worker", wake.pk, run)
                return WakeRun.objects.get(pk=run.pk)
            if queued_id is None and not busy:
                queued_id = turns.submit(tab, wake.prompt, origin=origin).pk
                WakeRun.objects.filter(pk=run.pk).update(queued_id=queued_id)
    except Tab.DoesNotExist:
        # Deleted between the read and the submit.
        return _tab_gone(wake, run, now)
    except ValueError as exc:
        return _finish(run, WakeRun.Status.FAILED, now, reason=str(exc), tab=tab)
    run.refresh_from_db()
    return run


def _tab_gone(wake: Wake, run: WakeRun, now: datetime) -> WakeRun:
    """The run of a wake whose tab was deleted: failed, and the wake disabled unless
    a history wipe made it a new-tab wake meanwhile (its later runs go there)."""
    disabled = Wake.objects.filter(pk=wake.pk, new_tab=False, tab__isnull=True).update(
        enabled=False, next_run_at=None
    )
    reason = TAB_DELETED if disabled else TAB_DELETED_NEW_TAB
    return _finish(run, WakeRun.Status.FAILED, now, reason=reason)


def _busy(tab: Tab) -> bool:
    """A turn runs in the tab or is about to (a message waits for one)."""
    running = RunningTurn.objects.filter(tab=tab).exclude(status=RunningTurn.Status.FINISHING)
    return running.exists() or QueuedMessage.objects.filter(tab=tab).exists()


def _already_sent(tab: Tab, origin: dict[str, Any]) -> int | None:
    """The queued message's id (0 once in the log) carrying this origin, or None."""
    key = {"wake_id": origin["wake_id"], "scheduled_for": origin["scheduled_for"]}
    queued = QueuedMessage.objects.filter(
        tab=tab, **{f"origin__{k}": v for k, v in key.items()}
    ).first()
    if queued is not None:
        return queued.pk
    logged = Chunk.objects.filter(
        tab=tab, role=Role.USER, **{f"data__origin__{k}": v for k, v in key.items()}
    ).exists()
    return 0 if logged else None


def _finish(
    run: WakeRun,
    status: str,
    now: datetime,
    *,
    reason: str = "",
    tab: Tab | None = None,
    queued_id: int | None = None,
) -> WakeRun:
    run.status, run.reason, run.finished_at = status, reason, now
    run.tab = tab if tab is not None else run.tab
    run.queued_id = queued_id
    # The tab may be gone by now (a wipe, a delete): the run keeps its record.
    if run.tab_id is not None and not Tab.objects.filter(pk=run.tab_id).exists():
        run.tab = None
    run.save(update_fields=["status", "reason", "finished_at", "tab", "queued_id"])
    return run


# --- recovery and the scheduler pass ---------------------------------------------------


def recover(now: datetime, clock: Clock | None = None) -> list[WakeRun]:
    """Fire the pending runs a crash left (older than PENDING_STALE), each taken by one
    worker: the one whose update moved its created_at on (and counted the attempt).
    A run of a wake disabled since is skipped; one tried MAX_FIRE_ATTEMPTS times fails."""
    done = []
    stale = WakeRun.objects.filter(
        status=WakeRun.Status.PENDING, created_at__lt=now - PENDING_STALE
    ).values_list("pk", "created_at", "attempts")
    for pk, created, attempts in list(stale[:MAX_FIRED_PER_PASS]):
        at = _tick(now, clock)
        taken = WakeRun.objects.filter(
            pk=pk, status=WakeRun.Status.PENDING, created_at=created, attempts=attempts
        ).update(created_at=at, attempts=attempts + 1)
        if not taken:
            continue
        try:
            done.append(_recovered(WakeRun.objects.select_related("wake").get(pk=pk), at))
        except Exception:
            # The others are recovered all the same; this one is taken again later.
            logger.exception("wake run %s: its recovery failed", pk)
    return done


def _recovered(run: WakeRun, now: datetime) -> WakeRun:
    logger.warning("wake %s: completing run for %s a crash left", run.wake_id, run)
    if run.attempts > MAX_FIRE_ATTEMPTS:
        # Taken that often and never finished: the last firing stopped its worker.
        why = f"Gave up after {MAX_FIRE_ATTEMPTS} attempts: the last stopped its worker."
        earlier = f" Before that: {run.reason}" if run.reason else ""
        return _finish(run, WakeRun.Status.FAILED, now, reason=why + earlier)
    if not run.wake.enabled:
        return _finish(run, WakeRun.Status.SKIPPED, now, reason=WAKE_DISABLED)
    return _fire_counted(run, now)


def _fire_counted(run: WakeRun, now: datetime) -> WakeRun:
    """fire(), with what it raised recorded on the run: pending for the recovery to try
    again, or failed after MAX_FIRE_ATTEMPTS."""
    try:
        return fire(run, now)
    except Exception as exc:
        logger.exception("wake %s: firing %s failed", run.wake_id, run)
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        run.refresh_from_db()
        if run.attempts >= MAX_FIRE_ATTEMPTS:
            reason = f"Gave up after {run.attempts} attempts: {error}"
            return _finish(run, WakeRun.Status.FAILED, now, reason=reason)
        run.reason = f"Attempt {run.attempts} of {MAX_FIRE_ATTEMPTS} failed, retrying: {error}"
        WakeRun.objects.filter(pk=run.pk, status=WakeRun.Status.PENDING).update(reason=run.reason)
        return run


def _tick(now: datetime, clock: Clock | None) -> datetime:
    return now if clock is None else max(now, clock())


def run_due(now: datetime, clock: Clock | None = None) -> list[WakeRun]:
    """One pass: recover what crashed, then claim and fire every due wake, each on its
    own (one that raises is logged and the others go on). The runs this worker fired
    (or recovered). `clock`: the time of each claim (default: `now`)."""
    return _run_due(now, clock)[0]


def _run_due(now: datetime, clock: Clock | None) -> tuple[list[WakeRun], int]:
    """run_due's runs, and how many claims raised."""
    fired = recover(now, clock)
    errors = 0
    due = Wake.objects.filter(
        enabled=True, owner__is_active=True, next_run_at__lte=now
    ).values_list("pk", flat=True)
    for wake_id in list(due[:MAX_FIRED_PER_PASS]):
        at = _tick(now, clock)
        try:
            run = claim(wake_id, at)
        except Exception:
            # Nothing moved (the claim is one transaction): due still, tried next pass.
            logger.exception("wake %s: its claim failed", wake_id)
            errors += 1
            continue
        if run is None:
            continue
        try:
            fired.append(_fire_counted(run, at))
        except Exception:
            # Recording the failure failed too (the database): the run is left pending.
            logger.exception("wake %s: firing %s failed", wake_id, run)
            errors += 1
    return fired, errors


def seconds_until_due(now: datetime) -> float:
    """How long the scheduler may sleep: until the next due time or pending run's
    recovery, at most SLEEP_CAP_SECONDS."""
    times = []
    next_run = (
        Wake.objects.filter(enabled=True, owner__is_active=True, next_run_at__isnull=False)
        .order_by("next_run_at")
        .values_list("next_run_at", flat=True)
        .first()
    )
    if next_run is not None:
        times.append(next_run)
    pending = (
        WakeRun.objects.filter(status=WakeRun.Status.PENDING)
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    if pending is not None:
        times.append(pending + PENDING_STALE)
    if not times:
        return SLEEP_CAP_SECONDS
    return max(0.0, min(SLEEP_CAP_SECONDS, (min(times) - now).total_seconds()))


def _pass() -> float:
    _, errors = _run_due(timezone.now(), timezone.now)
    delay = seconds_until_due(timezone.now())
    return max(delay, ERROR_RETRY_SECONDS) if errors else delay


# The running schedulers' wake-up events (a test may run two workers in one process).
_LISTENERS: set[asyncio.Event] = set()


def nudge() -> None:
    """A wakes.changed message reached this process's worker: its schedulers look now."""
    for event in _LISTENERS:
        event.set()


async def run_scheduler() -> None:
    """Fire wakes until cancelled (the worker's drain): a pass, then sleep until the
    next due time (capped) or a nudge. A pass cancelled midway finishes in its thread;
    a run it left pending is recovered."""
    event = asyncio.Event()
    _LISTENERS.add(event)
    try:
        while True:
            event.clear()
            try:
                delay = await database_sync_to_async(_pass)()
            except Exception:
                logger.exception("wake scheduler pass failed")
                delay = SLEEP_CAP_SECONDS
            with suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), delay)
    finally:
        _LISTENERS.discard(event)
