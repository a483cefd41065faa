"""Checking and showing configuration values, and the one line a bad one stops the process with.

Pure (the standard library only), so dispatch.settings, manage.py, dispatch.asgi,
chat.startup and the provider errors can all use it before Django is set up. It is
chat's, at the bottom of its layers: the project (dispatch/) imports chat, never the
other way round (.importlinter).
"""

from __future__ import annotations

import sys
from typing import NoReturn
from urllib.parse import urlsplit, urlunsplit

# A bad setting is a usage error (as argparse's 2): restarting will not fix it,
# so a process manager can be told not to (systemd: RestartPreventExitStatus=2).
EXIT_CONFIGURATION = 2
# sysexits' EX_UNAVAILABLE: a service that did not answer may answer later.
EXIT_UNAVAILABLE = 69


def url_problem(url: str, schemes: tuple[str, ...]) -> str | None:
    """Why `url` is not a URL of one of `schemes` with a host (unix://: a path), or None."""
    try:
        parts = urlsplit(url)
        # A port that is not a number only raises when asked for.
        _ = parts.port
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if parts.scheme not in schemes:
        return "does not start with " + " or ".join(f"{scheme}://" for scheme in schemes)
    if parts.scheme == "unix":
        return None if parts.path else "names no socket path"
    return None if parts.hostname else "names no host"


def masked_url(url: str) -> str:
    """`url` with its password (if any) shown as ***, safe to print and log."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "(a value that is not a URL)"
    if not password:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def reason(exc: BaseException) -> str:
    """The cause in `exc`'s message, on one line.

    libpq says 'connection failed: connection to server at "h", port 5432
    failed: Connection refused' and adds a hint on a second line; the part
    after the last "failed:" of the first line is the cause.
    """
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    cause = first.rpartition("failed: ")[2].strip()
    return (cause or first).removeprefix("FATAL:").strip().rstrip(".")


def unreachable_line(what: str, url: str, variable: str, exc: BaseException) -> str:
    return (
        f"Cannot reach {what} at {masked_url(url)}: {reason(exc)}. "
        f"Check {variable} and that the server is running."
    )


def exit_with(line: str, code: int) -> NoReturn:
    """Stop the process with `line` on stderr: what is wrong and how to fix it, no traceback."""
    sys.stderr.write(line.rstrip() + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


def exit_configuration_error(exc: Exception) -> NoReturn:
    exit_with(f"Configuration error: {exc}", EXIT_CONFIGURATION)


# Which of OpenAI's APIs the `openai` provider speaks (OPENAI_API_STYLE, or per endpoint
# in Settings): "responses" (POST /responses, reasoning kept between steps) or "chat"
# (POST /chat/completions, what every OpenAI-compatible server speaks). Unset: Responses
# at OpenAI's own endpoint, Chat Completions anywhere else.
API_STYLE_VARIABLE = "OPENAI_API_STYLE"
API_RESPONSES = "responses"
API_CHAT = "chat"
API_STYLES = (API_RESPONSES, API_CHAT)


def api_style_problem(value: str) -> str | None:
    """Why `value` (stripped, any case) is not an API style, or None."""
    if value.strip().lower() in API_STYLES:
        return None
    return (
        f"{API_STYLE_VARIABLE}={value!r} is not one of {', '.join(API_STYLES)}: set it to "
        f"{API_RESPONSES} (OpenAI's Responses API) or {API_CHAT} (Chat Completions, for "
        "any OpenAI-compatible server), or unset it to choose by the base URL."
    )
