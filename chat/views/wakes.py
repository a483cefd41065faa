"""The Wakes page: the user's wakes (see ARCHITECTURE.md, "Wakes"), a new one, and what
each offers (enable, disable, run now, keep, delete).
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from chat import schedule, wakes
from chat.forms import WakeForm
from chat.models import Tab, Wake, WakeRun
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest

# Runs listed under each wake on the Wakes page, most recent first.
WAKE_RUNS_SHOWN = 10


# Tabs offered as a wake's target: the most recently used.
WAKE_TARGET_TABS = 200


@dataclass(frozen=True)
class ShownWake:
    """A wake as its page lists it: the row, and what the page says of it."""

    wake: Wake
    when: str
    every: str
    expired: bool
    recent: list[WakeRun]


@login_required
def wakes_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The user's wakes, and a new one (each problem shown at its field)."""
    targets = list(
        Tab.objects.filter(owner=request.user).order_by("-updated_at")[:WAKE_TARGET_TABS]
    )
    if request.method != "POST":
        return _wakes_page(request, WakeForm(owner=request.user, tabs=targets))
    form = WakeForm(request.POST, owner=request.user, tabs=targets)
    if not form.is_valid() or form.wake is None:
        return _wakes_page(request, form, status=422)
    wake = form.wake
    wake.save()
    wakes.changed()
    messages.success(request, f"Added the wake “{wake}”: next run {_wake_when(wake)}.")
    return redirect(reverse("wakes"))


@login_required
@require_POST
def wake_action(request: AuthenticatedHttpRequest, wake_id: int, action: str) -> HttpResponse:
    """enable, disable, run (now, once), keep (no expiry), delete."""
    wake = Wake.objects.filter(pk=wake_id, owner=request.user).first()
    if wake is None:
        messages.error(request, "There is no such wake of yours; it may have been deleted.")
        return redirect(reverse("wakes"))
    now = timezone.now()
    try:
        if action == "delete":
            wake.delete()
            messages.success(request, f"Deleted the wake “{wake}”.")
        elif action == "run":
            run = wakes.run_now(wake, now)
            if run.status == WakeRun.Status.SUBMITTED:
                messages.success(request, f"“{wake}” runs now.")
            elif run.status == WakeRun.Status.PENDING:
                messages.error(request, f"“{wake}” did not run yet: {run.reason}")
            else:
                messages.error(request, f"“{wake}” did not run: {run.reason}")
        elif action in ("enable", "disable", "keep"):
            # Written by conditional updates (chat.wakes): the scheduler may have moved
            # the wake on since it was read.
            {"enable": wakes.enable, "disable": wakes.disable, "keep": wakes.keep}[action](
                wake, now
            )
            wake = Wake.objects.filter(pk=wake.pk).first() or wake
            messages.success(request, f"“{wake}”: next run {_wake_when(wake)}.")
        else:
            raise Http404
    except schedule.ScheduleError as exc:
        messages.error(request, f"“{wake}” cannot run again: {exc}")
    wakes.changed()
    return redirect(reverse("wakes"))


def _wake_when(wake: Wake) -> str:
    """The next run in the wake's own time zone, as its schedule reads."""
    if wake.next_run_at is None:
        return "never"
    try:
        zone = schedule.zone(wake.timezone)
    except schedule.ScheduleError:
        return f"{wake.next_run_at:%Y-%m-%d %H:%M} UTC"
    return f"{wake.next_run_at.astimezone(zone):%Y-%m-%d %H:%M %Z}"


def _wakes_page(
    request: AuthenticatedHttpRequest, form: WakeForm, status: int = 200
) -> HttpResponse:
    rows = list(
        Wake.objects.filter(owner=request.user).select_related("tab", "profile").order_by("id")
    )
    now = timezone.now()
    shown = [
        ShownWake(
            wake=wake,
            when=_wake_when(wake),
            every=schedule.every(wake.interval_seconds or 0),
            expired=wake.expires_at is not None and wake.expires_at <= now,
            recent=list(wake.runs.select_related("tab")[:WAKE_RUNS_SHOWN]),
        )
        for wake in rows
    ]
    context = {
        "tabs": common.sidebar_tabs(request),
        "wakes": shown,
        "form": form,
        "timezones": sorted(zoneinfo.available_timezones()),
    }
    return render(request, "chat/wakes.html", context, status=status)
