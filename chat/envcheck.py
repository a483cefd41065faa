"""Checking and showing configuration values, and the one line a bad one stops the process with.

Pure (the standard library only), so dispatch.settings, manage.py, dispatch.asgi,
chat.startup and the provider errors can all use it before Django is set up. It is
chat's, at the bottom of its layers: the project (dispatch/) imports chat, never the
other way round (.importlinter).
"""

from __future__ import annotations

import json
import re
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


# An external agent's name (DISPATCH_ACP_AGENTS): it becomes the model id `acp/<name>`,
# shown in the picker and in URLs, so a short slug.
ACP_AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
# What a configured agent may say besides its command and variables.
ACP_AGENT_KEYS = ("command", "env", "provider")
# Whose key and base URL a configured agent may be given.
ACP_AGENT_PROVIDERS = ("anthropic", "openai", "")

# name -> (argv, variables as sorted pairs, provider or None when not given)
AcpAgents = dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...], str | None]]


def acp_agents(text: str) -> AcpAgents:
    """DISPATCH_ACP_AGENTS parsed: JSON, name -> {"command": [argv...], "env": {...},
    "provider": "anthropic" | "openai" | ""}; ValueError saying what is wrong."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError('is not a JSON object (name -> {"command": [...], "env": {...}})')
    agents: AcpAgents = {}
    for name, spec in data.items():
        if not ACP_AGENT_NAME.fullmatch(name):
            raise ValueError(
                f"names an agent {name[:60]!r}: a name is 1 to 40 of a-z, 0-9, - and _, "
                "starting with a letter or digit"
            )
        if not isinstance(spec, dict):
            raise ValueError(f'agent {name}: is not an object ({{"command": [...]}})')
        if unknown := sorted(set(spec) - set(ACP_AGENT_KEYS)):
            raise ValueError(
                f"agent {name}: unknown key {unknown[0]!r} (known: command, env, provider)"
            )
        command = spec.get("command")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(word, str) and word and "\0" not in word for word in command)
        ):
            raise ValueError(f"agent {name}: command is not a non-empty list of non-empty strings")
        env = spec.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(value, str)
            and "\0" not in value
            and key
            and "=" not in key
            and "\0" not in key
            for key, value in env.items()
        ):
            raise ValueError(f"agent {name}: env is not a map of variable names to strings")
        provider = spec.get("provider")
        if provider is not None and provider not in ACP_AGENT_PROVIDERS:
            raise ValueError(f'agent {name}: provider is not one of anthropic, openai or ""')
        agents[name] = (tuple(command), tuple(sorted(env.items())), provider)
    return agents
