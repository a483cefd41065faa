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
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

from django import forms
from django.contrib.auth.models import User
from django.contrib.auth.signals import user_login_failed
from django.db import connection
from django.db.models import OuterRef, Subquery
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import path, reverse
from django.utils import timezone
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from chat import (
    blobs,
    cuts,
    follow,
    log,
    preferences,
    revocation,
    search,
    throttle,
    transfer,
    turns,
    usage,
)
from chat.chunks import Kind, ToolCall, ToolResult
from chat.forms import (
    MAX_MESSAGE_CHARS,
    MAX_SYSTEM_PROMPT_CHARS,
    check_runnable,
    validate_model_id,
)
from chat.models import ApiToken, Chunk, RunningTurn, Tab
from chat.tools.workdir import BadWorkdir
from chat.turn import lease

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
# Chunks per page: the tab page's default; the max keeps one response a few MB
# at most (a tool result is capped, so a chunk is a few KB).
CHUNKS_LIMIT_DEFAULT = 200
CHUNKS_LIMIT_MAX = 1000
# Tab.title's column.
TITLE_MAX_CHARS = 200
# A page wholly below the last seq never changes (rows are immutable, seqs dense):
# a client may keep it for a year.
IMMUTABLE_CACHE_CONTROL = "private, max-age=31536000, immutable"

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


# --- Errors outside the API's views --------------------------------------------------------
# Django's handler400/403/404/500 (dispatch/urls.py): what no view answered (no route, a
# body past Django's limits, an exception) is JSON under /api/ and Django's page elsewhere.

API_PREFIX = "/api/"
_TAB_SEGMENT = re.compile(r"^/api/v1/tabs/(?P<segment>[^/]+)")


def _is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX)


def handler400(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return error(400, "bad_request", f"The request was refused: {exception}")
    return defaults.bad_request(request, exception)


def handler403(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_api(request):
        return error(403, "forbidden", "You may not do that.")
    return defaults.permission_denied(request, exception)


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    found = _TAB_SEGMENT.match(request.path_info)
    if found and found["segment"] != "import":
        try:
            uuid.UUID(found["segment"])
        except ValueError:
            return error(404, "not_found", f"{found['segment']!r} is not a tab id (a UUID).")
    return error(
        404, "not_found", f"No API route {request.path_info!r} (see openapi.yaml for the routes)."
    )


def handler500(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return error(500, "server_error", "The server failed on this request; it is logged.")
    return defaults.server_error(request)


class _CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check, returning the reason instead of an HTML 403 page."""

    def _reject(self, request: HttpRequest, reason: str) -> str:
        return reason


def _no_view(request: HttpRequest) -> HttpResponse:
    """The view the CSRF check is told of: none in particular, and not exempt from it."""
    return HttpResponse()


def _check_csrf(request: HttpRequest) -> None:
    check = _CsrfCheck(_no_view)
    check.process_request(request)
    reason = check.process_view(request, _no_view, (), {})
    if reason:
        raise ApiError(403, "csrf_failed", f"CSRF check failed: {reason}")


def bearer(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Bearer` header; None without the header."""
    header = request.META.get("HTTP_AUTHORIZATION")
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "The Authorization header must be: Bearer <token>.")
    return token.strip()


def authenticate_token(request: HttpRequest, token: str) -> ApiToken:
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


class ApiRequest(HttpRequest):
    """The request an API view is given: `api_view` has signed its user in (by session
    or token) and set the token it came with (None for a session). For annotations
    only: the object is Django's request."""

    user: User
    api_token: ApiToken | None


def api_view(
    *methods: str, write: bool = False
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """An API view: allowed methods, authentication, CSRF for sessions, JSON errors.

    `write` views change something: a read-only token is refused with 403.
    """

    def decorate(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @csrf_exempt
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            try:
                if request.method not in methods:
                    response = error(
                        405,
                        "method_not_allowed",
                        f"{request.method} is not allowed here; use {', '.join(methods)}.",
                    )
                    response["Allow"] = ", ".join(methods)
                    return response
                # What the view is given: the checks below make it an ApiRequest.
                signed = cast(ApiRequest, request)
                token = bearer(request)
                if token is not None:
                    signed.api_token = authenticate_token(request, token)
                    signed.user = signed.api_token.user
                    if write and signed.api_token.read_only:
                        raise ApiError(
                            403, "read_only_token", "This token is read-only: it cannot do that."
                        )
                else:
                    signed.api_token = None
                    if not request.user.is_authenticated:
                        raise ApiError(
                            401,
                            "unauthorized",
                            "Sign in, or send Authorization: Bearer <token>.",
                        )
                    _check_csrf(request)
                return view(signed, *args, **kwargs)
            except ApiError as exc:
                return error(exc.status, exc.code, exc.message, exc.headers)
            except Tab.DoesNotExist:
                # Deleted while the request ran (found, then gone when locked).
                return error(404, "not_found", "That tab was deleted.")

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
        # Decoded here: json.loads would take a UTF-16 or UTF-32 byte order mark.
        data = json.loads(body.decode("utf-8"))
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
        "parent": _parent(tab),
        "conversation": str(tab.conversation),
        "created_at": tab.created_at.isoformat(),
        "updated_at": tab.updated_at.isoformat(),
    }


def _parent(tab: Tab) -> JsonDict | None:
    """Where a branch was cut: None for a tab that is not a branch. The parent's id is
    None once the parent is deleted (the branch holds its own copy and stays whole);
    fork_seq, the last seq copied, outlives it."""
    if tab.fork_seq is None:
        return None
    return {"id": str(tab.parent_id) if tab.parent_id else None, "at_seq": tab.fork_seq}


def _branches(tab: Tab) -> list[JsonDict]:
    """The tab's branches by where they were cut, then by age: one query, read by
    GET /tabs/<id> only (a list of tabs would need one per tab)."""
    rows = (
        Tab.objects.filter(parent=tab, owner_id=tab.owner_id)
        .order_by("fork_seq", "created_at", "id")
        .values_list("id", "title", "fork_seq", "created_at")
    )
    return [
        {"id": str(pk), "title": title, "at_seq": at_seq, "created_at": created.isoformat()}
        for pk, title, at_seq, created in rows
    ]


def waiting_call(tab_id: uuid.UUID, turn_id: uuid.UUID) -> JsonDict | None:
    """The call a waiting turn asks approval for: its first call without a result.

    Calls run in the order they were made, each sealed in the log before any
    runs, so the first unanswered one is the one waiting. Servers may repeat a
    call id, hence counting calls and results per id rather than matching sets.
    """
    rows = (
        Chunk.objects.filter(
            tab_id=tab_id, turn_id=turn_id, type__in=[Kind.TOOL_CALL, Kind.TOOL_RESULT]
        )
        .order_by("seq")
        .values_list("type", "data")
    )
    calls: list[ToolCall] = []
    answered: dict[str, int] = {}
    for kind, data in rows:
        if kind == Kind.TOOL_CALL:
            calls.append(cast(ToolCall, data))
        else:
            call_id = str(cast(ToolResult, data).get("call_id", ""))
            answered[call_id] = answered.get(call_id, 0) + 1
    for call in calls:
        call_id = str(call.get("call_id", ""))
        if answered.get(call_id, 0) > 0:
            answered[call_id] -= 1
            continue
        return {
            "call_id": call_id,
            "name": call.get("name", ""),
            "arguments": call.get("arguments", {}),
        }
    return None


def _status(tab: Tab) -> JsonDict:
    """The page's status (lease.status), as the API says it: queued message ids, and
    the call a waiting turn asks about."""
    status = lease.status(tab.id)
    status.pop("stale", None)
    status["queued"] = [queued["id"] for queued in status["queued"]]
    if status["state"] == RunningTurn.Status.WAITING:
        status["call"] = waiting_call(tab.id, uuid.UUID(status["turn_id"]))
    return status


def _tab_detail(tab: Tab) -> JsonDict:
    detail = _tab_summary(tab, None)
    status = _status(tab)
    detail["state"] = status["state"]
    detail["system_prompt"] = tab.system_prompt
    detail["profile"] = tab.profile.name if tab.profile else None
    detail["workdir"] = tab.workdir
    detail["status"] = status
    detail["branches"] = _branches(tab)
    detail["usage"] = _usage(usage.tab_totals(tab.id))
    return detail


def _usage(totals: usage.Totals) -> JsonDict:
    """Tokens and cost, as openapi.yaml's Usage with its cost. The cost is a decimal
    string (exact); null when no step's model has a price, never a made-up 0."""
    tokens = totals.tokens
    share = tokens.cache_share
    unpriced = bool(totals.models) and set(totals.models) <= set(totals.unknown)
    return {
        "input": tokens.input,
        "output": tokens.output,
        "cache_read": tokens.cache_read,
        "cache_write": tokens.cache_write,
        "requests": totals.steps,
        "cache_hit_share": None if share is None else round(share, 4),
        "cost_usd": None if unpriced else usage.usd_text(totals.usd),
        "unpriced_models": list(totals.unknown),
        "models": list(totals.models),
    }


def _get_tab(request: ApiRequest, tab_id: uuid.UUID) -> Tab:
    tab = Tab.objects.filter(pk=tab_id, owner=request.user).first()
    if tab is None:
        raise ApiError(404, "not_found", f"No tab {tab_id} (or it is not yours).")
    return tab


# --- Tabs ---------------------------------------------------------------------------------


@api_view("GET", "POST")
def tabs(request: ApiRequest) -> HttpResponse:
    if request.method == "POST":
        return _tab_create(request)
    return _tab_list(request)


def _tab_list(request: ApiRequest) -> HttpResponse:
    """The user's tabs, most recently active first."""
    limit = limit_param(request, default=TABS_LIMIT_DEFAULT, maximum=TABS_LIMIT_MAX)
    offset = int_param(request, "offset", minimum=0) or 0
    # A finishing turn's end is in the log: idle, as lease.status says.
    state = (
        RunningTurn.objects.filter(tab=OuterRef("pk"))
        .exclude(status=RunningTurn.Status.FINISHING)
        .values("status")[:1]
    )
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


def _tab_create(request: ApiRequest) -> HttpResponse:
    """A new tab; what is not given comes from the Settings page, as for a new tab there."""
    if request.api_token is not None and request.api_token.read_only:
        raise ApiError(403, "read_only_token", "This token is read-only: it cannot create tabs.")
    data = read_json(
        request,
        {
            "title": Field(str),
            "model": Field(str),
            "system_prompt": Field(str),
            "profile": Field(str),
            "workdir": Field(str),
        },
    )
    title = data.get("title", "").strip()
    if len(title) > TITLE_MAX_CHARS:
        raise ApiError(422, "invalid_value", f"A title has at most {TITLE_MAX_CHARS} characters.")
    model = ""
    if data.get("model", "").strip():
        try:
            model = validate_model_id(data["model"])
        except forms.ValidationError as exc:
            raise ApiError(422, "invalid_model", " ".join(exc.messages)) from None
        try:
            check_runnable(model)
        except forms.ValidationError as exc:
            # Its first message would fail: said now, with the fix.
            raise ApiError(422, "model_without_key", " ".join(exc.messages)) from None
    system_prompt = data.get("system_prompt")
    if system_prompt is not None and len(system_prompt) > MAX_SYSTEM_PROMPT_CHARS:
        raise ApiError(
            422,
            "invalid_value",
            f"A system prompt has at most {MAX_SYSTEM_PROMPT_CHARS} characters.",
        )
    profile = None
    if "profile" in data:
        try:
            profile = preferences.profile_named(data["profile"])
        except ValueError as exc:
            raise ApiError(422, "unknown_profile", str(exc)) from None
    try:
        tab = preferences.new_tab(
            request.user,
            model,
            profile=profile,
            workdir=data.get("workdir", ""),
            title=title,
            system_prompt=system_prompt,
        )
    except BadWorkdir as exc:
        raise ApiError(422, "invalid_workdir", str(exc)) from None
    response = JsonResponse(_tab_detail(tab), status=201)
    response["Location"] = reverse("api_tab", args=[tab.id])
    return response


@api_view("GET")
def tab(request: ApiRequest, tab_id: uuid.UUID) -> HttpResponse:
    return JsonResponse(_tab_detail(_get_tab(request, tab_id)))


@api_view("GET")
def chunks(request: ApiRequest, tab_id: uuid.UUID) -> HttpResponse:
    """A page of the log by seq: the last `limit` before `before` (default: the
    newest), or the first `limit` after `after`.

    Seqs are dense from 1 and rows never change, so a page that ends below the
    last seq is known from its bounds alone: its ETag is those bounds, and a
    matching If-None-Match is answered without reading a chunk.
    """
    tab = _get_tab(request, tab_id)
    limit = limit_param(request, default=CHUNKS_LIMIT_DEFAULT, maximum=CHUNKS_LIMIT_MAX)
    before = int_param(request, "before", minimum=1)
    after = int_param(request, "after", minimum=0)
    if before is not None and after is not None:
        raise ApiError(400, "invalid_parameter", "Send ?before= or ?after=, not both.")
    total = tab.last_seq
    if after is not None:
        low, high = after + 1, min(after + limit, total)
    else:
        high = total if before is None else min(before - 1, total)
        low = max(1, high - limit + 1)
    immutable = low <= high < total
    etag = f'"v1-{tab.id}-{low}-{high}"'
    if immutable and etag in _etags(request.META.get("HTTP_IF_NONE_MATCH", "")):
        response = HttpResponse(status=304)
        response["ETag"] = etag
        response["Cache-Control"] = IMMUTABLE_CACHE_CONTROL
        return response
    rows = (
        log.tail(tab.id, after=after, limit=limit)
        if after is not None
        else log.page(tab.id, before=before, limit=limit)
    )
    first = rows[0].seq if rows else None
    last = rows[-1].seq if rows else None
    if after is not None:
        has_more = last is not None and last < total
    else:
        has_more = first is not None and first > 1
    response = JsonResponse(
        {
            "chunks": [log.as_json(row) for row in rows],
            "total": total,
            "has_more": has_more,
            "next_before": first if first is not None and first > 1 else None,
            "next_after": last if last is not None and last < total else None,
        }
    )
    if immutable:
        response["ETag"] = etag
        response["Cache-Control"] = IMMUTABLE_CACHE_CONTROL
    else:
        # The newest page grows as the turn runs: always ask again.
        response["Cache-Control"] = "private, no-cache"
    return response


def _etags(header: str) -> set[str]:
    return {part.strip().removeprefix("W/") for part in header.split(",") if part.strip()}


# --- Turns --------------------------------------------------------------------------------


@api_view("POST", write=True)
def messages(request: ApiRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Send a message: queued at once, taken by the running turn at its next step or by
    a new turn. 202: accepted, not answered. JSON `{text}`, or multipart/form-data with
    `text` and files in `file` fields, checked as the page's uploads are (chat.blobs)."""
    tab = _get_tab(request, tab_id)
    attachments: list[str] = []
    if request.content_type == "multipart/form-data":
        text, attachments = _multipart_message(request, tab)
    else:
        text = read_json(request, {"text": Field(str, required=True)})["text"]
    if len(text) > MAX_MESSAGE_CHARS:
        raise ApiError(
            422,
            "invalid_value",
            f"The message is too long (at most {MAX_MESSAGE_CHARS} characters).",
        )
    try:
        queued = turns.submit(tab, text, attachments=attachments)
    except ValueError as exc:
        raise ApiError(422, "invalid_value", str(exc)) from None
    return JsonResponse({"id": queued.pk}, status=202)


def _multipart_message(request: ApiRequest, tab: Tab) -> tuple[str, list[str]]:
    """A multipart message's text and its files, stored as the tab's uploads (all, or
    none: 413 past the size bound, 422 for a file refused, saying why)."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > blobs.MAX_REQUEST_BYTES:
        raise ApiError(
            413,
            "body_too_large",
            f"The request body is larger than {blobs.MAX_REQUEST_BYTES} bytes: at most "
            f"{blobs.MAX_FILES} files of {blobs.human_bytes(blobs.MAX_UPLOAD_BYTES)} each.",
        )
    text = request.POST.get("text", "")
    uploads = request.FILES.getlist("file")
    if not uploads:
        return text, []
    try:
        files = blobs.normalise_uploads(uploads)
    except blobs.AttachmentError as exc:
        raise ApiError(422, "invalid_file", str(exc)) from None
    return text, blobs.add_uploads(tab.pk, files)


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ApiError(422, "invalid_value", f"{what} must be a UUID, not {value!r}.") from None


@api_view("POST", write=True)
def stop(request: ApiRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Stop the running turn: `turn_id` (what the client last saw) guards against
    stopping the turn after it; null or missing stops whichever runs."""
    tab = _get_tab(request, tab_id)
    data = read_json(request, {"turn_id": Field((str, type(None)), label="a UUID string or null")})
    turn_id = _uuid(data["turn_id"], "turn_id") if data.get("turn_id") is not None else None
    if not turns.cancel(tab.id, turn_id):
        message = (
            f"Turn {turn_id} is not running on this tab."
            if turn_id
            else "No turn is running on this tab."
        )
        raise ApiError(409, "not_running", message)
    return JsonResponse({"stopping": True}, status=202)


@api_view("POST", write=True)
def approval(request: ApiRequest, tab_id: uuid.UUID, call_id: str) -> HttpResponse:
    """Approve or deny the tool call the running turn waits on."""
    tab = _get_tab(request, tab_id)
    data = read_json(request, {"approve": Field(bool, required=True)})
    running = RunningTurn.objects.filter(tab_id=tab.id).first()
    waiting = (
        waiting_call(tab.id, running.turn_id)
        if running is not None and running.status == RunningTurn.Status.WAITING
        else None
    )
    if waiting is None or waiting["call_id"] != call_id:
        raise ApiError(
            409, "not_waiting", f"No turn on this tab waits for approval of {call_id!r}."
        )
    turns.approve(tab.id, call_id, data["approve"])
    return JsonResponse({"call_id": call_id, "approve": data["approve"]}, status=202)


@api_view("POST", write=True)
def continue_turn(request: ApiRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Continue the tab's last turn, which was cut short (a server restart, Stop, a
    limit, an error): a new turn whose message says what was interrupted and where.
    202 with that message, queued like any other; 409 when there is nothing to
    continue or a turn runs."""
    tab = _get_tab(request, tab_id)
    read_json(request, {})
    try:
        queued = turns.continue_turn(tab)
    except ValueError as exc:
        raise ApiError(409, "cannot_continue", str(exc)) from None
    return JsonResponse({"id": queued.pk, "text": queued.text}, status=202)


@api_view("POST", write=True)
def branch(request: ApiRequest, tab_id: uuid.UUID) -> HttpResponse:
    """A new tab holding a copy of this one's log up to `at_seq` (turns.branch); with
    `run`, a turn starts at once answering the copy as it stands. 201 with the new
    tab; 200 with the same tab when the same branch was made within
    turns.REPEAT_WINDOW (a double click, a client's retry)."""
    tab = _get_tab(request, tab_id)
    data = read_json(request, {"at_seq": Field(int, required=True), "run": Field(bool)})
    at_seq = data["at_seq"]
    if at_seq < 0:
        raise ApiError(
            422, "invalid_value", "at_seq must be at least 0 (0: before the first chunk)."
        )
    try:
        branched = turns.branch(tab, at_seq, run=data.get("run", False))
    except cuts.TurnRunning as exc:
        # A state that passes (a conflict), not a wrong cut.
        raise ApiError(409, "turn_running", str(exc)) from None
    except cuts.CutError as exc:
        raise ApiError(422, "invalid_cut", str(exc)) from None
    response = JsonResponse(_tab_detail(branched.tab), status=201 if branched.created else 200)
    if branched.created:
        response["Location"] = reverse("api_tab", args=[branched.tab.id])
    return response


# --- Live events ----------------------------------------------------------------------------


@api_view("GET")
def events(request: ApiRequest, tab_id: uuid.UUID) -> StreamingHttpResponse:
    """The tab's log as server-sent events from a position on: `Last-Event-ID` (a
    reconnect) or `?after=<seq>`, else the beginning. The WebSocket's sync behind
    another transport (chat.follow): no gap, no duplicate across reconnects."""
    tab = _get_tab(request, tab_id)
    position = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    try:
        hello = follow.parse_position(position)
    except ValueError as exc:
        raise ApiError(400, "bad_position", str(exc)) from None
    if request.api_token is not None:
        credential = revocation.Credential.of_token(request.api_token, tab.id)
    else:
        credential = revocation.Credential.of_session(request.session, request.user, tab.id)
    response = StreamingHttpResponse(
        _watched_events(credential, hello), content_type="text/event-stream"
    )
    if not connection.in_atomic_block:
        # The stream reads in threads of its own: the connection this request's thread
        # read with goes back to the pool now, not when the stream ends (ten open streams
        # held a process's whole pool).
        connection.close()
    response["Cache-Control"] = "no-cache"
    # nginx would otherwise buffer the stream and deliver it in lumps.
    response["X-Accel-Buffering"] = "no"
    return response


async def _watched_events(
    credential: revocation.Credential, hello: dict[str, Any]
) -> AsyncIterator[str]:
    """The events, until the token or session they were opened with ends (revoked,
    signed out, ...) or the tab is deleted: then a last `end` event says why."""
    async with (
        revocation.watching(credential) as ended,
        # events() made the credential for its tab: it names one.
        aclosing(
            follow.sse_events(cast(uuid.UUID, credential.tab_id), hello, until=ended)
        ) as events,
    ):
        async for frame in events:
            yield frame


# --- Export and import --------------------------------------------------------------------


@api_view("GET")
def tab_export(request: ApiRequest, tab_id: uuid.UUID) -> StreamingHttpResponse:
    """The tab streamed in constant memory: ?format=jsonl (default; lossless, what
    POST /tabs/import takes) or ?format=markdown (for people)."""
    tab = _get_tab(request, tab_id)
    fmt = request.GET.get("format", "jsonl")
    if fmt not in transfer.FORMATS:
        raise ApiError(
            400, "invalid_parameter", f"?format= must be jsonl or markdown, not {fmt!r}."
        )
    return transfer.export_response(tab, fmt)


FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


@api_view("POST", write=True)
def tab_import(request: ApiRequest) -> HttpResponse:
    """The body, a JSONL export, becomes a new tab.

    The size is checked on Content-Length before the body is read; the body is
    then read a line at a time, never whole.
    """
    if request.content_type in FORM_TYPES:
        # A form's body is parsed (and used up) by the CSRF check of a session.
        raise ApiError(
            400,
            "unsupported_body",
            "Send the export itself as the request body (Content-Type: application/x-ndjson),"
            " not as a form.",
        )
    if transfer.declared_too_large(request, multipart=False):
        too_large = transfer.ImportTooLarge(transfer.IMPORT_MAX_BYTES)
        raise ApiError(413, "import_too_large", f"Not imported: {too_large}.")
    try:
        tab = transfer.import_jsonl(request.user, request)
    except transfer.ImportTooLarge as exc:
        raise ApiError(413, "import_too_large", f"Not imported: {exc}.") from None
    except transfer.ImportRefused as exc:
        raise ApiError(422, "invalid_import", f"Not imported: {exc}.") from None
    return JsonResponse(_tab_summary(tab, None), status=201)


# --- Search -------------------------------------------------------------------------------


def _hit(hit: search.Hit) -> JsonDict:
    return {
        "tab_id": str(hit.tab_id),
        "tab_title": hit.title,
        "seq": hit.seq,
        "chunk_id": str(hit.chunk_id),
        "role": hit.role,
        "type": hit.type,
        "snippet": str(hit.snippet),
        "url": reverse("tab", args=[hit.tab_id]) + f"?seq={hit.seq}",
    }


@api_view("GET")
def search_hits(request: ApiRequest) -> HttpResponse:
    """Chunks of the user's tabs matching every word of ?q=, newest first."""
    q = request.GET.get("q")
    if q is None:
        raise ApiError(400, "missing_parameter", "?q= is required: the words to search for.")
    tab_id = None
    if raw := request.GET.get("tab"):
        try:
            tab_id = _get_tab(request, uuid.UUID(raw)).id
        except ValueError:
            raise ApiError(
                400, "invalid_parameter", f"?tab= must be a tab id (a UUID), not {raw!r}."
            ) from None
    limit = limit_param(request, default=search.DEFAULT_LIMIT, maximum=search.MAX_LIMIT)
    try:
        hits = search.search(
            request.user,
            q,
            tab=tab_id,
            role=request.GET.get("role"),
            type=request.GET.get("type"),
            limit=limit,
        )
    except search.SearchError as exc:
        raise ApiError(400, "invalid_query", str(exc)) from None
    return JsonResponse({"hits": [_hit(h) for h in hits]})


# Mounted at /api/v1/ by chat/urls.py. Other modules' API routes go here too, so
# the whole API is one list next to the decorator it shares.
urlpatterns = [
    path("tabs", tabs, name="api_tabs"),
    path("tabs/import", tab_import, name="api_tab_import"),
    path("tabs/<uuid:tab_id>/export", tab_export, name="api_tab_export"),
    path("tabs/<uuid:tab_id>", tab, name="api_tab"),
    path("tabs/<uuid:tab_id>/chunks", chunks, name="api_chunks"),
    path("tabs/<uuid:tab_id>/messages", messages, name="api_messages"),
    path("tabs/<uuid:tab_id>/stop", stop, name="api_stop"),
    path("tabs/<uuid:tab_id>/approvals/<str:call_id>", approval, name="api_approval"),
    path("tabs/<uuid:tab_id>/continue", continue_turn, name="api_continue"),
    path("tabs/<uuid:tab_id>/branch", branch, name="api_branch"),
    path("tabs/<uuid:tab_id>/events", events, name="api_events"),
    path("search", search_hits, name="api_search"),
]
