"""Classifying provider failures into ProviderError, the same way for every adapter,
and saying what one means to the person who has to act on it.

The turn engine decides about retries; this module only says whether one makes
sense and what the server asked for (retry-after). `explain` is the one place an
error becomes words for the page: what happened, and what to do (which variable
or Settings entry holds the key, the base URL tried, when to retry).
"""

from __future__ import annotations

import email.utils
import math
import socket
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2

from chat.chunks import ErrorFix
from chat.envcheck import masked_url
from chat.providers.base import ProviderError
from chat.providers.common import json_loads
from chat.providers.registry import (
    KEY_BOUND_ELSEWHERE,
    MAX_STREAM_IDLE_TIMEOUT,
    PROVIDERS,
    ProviderConfigError,
    from_env,
    idle_env,
    idle_timeout,
)

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


def connection(
    provider: str, what: str, *, timeout: bool = False, transport: str | None = None
) -> ProviderError:
    """A failed or dropped connection, or a timeout: always worth a retry."""
    return ProviderError(
        f"{provider}: {what}",
        error_type="timeout" if timeout else "connection_error",
        retryable=True,
        transport=transport,
    )


# Failures below HTTP (ProviderError.transport), each with its own way out.
REFUSED = "refused"  # nothing listens at that host and port
DNS = "dns"  # the host name does not resolve
TLS = "tls"  # the TLS handshake failed (a certificate, https to a plain http server)
CONNECT_FAILED = "connect"  # any other failure to connect
CONNECT_TIMEOUT = "connect_timeout"
READ_TIMEOUT = "read_timeout"  # connected, then silent past the HTTP client's timeout
CUT = "cut"  # the connection broke during the answer
INCOMPLETE = "incomplete"  # the body ended cleanly before the answer did
TRANSPORT = frozenset(
    {REFUSED, DNS, TLS, CONNECT_FAILED, CONNECT_TIMEOUT, READ_TIMEOUT, CUT, INCOMPLETE}
)
# The error type of an attempt the turn runner gave up as stalled (its idle watchdog).
STREAM_IDLE = "stream_idle"


def transport(provider: str, exc: BaseException, *, timeout: bool = False) -> ProviderError:
    """A failure below HTTP, from the HTTP client's exception or the SDK's wrapping of
    it (`timeout`: the SDK called it a timeout): which kind, naming the host."""
    chain = list(_chain(exc))
    request = _request(chain)
    where = request.url.netloc.decode("ascii", "replace") if request is not None else ""
    where = where or "the server"
    if any(isinstance(e, httpx2.ConnectTimeout) for e in chain):
        seconds = _timeout(request, "connect")
        after = f" after {seconds:g} s" if seconds else ""
        return connection(
            provider,
            f"connecting to {where} timed out{after}",
            timeout=True,
            transport=CONNECT_TIMEOUT,
        )
    if timeout or any(isinstance(e, httpx2.TimeoutException) for e in chain):
        seconds = _timeout(request, "read")
        what = f"{where} sent nothing for {seconds:g} s" if seconds else f"{where} timed out"
        return connection(provider, what, timeout=True, transport=READ_TIMEOUT)
    http = next((e for e in chain if isinstance(e, httpx2.HTTPError)), exc)
    detail = f"{type(http).__name__}: {http}" if str(http) else type(http).__name__
    if any(isinstance(e, httpx2.ConnectError) for e in chain):
        if any(isinstance(e, ConnectionRefusedError) for e in chain):
            return connection(
                provider, f"could not connect to {where}: connection refused", transport=REFUSED
            )
        if any(isinstance(e, socket.gaierror) for e in chain):
            return connection(
                provider,
                f"could not connect to {where}: its host name does not resolve ({detail})",
                transport=DNS,
            )
        if any(isinstance(e, ssl.SSLError) for e in chain):
            return connection(
                provider, f"the secure connection to {where} failed ({detail})", transport=TLS
            )
        return connection(
            provider, f"could not connect to {where} ({detail})", transport=CONNECT_FAILED
        )
    return connection(provider, f"the connection to {where} broke ({detail})", transport=CUT)


def incomplete(provider: str) -> ProviderError:
    """A body that ended without error before the answer was complete."""
    return connection(
        provider, "the stream ended before the response was complete", transport=INCOMPLETE
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _request(chain: Iterable[BaseException]) -> httpx2.Request | None:
    for exc in chain:
        try:
            request = getattr(exc, "request", None)
        except RuntimeError:  # httpx's exceptions raise when they were given none
            continue
        if isinstance(request, httpx2.Request):
            return request
    return None


def _timeout(request: httpx2.Request | None, which: str) -> float | None:
    timeouts = request.extensions.get("timeout") if request is not None else None
    value = timeouts.get(which) if isinstance(timeouts, Mapping) else None
    return float(value) if isinstance(value, int | float) else None


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


# --- Where it happened -----------------------------------------------------------


def shown_url(url: str) -> str:
    """A base URL fit for the page and the log: its user and password masked (a gateway
    may take its token as either), and its query (where some take a key) left out."""
    masked = masked_url(url)
    parts = urlsplit(masked)
    if "@" in parts.netloc:
        parts = parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2])
    return urlunsplit(parts._replace(query="…" if parts.query else ""))


def located(
    error: ProviderError,
    *,
    configured: str | None,
    effective: str,
    secrets: Iterable[str | None] = (),
) -> ProviderError:
    """`error` as it leaves an adapter: with the base URL it was sent to (`configured`,
    else the SDK's default `effective`), and no secret in its message (a server may
    quote the key it refused; a URL may carry a password)."""
    url = configured or effective
    if error.base_url is not None:
        return error
    if url:
        error.base_url = shown_url(url)
        error.default_url = configured is None
    hidden = [s for s in (*secrets, *_url_secrets(url)) if s and len(s) >= MIN_SECRET_CHARS]
    message = error.message
    for secret in hidden:
        message = message.replace(secret, "***")
    if message != error.message:
        error.message = message
        error.args = (message,)
    return error


# Shorter strings are not searched for in a message: a one-letter test key would
# star out every "k".
MIN_SECRET_CHARS = 4


def _url_secrets(url: str | None) -> list[str]:
    """What in a URL may be a credential: its user, its password, its query's values (a
    server's error may quote the URL it was sent)."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.username or "", parts.password or ""]
    except ValueError:
        return []
    found += [value for _, _, value in (p.partition("=") for p in parts.query.split("&"))]
    return found


# --- In words ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Explanation:
    """An error as the page says it: `summary`, what happened (the card's heading);
    `hint`, what to do (`code` in backticks). With the facts they rest on."""

    summary: str
    hint: str
    base_url: str | None = None
    retry_after: float | None = None
    attempts: int = 1
    # Where the fix is, for an error no retry can mend (an ErrorFix), or "".
    fix: str = ""

    def data(self) -> dict[str, Any]:
        """What goes into the error chunk next to its message and status code."""
        data: dict[str, Any] = {"summary": self.summary}
        if self.fix:
            data["fix"] = self.fix
        if self.hint:
            data["hint"] = self.hint
        if self.base_url:
            data["base_url"] = self.base_url
        if self.retry_after is not None:
            data["retry_after"] = self.retry_after
        if self.attempts > 1:
            data["attempts"] = self.attempts
        return data


# A 404 whose message says "model" is about the model id, not the URL's path:
# Anthropic says `model: claude-x`, OpenAI "The model `x` does not exist", and the
# compatible servers copy one or the other.
MODEL_WORD = "model"
# Error types that say the account has no quota or credit left (OpenAI sends
# insufficient_quota as a 429, Anthropic billing_error as a 402).
QUOTA_TYPES = frozenset({"insufficient_quota", "billing_error"})


def explain(error: ProviderError, *, model: str, attempts: int = 1) -> Explanation:
    """What `error` (of `model`, after `attempts` tries) means and what to do about it."""
    provider, _, name = model.partition("/")
    summary, hint = _Words(error, PROVIDERS.get(provider), provider, name).say()
    if attempts > 1:
        summary += f" (after {attempts} attempts)"
    return Explanation(
        summary,
        hint,
        base_url=error.base_url,
        retry_after=error.retry_after,
        attempts=attempts,
        fix=where_to_fix(error),
    )


def where_to_fix(error: ProviderError) -> str:
    """ErrorFix.CONNECTIONS for a missing, refused or misplaced key or endpoint,
    ErrorFix.MODEL for a model the provider does not know, else "" (an error a retry may
    get past: retrying a configuration error as things are gets it again)."""
    kind = error.error_type or ""
    status = error.status_code
    if (
        isinstance(error, ProviderConfigError)
        or kind in (KEY_BOUND_ELSEWHERE, "configuration_error", "authentication_error")
        or kind == "permission_error"
        or status in (401, 403)
    ):
        return ErrorFix.CONNECTIONS
    if status == 404 and (kind == "not_found_error" or MODEL_WORD in error.message.lower()):
        return ErrorFix.MODEL
    return ""


class _Words:
    """The summary and hint of one error: the cases in the order they are told apart."""

    def __init__(self, error: ProviderError, spec: Any, provider: str, name: str) -> None:
        self.error = error
        self.spec = spec
        self.name = name or "this model"
        # "OpenAI-compatible" names a wire format, not someone who can refuse a key.
        if spec is None:
            self.who = f"The {provider} provider" if provider else "The provider"
        elif spec.label.endswith("-compatible"):
            self.who = f"The {spec.label} server"
        else:
            self.who = spec.label
        self.api = spec.label if spec is not None else "provider's"
        self.host = _host(error.base_url)
        self.at = f"`{error.base_url}`" if error.base_url else "the provider's base URL"

    def say(self) -> tuple[str, str]:
        return self.unanswered() or self.refused()

    def unanswered(self) -> tuple[str, str] | None:
        """What went wrong before the provider answered, or in reading its answer; None
        when it answered with an error of its own."""
        error, who = self.error, self.who
        kind = error.error_type or ""
        if kind == KEY_BOUND_ELSEWHERE:
            # Its message names both endpoints and where to enter the key.
            return f"The stored {self.api} key was saved for another endpoint", ""
        if isinstance(error, ProviderConfigError) or kind == "configuration_error":
            # Its message already names the variable and the Settings entry.
            return f"{who} is not set up for this model", ""
        if kind == STREAM_IDLE:
            return "The model stopped sending", self.stalled()
        if error.transport is not None or kind in ("connection_error", "timeout"):
            return self.transport()
        if kind == "unexpected_response":
            return (
                f"{who} sent a response this version of Dispatch cannot read",
                "Retrying gets the same shape again: pick another model for this tab, "
                "or report the message above.",
            )
        if kind == "invalid_response":
            return (
                f"{who} sent a response that could not be read",
                f"Retry. If it happens again, check that {self.at} speaks the {self.api} "
                "API (a proxy or a captive portal answers with something else).",
            )
        return None

    def refused(self) -> tuple[str, str]:
        """The provider's own error answer, by its status and type."""
        error, who = self.error, self.who
        status = error.status_code
        kind = error.error_type or ""
        if status == 401 or kind == "authentication_error":
            return f"{who} did not accept the API key", self.fix_key()
        if kind in QUOTA_TYPES or status == 402:
            return (
                "The account of this API key has no quota or credit left",
                f"Add credit or raise the limit in the provider's console for {self.key()}, "
                "then Retry.",
            )
        if status == 403 or kind == "permission_error":
            return (
                f"{who} refused this key access",
                f"{_upper(self.key())} is not allowed to use {self.name} (or the account or "
                "region is restricted): check its permissions in the provider's console, "
                "use another key, or pick another model.",
            )
        if status == 404 and (kind == "not_found_error" or MODEL_WORD in error.message.lower()):
            return (
                f"{who} does not know the model “{self.name}”",
                f"Pick another model for this tab, or check the id: “{self.name}” was sent "
                f"to {self.at}.",
            )
        if status == 404:
            return (
                f"{self.host or who} has nothing at this address",
                f"Check the base URL {self.at}, {self.url_source()}; an OpenAI-compatible "
                "server usually wants it to end in /v1.",
            )
        if status == 413 or kind == "request_too_large":
            return (
                "The request is too large for the model",
                "Start a new tab, or branch from an earlier message, to send less.",
            )
        if status == 429 or kind == "rate_limit_error":
            return (
                f"{who} is rate-limiting this key",
                self.wait("Wait a minute, then Retry.")
                + f" If it keeps happening, the rate limit of {self.key()} is too low for "
                "this use.",
            )
        if status == 529 or kind == "overloaded_error":
            return "The model is overloaded", self.wait("Retry in a minute, or pick another model.")
        if status == 503:
            return f"{who} is unavailable for now", self.wait("Retry in a minute.")
        if status in (502, 504):
            what = "got no valid answer from" if status == 502 else "timed out waiting for"
            return (
                f"A gateway {what} {self.host or who}",
                self.wait(
                    f"The server behind {self.at} may be down or restarting: Retry in a moment."
                ),
            )
        if status == 408 or kind == "timeout_error":
            return f"{who} timed out on the request", self.wait("Retry in a moment.")
        if (status is not None and status >= 500) or kind == "api_error":
            return (
                f"{who} had an internal error",
                self.wait(
                    "Usually temporary: Retry in a moment. If it persists, check the "
                    "provider's status page."
                ),
            )
        if (status is not None and status >= 400) or kind == "invalid_request_error":
            return (
                f"{who} refused the request",
                "Its reason is above. Retry sends the same request again; Edit or branch "
                "from an earlier message to change it.",
            )
        return f"{who} failed", "Retry."

    def transport(self) -> tuple[str, str]:
        # A connection error classified before transports were told apart (or by
        # another path) still gets a sentence.
        failure = self.error.transport or (
            READ_TIMEOUT if self.error.error_type == "timeout" else None
        )
        where = self.host or "the server"
        if failure == REFUSED:
            return (
                f"Could not connect to {where}",
                f"Nothing answers at {self.at} (connection refused): is the server running? "
                f"The address is {self.url_source()}.",
            )
        if failure == DNS:
            return (
                f"Could not find the host {where}",
                f"Check the host name in {self.at}, {self.url_source()}, and this server's DNS.",
            )
        if failure == TLS:
            return (
                f"The secure connection to {where} failed",
                f"Check {self.at}, {self.url_source()}: a plain http server answers https "
                "this way, and so does one whose certificate this server does not trust.",
            )
        if failure in (CONNECT_TIMEOUT, CONNECT_FAILED):
            summary = (
                f"Connecting to {where} timed out"
                if failure == CONNECT_TIMEOUT
                else f"Could not connect to {where}"
            )
            return (
                summary,
                f"Check that {self.at} is reachable from this server (firewall, VPN, proxy); "
                f"the address is {self.url_source()}. Then Retry.",
            )
        if failure == READ_TIMEOUT:
            return (
                f"{_upper(where)} stopped answering",
                "Retry. If it keeps happening, the server is overloaded or something between "
                "here and it drops idle connections.",
            )
        if failure == CUT:
            return f"The connection to {where} broke during the answer", "Retry."
        if failure == INCOMPLETE:
            return f"The answer from {where} ended early", "Retry."
        return f"The connection to {where} failed", "Retry."

    def stalled(self) -> str:
        if self.spec is None:
            return ""
        variable = idle_env(self.spec.name)
        try:
            now = f"now {idle_timeout(self.spec.name):g} s"
        except ProviderConfigError:
            now = "now not a valid number"
        # The message already says to try again later or pick another model.
        return (
            "A slow model or local server may need longer between two events: raise "
            f"`{variable}` ({now}, at most "
            f"{MAX_STREAM_IDLE_TIMEOUT:g}) and restart the server."
        )

    def key(self) -> str:
        """The key actually used, as the registry resolves it: the environment first."""
        spec = self.spec
        if spec is None or not spec.key_env:
            return "the key"
        if from_env(spec.key_env) is not None:
            return f"the key in `{spec.key_env}`"
        return f"the {spec.label} key saved in Settings → API keys"

    def fix_key(self) -> str:
        spec = self.spec
        if spec is None or not spec.key_env:
            return "Check the provider's API key, then Retry."
        if from_env(spec.key_env) is not None:
            return (
                f"The key comes from `{spec.key_env}` in the server's environment: set a "
                "valid key there, restart the server, then Retry."
            )
        return (
            f"The key is the {spec.label} key saved in Settings → API keys: save a valid "
            "one there, then Retry."
        )

    def url_source(self) -> str:
        spec = self.spec
        if spec is not None and spec.url_env and from_env(spec.url_env) is not None:
            return f"set by `{spec.url_env}`"
        if self.error.default_url:
            return "the SDK's default"
        if spec is not None and self.error.base_url is not None:
            return f"the {spec.label} endpoint in Settings → Provider endpoints"
        return "the provider's base URL"

    def wait(self, otherwise: str) -> str:
        if self.error.retry_after is None:
            return otherwise
        seconds = max(1, math.ceil(self.error.retry_after))
        return f"Retry in {seconds} s: the server asked to wait that long."


def _upper(text: str) -> str:
    return text[:1].upper() + text[1:]


def _host(url: str | None) -> str:
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return parts.netloc.rpartition("@")[2]
