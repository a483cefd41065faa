"""PURE: when a wake is due (ARCHITECTURE.md, Wakes). No Django, no clock: every function
takes the times it works on (UTC in, UTC out), so tests drive it with any instant.

A schedule is a cron expression read in an IANA time zone (cronsim), an interval, or
one time. Daylight saving time is cronsim's (Debian cron's) rule, which is what a cron
user expects:

- A job at a fixed local time (minute and hour fields not starting with `*`):
  in the spring-forward gap it runs at the first minute after the gap (02:30 on the
  night Berlin skips 02:00-03:00 runs at 03:00); in the fall-back repeat it runs once,
  at the first of the two (02:30 CEST, not again at 02:30 CET).
- Any other job (`*/15 * * * *`, `0 * * * *`) follows real time: every matching wall
  clock minute that exists, so the repeated hour fires twice and the skipped one never.

Both are computed here on naive wall-clock times (cronsim without a zone), each match
mapped to the instants it names: cronsim's own zone handling steps real time by the
hour and misses slots in zones whose clocks move by 30 minutes (Australia/Lord_Howe)
or whose wall clock is 45 minutes off the hour (Pacific/Chatham).

An interval counts in real time from the previous slot; a once wake has one slot.
"""

from __future__ import annotations

import zoneinfo
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

CRON = "cron"
INTERVAL = "interval"
ONCE = "once"
KINDS = (CRON, INTERVAL, ONCE)

# A wake is a turn (a model's tokens, maybe tools): one a minute is already a lot, and a
# smaller interval is most likely seconds typed for minutes.
MIN_INTERVAL = timedelta(seconds=60)
# An interval longer than this is a date typo; a once wake says "that day" better.
MAX_INTERVAL = timedelta(days=366)
INTERVAL_RANGE = (
    f"between {MIN_INTERVAL.total_seconds():g} seconds and {MAX_INTERVAL.days} days "
    f"({MAX_INTERVAL.total_seconds():.0f} seconds)"
)
# A slot this late still runs under catch-up "skip": a worker that restarted, or a busy
# database, is not downtime the user asked to skip.
LATE_GRACE = timedelta(minutes=5)
# Missed slots recorded one WakeRun each after downtime: the most recent ones; the
# oldest of them says how many earlier ones there were. A month of a minutely wake
# would otherwise write 43,200 rows in one claim.
MAX_RECORDED_SKIPS = 20
# Missed slots counted one by one (each a cronsim step, 10-50 µs); past this the count
# is "more than" and the latest slot is found by looking back from now instead.
MAX_SCANNED_SLOTS = 10_000
# The largest step back any zone's clocks take (Antarctica/Troll: 2 hours): a wall
# time this far before `t`'s may still come again after `t`, in the repeated stretch.
MAX_CLOCK_STEP_BACK = timedelta(hours=3)


class ScheduleError(ValueError):
    """A schedule that cannot be used; the message is for the user."""


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: str
    cron: str = ""
    timezone: str = "UTC"
    interval: timedelta | None = None
    once_at: datetime | None = None  # UTC

    def next_after(self, t: datetime) -> datetime | None:
        """The first slot strictly after `t` (an interval's: `t` is the previous slot),
        or None when there is none."""
        _check_utc(t)
        if self.kind == ONCE:
            return self.once_at if self.once_at is not None and self.once_at > t else None
        if self.kind == INTERVAL:
            assert self.interval is not None
            return t + self.interval
        return _cron_after(self.cron, self.timezone, t)


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone, or ScheduleError naming it."""
    name = name.strip()
    if not name:
        raise ScheduleError("Choose a time zone (an IANA name such as Europe/Berlin, or UTC).")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"Unknown time zone {name!r}: use an IANA name such as Europe/Berlin, "
            "America/New_York or UTC."
        ) from None


def check_cron(expr: str, timezone: str = "UTC") -> str:
    """The expression, normalised (single spaces), or ScheduleError: not five fields,
    a bad field, or one that never fires (`0 0 30 2 *`)."""
    tz = zone(timezone)
    parts = expr.split()
    if len(parts) != 5:
        raise ScheduleError(
            f"A cron expression has five fields (minute hour day-of-month month "
            f"day-of-week), {expr.strip()!r} has {len(parts)}."
        )
    expr = " ".join(parts)
    start = datetime(2000, 1, 1, tzinfo=tz)
    try:
        CronSim(expr, start)
    except CronSimError as exc:
        # cronsim refuses a day no chosen month has with the same words as a bad day;
        # any month accepting it means the day is fine and the combination is not.
        try:
            CronSim(" ".join([*parts[:3], "*", parts[4]]), start)
        except CronSimError:
            raise ScheduleError(f"Invalid cron expression {expr!r}: {exc}.") from None
        raise ScheduleError(
            f"The cron expression {expr!r} never fires: no month it names has that day."
        ) from None
    if _cron_after(expr, timezone, datetime(2000, 1, 1, tzinfo=UTC)) is None:
        raise ScheduleError(f"The cron expression {expr!r} never fires.")
    return expr


def parse(
    kind: str,
    *,
    cron: str = "",
    timezone: str = "UTC",
    interval_seconds: int | None = None,
    once_at: datetime | None = None,
) -> Schedule:
    """A checked schedule, or ScheduleError saying what is wrong."""
    zone(timezone)
    if kind == CRON:
        return Schedule(CRON, cron=check_cron(cron, timezone), timezone=timezone.strip())
    if kind == INTERVAL:
        if interval_seconds is None:
            raise ScheduleError("Give the interval in seconds.")
        # Checked as a number first: timedelta() overflows past 10**9 days.
        if not MIN_INTERVAL.total_seconds() <= interval_seconds <= MAX_INTERVAL.total_seconds():
            raise ScheduleError(interval_error(interval_seconds))
        return Schedule(
            INTERVAL, timezone=timezone.strip(), interval=timedelta(seconds=interval_seconds)
        )
    if kind == ONCE:
        if once_at is None:
            raise ScheduleError("Give the time to run at.")
        _check_utc(once_at)
        return Schedule(ONCE, timezone=timezone.strip(), once_at=once_at)
    raise ScheduleError(f"Unknown schedule kind {kind!r}: use cron, interval or once.")


def every(seconds: int) -> str:
    """An interval as people say it: the largest whole unit ("every 2 days", "every hour",
    "every 90 minutes"), seconds only when nothing larger divides it."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = seconds // size
            return f"every {unit}" if count == 1 else f"every {count} {unit}s"
    return f"every {seconds} seconds"


def interval_error(seconds: int) -> str:
    return f"The interval must be {INTERVAL_RANGE}, not {seconds} seconds."


def local_to_utc(naive: datetime, timezone: str) -> datetime:
    """A wall-clock time in a zone as UTC; ScheduleError for one the zone skips (the
    spring-forward gap). A repeated time (fall-back) is its first occurrence."""
    tz = zone(timezone)
    local = naive.replace(tzinfo=tz, fold=0)
    utc = local.astimezone(UTC)
    if utc.astimezone(tz).replace(tzinfo=None) != naive:
        raise ScheduleError(
            f"{naive:%Y-%m-%d %H:%M} does not exist in {timezone}: the clocks skip it."
        )
    return utc


def first_run(schedule: Schedule, now: datetime, expires_at: datetime | None = None) -> datetime:
    """A new (or changed, or re-enabled) wake's next due time; ScheduleError when it
    would never fire: a once time already past, or an expiry before the first slot."""
    first = schedule.next_after(now)
    if first is None:
        if schedule.kind == ONCE:
            raise ScheduleError("That time has already passed: choose a time in the future.")
        raise ScheduleError("This schedule never fires.")
    if expires_at is not None and first > expires_at:
        raise ScheduleError(
            f"The wake would expire ({expires_at:%Y-%m-%d %H:%M} UTC) before its first "
            f"run ({first:%Y-%m-%d %H:%M} UTC)."
        )
    return first


@dataclass(frozen=True, slots=True)
class Plan:
    """What a claim of a due wake does: run one slot (or none), record the skipped ones
    (the most recent, oldest first), and move the wake on."""

    run: datetime | None
    skipped: tuple[datetime, ...]
    # Missed slots before the recorded ones, not recorded each; `more` when the count
    # stopped at MAX_SCANNED_SLOTS.
    unrecorded: int
    more: bool
    next_run_at: datetime | None


def plan(
    schedule: Schedule,
    due: datetime,
    now: datetime,
    *,
    catch_up: str,
    expires_at: datetime | None = None,
) -> Plan:
    """The claim of a wake whose next time is `due`, at `now`.

    Every slot from `due` to `now` (and not after `expires_at`) is due; the latest runs
    when catch-up is "latest", or when it is at most LATE_GRACE late; the others are
    skipped. `catch_up`: "latest" or "skip".
    """
    _check_utc(due)
    _check_utc(now)
    if due > now:
        return Plan(None, (), 0, False, due)
    end = now if expires_at is None else min(now, expires_at)
    recent: deque[datetime] = deque(maxlen=MAX_RECORDED_SKIPS + 1)
    count, more = 0, False
    slot: datetime | None = due
    while slot is not None and slot <= end:
        if count == MAX_SCANNED_SLOTS:
            more = True
            slot = _latest_slot(schedule, recent[-1], end)
            recent.append(slot)
            break
        count += 1
        recent.append(slot)
        slot = schedule.next_after(slot)
    if not recent:
        return Plan(None, (), 0, False, None)  # expired before `due`
    latest = recent.pop()
    run = latest if catch_up == "latest" or now - latest <= LATE_GRACE else None
    if run is None:
        recent.append(latest)
    skipped = tuple(recent)[-MAX_RECORDED_SKIPS:]
    counted = count if not more else count + 1
    unrecorded = counted - len(skipped) - (run is not None)
    following = schedule.next_after(latest)
    if following is not None and following <= now:
        # A fall-back repeat can give a slot behind the latest; never claim it again.
        following = schedule.next_after(now)
    if following is not None and expires_at is not None and following > expires_at:
        following = None
    return Plan(run, skipped, max(unrecorded, 0), more, following)


def _latest_slot(schedule: Schedule, after: datetime, end: datetime) -> datetime:
    """The last slot in (after, end], found by looking back from `end` (too many slots to
    walk from `after`); `after` itself when there is none."""
    if schedule.kind == INTERVAL:
        assert schedule.interval is not None
        return after + ((end - after) // schedule.interval) * schedule.interval
    if schedule.kind == ONCE:
        return after
    slot = _cron_at_or_before(schedule.cron, schedule.timezone, end)
    return slot if slot is not None and slot > after else after


def _is_fixed(expr: str) -> bool:
    """Debian cron's (and cronsim's) "job at a fixed time": neither the minute nor the
    hour field starts with `*`."""
    minute, hour, *_ = expr.split()
    return not minute.startswith("*") and not hour.startswith("*")


def _instants(naive: datetime, tz: zoneinfo.ZoneInfo, fixed: bool) -> list[datetime]:
    """The UTC instants a matching wall-clock time names, in order: none, one, or two (a
    time the clocks repeat); a fixed-time job's: its first occurrence, and in a gap
    the first minute after it."""
    found = []
    for fold in (0, 1):
        utc = naive.replace(tzinfo=tz, fold=fold).astimezone(UTC)
        if utc.astimezone(tz).replace(tzinfo=None) == naive and utc not in found:
            found.append(utc)
    if not fixed:
        return sorted(found)
    if found:
        return [min(found)]
    later = naive
    while True:  # a gap is at most a few hours (a day for a date-line move)
        later += timedelta(minutes=1)
        utc = later.replace(tzinfo=tz).astimezone(UTC)
        if utc.astimezone(tz).replace(tzinfo=None) == later:
            return [utc]


def _step_back_near(tz: zoneinfo.ZoneInfo, t: datetime, later: datetime) -> timedelta:
    """How far the clocks go back between `t` and `later` (MAX_CLOCK_STEP_BACK apart):
    wall times up to this far before `t`'s come again after it."""
    back = _utc_offset(t, tz) - _utc_offset(later, tz)
    return max(back, timedelta(0))


def _utc_offset(t: datetime, tz: zoneinfo.ZoneInfo) -> timedelta:
    offset = t.astimezone(tz).utcoffset()
    assert offset is not None  # an aware time in a zone always has one
    return offset


def _cron_after(expr: str, timezone: str, t: datetime) -> datetime | None:
    """The first slot after `t`. Wall-clock matches come in order; the instants of each
    rise with them, except that a repeated time's second instant comes after the
    next times' first ones: so the walk goes on until a match's first instant is after
    `t`, keeping the earliest instant after `t` seen."""
    tz = zone(timezone)
    fixed = _is_fixed(expr)
    start = t.astimezone(tz).replace(tzinfo=None)
    if not fixed:
        start -= _step_back_near(tz, t, t + MAX_CLOCK_STEP_BACK)
    best = None
    # cronsim gives the matches strictly after its start: a second earlier includes it.
    for naive in CronSim(expr, start.replace(microsecond=0) - timedelta(seconds=1)):
        instants = _instants(naive, tz, fixed)
        after = [u for u in instants if u > t]
        if after and (best is None or after[0] < best):
            best = after[0]
        if instants and instants[0] > t:
            break
    return best


def _cron_at_or_before(expr: str, timezone: str, t: datetime) -> datetime | None:
    """The last slot at or before `t` (within cronsim's 50 years): `_cron_after` walked
    backwards, from the matches of the latest wall time at or before `t`."""
    tz = zone(timezone)
    fixed = _is_fixed(expr)
    start = t.astimezone(tz).replace(tzinfo=None)
    start += _step_back_near(tz, t - MAX_CLOCK_STEP_BACK, t)
    best = None
    for naive in CronSim(expr, start.replace(microsecond=0) + timedelta(seconds=1), reverse=True):
        instants = _instants(naive, tz, fixed)
        before = [u for u in instants if u <= t]
        if before and (best is None or before[-1] > best):
            best = before[-1]
        if instants and instants[-1] <= t:
            break
    return best


def _check_utc(t: datetime) -> None:
    if t.tzinfo is None or t.utcoffset() != timedelta(0):
        raise ValueError(f"expected a UTC datetime, got {t!r}")
