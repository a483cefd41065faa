"""Request bodies are bounded before they are read, not after they are stored.

Each route takes at most its own largest body (`limit_for`: attachments, an import, and a
small default for every form and JSON command); past it the answer is 413, decided on
Content-Length before a byte of the body is read, or while a chunked body is counted on
its way in. A request without a valid session or API token may send at most
SMALL_BODY_BYTES (the sign-in and set-up forms): a larger one is refused before it is
read. Refusals are JSON under /api/ and one line of plain text elsewhere.

`Budget` is the decision, pure; `BodyLimitMiddleware` applies it in front of Django's
ASGI handler (which would otherwise spool any body to a temporary file before a view
runs); dispatch.server applies the same budget in daphne as the bytes arrive, since
daphne itself stores a whole body before the application sees it.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from importlib import import_module
from typing import Any

from channels.auth import get_user
from channels.db import database_sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest

from chat import api, blobs, transfer

# What a request without a session or token may send: the sign-in and set-up forms are
# well under 1 KB; 64 KB leaves room for long passwords and headers a proxy folds in.
SMALL_BODY_BYTES = 64 * 1024
# Every other form and JSON command: a message of forms.MAX_MESSAGE_CHARS, the largest,
# is at most ~1.2 MB however it is encoded (chat.api.MAX_BODY_BYTES says why).
DEFAULT_BODY_BYTES = api.MAX_BODY_BYTES
_UUID = r"[0-9a-fA-F-]{32,36}"


@dataclass(frozen=True)
class Limit:
    """The most a route takes, what its body is as a refusal says it, and the refusal's
    code (the route's view's own, where it has one)."""

    cap: int
    what: str
    code: str = "body_too_large"


# (path, multipart only, limit): the first that matches. Each cap is the route's own
# bound, checked again by its view; here it is only enforced earlier.
ROUTES: tuple[tuple[re.Pattern[str], bool, Limit], ...] = (
    (
        re.compile(rf"/t/{_UUID}/attachments/"),
        False,
        Limit(blobs.MAX_REQUEST_BYTES, "a request of attachments"),
    ),
    (
        re.compile(rf"/api/v1/tabs/{_UUID}/messages"),
        True,
        Limit(blobs.MAX_REQUEST_BYTES, "a message with attachments"),
    ),
    (
        re.compile(r"/api/v1/tabs/import"),
        False,
        Limit(transfer.IMPORT_MAX_BYTES, "an import", "import_too_large"),
    ),
    (
        re.compile(r"/t/import/"),
        False,
        Limit(
            transfer.IMPORT_MAX_BYTES + transfer.MULTIPART_SLACK, "an import", "import_too_large"
        ),
    ),
)
DEFAULT = Limit(DEFAULT_BODY_BYTES, "a request here")


def limit_for(path: str, content_type: str) -> Limit:
    multipart = content_type.lower().startswith("multipart/form-data")
    for pattern, multipart_only, limit in ROUTES:
        if pattern.fullmatch(path) and (multipart or not multipart_only):
            return limit
    return DEFAULT


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str

    def response(self, path: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """(status, headers, body): JSON under /api/ (chat.api's error shape), else text."""
        if path.startswith(api.API_PREFIX):
            body = json.dumps({"error": {"code": self.code, "message": self.message}}).encode()
            kind = b"application/json"
        else:
            body = (self.message + "\n").encode()
            kind = b"text/plain; charset=utf-8"
        headers = [
            (b"content-type", kind),
            (b"content-length", str(len(body)).encode()),
            # The rest of the body is not read: the connection cannot carry another request.
            (b"connection", b"close"),
        ]
        return self.status, headers, body


def too_large(limit: Limit) -> Refusal:
    return Refusal(
        413,
        limit.code,
        f"The request body is larger than {blobs.human_bytes(limit.cap)}, "
        f"the most {limit.what} may be.",
    )


def not_signed_in(path: str) -> Refusal:
    if path.startswith(api.API_PREFIX):
        return Refusal(
            401,
            "unauthorized",
            "Sign in, or send Authorization: Bearer <token>, before sending a body larger "
            f"than {blobs.human_bytes(SMALL_BODY_BYTES)}.",
        )
    return Refusal(
        413,
        "body_too_large",
        f"Sign in first: a request that is not signed in may send at most "
        f"{blobs.human_bytes(SMALL_BODY_BYTES)}.",
    )


def _header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> str | None:
    values = [value.decode("latin1") for key, value in headers if key.lower() == name]
    return ", ".join(values) if values else None


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The body's size as Content-Length says it; None when it does not say (chunked)."""
    headers = list(headers)
    length = _header(headers, b"content-length")
    if length is not None and _header(headers, b"transfer-encoding") is None:
        try:
            return max(0, int(length.split(",")[0].strip()))
        except ValueError:
            return None  # the server refuses it; counted as it comes if not
    return None if _header(headers, b"transfer-encoding") is not None else 0


def has_credentials(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether the request carries a session cookie or an Authorization header at all."""
    headers = list(headers)
    if _header(headers, b"authorization") is not None:
        return True
    cookie = _header(headers, b"cookie")
    if cookie is None:
        return False
    parsed = SimpleCookie()
    try:
        parsed.load(cookie.replace(", ", "; "))
    except Exception:  # a malformed header: Django reads what it can, so look plainly
        return f"{settings.SESSION_COOKIE_NAME}=" in cookie
    return settings.SESSION_COOKIE_NAME in parsed


class Budget:
    """What one request's body may be, decided as the request goes: by the route and
    the declared size first, then by whether it is signed in, then byte by byte."""

    def __init__(self, path: str, headers: Iterable[tuple[bytes, bytes]]) -> None:
        headers = list(headers)
        self.path = path
        self.limit = limit_for(path, _header(headers, b"content-type") or "")
        self.declared = declared_length(headers)
        self.credentials = has_credentials(headers)
        self.cap = self.limit.cap
        self.received = 0
        # Why a request that is not signed in is refused past SMALL_BODY_BYTES.
        self._unsigned: Refusal | None = None

    def declared_refusal(self) -> Refusal | None:
        if self.declared is not None and self.declared > self.limit.cap:
            return too_large(self.limit)
        return None

    def needs_sign_in(self) -> bool:
        """Whether the body may be larger than a request that is not signed in may send."""
        return self.declared is None or self.declared > SMALL_BODY_BYTES

    def signed_in(self, refusal: Refusal | None) -> Refusal | None:
        """The credentials were checked: None when valid, else why not. A body declared
        too large for that is refused now; a chunked one is held to SMALL_BODY_BYTES."""
        if refusal is None:
            return None
        if self.declared is not None:
            return refusal
        self.cap = SMALL_BODY_BYTES
        self._unsigned = refusal
        return self.count(0)

    def count(self, size: int) -> Refusal | None:
        """`size` more bytes arrived: the refusal once the body is past its cap."""
        self.received += size
        if self.received <= self.cap:
            return None
        return self._unsigned or too_large(self.limit)


async def credential_refusal(scope: dict[str, Any]) -> Refusal | None:
    """None when the request's token or session is valid; else why it is refused (as the
    API says it: a token that is not valid counts as a failed attempt, and a client
    locked out for too many gets 429, exactly as the view would say)."""
    headers = scope.get("headers", [])
    path = scope.get("path", "")
    if not has_credentials(headers):
        return not_signed_in(path)
    if _header(headers, b"authorization") is not None:
        return await database_sync_to_async(_token_refusal)(scope)
    cookies = SimpleCookie()
    try:
        cookies.load((_header(headers, b"cookie") or "").replace(", ", "; "))
    except Exception:
        return not_signed_in(path)
    morsel = cookies.get(settings.SESSION_COOKIE_NAME)
    store = import_module(settings.SESSION_ENGINE).SessionStore
    session = store(morsel.value if morsel else None)
    # The check a page request makes: a session whose password hash no longer matches
    # (password changed, logged out elsewhere) is not signed in.
    user = await get_user({"session": session})
    return None if user.is_authenticated else not_signed_in(path)


def _token_refusal(scope: dict[str, Any]) -> Refusal | None:
    request = ASGIRequest(dict(scope, method=scope.get("method", "POST")), io.BytesIO())
    try:
        token = api.bearer(request)
        if token is None:
            return not_signed_in(scope.get("path", ""))
        api.authenticate_token(request, token)
    except api.ApiError as exc:
        return Refusal(exc.status, exc.code, exc.message)
    return None


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def respond(send: Send, path: str, refusal: Refusal) -> None:
    status, headers, body = refusal.response(path)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodyLimitMiddleware:
    """Budget in front of an ASGI app: refuses before reading, counts while reading."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        budget = Budget(path, scope.get("headers", []))
        refusal = budget.declared_refusal()
        if refusal is None and budget.needs_sign_in():
            refusal = budget.signed_in(await credential_refusal(scope))
        if refusal is not None:
            return await respond(send, path, refusal)
        over: list[Refusal] = []

        async def counted() -> dict[str, Any]:
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            size = len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if found := budget.count(size):
                over.append(found)
                # Django's handler stops reading at a disconnect and answers nothing.
                return {"type": "http.disconnect"}
            return message

        await self.app(scope, counted, send)
        if over:
            await respond(send, path, over[0])
