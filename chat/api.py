"""The JSON API under /api/v1/: plain function views, JSON in and out.

Every response that is not a success is `{"error": {"code", "message"}}` with
its status. A request is authenticated by the session (a same-origin page, with
Django's CSRF check on writes) or by `Authorization: Bearer <token>` (a personal
ApiToken; no CSRF check, since a browser never sends that header on its own).
Failed token attempts count like failed sign-ins (django-axes rows, per client
address), so guessing tokens is as slow as guessing passwords. Every tab is
looked up together with its owner: another user's tab is a 404, as on pages.

`openapi.yaml` at the top of the repository describes every route here;
tests/api_helpers.py validates every response the tests get against it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.signals import user_login_failed
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from chat import throttle
from chat.models import ApiToken, RunningTurn, Tab

# A request body is a message or a small command; the largest, a message of
# forms.MAX_MESSAGE_CHARS characters, is at most ~1.2 MB as JSON even with every
# character \u-escaped. Past this the body is not read at all.
MAX_BODY_BYTES = 2 * 1024 * 1024
# last_used_at is a hint for people ("used yesterday"), not an audit log: one
# write a minute per token at most, not one per request.
TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)
# Tabs per page of GET /tabs: a sidebar's worth; max keeps one response small.
TABS_LIMIT_DEFAULT = 50
TABS_LIMIT_MAX = 200

JsonDict = dict[str, Any]


class ApiError(Exception):
    """Raised anywhere below a view: becomes the JSON error response."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JsonResponse:
    return JsonResponse(
        {"error": {"code": code, "message": message}}, status=status, headers=headers
    )


class _CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, returning the reason instead of an HTML 403 page."""

    def _reject(self, request: HttpRequest, reason: str) -> str:  # type: ignore[override]
        return reason


def _check_csrf(request: HttpRequest) -> None:
    check = _CsrfCheck(lambda _request: HttpResponse())
    check.process_request(request)
    reason = check.process_view(request, None, (), {})
    if reason:
        raise ApiError(403, "csrf_failed", f"CSRF check failed: {reason}")


def _bearer(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Bearer` header; None without the header."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "The Authorization header must be: Bearer <token>.")
    return token.strip()


def _authenticate_token(request: HttpRequest, token: str) -> ApiToken:
    address = throttle.client_ip(request)
    found = throttle.locks(ip_address=address)
    if found:
        now = timezone.now()
        until = max(lock.until for lock in found)
        raise ApiError(
            429,
            "too_many_attempts",
            throttle.token_wait_message(until, now),
            {"Retry-After": throttle.retry_after(until, now)},
        )
    row = (
        ApiToken.objects.select_related("user")
        .filter(token_hash=ApiToken.hash(token), user__is_active=True)
        .first()
    )
    if row is None:
        # Counted by axes like a failed sign-in; when this one reaches the
        # limit, axes' middleware swaps the response for throttle's 429.
        user_login_failed.send(sender=__name__, credentials={"username": None}, request=request)
        raise ApiError(401, "invalid_token", "The API token is not valid (revoked or mistyped).")
    now = timezone.now()
    if row.last_used_at is None or now - row.last_used_at >= TOKEN_TOUCH_INTERVAL:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        row.last_used_at = now
    return row


def api_view(
    *methods: str, write: bool = False
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """An API view: allowed methods, authentication, CSRF for sessions, JSON errors.

    `write` views change something: a read-only token is refused with 403.
    """

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in methods:
                    response = error(
                        405,
                        "method_not_allowed",
                        f"{request.method} is not allowed here; use {', '.join(methods)}.",
                    )
                    response["Allow"] = ", ".join(methods)
                    return response
                token = _bearer(request)
                if token is not None:
                    request.api_token = _authenticate_token(request, token)
                    request.user = request.api_token.user
                    if write and request.api_token.read_only:
                        raise ApiError(
                            403, "read_only_token", "This token is read-only: it cannot do that."
                        )
                else:
                    request.api_token = None
                    if not request.user.is_authenticated:
                        raise ApiError(
                            401,
                            "unauthorized",
                            "Sign in, or send Authorization: Bearer <token>.",
                        )
                    _check_csrf(request)
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return error(exc.status, exc.code, exc.message, exc.headers)

        return wrapper

    return decorate


# --- Input --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Field:
    type: type | tuple[type, ...]
    required: bool = False
    # What the type is called in an error message.
    label: str = ""


def _type_name(field: Field) -> str:
    if field.label:
        return field.label
    names = {str: "a string", bool: "true or false", int: "an integer", dict: "an object"}
    types = field.type if isinstance(field.type, tuple) else (field.type,)
    return " or ".join(names.get(t, t.__name__) for t in types)


def _is(value: Any, field: Field) -> bool:
    types = field.type if isinstance(field.type, tuple) else (field.type,)
    # bool is an int to Python, never to a client.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def read_json(request: HttpRequest, fields: dict[str, Field]) -> JsonDict:
    """The request's JSON object, checked against `fields`: 400 when it is not JSON
    or not an object, 413 when it is too large, 422 for unknown, missing or
    mistyped fields. Returns only the fields that were sent."""
    length = request.META.get("CONTENT_LENGTH") or "0"
    try:
        declared = int(length)
    except ValueError:
        declared = 0
    if declared > MAX_BODY_BYTES:
        raise ApiError(
            413, "body_too_large", f"The request body is larger than {MAX_BODY_BYTES} bytes."
        )
    body = request.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(
            413, "body_too_large", f"The request body is larger than {MAX_BODY_BYTES} bytes."
        )
    if not body.strip():
        if any(f.required for f in fields.values()):
            raise ApiError(400, "invalid_json", "The request body is empty: send a JSON object.")
        return {}
    try:
        data = json.loads(body)
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_json", "The request body is not UTF-8.") from None
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, "invalid_json", f"The request body is not valid JSON: {exc.msg} at {exc.pos}."
        ) from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "The request body must be a JSON object.")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = ", ".join(fields) or "none"
        raise ApiError(
            422, "unknown_field", f"Unknown field(s): {', '.join(unknown)} (known: {known})."
        )
    for name, field in fields.items():
        if name not in data:
            if field.required:
                raise ApiError(422, "missing_field", f"The field {name!r} is required.")
            continue
        if not _is(data[name], field):
            raise ApiError(422, "wrong_type", f"The field {name!r} must be {_type_name(field)}.")
    return data


def int_param(request: HttpRequest, name: str, *, minimum: int) -> int | None:
    """A whole-number query parameter, or None when absent: 400 otherwise."""
    raw = request.GET.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(
            400, "invalid_parameter", f"?{name}= must be a whole number, not {raw!r}."
        ) from None
    if value < minimum:
        raise ApiError(400, "invalid_parameter", f"?{name}= must be at least {minimum}.")
    return value


def limit_param(request: HttpRequest, *, default: int, maximum: int) -> int:
    """?limit=: at least 1; larger than `maximum` is clamped to it, not refused."""
    value = int_param(request, "limit", minimum=1)
    return default if value is None else min(value, maximum)


# --- Output -------------------------------------------------------------------------------


def _tab_summary(tab: Tab, state: str | None) -> JsonDict:
    return {
        "id": str(tab.id),
        "title": tab.title,
        "model": tab.model,
        "state": state or "idle",
        "total": tab.last_seq,
        "created_at": tab.created_at.isoformat(),
        "updated_at": tab.updated_at.isoformat(),
    }


# --- Tabs ---------------------------------------------------------------------------------


@api_view("GET")
def tabs(request: HttpRequest) -> HttpResponse:
    """The user's tabs, most recently active first."""
    limit = limit_param(request, default=TABS_LIMIT_DEFAULT, maximum=TABS_LIMIT_MAX)
    offset = int_param(request, "offset", minimum=0) or 0
    state = RunningTurn.objects.filter(tab=OuterRef("pk")).values("status")[:1]
    rows = list(
        Tab.objects.filter(owner=request.user)
        .annotate(state=Subquery(state))
        .order_by("-updated_at", "-id")[offset : offset + limit + 1]
    )
    has_more = len(rows) > limit
    rows = rows[:limit]
    return JsonResponse(
        {
            "tabs": [_tab_summary(tab, tab.state) for tab in rows],
            "has_more": has_more,
            "next_offset": offset + limit if has_more else None,
        }
    )


# Mounted at /api/v1/ by chat/urls.py. Other modules' API routes go here too, so
# the whole API is one list next to the decorator it shares.
urlpatterns = [
    path("tabs", tabs, name="api_tabs"),
]
