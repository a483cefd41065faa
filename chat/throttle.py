"""Sign-in throttling: what django-axes calls back into, and the locks as operators see them.

Axes counts failed sign-ins in the database (`AccessAttempt`: one row per
username, client address and user agent, with its failure count and the time
of its last failure), so every process of a scaled install sees the same
counts. It counts per account and, separately, per address
(settings.AXES_LOCKOUT_PARAMETERS); either reaching the limit locks sign-in
until the cool-off has passed since the failure that reached it. This module
says who the client is behind a proxy, how long a lock has left, and what a
locked-out person sees: the sign-in page with the wait, status 429.

Failed API token attempts (chat.api) are counted in the same rows, per client
address: a token is a password to whoever guesses it. An API client gets the
429 as JSON.
"""

from __future__ import annotations

import ipaddress
import logging
import math
from dataclasses import dataclass
from datetime import datetime

from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

logger = logging.getLogger(__name__)

# Too Many Requests: the client may try again, later.
LOCKED_STATUS = 429
# The lockable fields of an attempt row and how a person calls them.
KINDS = {"username": "account", "ip_address": "address"}


@dataclass(frozen=True, slots=True)
class Lock:
    field: str  # "username" | "ip_address"
    value: str
    until: datetime

    @property
    def kind(self) -> str:
        return KINDS[self.field]


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: the peer's, or behind DISPATCH_TRUSTED_PROXIES proxies the
    X-Forwarded-For entry the outermost trusted proxy appended.

    Only entries appended by the trusted proxies count: a client can write
    anything at the left of the header. A request with fewer entries than
    proxies did not come through them, so its peer is the client.
    """
    peer = request.META.get("REMOTE_ADDR") or None
    trusted = settings.DISPATCH_TRUSTED_PROXIES
    if not trusted:
        return peer
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    forwarded = [part.strip() for part in header.split(",") if part.strip()]
    if len(forwarded) < trusted:
        return peer
    candidate = forwarded[-trusted]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:
        # The attempt table stores addresses; a proxy writing something else
        # is misconfigured, and the peer is still a real address to count.
        logger.warning("X-Forwarded-For entry %r is not an address; counting the peer", candidate)
        return peer


def locks(
    *, username: str | None = None, ip_address: str | None = None, now: datetime | None = None
) -> list[Lock]:
    """The locks in force on this account and this address (either may be None)."""
    now = now or timezone.now()
    found = []
    for field, value in (("username", username), ("ip_address", ip_address)):
        if value and (until := _locked_until(field, value, now)) is not None:
            found.append(Lock(field, value, until))
    return found


def all_locks(now: datetime | None = None) -> list[Lock]:
    """Every lock in force, accounts first, each soonest-ending first."""
    now = now or timezone.now()
    recent = AccessAttempt.objects.filter(attempt_time__gte=now - settings.AXES_COOLOFF_TIME)
    found = []
    for field in KINDS:
        values = recent.exclude(**{f"{field}__isnull": True}).values_list(field, flat=True)
        for value in sorted(set(values)):
            if (until := _locked_until(field, value, now)) is not None:
                found.append(Lock(field, value, until))
    return sorted(found, key=lambda lock: (lock.field != "username", lock.until))


def _locked_until(field: str, value: str, now: datetime) -> datetime | None:
    """When the lock on `field` = `value` ends, or None when there is none.

    Axes counts the failures of the rows whose last failure is within the
    cool-off. Newest first, the row at which the count reaches the limit is
    the one whose ageing out brings the count back under it.
    """
    cooloff = settings.AXES_COOLOFF_TIME
    rows = (
        AccessAttempt.objects.filter(**{field: value}, attempt_time__gte=now - cooloff)
        .order_by("-attempt_time")
        .values_list("failures_since_start", "attempt_time")
    )
    failures = 0
    for count, at in rows:
        failures += count
        if failures >= settings.AXES_FAILURE_LIMIT:
            return at + cooloff
    return None


def minutes_left(until: datetime, now: datetime) -> int:
    """Whole minutes, rounded up: "1 minute" until the very end, never "0 minutes"."""
    return max(1, math.ceil((until - now).total_seconds() / 60))


def wait_message(minutes: int) -> str:
    unit = "minute" if minutes == 1 else "minutes"
    return f"Too many failed sign-ins. Try again in {minutes} {unit}."


def token_wait_message(until: datetime, now: datetime) -> str:
    minutes = minutes_left(until, now)
    unit = "minute" if minutes == 1 else "minutes"
    return f"Too many failed API token attempts from this address. Try again in {minutes} {unit}."


def retry_after(until: datetime, now: datetime) -> str:
    return str(max(1, math.ceil((until - now).total_seconds())))


def lockout_response(
    request: HttpRequest, original_response: object = None, credentials: object = None
) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: the sign-in page again, saying how long to wait.

    The extra arguments are ignored: axes' async middleware passes them in
    another order than its sync one, and everything needed is in the request.
    """
    if request.path_info.startswith(API_PREFIX):
        return api_lockout_response(request)
    username = request.POST.get("username") or None
    now = timezone.now()
    found = locks(username=username, ip_address=getattr(request, "axes_ip_address", None), now=now)
    # Axes found a lock; should it be gone by now (an operator unlocked in
    # between), the full cool-off is an honest upper bound.
    until = max((lock.until for lock in found), default=now + settings.AXES_COOLOFF_TIME)
    form = AuthenticationForm(request, initial={"username": username})
    context = {
        "form": form,
        "locked": wait_message(minutes_left(until, now)),
        "next": request.POST.get("next", ""),
    }
    response = render(request, "chat/login.html", context, status=LOCKED_STATUS)
    # For scripts and clients that honour it; people read the page.
    response["Retry-After"] = retry_after(until, now)
    return response


# Where chat.api's routes are mounted (chat/urls.py).
API_PREFIX = "/api/"


def api_lockout_response(request: HttpRequest) -> JsonResponse:
    """The 429 of a token attempt while the client's address is locked, as the API's JSON."""
    now = timezone.now()
    found = locks(ip_address=getattr(request, "axes_ip_address", None) or client_ip(request))
    until = max((lock.until for lock in found), default=now + settings.AXES_COOLOFF_TIME)
    message = token_wait_message(until, now)
    response = JsonResponse(
        {"error": {"code": "too_many_attempts", "message": message}}, status=LOCKED_STATUS
    )
    response["Retry-After"] = retry_after(until, now)
    return response
