"""Dispatch settings: one file, driven by environment variables.

Every variable is read through a typed helper that raises ImproperlyConfigured
on a value it cannot parse, so a typo stops the server at start-up instead of
being silently ignored.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from chat.envcheck import acp_agents, masked_url, url_problem

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def envbool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use 1/0, true/false)")


def envint(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def envfloat(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be at least {minimum}")
    return number


def envstr(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip() or default


def envlist(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def envchoice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, in any case; returned as spelled in `choices`."""
    value = envstr(name, default)
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise ImproperlyConfigured(f"{name}={value!r} is not one of {', '.join(choices)}")


def envurl(name: str, schemes: tuple[str, ...], example: str) -> str:
    """A URL of one of `schemes` with a host; "" when unset."""
    value = envstr(name)
    if value and (problem := url_problem(value, schemes)):
        raise ImproperlyConfigured(f"{name}={masked_url(value)!r} {problem}; set it like {example}")
    return value


def _default_data_dir() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "dispatch"


DATA_DIR = Path(envstr("DISPATCH_DATA_DIR") or _default_data_dir()).expanduser()
# The owner's only: it holds every chat, the sessions and the keys (chat.startup warns
# when an existing one is looser).
DATA_DIR_MODE = 0o700
DATA_FILE_MODE = 0o600
try:
    DATA_DIR.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
except OSError as exc:
    raise ImproperlyConfigured(f"DISPATCH_DATA_DIR {DATA_DIR} cannot be created: {exc}") from exc


def _secret_key() -> str:
    """SECRET_KEY from the environment, else generated once and kept in the data dir."""
    if key := envstr("SECRET_KEY"):
        return key
    path = DATA_DIR / "secret_key"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    key = secrets.token_urlsafe(50)
    # O_EXCL: two processes starting at once must not each write their own key.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DATA_FILE_MODE)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


SECRET_KEY = _secret_key()
DEBUG = envbool("DEBUG", False)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1"])
if not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS is set but empty, so every request would be refused: list the host "
        "names the server is reached by, comma-separated (e.g. localhost,127.0.0.1)"
    )
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
for _origin in CSRF_TRUSTED_ORIGINS:
    # Django compares whole origins: a path or a missing scheme never matches.
    _problem = url_problem(_origin, ("http", "https"))
    if _problem is None and urlsplit(_origin)[2:] != ("", "", ""):
        _problem = "has a path; an origin is only scheme://host[:port]"
    if _problem:
        raise ImproperlyConfigured(
            f"CSRF_TRUSTED_ORIGINS entry {_origin!r} {_problem} (e.g. https://chat.example.com)"
        )

INSTALLED_APPS = [
    "daphne",
    # Before channels: chat's runworker command replaces Channels' own.
    "chat",
    # The project itself, for its `serve` command (daphne with bounded request bodies).
    "dispatch",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    # Failed sign-ins, counted in the database so every process sees them.
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # SECURE_CSP below, on every response.
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as axes asks: it turns a lockout into chat.throttle's 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "dispatch.urls"
ASGI_APPLICATION = "dispatch.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # csp_nonce for the admin's inline <style> (templates/admin/chat/).
                "django.template.context_processors.csp",
            ],
        },
    },
]

# --- Database ----------------------------------------------------------------

DATABASE_URL = envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'dispatch.db'}")
if urlsplit(DATABASE_URL).scheme not in ("sqlite", "postgres", "postgresql", "pgsql"):
    raise ImproperlyConfigured(
        f"DATABASE_URL={masked_url(DATABASE_URL)!r} is not a SQLite or PostgreSQL URL; set it "
        "like sqlite:////var/lib/dispatch/dispatch.db or postgres://user:password@host:5432/db"
    )
try:
    # Connections are kept: the turn worker's thread would otherwise reconnect
    # (and re-run the SQLite PRAGMAs) for every write.
    DATABASES = {
        "default": dj_database_url.parse(DATABASE_URL, conn_max_age=600, conn_health_checks=True)
    }
except ValueError as exc:
    raise ImproperlyConfigured(
        f"DATABASE_URL={masked_url(DATABASE_URL)!r} is not a database URL ({exc})"
    ) from exc


def _create_sqlite_private(name: object) -> None:
    """An empty database file of the owner's only, made before SQLite makes it 0644:
    SQLite gives its -wal and -shm files the database file's mode."""
    path = Path(str(name))
    if str(name) == ":memory:" or str(name).startswith("file:") or not path.parent.is_dir():
        return
    # Exists already, or cannot be made here: SQLite says so when it connects.
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DATA_FILE_MODE))


if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _create_sqlite_private(DATABASES["default"]["NAME"])

# libpq waits for ever on an address that drops packets; a server that is up
# answers in milliseconds, so past this it is down (and start-up says so).
DATABASE_CONNECT_TIMEOUT = 10
# PostgreSQL connections a process holds at most (DISPATCH_DATABASE_POOL_SIZE): PostgreSQL's
# default allows 100 in all, and a team runs a few web processes and workers.
DATABASE_POOL_SIZE = envint("DISPATCH_DATABASE_POOL_SIZE", 10, minimum=1)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", DATABASE_CONNECT_TIMEOUT)
    # A pool, not a connection kept per thread: under ASGI every request runs in a thread
    # of its own, and each kept its connection until it was collected, so 32 messages
    # sent at once filled PostgreSQL's 100 ("too many clients already"). A request
    # waits up to `timeout` for a connection of the pool.
    options["pool"] = {"min_size": 1, "max_size": DATABASE_POOL_SIZE, "timeout": 30}
    DATABASES["default"]["CONN_MAX_AGE"] = 0

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # WAL lets readers (page renders) run while the turn runner writes.
        "init_command": (
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
            # After a checkpoint the WAL file is cut back to this size: without it,
            # one burst of writes (a wipe, branches of long tabs) leaves it gigabytes
            # big for good.
            "PRAGMA journal_size_limit=67108864;"
        ),
        # IMMEDIATE takes the write lock at BEGIN, so two writers queue on the
        # busy timeout instead of failing with "database is locked" on upgrade.
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels ------------------------------------------------------------------

REDIS_URL = envurl("REDIS_URL", ("redis", "rediss", "unix"), "redis://127.0.0.1:6379/0")
if REDIS_URL and urlsplit(REDIS_URL).scheme != "unix":
    # redis-py reads the path as the database number.
    _db = urlsplit(REDIS_URL).path.strip("/")
    if _db and not _db.isdigit():
        raise ImproperlyConfigured(
            f"REDIS_URL={masked_url(REDIS_URL)!r}: the path {_db!r} is not a database "
            "number; set it like redis://127.0.0.1:6379/0"
        )
# channels-redis blocks 5 s on an idle channel, and redis-py's default read
# timeout is also 5 s: the two race, and an idle worker or socket dies. A read
# must outlast the blocking pop. A socket_timeout in the URL still wins.
REDIS_SOCKET_TIMEOUT = 15
# Messages a channel of the queues holds before the layer drops more, silently: the
# workers' channel, a control group's, a snapshot's reply; embedded, also a channel no hub
# listens to (the send command's, a sub-agent's parent's). On Redis the limit counts a
# process's channels together (channels_redis keeps them under one key). The scaled
# mode's tab ops go over pub/sub (bus.layer_for), which keeps nothing: a page that misses
# one sees the gap at the next and catches up.
CHANNEL_CAPACITY = 1500
# Seconds a message waits for its reader: a socket or worker that has not read
# for a minute is gone, and its messages would only use memory.
CHANNEL_EXPIRY = 60
# Every live stream (a page's socket, an API client's events) is checked this often
# against what it was opened with (chat.revocation): a session signed out, a token
# revoked, a deactivated user or a deleted tab elsewhere (the admin, another process,
# a database edit) ends it within this. The check costs a few indexed queries per
# process, however many streams it serves.
STREAM_RECHECK_SECONDS = envfloat("DISPATCH_STREAM_RECHECK_SECONDS", 2.0, minimum=0.05)


def redis_channel_layers(url: str) -> dict[str, dict[str, Any]]:
    """The scaled mode's channel layers on the Redis at `url`."""
    hosts = [{"address": url, "socket_timeout": REDIS_SOCKET_TIMEOUT}]
    parts = urlsplit(url)
    # A unix socket URL's path is the socket's: its database is in the query.
    number = "" if parts.scheme == "unix" else parts.path.strip("/")
    database = dict(parse_qsl(parts.query)).get("db") or number or "0"
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": hosts, "capacity": CHANNEL_CAPACITY, "expiry": CHANNEL_EXPIRY},
        },
        # The groups every listener of hears (chat.bus.layer_for): Redis's pub/sub, one
        # PUBLISH per message and nothing to poll. The core layer's queues cost a few
        # round trips a message on each side, about 0.9 ms of CPU where pub/sub costs
        # 0.15 ms, and 100 streaming tabs send thousands a second.
        # Pub/sub channels are the server's, not a database's: the prefix keeps apart
        # what two installations on two databases of one Redis publish (their users'
        # ids, so their user groups, are the same numbers).
        "broadcast": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": hosts, "prefix": f"dispatch.db{database}."},
        },
    }


if REDIS_URL:
    CHANNEL_LAYERS = redis_channel_layers(REDIS_URL)
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "chat.layers.EmbeddedChannelLayer",
            "CONFIG": {"capacity": CHANNEL_CAPACITY, "expiry": CHANNEL_EXPIRY},
        }
    }

# --- Browser security --------------------------------------------------------

# Scripts, styles and connections from this site only, and no inline script or
# style attribute: markup that slipped past the sanitiser cannot run or load
# anything. The pages use no inline script, event handler or style attribute
# (htmx is told not to inject its indicator style and not to eval); the nonce
# is for the admin's own inline <style>. 'self' covers the same-origin ws(s):
# socket. The favicon is a data: URL.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF, CSP.NONCE],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "form-action": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
}
# Served over https by a TLS-terminating reverse proxy (see README): trust its
# X-Forwarded-Proto, so Django and the socket's origin check see https, and
# send the session and CSRF cookies over TLS only. Off by default, since then
# any client could claim https with that header.
DISPATCH_BEHIND_TLS_PROXY = envbool("DISPATCH_BEHIND_TLS_PROXY", False)
if DISPATCH_BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# Request bodies are bounded per route before Django reads them (dispatch/bodylimit.py);
# these are Django's own bounds behind that: a form's fields (not its files) at most the
# largest command's 2 MB, and an uploaded file past 2 MB spooled to disk, not memory.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024

# --- Auth, i18n, static ------------------------------------------------------

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Sign-in throttling (django-axes): failures are counted per account and,
# separately, per client address; either reaching the limit locks sign-in for
# that account or address until the cool-off has passed since the failure that
# reached it. `manage.py unlock_login` lifts a lock.
AUTHENTICATION_BACKENDS = [
    # First: it refuses a locked sign-in before a password is even checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Five tries cover typos; a guesser gets 5 guesses per account per 15 minutes.
DISPATCH_LOGIN_FAILURE_LIMIT = envint("DISPATCH_LOGIN_FAILURE_LIMIT", 5, minimum=1)
DISPATCH_LOGIN_COOLOFF_MINUTES = envint("DISPATCH_LOGIN_COOLOFF_MINUTES", 15, minimum=1)
# Reverse proxies in front of Dispatch that append the client to
# X-Forwarded-For (nginx: proxy_add_x_forwarded_for). 0 trusts no header: the
# client is the peer address. Set it, or every client counts as the proxy.
DISPATCH_TRUSTED_PROXIES = envint("DISPATCH_TRUSTED_PROXIES", 0, minimum=0)
AXES_FAILURE_LIMIT = DISPATCH_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=DISPATCH_LOGIN_COOLOFF_MINUTES)
# Two separate counters (a list of two, not a pair): the account, whatever the
# address, and the address, whatever the account.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
# A try while locked is refused without counting, so the wait shown is the
# wait there is, and the owner trying the right password does not extend it.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "chat.throttle.client_ip"
AXES_LOCKOUT_CALLABLE = "chat.throttle.lockout_response"
# The sign-in log would grow by a row per sign-in forever; failures are kept.
AXES_DISABLE_ACCESS_LOG = True
# Quiet: no start-up banner on every manage.py command.
AXES_VERBOSE = False

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"

# --- Dispatch ----------------------------------------------------------------

# The model new tabs use; "offline/demo" needs no key and no network.
DISPATCH_MODEL = envstr("DISPATCH_MODEL")
DISPATCH_FALLBACK_MODEL = envstr("DISPATCH_FALLBACK_MODEL")
# Where the tools may read, write and run commands.
DISPATCH_WORKSPACE = Path(envstr("DISPATCH_WORKSPACE") or DATA_DIR / "workspace").expanduser()
# A user's new workspace starts with a small sample project (chat.tools.workdir), so the
# offline demo's suggestions work on a first run; off, it starts empty.
DISPATCH_SAMPLE_PROJECT = envbool("DISPATCH_SAMPLE_PROJECT", True)
if DISPATCH_WORKSPACE.exists() and not DISPATCH_WORKSPACE.is_dir():
    raise ImproperlyConfigured(
        f"DISPATCH_WORKSPACE={str(DISPATCH_WORKSPACE)!r} is not a directory: point it at a "
        "directory (a missing one is created)"
    )
# The shell and the file tools reach all of the workspace: one holding the data
# directory would hand them the database and the secret key (a command can
# also move a covered directory's parent away). Inside it is fine (the default).
_workspace, _data = DISPATCH_WORKSPACE.resolve(), DATA_DIR.resolve()
if _workspace == _data or _workspace in _data.parents:
    raise ImproperlyConfigured(
        f"DISPATCH_WORKSPACE={str(DISPATCH_WORKSPACE)!r} holds DISPATCH_DATA_DIR={str(DATA_DIR)!r} "
        "(the database and secret key), which the tools could then read: point "
        "DISPATCH_WORKSPACE at a directory outside it, or unset it for the default "
        f"{str(DATA_DIR / 'workspace')!r}"
    )
# A runaway model must not loop forever; 50 steps is far past a normal task.
DISPATCH_MAX_STEPS = envint("DISPATCH_MAX_STEPS", 50, minimum=1)
# Sub-agents (the `agent` tool, chat.turn.agents). A child's turn stops at this many steps:
# a delegated task is narrower than its parent's, and a looping child must not run up
# the parent's bill for 50 steps unseen.
DISPATCH_CHILD_MAX_STEPS = envint("DISPATCH_CHILD_MAX_STEPS", 25, minimum=1)
# Seconds a parent waits for a child's turn before stopping it: past half an hour
# a delegated task is stuck, and the parent's own turn must end some time.
DISPATCH_CHILD_TIMEOUT = envfloat("DISPATCH_CHILD_TIMEOUT", 1800.0, minimum=1)
# Children one parent step runs at once; more `agent` calls in the step are refused.
# Each is a turn of its own on some worker, with its own requests to the provider.
DISPATCH_CHILD_CONCURRENCY = envint("DISPATCH_CHILD_CONCURRENCY", 4, minimum=1)
# How deep a tree of sub-agents may grow where profiles allow nesting (a child is 1 deep,
# its child 2): each level multiplies the work one message can start, unseen.
DISPATCH_CHILD_MAX_DEPTH = envint("DISPATCH_CHILD_MAX_DEPTH", 3, minimum=1)
# Tokens per second the offline demo model streams at (0: as fast as possible).
DISPATCH_OFFLINE_PACE = envfloat("DISPATCH_OFFLINE_PACE", 40.0, minimum=0)
# Seconds a stopping server (serve or runworker) lets running turns finish
# before it interrupts them: most answers end within it, and a process
# manager's stop timeout (systemd: 90 s, Docker: 10 s) should be set above it.
DISPATCH_SHUTDOWN_GRACE = envfloat("DISPATCH_SHUTDOWN_GRACE", 20.0, minimum=0)
# Shell commands run in a bubblewrap sandbox (chat/tools/sandbox.py). Network
# on by default (package installs, git); off gives them only a loopback.
DISPATCH_SHELL_NETWORK = envbool("DISPATCH_SHELL_NETWORK", True)
# The explicit opt-out where bwrap cannot run: commands then run unconfined and
# can read the server's secrets. Loud on purpose; the UI says it is set.
DISPATCH_SHELL_UNSANDBOXED = envbool("DISPATCH_SHELL_UNSANDBOXED", False)

# External coding agents (chat/acp/config.py): JSON, name -> {"command": [argv...],
# "env": {...}}; checked here so a typo stops the server at start-up.
try:
    DISPATCH_ACP_AGENTS = acp_agents(os.environ.get("DISPATCH_ACP_AGENTS", ""))
except ValueError as _exc:
    raise ImproperlyConfigured(f"DISPATCH_ACP_AGENTS {_exc}") from None

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {
        "handlers": ["console"],
        "level": envchoice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
    },
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # Axes logs every sign-in at INFO; its failures and lockouts are WARNING.
        "axes": {"level": "WARNING"},
    },
}
