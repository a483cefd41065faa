"""The Wakes page: the list, the create form and its errors, the actions, another user's
wakes, and the clock badge of a wake's message in a tab."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat import log, turns, wakes
from chat.models import QueuedMessage, RunningTurn, Wake, WakeRun
from chat.preferences import new_tab
from chat.stream import Block, Kind, Role

pytestmark = pytest.mark.django_db(transaction=True)

User = get_user_model()
D6 = timedelta(days=6)


@pytest.fixture
def alice():
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice):
    return new_tab(alice, "offline/demo")


def form(tab, **fields) -> dict[str, str]:
    values = {
        "name": "morning",
        "target": str(tab.pk),
        "prompt": "Plan my day",
        "kind": "cron",
        "cron": "0 8 * * 1-5",
        "timezone": "Europe/Berlin",
        "overlap": "queue",
        "catch_up": "latest",
        "approval": "wait",
    }
    values.update(fields)
    return values


def test_it_adds_a_wake_and_lists_it_with_its_next_run_in_its_zone(client, alice, tab):
    response = client.post(reverse("wakes"), form(tab), follow=True)
    wake = Wake.objects.get()
    assert (wake.owner, wake.tab, wake.cron, wake.timezone) == (
        alice,
        tab,
        "0 8 * * 1-5",
        "Europe/Berlin",
    )
    page = response.content.decode()
    assert "Added the wake “morning”: next run " in page
    assert "08:00 CE" in page  # CET or CEST: the wake's own zone
    assert f'id="wake-{wake.pk}"' in page


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"timezone": "Mars/Olympus"}, "Unknown time zone &#x27;Mars/Olympus&#x27;"),
        ({"cron": "0 8 * *"}, "A cron expression has five fields"),
        ({"cron": "0 25 * * *"}, "Invalid cron expression"),
        ({"cron": "0 0 30 2 *"}, "never fires"),
        ({"kind": "interval", "interval_seconds": "10"}, "between 60 seconds"),
        # Past timedelta's range: the same message, not a server error.
        ({"kind": "interval", "interval_seconds": str(10**14)}, "between 60 seconds"),
        ({"kind": "once", "once_at": "2001-01-01T09:00"}, "already passed"),
        ({"kind": "once", "once_at": "2030-03-31T02:30"}, "the clocks skip it"),
        ({"kind": "once", "once_at": ""}, "Give the time to run at."),
        ({"expires_at": "2001-01-01T00:00"}, "would expire"),
        ({"prompt": ""}, "This field is required."),
    ],
)
def test_bad_input_is_shown_at_its_field_and_nothing_is_added(client, tab, fields, message):
    response = client.post(reverse("wakes"), form(tab, **fields))
    assert response.status_code == 422
    assert message in response.content.decode()
    assert not Wake.objects.exists()


def test_another_users_tab_is_not_a_target(client, tab):
    bob = User.objects.create_user("bob", password="x")
    theirs = new_tab(bob, "offline/demo")
    response = client.post(reverse("wakes"), form(tab, target=str(theirs.pk)))
    assert response.status_code == 422 and not Wake.objects.exists()


def _wake(alice, tab, **fields) -> Wake:
    values = {
        "owner": alice,
        "name": "w",
        "tab": tab,
        "prompt": "p",
        "kind": "interval",
        "interval_seconds": 3600,
        "next_run_at": timezone.now() + timedelta(hours=1),
    }
    values.update(fields)
    return Wake.objects.create(**values)


def test_an_interval_wake_reads_in_its_unit(client, alice, tab):
    _wake(alice, tab, interval_seconds=86400)
    page = client.get(reverse("wakes")).content.decode()
    assert "every day" in page and "86400" not in page


def test_the_actions(client, alice, tab):
    wake = _wake(alice, tab, created_by="agent", expires_at=timezone.now() + timedelta(days=7))
    act = lambda action: client.post(reverse("wake_action", args=[wake.pk, action]))  # noqa: E731

    act("keep")
    wake.refresh_from_db()
    assert wake.expires_at is None and wake.next_run_at is not None
    act("disable")
    wake.refresh_from_db()
    assert not wake.enabled and wake.next_run_at is None
    act("enable")
    wake.refresh_from_db()
    assert wake.enabled and wake.next_run_at > timezone.now()
    act("run")
    assert QueuedMessage.objects.filter(tab=tab).count() == 1
    page = client.get(reverse("wakes")).content.decode()
    assert "submitted" in page and reverse("tab", args=[tab.pk]) in page
    act("delete")
    assert not Wake.objects.exists() and not WakeRun.objects.exists()


def test_run_now_of_a_wake_whose_tab_was_deleted_says_why(client, alice, tab):
    wake = _wake(alice, tab)
    tab.delete()
    page = client.post(reverse("wake_action", args=[wake.pk, "run"]), follow=True)
    assert "did not run: The wake&#x27;s tab was deleted" in page.content.decode()
    wake.refresh_from_db()
    assert not wake.enabled


def test_keep_racing_the_scheduler_does_not_put_back_the_claimed_time(
    client, alice, tab, monkeypatch
):
    """Keep read the wake (next run 09:00); the scheduler claimed 09:00 before Keep
    wrote. The wake keeps its new next time (saving the whole row Keep read would make the
    wake due at 09:00 again: its claim would hit the existing run, and it would never fire
    again while the scheduler spun)."""
    nine = timezone.now().replace(microsecond=0) - timedelta(minutes=1)
    wake = _wake(alice, tab, next_run_at=nine, created_by="agent", expires_at=nine + D6)
    real_now = timezone.now
    raced = []

    def now():
        # The view asks for the time after its read: the scheduler's pass runs here.
        if sys._getframe(1).f_code.co_name == "wake_action" and not raced:
            raced.append(wakes.run_due(nine))
        return real_now()

    monkeypatch.setattr(timezone, "now", now)
    client.post(reverse("wake_action", args=[wake.pk, "keep"]))
    monkeypatch.setattr(timezone, "now", real_now)

    assert [r.status for r in raced[0]] == ["submitted"]
    wake.refresh_from_db()
    assert (wake.expires_at, wake.next_run_at) == (None, nine + timedelta(hours=1))
    assert wakes.run_due(nine + timedelta(seconds=1)) == []
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_run_now_on_a_busy_tab_of_a_skip_wake_says_it_was_skipped(client, alice, tab):
    wake = _wake(alice, tab, overlap="skip")
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    page = client.post(reverse("wake_action", args=[wake.pk, "run"]), follow=True)
    text = page.content.decode()
    assert "did not run: A turn was running in the tab (overlap: skip)." in text
    assert "runs now" not in text
    assert WakeRun.objects.get(wake=wake).status == "skipped"


def test_a_firing_that_failed_shows_its_error_on_the_wakes_page(client, alice, tab, monkeypatch):
    """Fault injection at the submit: the run's attempt and then its failure, with the
    error, are on the page."""
    wake = _wake(alice, tab, next_run_at=timezone.now() - timedelta(seconds=1))

    def submit(*args, **kwargs):
        raise RuntimeError("the channel layer is down")

    monkeypatch.setattr(turns, "submit", submit)
    now = timezone.now()
    wakes.run_due(now)
    page = client.get(reverse("wakes")).content.decode()
    assert "pending" in page
    assert "Attempt 1 of 3 failed, retrying: RuntimeError: the channel layer is down" in page
    WakeRun.objects.filter(wake=wake).update(attempts=wakes.MAX_FIRE_ATTEMPTS - 1)
    wakes.run_due(now + wakes.PENDING_STALE * 2)
    page = client.get(reverse("wakes")).content.decode()
    assert "Gave up after 3 attempts: RuntimeError: the channel layer is down" in page


def test_another_users_wake_is_neither_shown_nor_touched(client, tab):
    bob = User.objects.create_user("bob", password="x")
    theirs = _wake(bob, new_tab(bob, "offline/demo"), name="bobs")
    assert "bobs" not in client.get(reverse("wakes")).content.decode()
    page = client.post(reverse("wake_action", args=[theirs.pk, "delete"]), follow=True)
    assert "no such wake of yours" in page.content.decode()
    assert Wake.objects.filter(pk=theirs.pk).exists()


def test_a_wakes_message_shows_a_clock_badge_with_its_name_and_time(client, tab):
    origin = {
        "kind": "wake",
        "wake_id": 1,
        "scheduled_for": "2026-06-01T07:00:00+00:00",
        "name": "morning",
        "timezone": "Europe/Berlin",
        "approval": "wait",
    }
    turn = uuid.uuid4()
    log.append(
        tab.pk,
        [
            Block(uuid.uuid4(), turn, 0, Role.USER, Kind.TEXT, {"text": "Plan", "origin": origin}),
            Block(uuid.uuid4(), turn, 0, Role.USER, Kind.TEXT, {"text": "mine"}),
        ],
    )
    page = client.get(reverse("tab", args=[tab.pk])).content.decode()
    assert "</svg> morning · 2026-06-01 09:00 CEST</div>" in page
    assert page.count('class="wake-badge"') == 1


# --- the admin ------------------------------------------------------------------------------


def _admin_form(alice, **fields) -> dict[str, str]:
    values = {
        "owner": str(alice.pk),
        "name": "a",
        "prompt": "p",
        "kind": "cron",
        "cron": "0 9 * * *",
        "timezone": "America/New_York",
        "enabled": "on",
        "overlap": "queue",
        "catch_up": "latest",
        "approval": "wait",
        "created_by": "user",
        "new_tab": "on",
        "runs-TOTAL_FORMS": "0",
        "runs-INITIAL_FORMS": "0",
    }
    values.update(fields)
    return values


def test_the_admin_checks_the_schedule_and_computes_the_next_run(alice):
    admin_user = User.objects.create_superuser("root", password="x")
    client = Client()
    client.force_login(admin_user)
    url = reverse("admin:chat_wake_add")
    bad = client.post(url, _admin_form(alice, cron="0 0 30 2 *"))
    assert bad.status_code == 200 and "never fires" in bad.content.decode()
    assert not Wake.objects.exists()
    good = client.post(url, _admin_form(alice))
    assert good.status_code == 302, good.content.decode()
    wake = Wake.objects.get()
    assert wake.next_run_at is not None and wake.next_run_at > timezone.now()
    assert client.get(reverse("admin:chat_wake_changelist")).status_code == 200
    assert client.get(reverse("admin:chat_wake_change", args=[wake.pk])).status_code == 200
    assert client.get(reverse("admin:chat_wakerun_changelist")).status_code == 200


def _admin_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    return client


def test_the_admin_refuses_a_tab_of_another_user(alice, tab):
    bob = User.objects.create_user("bob", password="x")
    response = _admin_client().post(
        reverse("admin:chat_wake_add"), _admin_form(bob, tab=str(tab.pk), new_tab="")
    )
    assert response.status_code == 200
    assert "That tab is not bob&#x27;s: a wake runs as its owner." in response.content.decode()
    assert not Wake.objects.exists()


def test_the_admin_keeps_the_next_run_when_only_the_prompt_changes(alice, tab):
    """The next run is the scheduler's (here a missed 07:00 it has yet to claim), not
    restarted from now by an edit of the prompt; a schedule change restarts it."""
    due = timezone.now().replace(microsecond=0) - timedelta(hours=2)
    wake = _wake(alice, tab, next_run_at=due)
    fields = {"tab": str(tab.pk), "new_tab": "", "kind": "interval", "cron": "", "timezone": "UTC"}
    client = _admin_client()
    url = reverse("admin:chat_wake_change", args=[wake.pk])

    edit = client.post(url, _admin_form(alice, **fields, interval_seconds="3600", prompt="new"))

    assert edit.status_code == 302, edit.content.decode()
    wake.refresh_from_db()
    assert (wake.prompt, wake.next_run_at) == ("new", due)
    client.post(url, _admin_form(alice, **fields, interval_seconds="7200", prompt="new"))
    wake.refresh_from_db()
    assert wake.next_run_at > timezone.now() + timedelta(minutes=119)


def test_the_admin_edits_a_once_wake_that_already_fired(alice, tab):
    """Its time is past: the prompt can be changed and the wake disabled; enabling it
    again is what "already passed" is for."""
    past = timezone.now().replace(microsecond=0) - timedelta(days=1)
    wake = _wake(alice, tab, kind="once", interval_seconds=None, once_at=past, next_run_at=None)
    client = _admin_client()
    url = reverse("admin:chat_wake_change", args=[wake.pk])
    fields = {
        "tab": str(tab.pk),
        "new_tab": "",
        "kind": "once",
        "cron": "",
        "timezone": "UTC",
        "once_at_0": past.strftime("%Y-%m-%d"),
        "once_at_1": past.strftime("%H:%M:%S"),
    }

    edited = client.post(url, _admin_form(alice, **fields, prompt="again"))
    assert edited.status_code == 302, edited.content.decode()
    disabled = client.post(url, _admin_form(alice, **fields, prompt="again", enabled=""))
    assert disabled.status_code == 302, disabled.content.decode()
    wake.refresh_from_db()
    assert (wake.prompt, wake.enabled, wake.next_run_at) == ("again", False, None)
    enabled = client.post(url, _admin_form(alice, **fields, prompt="again"))
    assert enabled.status_code == 200 and "already passed" in enabled.content.decode()
