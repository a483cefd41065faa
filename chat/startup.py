"""Start-up checks: what settings.py cannot check, before anything is served.

settings.py checks every variable it reads. What the app reads outside it (the
model ids, whose providers the registry knows; the providers' base URLs and
stream idle timeouts, read by the registry from the environment) and the
services a server needs (the database; Redis in the scaled mode) are checked
here, by `serve`, `runworker` and `send` before they start, and (without the
services) by plain daphne through dispatch.asgi. Every problem is one line on
stderr naming the variable and the fix, then the process exits: 2 for
configuration (or migrations not applied), 69 for a service that did not
answer.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from chat.acp import config as acp_config
from chat.dbcheck import database_unreachable
from chat.envcheck import (
    API_STYLE_VARIABLE,
    EXIT_CONFIGURATION,
    EXIT_UNAVAILABLE,
    api_style_problem,
    exit_with,
    masked_url,
    unreachable_line,
    url_problem,
)
from chat.providers.registry import (
    AGENT_PROVIDER,
    OFFLINE_MODEL,
    PROVIDERS,
    ProviderConfigError,
    idle_timeout,
    model_info,
)
from chat.tools import files, workdir

logger = logging.getLogger(__name__)

# A Redis that is up answers a PING in milliseconds; this only bounds a dead
# address (one that drops packets instead of refusing).
REDIS_TIMEOUT = 5
# The settings that name a model.
MODEL_VARIABLES = ("DISPATCH_MODEL", "DISPATCH_FALLBACK_MODEL")
# An example endpoint for a provider whose spec has no hint of its own.
URL_EXAMPLE = "https://api.example.com/v1"


def configuration_problems() -> list[str]:
    """One line per problem with the models, provider URLs, stream timeouts and workspace;
    empty when fine."""
    return [
        *_model_problems(),
        *_base_url_problems(),
        *_idle_timeout_problems(),
        *_api_style_problems(),
        *_workspace_problems(),
    ]


def _model_problems() -> list[str]:
    problems = []
    for variable in MODEL_VARIABLES:
        value = (getattr(settings, variable, "") or "").strip()
        if not value:
            continue
        provider, _, name = value.partition("/")
        if provider == AGENT_PROVIDER:
            # An external agent (chat.acp) is a tab's model, never a step's fallback.
            if variable != "DISPATCH_MODEL":
                problems.append(f"{variable}={value!r}: an external agent cannot be a fallback.")
            elif name not in _agents():
                problems.append(
                    f"{variable}={value!r}: no agent {name!r} is configured "
                    "(DISPATCH_ACP_AGENTS, Settings, or a preset found on PATH)."
                )
            continue
        try:
            # An unknown model of a known provider is allowed: it gets the
            # provider's defaults. An unknown provider or a malformed id is not.
            model_info(value)
        except ValueError as exc:
            problems.append(
                f"{variable}={value!r}: {exc}. Set it to a provider/model id such as "
                f"{PROVIDERS['anthropic'].default_model} or {OFFLINE_MODEL}, or unset it."
            )
    return problems


def _agents() -> dict[str, object]:
    try:
        return dict(acp_config.agents())
    except DatabaseError:
        # Not migrated yet (this check runs before the database's): the saved agents
        # are read once it is.
        return dict(acp_config.agents(saved=False))


def _base_url_problems() -> list[str]:
    problems = []
    for spec in PROVIDERS.values():
        value = os.environ.get(spec.url_env, "").strip() if spec.url_env else ""
        if value and (problem := url_problem(value, ("http", "https"))):
            example = spec.url_hint or URL_EXAMPLE
            problems.append(
                f"{spec.url_env}={value!r} {problem}: set it to the {spec.label} API's "
                f"http(s) URL (e.g. {example}), or unset it."
            )
    return problems


def _idle_timeout_problems() -> list[str]:
    # Read when a turn starts its provider: a bad value would otherwise fail
    # every turn of that provider, long after start-up.
    problems = []
    for spec in PROVIDERS.values():
        try:
            idle_timeout(spec.name)
        except ProviderConfigError as exc:
            problems.append(str(exc))
    return problems


def _api_style_problems() -> list[str]:
    # Read when a turn starts an OpenAI provider: a typo would otherwise fail every one.
    value = os.environ.get(API_STYLE_VARIABLE, "").strip()
    problem = api_style_problem(value) if value else None
    return [problem] if problem else []


def _workspace_problems() -> list[str]:
    workspace = Path(settings.DISPATCH_WORKSPACE)
    try:
        files.make_private(workspace)
    except OSError as exc:
        return [
            f"DISPATCH_WORKSPACE={str(workspace)!r} cannot be created "
            f"({exc.strerror or exc}): point it at a directory this user can write."
        ]
    if not os.access(workspace, os.W_OK | os.X_OK):
        return [
            f"DISPATCH_WORKSPACE={str(workspace)!r} is not writable by this user: "
            "the tools write there; fix its permissions or point it elsewhere."
        ]
    return []


def shared_workspace_problem() -> str | None:
    """Move what lies at the top of DISPATCH_WORKSPACE into the first superuser's
    workspace, as migration 0014 does (it found no user, or a file was put there since);
    a line when it cannot be."""
    if not workdir.shared_entries(Path(settings.DISPATCH_WORKSPACE)):
        return None
    try:
        owner = workdir.first_owner(get_user_model())
        if owner is None:
            return None
        workdir.adopt_shared(owner.pk)
    except (workdir.AdoptionClash, OSError) as exc:
        return f"The shared workspace was not moved into a user's: {exc}"
    finally:
        connections[DEFAULT_DB_ALIAS].close()
    return None


def service_problems() -> list[str]:
    """One line per service that does not answer (passwords masked); empty when all do."""
    problems = []
    if (exc := database_unreachable()) is not None:
        problems.append(
            unreachable_line("the database", settings.DATABASE_URL, "DATABASE_URL", exc)
        )
    if settings.REDIS_URL:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=REDIS_TIMEOUT, socket_timeout=REDIS_TIMEOUT
        )
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            problems.append(unreachable_line("Redis", settings.REDIS_URL, "REDIS_URL", exc))
        finally:
            client.close()
    return problems


def schema_problem() -> str | None:
    """A line when the database lacks migrations (a new install or an upgrade without
    `migrate`), which would otherwise surface as "no such table" on some later request."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    finally:
        connection.close()
    if not pending:
        return None
    return (
        f"The database at {masked_url(settings.DATABASE_URL)} lacks {len(pending)} "
        "migration(s): run `manage.py migrate` first (with the same DATABASE_URL)."
    )


def loose_modes() -> list[str]:
    """One line per path of the data dir that others than its owner may read: the dir
    itself, the secret key, a SQLite database and its -wal/-shm, the blobs. A fresh data
    dir is made the owner's only (settings.py); an older one may not be."""
    data = Path(settings.DATA_DIR)
    paths = [data, data / "secret_key", data / "blobs"]
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        db = str(settings.DATABASES["default"]["NAME"])
        paths += [Path(db), Path(db + "-wal"), Path(db + "-shm")]
    lines = []
    for path in paths:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            continue
        if mode & 0o077:
            fix = "chmod -R go-rwx" if path.is_dir() else f"chmod {settings.DATA_FILE_MODE:o}"
            lines.append(
                f"{path} is mode {mode:o}: other local users can read it; run `{fix} {path}`."
            )
    return lines


@functools.cache
def _warn_loose_modes() -> None:
    # Once per process: serve checks, then imports dispatch.asgi, which checks again.
    for line in loose_modes():
        logger.warning("%s", line)


def check(*, services: bool = True) -> None:
    """Exit with one line per problem when the configuration (or a service) is not usable."""
    if problems := configuration_problems():
        exit_with("\n".join(f"Configuration error: {p}" for p in problems), EXIT_CONFIGURATION)
    _warn_loose_modes()
    if not services:
        return
    if problems := service_problems():
        exit_with("\n".join(problems), EXIT_UNAVAILABLE)
    if problem := schema_problem():
        # Restarting will not apply them: the exit status of a configuration error.
        exit_with(problem, EXIT_CONFIGURATION)
    if problem := shared_workspace_problem():
        exit_with(f"Configuration error: {problem}", EXIT_CONFIGURATION)
