"""Wakes in the database: the claim (exactly once, across threads and processes), firing,
recovery after a crash, overlap, catch-up, a deleted tab, the command, the tool and the
wipe. The clock is the `now` each call is given."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import DataError, connection, transaction

from chat import turns, wakes
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab, Wake, WakeRun
from chat.preferences import new_tab
from chat.tools import always_asks, needs_approval, run_tool
from chat.tools.wake import AGENT_WAKE_LIFETIME
from harness.servers import ROOT, server_env

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("owner", password="pw")


@pytest.fixture
def tab(owner):
    return new_tab(owner, "offline/demo")


def make_wake(owner, tab=None, **fields) -> Wake:
    values = {
        "owner": owner,
        "name": "digest",
        "tab": tab,
        "new_tab": tab is None,
        "prompt": "Summarise the news",
        "kind": "cron",
        "cron": "0 * * * *",
        "timezone": "Europe/Berlin",
        "next_run_at": NOW,
    }
    values.update(fields)
    return Wake.objects.create(**values)


def runs(wake: Wake) -> list[tuple[datetime, str]]:
    return list(
        WakeRun.objects.filter(wake=wake)
        .order_by("scheduled_for")
        .values_list("scheduled_for", "status")
    )


# --- firing ----------------------------------------------------------------------------


def test_a_due_wake_fires_once_into_its_tab_with_its_origin(owner, tab):
    wake = make_wake(owner, tab)

    fired = wakes.run_due(NOW + timedelta(seconds=1))
    again = wakes.run_due(NOW + timedelta(seconds=2))

    assert [r.status for r in fired] == ["submitted"] and again == []
    queued = QueuedMessage.objects.get(tab=tab)
    assert queued.text == "Summarise the news"
    assert queued.origin == {
        "kind": "wake",
        "wake_id": wake.pk,
        "scheduled_for": NOW.isoformat(),
        "name": "digest",
        "timezone": "Europe/Berlin",
        "approval": "wait",
    }
    run = WakeRun.objects.get(wake=wake)
    assert (run.tab_id, run.queued_id, run.scheduled_for) == (tab.pk, queued.pk, NOW)
    wake.refresh_from_db()
    assert wake.next_run_at == NOW + timedelta(hours=1)


def test_a_wake_not_due_yet_does_nothing(owner, tab):
    make_wake(owner, tab)
    assert wakes.run_due(NOW - timedelta(seconds=1)) == []
    assert not WakeRun.objects.exists() and not QueuedMessage.objects.exists()


def test_a_new_tab_each_time_gets_the_wakes_model_and_name(owner):
    wake = make_wake(owner, None, model="offline/demo", name="standup")
    first = wakes.run_due(NOW)[0]
    second = wakes.run_due(NOW + timedelta(hours=1))[0]
    assert first.tab_id != second.tab_id
    made = Tab.objects.get(pk=first.tab_id)
    assert (made.owner_id, made.model, made.title) == (owner.pk, "offline/demo", "standup")
    assert QueuedMessage.objects.get(tab=made).origin["wake_id"] == wake.pk


def test_claims_racing_in_threads_fire_once(owner, tab):
    """Eight workers read the same due time at once: one compare-and-set wins."""
    wake = make_wake(owner, tab)
    barrier = threading.Barrier(8)
    claimed = []

    def worker():
        try:
            barrier.wait()
            claimed.append(wakes.claim(wake.pk, NOW))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len([c for c in claimed if c is not None]) == 1
    assert runs(wake) == [(NOW, "pending")]


def test_two_processes_running_due_wakes_fire_each_once(owner, tab, tmp_path):
    """Three `manage.py wake run-due` processes at once over ten due wakes."""
    past = datetime.now(UTC) - timedelta(seconds=30)
    tabs = [new_tab(owner, "offline/demo") for _ in range(10)]
    made = [make_wake(owner, t, next_run_at=past, catch_up="latest") for t in tabs]
    env = server_env(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "wake", "run-due"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    for wake, t in zip(made, tabs, strict=True):
        assert runs(wake) == [(past, "submitted")]
        assert QueuedMessage.objects.filter(tab=t).count() == 1
    reported = sum(out.count(": submitted in tab") for out in outputs)
    assert reported == 10, outputs


# --- crashes --------------------------------------------------------------------------


def test_a_crash_between_claim_and_submit_is_completed_by_recovery_once(owner, tab):
    wake = make_wake(owner, tab)
    run = wakes.claim(wake.pk, NOW)  # the worker dies here
    assert run is not None and runs(wake) == [(NOW, "pending")]

    assert wakes.recover(NOW + timedelta(seconds=30)) == []  # not stale yet
    recovered = wakes.recover(NOW + wakes.PENDING_STALE + timedelta(seconds=1))
    later = wakes.recover(NOW + 10 * wakes.PENDING_STALE)

    assert [r.pk for r in recovered] == [run.pk] and later == []
    assert runs(wake) == [(NOW, "submitted")]
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_recovery_does_not_send_again_what_was_submitted_before_the_crash(owner, tab):
    """The crash came after the submit, before the run was marked: queued or already in
    the log, the message is not sent twice."""
    wake = make_wake(owner, tab)
    run = wakes.claim(wake.pk, NOW)
    queued = turns.submit(tab, wake.prompt, origin=wakes.origin_of(wake, run.scheduled_for))
    recovered = wakes.recover(NOW + wakes.PENDING_STALE * 2)
    assert recovered[0].status == "submitted" and recovered[0].queued_id == queued.pk
    assert QueuedMessage.objects.filter(tab=tab).count() == 1

    # The same, once a turn took the message into the log.
    wake2 = make_wake(owner, tab, name="second", next_run_at=NOW)
    run2 = wakes.claim(wake2.pk, NOW)
    origin = wakes.origin_of(wake2, run2.scheduled_for)
    Chunk.objects.create(
        tab=tab, seq=1, role="user", type="text", data={"text": "x", "origin": origin}
    )
    recovered = wakes.recover(NOW + wakes.PENDING_STALE * 2)
    assert [(r.wake_id, r.status) for r in recovered] == [(wake2.pk, "submitted")]
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_a_time_that_has_a_run_already_is_moved_past_not_fired_again(owner, tab):
    """The clock steps back half an hour after 09:00 fired, and the wake is disabled and
    enabled: its next time is 09:00 again. Reaching it, the claim moves the wake on to
    10:00 without a second firing, and the scheduler sleeps (rather than rolling the move
    back on the unique run and spinning at 0 s, the wake never firing again)."""
    wake = make_wake(owner, tab)
    assert [r.status for r in wakes.run_due(NOW)] == ["submitted"]
    wakes.disable(wake, NOW - timedelta(minutes=30))
    wakes.enable(wake, NOW - timedelta(minutes=30))
    wake.refresh_from_db()
    assert wake.next_run_at == NOW

    assert wakes.run_due(NOW + timedelta(seconds=1)) == []

    wake.refresh_from_db()
    assert wake.next_run_at == NOW + timedelta(hours=1)
    assert wakes.seconds_until_due(NOW + timedelta(seconds=1)) == wakes.SLEEP_CAP_SECONDS
    assert runs(wake) == [(NOW, "submitted")]
    assert QueuedMessage.objects.filter(tab=tab).count() == 1
    [run] = wakes.run_due(NOW + timedelta(hours=1))
    assert (run.scheduled_for, run.status) == (NOW + timedelta(hours=1), "submitted")


@pytest.mark.parametrize("action", ["keep", "enable", "disable"])
def test_an_action_on_a_stale_read_does_not_put_back_the_claimed_time(owner, tab, action):
    """The page read the wake (next run 09:00), the scheduler claimed 09:00, then the
    action wrote: only the fields it changes, so the wake is not due at 09:00 again."""
    wake = make_wake(owner, tab, created_by="agent", expires_at=NOW + timedelta(days=6))
    read = Wake.objects.get(pk=wake.pk)
    assert [r.status for r in wakes.run_due(NOW)] == ["submitted"]

    getattr(wakes, action)(read, NOW + timedelta(seconds=1))

    wake.refresh_from_db()
    if action == "disable":
        assert (wake.enabled, wake.next_run_at) == (False, None)
    else:
        assert (wake.enabled, wake.next_run_at) == (True, NOW + timedelta(hours=1))
    assert wake.expires_at == (None if action == "keep" else NOW + timedelta(days=6))
    assert wakes.run_due(NOW + timedelta(seconds=2)) == []
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_keep_of_an_expired_wake_starts_it_again_from_now(owner, tab):
    wake = make_wake(owner, tab, expires_at=NOW + timedelta(minutes=30))
    wakes.run_due(NOW)
    wake.refresh_from_db()
    assert wake.next_run_at is None
    wakes.keep(wake, NOW + timedelta(hours=2, minutes=10))
    wake.refresh_from_db()
    assert (wake.expires_at, wake.next_run_at) == (None, NOW + timedelta(hours=3))


def _failing_submit(monkeypatch, tab: Tab) -> None:
    """Fault injection: submitting into `tab` raises (a database or channel failure)."""
    real = turns.submit

    def submit(target, text, **kwargs):
        if target.pk == tab.pk:
            raise RuntimeError("the channel layer is down")
        return real(target, text, **kwargs)

    monkeypatch.setattr(turns, "submit", submit)


def test_a_firing_that_raises_is_retried_then_failed_with_the_error(owner, tab, monkeypatch):
    """Each attempt is counted on the run and its error shown; after MAX_FIRE_ATTEMPTS
    the run fails with the error, and the wake goes on to its next time."""
    wake = make_wake(owner, tab)
    _failing_submit(monkeypatch, tab)

    [run] = wakes.run_due(NOW)
    assert (run.status, run.attempts) == ("pending", 1)
    assert run.reason == (
        "Attempt 1 of 3 failed, retrying: RuntimeError: the channel layer is down"
    )
    t = NOW
    for attempt in range(2, wakes.MAX_FIRE_ATTEMPTS + 1):
        t += wakes.PENDING_STALE + timedelta(seconds=1)
        [run] = [r for r in wakes.run_due(t) if r.scheduled_for == NOW]
        assert run.attempts == attempt
    assert run.status == "failed"
    assert run.reason == "Gave up after 3 attempts: RuntimeError: the channel layer is down"
    assert WakeRun.objects.get(wake=wake, scheduled_for=NOW).status == "failed"
    assert wakes.recover(t + 10 * wakes.PENDING_STALE) == []


def test_a_run_whose_firing_kept_stopping_its_worker_fails(owner, tab):
    """Taken MAX_FIRE_ATTEMPTS times and never finished (each firing killed its worker):
    the next take records it failed instead of firing it again."""
    wake = make_wake(owner, tab)
    wakes.claim(wake.pk, NOW)
    WakeRun.objects.filter(wake=wake).update(attempts=wakes.MAX_FIRE_ATTEMPTS)
    [run] = wakes.recover(NOW + wakes.PENDING_STALE * 2)
    assert run.status == "failed" and run.reason.startswith("Gave up after 3 attempts")
    assert not QueuedMessage.objects.exists()


def test_a_failing_recovered_run_does_not_starve_the_other_wakes(owner, tab, monkeypatch):
    other = new_tab(owner, "offline/demo")
    make_wake(owner, tab, name="bad")
    good = make_wake(
        owner, other, name="good", kind="interval", cron="", interval_seconds=60, next_run_at=NOW
    )
    _failing_submit(monkeypatch, tab)
    t = NOW
    for _ in range(5):
        wakes.run_due(t)
        t += wakes.PENDING_STALE + timedelta(seconds=1)
    assert WakeRun.objects.filter(wake=good, status="submitted").count() == 5


def test_a_pass_whose_claim_raised_does_not_spin(owner, tab, monkeypatch):
    """The wake stays due after a claim that raised (the database, say): the pass sleeps
    ERROR_RETRY_SECONDS at least rather than "until it is due", which is 0 s."""
    make_wake(owner, tab, next_run_at=NOW)

    def claim(*args):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(wakes, "claim", claim)
    assert wakes._pass() == wakes.ERROR_RETRY_SECONDS


def test_a_row_broken_by_hand_does_not_stop_the_other_wakes(owner, tab):
    """An interval past timedelta's range (only SQLite stores it) disables its wake with
    the reason; the other wake fires in the same pass."""
    broken = make_wake(owner, tab, name="broken", kind="interval", cron="", interval_seconds=60)
    if connection.vendor != "sqlite":
        # PostgreSQL refuses the value itself: such a row cannot exist there.
        with pytest.raises(DataError), transaction.atomic():
            Wake.objects.filter(pk=broken.pk).update(interval_seconds=10**14)
        return
    Wake.objects.filter(pk=broken.pk).update(interval_seconds=10**14)
    good = make_wake(owner, new_tab(owner, "offline/demo"), name="good")

    fired = wakes.run_due(NOW)

    assert [(r.wake_id, r.status) for r in fired] == [(good.pk, "submitted")]
    run = WakeRun.objects.get(wake=broken)
    assert run.status == "failed" and "between 60 seconds and 366 days" in run.reason
    assert not Wake.objects.get(pk=broken.pk).enabled


def test_each_claim_is_stamped_when_it_happens(owner, tab, monkeypatch):
    """A pass that began at NOW claims a wake a minute later: its run is stamped then,
    so another worker's recovery at that moment leaves it to the worker firing it."""
    make_wake(owner, tab, timezone="UTC")
    claimed_at = NOW + wakes.PENDING_STALE + timedelta(seconds=1)
    real = turns.submit

    def submit(target, text, **kwargs):
        # This worker is about to submit; another worker's recovery runs now.
        assert wakes.recover(claimed_at) == []
        return real(target, text, **kwargs)

    monkeypatch.setattr(turns, "submit", submit)
    [run] = wakes.run_due(NOW, clock=lambda: claimed_at)
    assert run.status == "submitted" and run.created_at == claimed_at
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_a_recovery_while_the_run_is_submitted_does_not_submit_it_again(owner, tab, monkeypatch):
    """Another worker, its clock a minute ahead, recovers while this one submits: the
    run is already marked submitted in the submitting transaction, so it is not taken
    (and not submitted twice)."""
    make_wake(owner, tab, timezone="UTC")
    real = turns.submit
    recovered = []

    def submit(target, text, **kwargs):
        recovered.extend(wakes.recover(NOW + wakes.PENDING_STALE + timedelta(seconds=1)))
        return real(target, text, **kwargs)

    monkeypatch.setattr(turns, "submit", submit)
    [run] = wakes.run_due(NOW)
    assert run.status == "submitted" and recovered == []
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_a_worker_whose_run_was_taken_does_not_submit_it(owner, tab):
    """Another worker's recovery took the run (it thought this one dead) and stopped
    before submitting: this worker's late firing leaves it to the next recovery."""
    wake = make_wake(owner, tab)
    run = wakes.claim(wake.pk, NOW)
    later = NOW + wakes.PENDING_STALE + timedelta(seconds=1)
    WakeRun.objects.filter(pk=run.pk).update(created_at=later, attempts=2)  # the take

    assert wakes.fire(run, NOW).status == "pending"
    assert not QueuedMessage.objects.exists()
    [recovered] = wakes.recover(later + wakes.PENDING_STALE + timedelta(seconds=1))
    assert (recovered.status, recovered.attempts) == ("submitted", 3)
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_recovery_skips_the_run_of_a_wake_disabled_since(owner, tab):
    wake = make_wake(owner, tab)
    wakes.claim(wake.pk, NOW)  # the worker dies here
    wakes.disable(wake, NOW + timedelta(seconds=10))
    [run] = wakes.recover(NOW + wakes.PENDING_STALE * 2)
    assert (run.status, run.reason) == ("skipped", wakes.WAKE_DISABLED)
    assert not QueuedMessage.objects.exists()


def test_a_deactivated_owners_wakes_are_not_claimed(owner, tab):
    """Not claimed (so not skipped every time, and caught up by its policy once the
    owner is active again), not counted as due by the scheduler's sleep, and a run
    claimed before the deactivation is skipped with the reason."""
    wake = make_wake(owner, tab)
    other = make_wake(owner, tab, name="claimed", next_run_at=NOW)
    wakes.claim(other.pk, NOW)  # claimed; the worker dies
    get_user_model().objects.filter(pk=owner.pk).update(is_active=False)

    fired = wakes.run_due(NOW + wakes.PENDING_STALE * 2)

    assert [(r.wake_id, r.status, r.reason) for r in fired] == [
        (other.pk, "skipped", wakes.OWNER_INACTIVE)
    ]
    assert not QueuedMessage.objects.exists()
    assert runs(wake) == []
    assert wakes.seconds_until_due(NOW) == wakes.SLEEP_CAP_SECONDS
    get_user_model().objects.filter(pk=owner.pk).update(is_active=True)
    [run] = wakes.run_due(NOW + wakes.PENDING_STALE * 2)
    assert (run.wake_id, run.status) == (wake.pk, "submitted")


def test_a_tab_deleted_by_a_wipe_while_firing_says_the_wake_moved_to_new_tabs(
    owner, tab, monkeypatch
):
    """The run read the wake (into its tab); a history wipe made it a new-tab wake and
    deleted the tab before the submit: the run fails, and its reason says what is true
    of the wake now (not "the wake is disabled")."""
    wake = make_wake(owner, tab)
    run = wakes.claim(wake.pk, NOW)
    real = wakes.origin_of

    def wipe_meanwhile(*args):
        call_command("wipe_history", "--yes", stdout=io.StringIO())
        return real(*args)

    monkeypatch.setattr(wakes, "origin_of", wipe_meanwhile)
    fired = wakes.fire(run, NOW)

    assert (fired.status, fired.reason) == ("failed", wakes.TAB_DELETED_NEW_TAB)
    wake.refresh_from_db()
    assert wake.enabled and wake.new_tab


# --- overlap, catch-up, deleted tabs ---------------------------------------------------


def _running_turn(tab: Tab) -> None:
    RunningTurn.objects.create(tab=tab, turn_id=uuid.uuid4(), worker="elsewhere", heartbeat_at=NOW)


def test_overlap_skip_records_the_reason(owner, tab):
    wake = make_wake(owner, tab, overlap="skip")
    _running_turn(tab)
    [run] = wakes.run_due(NOW)
    assert (run.status, run.reason) == ("skipped", wakes.SKIPPED_BUSY)
    assert not QueuedMessage.objects.exists()
    wake.refresh_from_db()
    assert wake.enabled and wake.next_run_at == NOW + timedelta(hours=1)


def test_overlap_queue_submits_behind_the_running_turn(owner, tab):
    make_wake(owner, tab, overlap="queue")
    _running_turn(tab)
    [run] = wakes.run_due(NOW)
    assert run.status == "submitted"
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_catch_up_latest_after_downtime_runs_the_latest_and_records_the_rest(owner, tab):
    wake = make_wake(owner, tab, catch_up="latest")
    wakes.run_due(NOW + timedelta(hours=3, minutes=20))
    assert runs(wake) == [
        (NOW, "skipped"),
        (NOW + timedelta(hours=1), "skipped"),
        (NOW + timedelta(hours=2), "skipped"),
        (NOW + timedelta(hours=3), "submitted"),
    ]
    skipped = WakeRun.objects.filter(wake=wake, status="skipped").first()
    assert skipped.reason == "Missed while no worker ran (catch-up: latest only)."
    wake.refresh_from_db()
    assert wake.next_run_at == NOW + timedelta(hours=4)


def test_catch_up_skip_after_downtime_runs_nothing_missed(owner, tab):
    wake = make_wake(owner, tab, catch_up="skip")
    wakes.run_due(NOW + timedelta(hours=1, minutes=30))
    assert runs(wake) == [(NOW, "skipped"), (NOW + timedelta(hours=1), "skipped")]
    assert not QueuedMessage.objects.exists()


def test_a_wake_into_a_deleted_tab_fails_and_is_disabled(owner, tab):
    wake = make_wake(owner, tab)
    tab.delete()
    [run] = wakes.run_due(NOW)
    assert (run.status, run.reason) == ("failed", wakes.TAB_DELETED)
    wake.refresh_from_db()
    assert not wake.enabled and wake.next_run_at is None
    assert wakes.run_due(NOW + timedelta(hours=5)) == []


def test_an_expired_wake_stops(owner, tab):
    wake = make_wake(owner, tab, expires_at=NOW + timedelta(minutes=30))
    assert [r.status for r in wakes.run_due(NOW)] == ["submitted"]
    wake.refresh_from_db()
    assert wake.next_run_at is None
    assert wakes.run_due(NOW + timedelta(hours=2)) == []


def test_a_schedule_broken_by_hand_disables_the_wake_with_the_reason(owner, tab):
    wake = make_wake(owner, tab, timezone="Mars/Olympus")
    assert wakes.run_due(NOW) == []
    run = WakeRun.objects.get(wake=wake)
    assert run.status == "failed" and "Unknown time zone 'Mars/Olympus'" in run.reason
    wake.refresh_from_db()
    assert not wake.enabled


def test_run_now_leaves_the_schedule_alone(owner, tab):
    wake = make_wake(owner, tab, next_run_at=NOW + timedelta(hours=5))
    run = wakes.run_now(wake, NOW)
    assert run.status == "submitted"
    wake.refresh_from_db()
    assert wake.next_run_at == NOW + timedelta(hours=5)


def test_the_scheduler_sleeps_until_the_next_due_time_capped(owner, tab):
    assert wakes.seconds_until_due(NOW) == wakes.SLEEP_CAP_SECONDS
    make_wake(owner, tab, next_run_at=NOW + timedelta(seconds=7))
    assert wakes.seconds_until_due(NOW) == 7
    make_wake(owner, tab, next_run_at=NOW - timedelta(seconds=7), name="late")
    assert wakes.seconds_until_due(NOW) == 0
    Wake.objects.all().update(next_run_at=NOW + timedelta(days=1))
    assert wakes.seconds_until_due(NOW) == wakes.SLEEP_CAP_SECONDS


# --- the command ------------------------------------------------------------------------


def _command(*args: str) -> str:
    out = io.StringIO()
    call_command("wake", *args, stdout=out)
    return out.getvalue()


def test_the_command_adds_lists_runs_and_removes(owner, tab):
    out = _command(
        "add",
        "--owner",
        "owner",
        "--tab",
        str(tab.pk),
        "--prompt",
        "hi",
        "--name",
        "n",
        "--cron",
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
    )
    wake = Wake.objects.get()
    assert out.startswith(f"Added wake {wake.pk}: next run ")
    assert wake.cron == "30 2 * * *" and wake.next_run_at is not None
    assert "cron 30 2 * * * (Europe/Berlin)" in _command("list")
    assert ": submitted in tab" in _command("run", str(wake.pk))
    assert QueuedMessage.objects.filter(tab=tab).count() == 1
    assert _command("remove", str(wake.pk)) == f"Removed wake {wake.pk}.\n"
    assert not Wake.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 9 * * *", "--timezone", "Mars/Olympus"], "Unknown time zone 'Mars/Olympus'"),
        (["--cron", "61 9 * * *"], "Invalid cron expression '61 9 \\* \\* \\*'"),
        (["--cron", "0 0 30 2 *"], "never fires"),
        (["--every", "5"], "between 60 seconds"),
        (["--every", str(10**14)], "between 60 seconds and 366 days"),
        (["--at", "2001-01-01 09:00"], "already passed"),
        (["--at", "tomorrow"], "'tomorrow' is not a time"),
        (["--at", "2030-03-31 02:30", "--timezone", "Europe/Berlin"], "clocks skip it"),
    ],
)
def test_the_command_refuses_bad_schedules(owner, tab, args, message):
    with pytest.raises(CommandError, match=message):
        _command("add", "--owner", "owner", "--tab", str(tab.pk), "--prompt", "hi", *args)
    assert not Wake.objects.exists()


def test_the_command_refuses_another_users_tab_and_unknown_wakes(owner, tab):
    get_user_model().objects.create_user("other", password="pw")
    with pytest.raises(CommandError, match="other has no tab"):
        _command("add", "--owner", "other", "--tab", str(tab.pk), "--prompt", "p", "--every", "60")
    with pytest.raises(CommandError, match="No wake 999"):
        _command("run", "999")
    with pytest.raises(CommandError, match="No wake 999"):
        _command("remove", "999")


def test_the_command_run_of_a_wake_whose_tab_was_deleted_says_so(owner, tab):
    wake = make_wake(owner, tab)
    tab.delete()
    with pytest.raises(CommandError, match="tab was deleted"):
        _command("run", str(wake.pk))


# --- the tool --------------------------------------------------------------------------


async def _tool(tab_id, **args):
    return await run_tool("schedule_wake", args, ROOT, tab_id=tab_id)


@pytest.mark.asyncio
async def test_the_tool_makes_an_expiring_agent_wake_for_its_tab(tab, tmp_path):
    outcome = await _tool(
        tab.pk,
        name="check",
        prompt="check the build",
        cron="0 9 * * 1-5",
        timezone="America/New_York",
    )
    assert not outcome.is_error, outcome.result
    wake = await Wake.objects.aget()
    assert (wake.tab_id, wake.created_by, wake.kind) == (tab.pk, "agent", "cron")
    lifetime = wake.expires_at - wake.created_at
    assert abs(lifetime - AGENT_WAKE_LIFETIME) < timedelta(minutes=1)
    assert f"Scheduled wake {wake.pk} (check)" in outcome.result


@pytest.mark.asyncio
async def test_a_once_wake_from_the_tool_does_not_expire(tab):
    outcome = await _tool(tab.pk, name="later", prompt="p", at="2099-01-01T09:00", target="new_tab")
    assert not outcome.is_error, outcome.result
    wake = await Wake.objects.aget()
    assert wake.expires_at is None and wake.new_tab and wake.tab_id is None


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"cron": "every day"}, "five fields"),
        ({"cron": "0 9 * * *", "timezone": "Berlin"}, "Unknown time zone 'Berlin'"),
        ({"interval_seconds": 60, "cron": "* * * * *"}, "exactly one of"),
        ({}, "exactly one of"),
        ({"at": "soon"}, "at must be a local time"),
        ({"at": "2099-01-01T09:00+02:00"}, "without an offset"),
        ({"at": "2001-01-01T09:00"}, "already passed"),
        ({"interval_seconds": 10**14}, "must be at most 31622400"),
        ({"every": 5}, "unknown argument 'every'"),
        ({"cron": "0 9 * * *", "target": "other_tab"}, "target must be"),
    ],
)
async def test_the_tool_refuses_bad_input_with_a_message(tab, args, message):
    outcome = await _tool(tab.pk, name="n", prompt="p", **args)
    assert outcome.is_error and message in outcome.result, outcome.result
    assert not await Wake.objects.aexists()


def test_the_tool_always_asks():
    assert needs_approval("schedule_wake") and always_asks("schedule_wake")
    assert not always_asks("write_file")


# --- wipe_history ------------------------------------------------------------------------


def test_wipe_history_keeps_wakes_and_their_runs(owner, tab):
    wake = make_wake(owner, tab, model="", profile=None)
    Tab.objects.filter(pk=tab.pk).update(model="offline/demo")
    [run] = wakes.run_due(NOW)
    out = io.StringIO()
    call_command("wipe_history", yes=True, stdout=out)
    assert "1 wake(s) that sent to a tab now start a new tab" in out.getvalue()
    wake.refresh_from_db()
    run.refresh_from_db()
    assert (wake.tab_id, wake.new_tab, wake.model, wake.enabled) == (
        None,
        True,
        "offline/demo",
        True,
    )
    assert (run.tab_id, run.status) == (None, "submitted")
    assert [r.status for r in wakes.run_due(NOW + timedelta(hours=1))] == ["submitted"]
