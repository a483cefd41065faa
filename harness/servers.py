"""The one launcher: a child process with its output in a file, stopped by its own PID.

Every server here starts on port 0 and says which port the OS chose with daphne's
"Listening on TCP address" line: `manage.py serve` logs it (at INFO), the bench server
and the fake provider process print the same line (`LISTENING_LINE`). `Proc.listening()`
waits for it.

    server = Proc("web", serve_argv(), server_env(workspace), log_path).start().listening()
    ... server.url ...
    server.stop()

`Servers` is a test's (or a bench's) group of `manage.py serve` processes on this
process's database and data directory, sharing one workspace, stopped together.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

LISTENING_LINE = "Listening on TCP address {host}:{port}"
LISTENING_RE = re.compile(r"Listening on TCP address 127\.0\.0\.1:(\d+)")
# Django start-up (plus migrations for some) on two busy cores takes a few seconds;
# past this a process is stuck, and its log (in the error) says why.
STARTUP_TIMEOUT = 40.0
# SIGTERM, then this long to exit, then SIGKILL. Longer than a worker's shutdown
# grace in the scaled tests, so a graceful stop is never cut.
STOP_TIMEOUT = 25.0
# A live `manage.py serve` gets SHUTDOWN_GRACE to interrupt the turns a test left
# running, so it exits well within this.
SERVE_STOP_TIMEOUT = 5.0
SHUTDOWN_GRACE = "0.5"
# How often a wait on a log file looks again.
POLL_SECONDS = 0.05
# The lines of a process's log an error (or a failed test) shows.
LOG_TAIL_LINES = 60
# Variables of the developer's shell that would point a server elsewhere or change
# what the tests assert. The sandbox opt-outs (DISPATCH_SHELL_*) and SECRET_KEY stay:
# the test process sees them too, and a server must agree with it.
SCRUBBED_ENV = (
    "REDIS_URL",
    "DATABASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "DEEPSEEK_API_KEY",
    "DEEPSEEK_BASE_URL",
    "DISPATCH_FALLBACK_MODEL",
    "DISPATCH_MAX_STEPS",
    "DISPATCH_SHUTDOWN_GRACE",
    "DISPATCH_LOGIN_FAILURE_LIMIT",
    "DISPATCH_LOGIN_COOLOFF_MINUTES",
    "DISPATCH_TRUSTED_PROXIES",
    "DISPATCH_BEHIND_TLS_PROXY",
    "PORT",
)

_PR_SET_PDEATHSIG = 1


class ProcessFailed(RuntimeError):
    """A child process exited, or never said it was ready; the message holds its log."""


def _die_with_parent() -> None:
    # If the test run or bench is killed, its children go too (Linux; elsewhere the
    # owner's own stop is all there is).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Proc:
    """One child process, its output (stdout and stderr) in `log_path`."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        *,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> Proc:
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def url(self) -> str:
        assert self.port, f"{self.name} has no port yet: wait for listening() first"
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_for(self, pattern: str | re.Pattern, timeout: float = STARTUP_TIMEOUT) -> re.Match:
        """Wait until the log matches `pattern`; ProcessFailed, with the log, if it exits
        first or `timeout` passes (the process is left as it is)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            if match := regex.search(self.log()):
                return match
            if not self.alive:
                state = f"exited with {self.proc.returncode}" if self.proc else "never started"
                break
            if time.monotonic() > deadline:
                state = f"still running after {timeout} s"
                break
            time.sleep(POLL_SECONDS)
        raise ProcessFailed(
            f"{self.name} (pid {self.proc.pid if self.proc else '-'}, {shlex.join(self.argv)}) "
            f"never printed /{regex.pattern}/: {state}.\n--- log ---\n{self.log_tail()}"
        )

    def listening(self, timeout: float = STARTUP_TIMEOUT) -> Proc:
        """Wait for the "Listening on" line and take the port from it; a server that
        never listens is stopped before the error is raised."""
        try:
            self.port = int(self.wait_for(LISTENING_RE, timeout).group(1))
        except ProcessFailed:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL, and reap it at once: a zombie's pid would still look alive."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=self.stop_timeout)

    def terminate(self, timeout: float | None = None) -> int | None:
        """SIGTERM and the exit code; SIGKILL if it takes longer than `timeout`."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
        return self.reap(timeout)

    def reap(self, timeout: float | None = None) -> int | None:
        """Wait for the exit code (no signal: a second SIGTERM would cut a server's
        drain short); SIGKILL after `timeout`, by default the stop timeout."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self.proc.returncode

    def stop(self) -> None:
        self.terminate()

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_all(procs: list[Proc]) -> None:
    """SIGTERM to every one at once, then wait for each (SIGKILL past its stop timeout)."""
    for proc in procs:
        if proc.alive:
            proc.proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.reap()


# --- Dispatch's own processes -----------------------------------------------------------


def serve_argv(port: int = 0) -> list[str]:
    """`manage.py serve` on `port`, by default one the OS chooses (the log says which)."""
    return [sys.executable, "manage.py", "serve", "--port", str(port)]


def procfile_argv(kind: str, port: int = 0) -> list[str]:
    """The Procfile's command for `kind` (web, worker), run by this interpreter."""
    for line in (ROOT / "Procfile").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, command = line.partition(":")
        if name.strip() != kind:
            continue
        argv = shlex.split(command.replace("${PORT:-8000}", str(port)))
        if argv[0].endswith("python"):
            argv[0] = sys.executable
        return argv
    raise ValueError(f"the Procfile has no {kind!r} process type")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without `SCRUBBED_ENV`, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update(extra)
    return env


def database_url() -> str:
    """The URL of the database this process uses (under pytest: the test database)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    if connection.vendor == "postgresql":
        auth = quote(db["USER"] or "", safe="")
        if db["PASSWORD"]:
            auth += ":" + quote(db["PASSWORD"], safe="")
        host = f"{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}"
        return f"postgres://{auth}@{host}/{quote(db['NAME'], safe='')}"
    raise ValueError(f"no server database URL for a {connection.vendor} database")


def server_env(workspace: Path, **extra: str) -> dict[str, str]:
    """The environment of a server on this process's database and data directory: the
    offline model paced like a hosted one, a short shutdown grace; `extra` on top."""
    defaults = {
        "DJANGO_SETTINGS_MODULE": "dispatch.settings",
        "DISPATCH_DATA_DIR": str(settings.DATA_DIR),
        "DATABASE_URL": database_url(),
        "DISPATCH_WORKSPACE": str(workspace),
        "DISPATCH_MODEL": "offline/demo",
        "DISPATCH_OFFLINE_PACE": "40",
        "DISPATCH_SHUTDOWN_GRACE": SHUTDOWN_GRACE,
        # Workspaces start empty, as the tests expect (a test may ask for the sample).
        "DISPATCH_SAMPLE_PROJECT": "0",
        # daphne's "Listening on" line is INFO.
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    return clean_env(**{**defaults, **extra})


class Servers:
    """Live `manage.py serve` processes sharing one workspace under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.workspace = directory / "workspace"
        self.workspace.mkdir(exist_ok=True)
        self.started: list[Proc] = []

    def workspace_of(self, user: Any) -> Path:
        """The servers' workspace of `user` (made if missing), where their tabs' tools work."""
        # Imported here: the bench imports this module before Django is set up, and
        # chat.tools pulls in the models.
        from chat.tools import workdir

        return workdir.user_workspace_under(self.workspace, user.pk)

    def start(self, port: int = 0, **env: str) -> Proc:
        """A new server with these variables on top of `server_env`; returns once it listens.
        `port`: a stopped server's, to bring it back where its pages reconnect."""
        name = f"server-{len(self.started)}"
        server = Proc(
            name,
            serve_argv(port),
            server_env(self.workspace, **env),
            self.dir / f"{name}.log",
            stop_timeout=SERVE_STOP_TIMEOUT,
        )
        self.started.append(server.start())
        return server.listening()

    async def __call__(self, port: int = 0, **env: str) -> Proc:
        return await asyncio.to_thread(self.start, port, **env)

    def stop_all(self) -> None:
        """Stop every server; print the end of each log (pytest shows it for a failure)."""
        stop_all(self.started)
        for server in self.started:
            code = server.proc.returncode if server.proc else None
            print(f"--- {server.log_path.name} (exit {code}) ---")
            print(server.log_tail())
