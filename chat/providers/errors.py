"""Classifying provider failures into ProviderError, the same way for every adapter.

The turn engine decides about retries; this module only says whether one makes
sense and what the server asked for (retry-after).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from chat.providers.base import ProviderError
from chat.providers.common import json_loads

# Statuses where the same request may succeed later: timeout, conflict (a
# concurrent request), rate limit, and every server-side failure (5xx, 529).
RETRYABLE_STATUS = frozenset({408, 409, 429})
# Error types (Anthropic's names; OpenAI-compatible servers use the same ones
# or none) that mean a transient condition when they arrive inside a stream.
RETRYABLE_TYPES = frozenset(
    {"overloaded_error", "api_error", "rate_limit_error", "timeout_error", "server_error"}
)
# The HTTP status each Anthropic error type stands for, for errors that arrive
# inside a 200 stream: the UI and the retry policy reason in status codes.
STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
# A retry-after further out than this is treated as absent: a broken clock or
# proxy, not a real request to wait an hour.
MAX_RETRY_AFTER_SECONDS = 3600.0


def is_retryable_status(status: int | None) -> bool:
    return status is not None and (status in RETRYABLE_STATUS or status >= 500)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked to wait: retry-after-ms, else retry-after
    (seconds or an HTTP date)."""
    if not headers:
        return None
    value: float | None = None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            value = float(ms) / 1000
        except ValueError:
            value = None
    if value is None and (raw := headers.get("retry-after")) is not None:
        try:
            value = float(raw)
        except ValueError:
            parsed = email.utils.parsedate_tz(raw)
            if parsed is not None:
                value = email.utils.mktime_tz(parsed) - time.time()
    if value is None or value < 0 or value > MAX_RETRY_AFTER_SECONDS:
        return None
    return value


def error_fields(body: Any) -> tuple[str | None, str | None]:
    """(type, message) from an error body: `{"error": {"type", "message"}}` or
    the inner object itself (the OpenAI SDK hands over the inner one)."""
    if isinstance(body, str):
        try:
            body = json_loads(body)
        except ValueError:
            return None, body.strip() or None
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        body = body["error"]
    if not isinstance(body, Mapping):
        return None, None
    kind = body.get("type") or body.get("code")
    message = body.get("message")
    return (
        str(kind) if kind is not None else None,
        str(message) if message is not None else None,
    )


def from_status(
    provider: str,
    status: int,
    body: Any,
    headers: Mapping[str, str] | None,
) -> ProviderError:
    """An HTTP error response."""
    kind, message = error_fields(body)
    text = f"{provider} error {status}"
    if kind:
        text += f" ({kind})"
    if message:
        text += f": {message}"
    return ProviderError(
        text,
        status_code=status,
        error_type=kind,
        retry_after=retry_after(headers),
        retryable=is_retryable_status(status),
    )


def in_stream(provider: str, body: Any) -> ProviderError:
    """An error event inside a stream that began with 200.

    Its status is the one its type stands for (overloaded_error is a 529),
    not the 200 the stream began with.
    """
    kind, message = error_fields(body)
    status = STATUS_OF_TYPE.get(kind or "")
    text = f"{provider} error in the stream"
    if kind:
        text += f" ({kind})"
    if message:
        text += f": {message}"
    if status is not None:
        retryable = is_retryable_status(status)
    else:
        # Unnamed errors mid-stream are almost always the server's trouble.
        retryable = kind is None or kind in RETRYABLE_TYPES
    return ProviderError(text, status_code=status, error_type=kind, retryable=retryable)


def connection(provider: str, what: str, *, timeout: bool = False) -> ProviderError:
    """A failed or dropped connection, or a timeout: always worth a retry."""
    return ProviderError(
        f"{provider}: {what}",
        error_type="timeout" if timeout else "connection_error",
        retryable=True,
    )


def bad_stream(provider: str, what: str) -> ProviderError:
    """A stream that cannot be understood (a malformed line, a stream cut short
    without a transport error). A retry usually gets a clean one."""
    return ProviderError(f"{provider}: {what}", error_type="invalid_response", retryable=True)


def unexpected(provider: str, where: str, value: Any) -> ProviderError:
    """A stream that is well-formed JSON but has a shape this adapter does not
    know (a field of another type, a content part of an unknown kind). Not
    retryable: the server would send the same shape again."""
    return ProviderError(
        f"{provider} stream: unexpected `{where}` of type {type(value).__name__} "
        f"({_preview(value)})",
        error_type="unexpected_response",
        retryable=False,
    )


# How much of an unexpected value an error message quotes: enough to recognise
# it, short enough for one line in the tab.
PREVIEW_CHARS = 120


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def unreadable(provider: str, exc: BaseException) -> ProviderError:
    """A stream event the adapter failed on in a way no check above it named:
    still the provider's error in the tab, not a crash of the turn."""
    return ProviderError(
        f"{provider} stream: an event this adapter cannot read ({type(exc).__name__}: {exc})",
        error_type="unexpected_response",
        retryable=False,
    )


# How much of a body that is not an event stream an error quotes.
NOT_A_STREAM_PREVIEW = 500


async def check_event_stream(provider: str, response: Any) -> None:
    """Refuse a 200 whose body is not server-sent events (a proxy's HTML page, a
    JSON error from a server that ignored `stream`): a clear, non-retryable error
    quoting it, instead of "the stream ended early" and retries that fail the same."""
    content_type = response.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() == "text/event-stream":
        return
    head = b""
    async for piece in response.aiter_bytes():
        head += piece
        if len(head) >= NOT_A_STREAM_PREVIEW:
            break
    text = head[:NOT_A_STREAM_PREVIEW].decode("utf-8", "replace")
    _, message = error_fields(text)
    raise ProviderError(
        f"{provider}: the server answered with {content_type or 'no content type'}, "
        "not an event stream: "
        f"{message or text.strip() or '(empty body)'}",
        error_type="invalid_response",
        retryable=False,
    )
