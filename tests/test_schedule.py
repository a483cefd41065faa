"""chat.schedule: when wakes are due, table by table, on given instants (no clock).

Times in the tables are written in the wake's zone (`L(...)`) and compared in UTC, so a
row reads as a user would say it ("02:30 Berlin on the night the clocks go forward")."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim

from chat import schedule
from chat.schedule import ScheduleError

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"
CHATHAM = "Pacific/Chatham"


def L(zone: str, *args: int, fold: int = 0) -> datetime:  # noqa: N802 - reads as a time
    """A wall-clock time in `zone`, as UTC."""
    return datetime(*args, tzinfo=ZoneInfo(zone), fold=fold).astimezone(UTC)


def U(*args: int) -> datetime:  # noqa: N802
    return datetime(*args, tzinfo=UTC)


def cron(expr: str, zone: str = "UTC") -> schedule.Schedule:
    return schedule.parse("cron", cron=expr, timezone=zone)


def slots(spec: schedule.Schedule, after: datetime, n: int) -> list[datetime]:
    out = []
    for _ in range(n):
        after = spec.next_after(after)
        out.append(after)
    return out


# --- next due time, across daylight saving time ------------------------------------

# 2026: Europe/Berlin springs forward on 29 March (02:00 -> 03:00) and falls back on
# 25 October (03:00 -> 02:00); America/New_York on 8 March and 1 November, at 02:00.
NEXT_CASES = [
    # A fixed-time job in the skipped hour runs at the first minute after the gap...
    (
        BERLIN,
        "30 2 * * *",
        L(BERLIN, 2026, 3, 28, 12),
        [L(BERLIN, 2026, 3, 29, 3, 0), L(BERLIN, 2026, 3, 30, 2, 30)],
    ),
    (
        NEW_YORK,
        "30 2 * * *",
        L(NEW_YORK, 2026, 3, 7, 12),
        [L(NEW_YORK, 2026, 3, 8, 3, 0), L(NEW_YORK, 2026, 3, 9, 2, 30)],
    ),
    # ... and once in the repeated hour, at its first occurrence (summer time).
    (
        BERLIN,
        "30 2 * * *",
        L(BERLIN, 2026, 10, 24, 12),
        [U(2026, 10, 25, 0, 30), U(2026, 10, 26, 1, 30)],
    ),
    (
        NEW_YORK,
        "30 1 * * *",
        L(NEW_YORK, 2026, 10, 31, 12),
        [U(2026, 11, 1, 5, 30), U(2026, 11, 2, 6, 30)],
    ),
    # A job outside the changed hours keeps its wall-clock time: 24 h apart in UTC
    # on ordinary days, 23 h and 25 h across the changes.
    (BERLIN, "0 9 * * *", L(BERLIN, 2026, 3, 28, 12), [U(2026, 3, 29, 7), U(2026, 3, 30, 7)]),
    (BERLIN, "0 9 * * *", L(BERLIN, 2026, 3, 28, 8), [U(2026, 3, 28, 8), U(2026, 3, 29, 7)]),
    (BERLIN, "0 9 * * *", L(BERLIN, 2026, 10, 24, 12), [U(2026, 10, 25, 8), U(2026, 10, 26, 8)]),
    # A wildcard-hour job follows real time: the repeated hour fires twice ...
    (
        BERLIN,
        "*/30 * * * *",
        L(BERLIN, 2026, 10, 25, 1, 45),
        [
            U(2026, 10, 25, 0, 0),
            U(2026, 10, 25, 0, 30),
            U(2026, 10, 25, 1, 0),
            U(2026, 10, 25, 1, 30),
            U(2026, 10, 25, 2, 0),
        ],
    ),
    # ... and the skipped hour never.
    (
        BERLIN,
        "*/30 * * * *",
        L(BERLIN, 2026, 3, 29, 1, 15),
        [
            L(BERLIN, 2026, 3, 29, 1, 30),
            L(BERLIN, 2026, 3, 29, 3, 0),
            L(BERLIN, 2026, 3, 29, 3, 30),
        ],
    ),
    (
        NEW_YORK,
        "0 * * * *",
        L(NEW_YORK, 2026, 11, 1, 0, 30),
        [U(2026, 11, 1, 5), U(2026, 11, 1, 6), U(2026, 11, 1, 7)],
    ),
    # Clocks that move by 30 minutes (Lord Howe: 02:00 +11 -> 01:30 +10:30 on 5 April,
    # 02:00 +10:30 -> 02:30 +11 on 4 October): 02:00 after the repeat and 02:30 right
    # after the gap exist, and run.
    (
        LORD_HOWE,
        "0 */2 * * *",
        U(2026, 4, 4, 12),
        [U(2026, 4, 4, 13), U(2026, 4, 4, 15, 30), U(2026, 4, 4, 17, 30)],
    ),
    (
        LORD_HOWE,
        "30 * * * *",
        U(2026, 10, 3, 14),
        [U(2026, 10, 3, 15), U(2026, 10, 3, 15, 30), U(2026, 10, 3, 16, 30)],
    ),
    # A zone 45 minutes off the hour (Chatham: 03:45 +13:45 -> 02:45 +12:45 on 5 April):
    # the repeated 02:45-02:59 runs again.
    (
        CHATHAM,
        "*/5 2 * * *",
        U(2026, 4, 4, 13, 5),
        [
            U(2026, 4, 4, 13, 10),
            U(2026, 4, 4, 14, 0),
            U(2026, 4, 4, 14, 5),
            U(2026, 4, 4, 14, 10),
            U(2026, 4, 5, 13, 15),
        ],
    ),
    (
        CHATHAM,
        "45 * * * *",
        U(2026, 9, 26, 12),
        [U(2026, 9, 26, 13), U(2026, 9, 26, 14), U(2026, 9, 26, 15)],
    ),
    # UTC has no daylight saving time.
    ("UTC", "30 2 * * *", U(2026, 3, 28, 12), [U(2026, 3, 29, 2, 30), U(2026, 3, 30, 2, 30)]),
    # Day-of-month and day-of-week: either (Debian cron's rule when neither is `*`).
    ("UTC", "0 12 13 * 5", U(2026, 2, 1), [U(2026, 2, 6, 12), U(2026, 2, 13, 12)]),
    # A leap day: every four years.
    ("UTC", "0 0 29 2 *", U(2026, 1, 1), [U(2028, 2, 29), U(2032, 2, 29)]),
]


@pytest.mark.parametrize(("zone", "expr", "after", "expected"), NEXT_CASES)
def test_next_due_times(zone, expr, after, expected):
    assert slots(cron(expr, zone), after, len(expected)) == expected


def test_a_fixed_time_job_asked_inside_the_repeated_hour_gives_the_next_day():
    """Asked at 02:10 CET, after 02:30 CEST already fired: never 02:30 CEST again."""
    after = L(BERLIN, 2026, 10, 25, 2, 10, fold=1)
    assert cron("30 2 * * *", BERLIN).next_after(after) == L(BERLIN, 2026, 10, 26, 2, 30)


def test_next_after_is_strictly_after():
    spec = cron("0 9 * * *", BERLIN)
    nine = L(BERLIN, 2026, 6, 1, 9)
    assert spec.next_after(nine) == L(BERLIN, 2026, 6, 2, 9)
    assert spec.next_after(nine - timedelta(microseconds=1)) == nine


def test_interval_and_once():
    every = schedule.parse("interval", interval_seconds=3600)
    assert every.next_after(U(2026, 3, 29, 0, 30)) == U(2026, 3, 29, 1, 30)
    once = schedule.parse("once", once_at=U(2026, 5, 1, 8))
    assert once.next_after(U(2026, 5, 1, 7)) == U(2026, 5, 1, 8)
    assert once.next_after(U(2026, 5, 1, 8)) is None


def test_naive_or_local_times_are_refused():
    with pytest.raises(ValueError, match="UTC"):
        cron("0 9 * * *").next_after(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="UTC"):
        cron("0 9 * * *").next_after(datetime(2026, 1, 1, tzinfo=ZoneInfo(BERLIN)))


# --- bad schedules -------------------------------------------------------------------

BAD_CASES = [
    ({"kind": "cron", "cron": "0 0 30 2 *"}, "never fires: no month it names has that day"),
    ({"kind": "cron", "cron": "0 0 31 4,6,9,11 *"}, "never fires"),
    ({"kind": "cron", "cron": "0 0 30,31 2 *"}, "never fires"),
    ({"kind": "cron", "cron": "61 * * * *"}, "Invalid cron expression '61 \\* \\* \\* \\*'"),
    ({"kind": "cron", "cron": "0 0 32 * *"}, "Invalid cron expression"),
    ({"kind": "cron", "cron": "* * *"}, "has 3"),
    ({"kind": "cron", "cron": "0 * * * * *"}, "five fields"),
    ({"kind": "cron", "cron": ""}, "has 0"),
    ({"kind": "cron", "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "Unknown time zone 'Mars/"),
    ({"kind": "cron", "cron": "0 9 * * *", "timezone": "../../etc/passwd"}, "Unknown time zone"),
    ({"kind": "cron", "cron": "0 9 * * *", "timezone": ""}, "Choose a time zone"),
    ({"kind": "interval", "interval_seconds": 59}, "between 60 seconds and 366 days"),
    ({"kind": "interval", "interval_seconds": 0}, "between"),
    # Past timedelta's range (10**9 days): still the bound's message, not OverflowError.
    ({"kind": "interval", "interval_seconds": 10**14}, "366 days .31622400 seconds., not 1"),
    ({"kind": "interval", "interval_seconds": 366 * 86400 + 1}, "between 60 seconds"),
    ({"kind": "interval"}, "Give the interval"),
    ({"kind": "once"}, "Give the time"),
    ({"kind": "weekly"}, "Unknown schedule kind 'weekly'"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_CASES)
def test_bad_schedules_say_what_is_wrong(fields, message):
    kind = fields.pop("kind")
    with pytest.raises(ScheduleError, match=message):
        schedule.parse(kind, **fields)


def test_cron_is_normalised():
    assert cron("  0   9 * *  1-5 ").cron == "0 9 * * 1-5"


def test_first_run_refuses_what_would_never_fire():
    now = U(2026, 6, 1, 12)
    with pytest.raises(ScheduleError, match="already passed"):
        schedule.first_run(schedule.parse("once", once_at=U(2026, 6, 1, 11)), now)
    with pytest.raises(ScheduleError, match="expire .* before its first run"):
        schedule.first_run(cron("0 9 * * *"), now, expires_at=U(2026, 6, 2, 8))
    assert schedule.first_run(cron("0 9 * * *"), now, U(2026, 6, 2, 9)) == U(2026, 6, 2, 9)


LOCAL_CASES = [
    (BERLIN, datetime(2026, 6, 1, 9), U(2026, 6, 1, 7)),
    # The repeated hour: its first occurrence (summer time).
    (BERLIN, datetime(2026, 10, 25, 2, 30), U(2026, 10, 25, 0, 30)),
    (NEW_YORK, datetime(2026, 11, 1, 1, 30), U(2026, 11, 1, 5, 30)),
]


@pytest.mark.parametrize(("zone", "naive", "expected"), LOCAL_CASES)
def test_local_to_utc(zone, naive, expected):
    assert schedule.local_to_utc(naive, zone) == expected


@pytest.mark.parametrize(
    ("zone", "naive"),
    [(BERLIN, datetime(2026, 3, 29, 2, 30)), (NEW_YORK, datetime(2026, 3, 8, 2, 0))],
)
def test_a_local_time_the_clocks_skip_is_refused(zone, naive):
    with pytest.raises(ScheduleError, match="does not exist .* the clocks skip it"):
        schedule.local_to_utc(naive, zone)


# --- catch-up ------------------------------------------------------------------------

HOURLY = cron("0 * * * *")


def test_on_time_runs_and_moves_on():
    p = schedule.plan(HOURLY, U(2026, 1, 1, 9), U(2026, 1, 1, 9, 0, 1), catch_up="skip")
    assert p == schedule.Plan(U(2026, 1, 1, 9), (), 0, False, U(2026, 1, 1, 10))


def test_not_due_yet_changes_nothing():
    p = schedule.plan(HOURLY, U(2026, 1, 1, 9), U(2026, 1, 1, 8, 59), catch_up="latest")
    assert p == schedule.Plan(None, (), 0, False, U(2026, 1, 1, 9))


CATCH_UP_CASES = [
    # (catch-up, now) after missing 09:00..12:00; the run, the skipped, the next.
    (
        "latest",
        U(2026, 1, 1, 12, 30),
        U(2026, 1, 1, 12),
        [U(2026, 1, 1, h) for h in (9, 10, 11)],
        U(2026, 1, 1, 13),
    ),
    # "skip" runs nothing missed by more than LATE_GRACE ...
    (
        "skip",
        U(2026, 1, 1, 12, 30),
        None,
        [U(2026, 1, 1, h) for h in (9, 10, 11, 12)],
        U(2026, 1, 1, 13),
    ),
    # ... and a slot late by less (a restart) still runs.
    (
        "skip",
        U(2026, 1, 1, 12, 4),
        U(2026, 1, 1, 12),
        [U(2026, 1, 1, h) for h in (9, 10, 11)],
        U(2026, 1, 1, 13),
    ),
    # "latest" runs the latest however old it is.
    ("latest", U(2026, 1, 1, 9, 59), U(2026, 1, 1, 9), [], U(2026, 1, 1, 10)),
]


@pytest.mark.parametrize(("policy", "now", "run", "skipped", "following"), CATCH_UP_CASES)
def test_catch_up_after_downtime(policy, now, run, skipped, following):
    p = schedule.plan(HOURLY, U(2026, 1, 1, 9), now, catch_up=policy)
    assert (p.run, list(p.skipped), p.unrecorded, p.next_run_at) == (run, skipped, 0, following)


def test_catch_up_across_fall_back_never_claims_a_slot_twice():
    """Down over the night Berlin falls back: the 02:30 job ran once that night."""
    spec = cron("30 2 * * *", BERLIN)
    due = L(BERLIN, 2026, 10, 24, 2, 30)
    p = schedule.plan(spec, due, L(BERLIN, 2026, 10, 25, 9), catch_up="latest")
    assert p.run == U(2026, 10, 25, 0, 30)
    assert p.skipped == (due,)
    assert p.next_run_at == L(BERLIN, 2026, 10, 26, 2, 30)


def test_catch_up_across_spring_forward():
    spec = cron("30 2 * * *", NEW_YORK)
    p = schedule.plan(
        spec, L(NEW_YORK, 2026, 3, 7, 2, 30), L(NEW_YORK, 2026, 3, 8, 3, 1), catch_up="skip"
    )
    assert p.run == L(NEW_YORK, 2026, 3, 8, 3, 0)
    assert p.skipped == (L(NEW_YORK, 2026, 3, 7, 2, 30),)
    assert p.next_run_at == L(NEW_YORK, 2026, 3, 9, 2, 30)


def test_long_downtime_records_only_the_latest_skips_and_counts_the_rest():
    minutely = cron("* * * * *")
    due, now = U(2026, 1, 1), U(2026, 1, 1, 1, 0, 30)  # 61 slots missed
    p = schedule.plan(minutely, due, now, catch_up="latest")
    assert p.run == U(2026, 1, 1, 1)
    assert len(p.skipped) == schedule.MAX_RECORDED_SKIPS
    assert p.skipped[-1] == U(2026, 1, 1, 0, 59)
    assert p.skipped[0] == U(2026, 1, 1, 0, 40)
    assert p.unrecorded == 40 and not p.more
    assert p.next_run_at == U(2026, 1, 1, 1, 1)


def test_downtime_past_the_scan_bound_finds_the_latest_slot():
    """A month of a minutely wake: counted up to the bound, the latest found from now."""
    minutely = cron("* * * * *")
    due, now = U(2026, 1, 1), U(2026, 2, 1, 0, 0, 30)
    p = schedule.plan(minutely, due, now, catch_up="latest")
    assert p.run == U(2026, 2, 1)
    assert p.more and p.unrecorded >= schedule.MAX_SCANNED_SLOTS - schedule.MAX_RECORDED_SKIPS
    assert p.next_run_at == U(2026, 2, 1, 0, 1)


def test_downtime_past_the_scan_bound_finds_the_latest_slot_of_a_dense_cron():
    """Every minute of 1-28 February: the latest missed slot is 28 February 23:59, found
    looking back from now (walking forward from a window's start stopped short)."""
    dense = cron("* * 1-28 2 *")
    p = schedule.plan(dense, U(2026, 2, 1), U(2026, 3, 15), catch_up="latest")
    assert p.more
    assert p.run == U(2026, 2, 28, 23, 59)
    assert p.next_run_at == U(2027, 2, 1)


def test_catch_up_across_a_half_hour_fall_back():
    """Lord Howe's repeated half hour: the latest missed two-hourly slot is 02:00 +10:30."""
    two_hourly = cron("0 */2 * * *", LORD_HOWE)
    p = schedule.plan(two_hourly, U(2026, 4, 4, 13), U(2026, 4, 4, 16), catch_up="latest")
    assert p.run == U(2026, 4, 4, 15, 30)
    assert p.skipped == (U(2026, 4, 4, 13),)
    assert p.next_run_at == U(2026, 4, 4, 17, 30)


SLOT_ZONES = [BERLIN, NEW_YORK, LORD_HOWE, CHATHAM, "America/Santiago", "Asia/Tehran"]


def brute_force_slots(expr: str, zone: str, after: datetime, end: datetime) -> list[datetime]:
    """The definition, minute by minute in real time: a fixed-time job at each matching
    day and time (its first occurrence, or the first minute after a gap); any other job
    at each instant whose wall-clock minute matches."""
    tz = ZoneInfo(zone)
    spec = CronSim(expr, datetime(2000, 1, 1))
    minute, hour, *_ = expr.split()
    out: set[datetime] = set()
    if minute.startswith("*") or hour.startswith("*"):
        t = after.replace(second=0) + timedelta(minutes=1)
        while t <= end:
            local = t.astimezone(tz)
            if (
                local.minute in spec.minutes
                and local.hour in spec.hours
                and local.month in spec.months
                and spec.match_day(local.date())
            ):
                out.add(t)
            t += timedelta(minutes=1)
        return sorted(out)
    day = (after - timedelta(days=2)).date()
    while day <= (end + timedelta(days=2)).date():
        if day.month in spec.months and spec.match_day(day):
            for h in sorted(spec.hours):
                for m in sorted(spec.minutes):
                    naive = datetime(day.year, day.month, day.day, h, m)
                    while True:
                        utc = naive.replace(tzinfo=tz).astimezone(UTC)
                        if utc.astimezone(tz).replace(tzinfo=None) == naive:
                            break
                        naive += timedelta(minutes=1)
                    if after < utc <= end:
                        out.add(utc)
        day += timedelta(days=1)
    return sorted(out)


@functools.cache
def transitions(zone: str, year: int) -> list[datetime]:
    tz, t = ZoneInfo(zone), datetime(year, 1, 1, tzinfo=UTC)
    found, offset = [], t.astimezone(tz).utcoffset()
    while t.year == year:
        t += timedelta(minutes=15)
        if t.astimezone(tz).utcoffset() != offset:
            found.append(t)
            offset = t.astimezone(tz).utcoffset()
    return found


@pytest.mark.parametrize("zone", SLOT_ZONES)
@pytest.mark.parametrize(
    "expr",
    ["*/15 * * * *", "0 * * * *", "30 * * * *", "* 2 * * *", "0 */2 * * *", "*/10 0-3 * * *"]
    + ["30 2 * * *", "0 2 * * *", "15,45 1-3 * * *", "0-59 2 * * *"],
)
def test_slots_around_each_clock_change_match_the_brute_force_definition(zone, expr):
    """Forward (next_after) and backward (the latest slot) against the definition."""
    spec = cron(expr, zone)
    for change in transitions(zone, 2026):
        after, end = change - timedelta(hours=4), change + timedelta(hours=4)
        expected = brute_force_slots(expr, zone, after, end)
        got, t = [], after
        while (t := spec.next_after(t)) is not None and t <= end:
            got.append(t)
        assert got == expected, change
        if expected:
            assert schedule._latest_slot(spec, after, end) == expected[-1], change


def test_interval_catch_up_is_counted_exactly():
    every = schedule.parse("interval", interval_seconds=600)
    p = schedule.plan(every, U(2026, 1, 1), U(2026, 1, 1, 1, 5), catch_up="latest")
    assert p.run == U(2026, 1, 1, 1)
    assert len(p.skipped) == 6 and p.unrecorded == 0
    assert p.next_run_at == U(2026, 1, 1, 1, 10)


# --- expiry --------------------------------------------------------------------------


def test_a_wake_past_its_expiry_stops():
    p = schedule.plan(
        HOURLY, U(2026, 1, 1, 9), U(2026, 1, 1, 9), catch_up="latest", expires_at=U(2026, 1, 1, 9)
    )
    assert p.run == U(2026, 1, 1, 9) and p.next_run_at is None


def test_slots_after_expiry_are_neither_run_nor_skipped():
    p = schedule.plan(
        HOURLY,
        U(2026, 1, 1, 9),
        U(2026, 1, 1, 15),
        catch_up="latest",
        expires_at=U(2026, 1, 1, 10, 30),
    )
    assert p.run == U(2026, 1, 1, 10)
    assert p.skipped == (U(2026, 1, 1, 9),)
    assert p.next_run_at is None


def test_expired_before_its_due_time_runs_nothing():
    p = schedule.plan(
        HOURLY,
        U(2026, 1, 1, 9),
        U(2026, 1, 1, 12),
        catch_up="latest",
        expires_at=U(2026, 1, 1, 8),
    )
    assert p == schedule.Plan(None, (), 0, False, None)


def test_once_runs_once():
    once = schedule.parse("once", once_at=U(2026, 1, 1, 9))
    p = schedule.plan(once, U(2026, 1, 1, 9), U(2026, 1, 3), catch_up="latest")
    assert p == schedule.Plan(U(2026, 1, 1, 9), (), 0, False, None)
    p = schedule.plan(once, U(2026, 1, 1, 9), U(2026, 1, 3), catch_up="skip")
    assert p == schedule.Plan(None, (U(2026, 1, 1, 9),), 0, False, None)


def test_day_of_month_or_day_of_week_fires_on_either():
    """`0 0 31 2 1`: no 31 February, but every Monday of February (cron's OR)."""
    assert cron("0 0 31 2 1").next_after(U(2026, 1, 1)) == U(2026, 2, 2)


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (60, "every minute"),
        (90, "every 90 seconds"),
        (5400, "every 90 minutes"),
        (3600, "every hour"),
        (7200, "every 2 hours"),
        (86400, "every day"),
        (90000, "every 25 hours"),
        (604800, "every 7 days"),
        (86401, "every 86401 seconds"),
    ],
)
def test_an_interval_is_said_in_its_largest_whole_unit(seconds, said):
    assert schedule.every(seconds) == said
