"""Start-up: a bad value, or a service that does not answer, stops `serve`, `runworker`, `send`,
`migrate` and plain daphne with one line naming the variable and the fix, no traceback,
passwords masked; valid settings still serve.

Each way out (serve's check, plain daphne's, manage.py's, each exit status) is run as a
real process, as an operator starts it. Which values the check refuses, and its words,
are checked in this process through the very function those processes call
(chat.startup.check, and the commands' handle): a process costs seconds of imports.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from chat import startup
from chat.envcheck import EXIT_CONFIGURATION, EXIT_UNAVAILABLE
from chat.tools import sandbox
from harness.servers import ROOT, SCRUBBED_ENV

# Django start-up on two busy cores; a check that hangs fails here, not at the suite timeout.
COMMAND_TIMEOUT = 60
SECRET = "s3cret-pw"


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(tmp_path: Path, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    clean.pop("DISPATCH_MODEL", None)
    clean.update(
        DJANGO_SETTINGS_MODULE="dispatch.settings",
        DISPATCH_DATA_DIR=str(tmp_path / "data"),
        **env,
    )
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=clean,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )


def manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run(tmp_path, [sys.executable, "manage.py", *args], **env)


def check_in_process(
    settings, monkeypatch, capsys, tmp_path: Path, command: list[str] | None = None, **env: str
) -> subprocess.CompletedProcess:
    """How `serve` (or `command`) stops on `env`, run in this process: the exit status and
    output of chat.startup.check, as `manage()` reports a process's.

    The environment is `manage()`'s; the values dispatch.settings reads (the models, the
    workspace) go through the `settings` fixture, the rest (provider URLs, stream idle
    timeouts) stay in the environment, where the check reads them.
    """
    for name in (*SCRUBBED_ENV, "DISPATCH_MODEL"):
        monkeypatch.delenv(name, raising=False)
    settings.DISPATCH_MODEL = settings.DISPATCH_FALLBACK_MODEL = ""
    settings.DISPATCH_WORKSPACE = tmp_path / "data" / "workspace"
    for name, value in env.items():
        if name in startup.MODEL_VARIABLES:
            setattr(settings, name, value)
        elif name == "DISPATCH_WORKSPACE":
            settings.DISPATCH_WORKSPACE = Path(value)
        elif name == "REDIS_URL":
            settings.REDIS_URL = value
        else:
            monkeypatch.setenv(name, value)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        if command is None:
            # What `serve` runs first (dispatch/management/commands/serve.py).
            startup.check()
        else:
            call_command(*command)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(command or ["serve"], stopped.value.code, out, err)


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    """The single stderr line of a process that stopped with `code` and no traceback."""
    output = done.stdout + done.stderr
    assert done.returncode == code, output
    assert "Traceback" not in output, output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"DISPATCH_MODEL": "foo/bar"},
            "Configuration error: DISPATCH_MODEL='foo/bar': unknown model provider 'foo'",
        ),
        (
            {"DISPATCH_MODEL": "claude"},
            "Configuration error: DISPATCH_MODEL='claude': model id 'claude' is not of the form",
        ),
        (
            {"DISPATCH_FALLBACK_MODEL": "offline/other"},
            "Configuration error: DISPATCH_FALLBACK_MODEL='offline/other': the offline provider",
        ),
        (
            {"ANTHROPIC_BASE_URL": "api.anthropic.com"},
            "Configuration error: ANTHROPIC_BASE_URL='api.anthropic.com' does not start with "
            "http:// or https://",
        ),
        (
            {"OPENAI_BASE_URL": "http://"},
            "Configuration error: OPENAI_BASE_URL='http://' names no host",
        ),
        (
            {"DEEPSEEK_BASE_URL": "https://api.deepseek.com:port"},
            "Configuration error: DEEPSEEK_BASE_URL='https://api.deepseek.com:port' is not a URL",
        ),
    ],
)
def test_serve_stops_on_a_value_only_the_app_can_check(
    settings, monkeypatch, capsys, tmp_path, env, expected
):
    done = check_in_process(settings, monkeypatch, capsys, tmp_path, **env)
    line = one_line(done, EXIT_CONFIGURATION)
    assert line.startswith(expected), line
    assert line.endswith("or unset it."), "the line says how to fix it"


def test_serve_stops_on_a_value_only_the_app_can_check_as_a_process(tmp_path):
    """The check above, in `serve` as started: its one line and exit status."""
    line = one_line(
        manage(tmp_path, "serve", "--port", "0", DISPATCH_MODEL="foo/bar"), EXIT_CONFIGURATION
    )
    assert line.startswith(
        "Configuration error: DISPATCH_MODEL='foo/bar': unknown model provider 'foo'"
    ), line
    assert line.endswith("or unset it."), "the line says how to fix it"


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ANTHROPIC_STREAM_IDLE_TIMEOUT", "soon"), ("OFFLINE_STREAM_IDLE_TIMEOUT", "0")],
)
def test_serve_stops_on_a_bad_stream_idle_timeout(
    settings, monkeypatch, capsys, tmp_path, variable, value
):
    """Read when a turn starts its provider: without the check, every turn of that provider
    would fail, long after start-up."""
    done = check_in_process(settings, monkeypatch, capsys, tmp_path, **{variable: value})
    line = one_line(done, EXIT_CONFIGURATION)
    assert line == (
        f"Configuration error: {variable}={value!r} is not a number of seconds between 0 "
        "and 600: fix it or unset it (default 60)."
    )


def test_serve_stops_when_the_workspace_cannot_be_created(settings, monkeypatch, capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = check_in_process(
        settings, monkeypatch, capsys, tmp_path, DISPATCH_WORKSPACE=str(blocker / "ws")
    )
    line = one_line(done, EXIT_CONFIGURATION)
    assert line.startswith(f"Configuration error: DISPATCH_WORKSPACE='{blocker / 'ws'}' cannot ")


def test_runworker_and_send_check_too(settings, monkeypatch, capsys, tmp_path):
    """Their handle() runs the check `serve` runs, before anything else; it exits the same."""
    worker = check_in_process(
        settings,
        monkeypatch,
        capsys,
        tmp_path,
        ["runworker"],
        REDIS_URL="redis://127.0.0.1:6379/0",
        DISPATCH_MODEL="x/y",
    )
    assert one_line(worker, EXIT_CONFIGURATION).startswith("Configuration error: DISPATCH_MODEL=")
    send = check_in_process(
        settings,
        monkeypatch,
        capsys,
        tmp_path,
        ["send", "--new", "hi"],
        DISPATCH_FALLBACK_MODEL="x/y",
    )
    line = one_line(send, EXIT_CONFIGURATION)
    assert line.startswith("Configuration error: DISPATCH_FALLBACK_MODEL=")


def test_plain_daphne_stops_with_the_same_line(tmp_path):
    daphne = [sys.executable, "-m", "daphne", "-p", "0", "dispatch.asgi:application"]
    line = one_line(run(tmp_path, daphne, DISPATCH_MODEL="foo/bar"), EXIT_CONFIGURATION)
    assert line.startswith("Configuration error: DISPATCH_MODEL='foo/bar'")
    line = one_line(run(tmp_path, daphne, LOG_LEVEL="chatty"), EXIT_CONFIGURATION)
    assert line.startswith("Configuration error: LOG_LEVEL='chatty' is not one of DEBUG")


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["migrate"]])
def test_an_unreachable_database_is_named_with_its_password_masked(tmp_path, command):
    port = closed_port()
    url = f"postgres://dispatch:{SECRET}@127.0.0.1:{port}/dispatch"
    done = manage(tmp_path, *command, DATABASE_URL=url)
    assert one_line(done, EXIT_UNAVAILABLE) == (
        f"Cannot reach the database at postgres://dispatch:***@127.0.0.1:{port}/dispatch: "
        "Connection refused. Check DATABASE_URL and that the server is running."
    )
    assert SECRET not in done.stdout + done.stderr


def test_an_unreachable_redis_is_named_with_its_password_masked(tmp_path):
    port = closed_port()
    done = manage(
        tmp_path, "serve", "--port", "0", REDIS_URL=f"redis://:{SECRET}@127.0.0.1:{port}/0"
    )
    line = one_line(done, EXIT_UNAVAILABLE)
    assert line.startswith(f"Cannot reach Redis at redis://:***@127.0.0.1:{port}/0: ")
    assert "Connection refused" in line and line.endswith(
        "Check REDIS_URL and that the server is running."
    )
    assert SECRET not in done.stdout + done.stderr


def test_a_database_without_its_migrations_is_named_with_the_fix(tmp_path):
    """A new data dir, or an upgrade, without `migrate`: one line, not "no such table" later."""
    line = one_line(manage(tmp_path, "serve", "--port", "0"), EXIT_CONFIGURATION)
    database = tmp_path / "data" / "dispatch.db"
    assert line.startswith(f"The database at sqlite:///{database} lacks ")
    assert line.endswith("run `manage.py migrate` first (with the same DATABASE_URL).")


def test_every_configuration_problem_is_listed_at_once(settings, monkeypatch, capsys, tmp_path):
    done = check_in_process(
        settings, monkeypatch, capsys, tmp_path, DISPATCH_MODEL="foo/bar", OPENAI_BASE_URL="nope"
    )
    assert done.returncode == EXIT_CONFIGURATION and "Traceback" not in done.stderr
    assert [line.split("=")[0] for line in done.stderr.splitlines()] == [
        "Configuration error: DISPATCH_MODEL",
        "Configuration error: OPENAI_BASE_URL",
    ]


@pytest.mark.django_db(transaction=True)
async def test_valid_settings_still_serve(serve):  # noqa: F811
    """A model the registry does not list, of a known provider, and a local endpoint are
    fine: the server listens (the launcher fails the test if it exits instead)."""
    server = await serve(
        DISPATCH_MODEL="openai/some-new-model",
        OPENAI_BASE_URL="http://127.0.0.1:11434/v1",
        OPENAI_API_KEY="local",
    )
    assert server.port > 0 and server.proc.poll() is None
    assert "some-new-model" in server.log()
    # As root (here, and in CI) one line says what that costs; otherwise nothing.
    assert (f"Warning: {sandbox.AS_ROOT}" in server.log()) == (os.geteuid() == 0)
