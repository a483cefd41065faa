"""Settings: typed environment helpers fail loudly; defaults need nothing but a data dir.

Each way out is run as a real process (a bad value through plain `django.setup()` and
through `manage.py check`, good values through `manage.py check`). Which values are
refused, and the words, are checked by running dispatch/settings.py itself in this
process (`load_settings`), as those processes import it: a process costs seconds of
imports, this milliseconds.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from channels_redis.pubsub import RedisPubSubChannelLayer
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from chat.envcheck import (
    EXIT_CONFIGURATION,
    exit_configuration_error,
    masked_url,
    reason,
    url_problem,
)
from dispatch.settings import envbool, envfloat, envint, envlist, redis_channel_layers
from tests.procs import require_services, scratch_redis

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("off", False),
        ("", False),
        (None, True),
    ],
)
def test_envbool_reads_the_usual_spellings(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv("X_BOOL", raising=False)
    else:
        monkeypatch.setenv("X_BOOL", raw)
    assert envbool("X_BOOL", True) is expected


@pytest.mark.parametrize(
    ("helper", "raw", "message"),
    [
        (lambda: envbool("X", False), "maybe", "X='maybe' is not a boolean"),
        (lambda: envint("X", 1), "ten", "X='ten' is not an integer"),
        (lambda: envint("X", 1, minimum=1), "0", "X=0 must be at least 1"),
        (lambda: envfloat("X", 1.0), "fast", "X='fast' is not a number"),
        (lambda: envfloat("X", 1.0, minimum=0), "-1", "X=-1.0 must be at least 0"),
    ],
)
def test_a_bad_value_raises_improperly_configured_naming_it(monkeypatch, helper, raw, message):
    monkeypatch.setenv("X", raw)
    with pytest.raises(ImproperlyConfigured, match=message):
        helper()


def test_envlist_splits_on_commas(monkeypatch):
    monkeypatch.setenv("X_LIST", " a.example, b.example ,,")
    assert envlist("X_LIST", []) == ["a.example", "b.example"]


def _settings_in_subprocess(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({'db': s.DATABASES['default']['ENGINE'], "
        "'name': str(s.DATABASES['default']['NAME']), "
        "'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'debug': s.DEBUG, "
        "'hosts': s.ALLOWED_HOSTS, 'key': s.SECRET_KEY}))"
    )
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS"}
    }
    clean.update(DJANGO_SETTINGS_MODULE="dispatch.settings", DISPATCH_DATA_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


def load_settings(
    monkeypatch, data_dir: Path, *, unset: tuple[str, ...] = (), **env: str
) -> dict[str, object]:
    """The names dispatch/settings.py defines, run in this process under the environment
    a subprocess above or below is given: this one's, without `unset` and the two service
    URLs, with DISPATCH_DATA_DIR=`data_dir` and `env`. Raises what it raises."""
    for name in ("DATABASE_URL", "REDIS_URL", *unset):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "dispatch.settings")
    monkeypatch.setenv("DISPATCH_DATA_DIR", str(data_dir))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(ROOT / "dispatch" / "settings.py"), run_name="settings_under_test")


# What _settings_in_subprocess leaves out of the environment.
SETTINGS_SUBPROCESS_UNSET = ("SECRET_KEY", "DEBUG", "ALLOWED_HOSTS")


def test_the_defaults_are_sqlite_in_the_data_dir_and_the_in_memory_layer(monkeypatch, tmp_path):
    values = load_settings(monkeypatch, tmp_path, unset=SETTINGS_SUBPROCESS_UNSET)
    assert values["DATABASES"]["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert str(values["DATABASES"]["default"]["NAME"]) == str(tmp_path / "dispatch.db")
    assert values["CHANNEL_LAYERS"]["default"]["BACKEND"] == "chat.layers.EmbeddedChannelLayer"
    assert values["DEBUG"] is False
    assert values["ALLOWED_HOSTS"] == ["localhost", "127.0.0.1"]
    # The secret key is generated once, kept with mode 0600, and reused.
    key_file = tmp_path / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again = load_settings(monkeypatch, tmp_path, unset=SETTINGS_SUBPROCESS_UNSET)
    assert again["SECRET_KEY"] == values["SECRET_KEY"] == key_file.read_text()


def test_redis_url_and_database_url_switch_the_backends(monkeypatch, tmp_path):
    values = load_settings(
        monkeypatch,
        tmp_path,
        unset=SETTINGS_SUBPROCESS_UNSET,
        REDIS_URL="redis://127.0.0.1:6379/9",
        DATABASE_URL="postgres://u@h/db",
    )
    layers = values["CHANNEL_LAYERS"]
    assert layers["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert layers["broadcast"]["BACKEND"] == "channels_redis.pubsub.RedisPubSubChannelLayer"
    database = values["DATABASES"]["default"]
    assert database["ENGINE"] == "django.db.backends.postgresql"
    # Pooled per process, not kept per thread (every ASGI request has a thread of its own).
    assert database["CONN_MAX_AGE"] == 0
    assert database["OPTIONS"]["pool"]["max_size"] == 10


def test_a_bad_environment_value_stops_start_up_with_its_name(tmp_path):
    """Plain `django.setup()`, as any process that imports the settings."""
    done = _settings_in_subprocess(tmp_path, DEBUG="perhaps")
    assert done.returncode != 0
    assert "DEBUG='perhaps' is not a boolean" in done.stderr


# --- Every variable, checked at start-up -----------------------------------------------


def check_in_process(
    monkeypatch, capsys, data_dir: Path, **env: str
) -> subprocess.CompletedProcess:
    """How `manage.py check` (`_manage_check`) stops on `env`, run in this process: the
    settings module raises, and manage.py's exit_configuration_error reports it."""
    try:
        load_settings(monkeypatch, data_dir, **env)
    except ImproperlyConfigured as exc:
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            exit_configuration_error(exc)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["manage.py", "check"], stopped.value.code, out, err)
    return subprocess.CompletedProcess(["manage.py", "check"], 0, "", "")


def _manage_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(DJANGO_SETTINGS_MODULE="dispatch.settings", DISPATCH_DATA_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"REDIS_URL": "notaurl"}, "REDIS_URL='notaurl' does not start with redis://"),
        (
            {"REDIS_URL": "redis://:pw@127.0.0.1:6379/zero"},
            "REDIS_URL='redis://:***@127.0.0.1:6379/zero': the path 'zero' is not a database",
        ),
        ({"REDIS_URL": "redis://:6379"}, "REDIS_URL='redis://:6379' names no host"),
        ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS is set but empty"),
        ({"ALLOWED_HOSTS": " , "}, "ALLOWED_HOSTS is set but empty"),
        (
            {"CSRF_TRUSTED_ORIGINS": "chat.example.com"},
            "CSRF_TRUSTED_ORIGINS entry 'chat.example.com' does not start with http://",
        ),
        (
            {"CSRF_TRUSTED_ORIGINS": "https://chat.example.com/"},
            "CSRF_TRUSTED_ORIGINS entry 'https://chat.example.com/' has a path",
        ),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='loud' is not one of DEBUG, INFO, WARNING"),
        ({"DATABASE_URL": "notaurl"}, "DATABASE_URL='notaurl' is not a SQLite or PostgreSQL URL"),
        (
            {"DATABASE_URL": "mysql://u:hunter2@h/db"},
            "DATABASE_URL='mysql://u:***@h/db' is not a SQLite or PostgreSQL URL",
        ),
        (
            {"DATABASE_URL": "postgres://u:hunter2@h:port/db"},
            "DATABASE_URL='postgres://u:***@h:port/db' is not a database URL",
        ),
        ({"DEBUG": "perhaps"}, "DEBUG='perhaps' is not a boolean"),
        (
            {"DISPATCH_LOGIN_FAILURE_LIMIT": "0"},
            "DISPATCH_LOGIN_FAILURE_LIMIT=0 must be at least 1",
        ),
        ({"DISPATCH_TRUSTED_PROXIES": "one"}, "DISPATCH_TRUSTED_PROXIES='one' is not an integer"),
    ],
)
def test_a_bad_value_is_one_line_naming_it_and_no_traceback(
    monkeypatch, capsys, tmp_path, env, expected
):
    assert_one_line(check_in_process(monkeypatch, capsys, tmp_path, **env), expected)


def test_a_bad_value_is_one_line_naming_it_and_no_traceback_as_a_process(tmp_path):
    """The table above, through `manage.py check` as started: its exit status and line."""
    done = _manage_check(tmp_path, DATABASE_URL="mysql://u:hunter2@h/db")
    assert_one_line(done, "DATABASE_URL='mysql://u:***@h/db' is not a SQLite or PostgreSQL URL")


def assert_one_line(done: subprocess.CompletedProcess, expected: str) -> None:
    assert done.returncode == EXIT_CONFIGURATION == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"Configuration error: {expected}"), done.stderr
    assert "hunter2" not in done.stderr


def test_a_workspace_that_is_a_file_is_refused(monkeypatch, capsys, tmp_path):
    path = tmp_path / "workspace"
    path.write_text("not a directory")
    done = check_in_process(monkeypatch, capsys, tmp_path, DISPATCH_WORKSPACE=str(path))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"Configuration error: DISPATCH_WORKSPACE='{path}' is not a directory: point it at a "
        "directory (a missing one is created)"
    )


@pytest.mark.parametrize(
    ("workspace", "data"),
    [
        # The home directory holding the XDG data directory: `mv .local x` moved a
        # covering mount's parent away and showed the database and secret key.
        ("home", "home/.local/share/dispatch"),
        ("data", "data"),
        # The same directory by another path (a symlink): compared resolved.
        ("link-to-data", "data"),
    ],
)
def test_a_workspace_that_holds_the_data_directory_is_refused(
    monkeypatch, capsys, tmp_path, workspace, data
):
    (tmp_path / "data").mkdir()
    (tmp_path / "link-to-data").symlink_to(tmp_path / "data")
    done = check_in_process(
        monkeypatch,
        capsys,
        tmp_path / data,
        DISPATCH_WORKSPACE=str(tmp_path / workspace),
        SECRET_KEY="k",
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"Configuration error: DISPATCH_WORKSPACE='{tmp_path / workspace}' holds "
        f"DISPATCH_DATA_DIR='{tmp_path / data}' (the database and secret key), which the "
        "tools could then read: point DISPATCH_WORKSPACE at a directory outside it, or unset "
        f"it for the default '{tmp_path / data / 'workspace'}'"
    )


@pytest.mark.parametrize("workspace", [None, "data/workspace", "elsewhere", "data-2"])
def test_a_workspace_inside_or_beside_the_data_directory_is_accepted(
    monkeypatch, capsys, tmp_path, workspace
):
    env = {"DISPATCH_WORKSPACE": str(tmp_path / workspace)} if workspace else {}
    done = check_in_process(monkeypatch, capsys, tmp_path / "data", **env)
    assert done.returncode == 0, done.stderr


def test_good_values_pass(tmp_path):
    done = _manage_check(
        tmp_path,
        REDIS_URL="unix:///run/redis.sock",
        ALLOWED_HOSTS="chat.example.com",
        CSRF_TRUSTED_ORIGINS="https://chat.example.com,http://127.0.0.1:8000",
        LOG_LEVEL="warning",
        DATABASE_URL="postgresql://u:pw@db.example.com:5432/dispatch",
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("url", "schemes", "problem"),
    [
        ("https://api.example.com/v1", ("http", "https"), None),
        ("http://127.0.0.1:11434/v1", ("http", "https"), None),
        ("rediss://:pw@redis.example.com:6380/1", ("redis", "rediss", "unix"), None),
        ("unix:///run/redis.sock", ("redis", "rediss", "unix"), None),
        ("unix://", ("redis", "rediss", "unix"), "names no socket path"),
        ("api.example.com", ("http", "https"), "does not start with http:// or https://"),
        ("ftp://example.com", ("http", "https"), "does not start with http:// or https://"),
        ("https://", ("http", "https"), "names no host"),
        ("https://h:99999", ("http", "https"), "is not a URL (Port out of range 0-65535)"),
    ],
)
def test_url_problem(url, schemes, problem):
    assert url_problem(url, schemes) == problem


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgres://dispatch:s3cret@db:5432/dispatch", "postgres://dispatch:***@db:5432/dispatch"),
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("postgres://a:b:c@d@host/db", "postgres://a:***@host/db"),
        ("postgres://dispatch@db/dispatch", "postgres://dispatch@db/dispatch"),
        ("sqlite:////var/lib/dispatch.db", "sqlite:////var/lib/dispatch.db"),
        ("postgres://u:s3cret@h:port/db", "postgres://u:***@h:port/db"),
        ("postgres://u:s3cret@[::1/db", "(a value that is not a URL)"),
    ],
)
def test_masked_url_never_shows_a_password(url, shown):
    assert masked_url(url) == shown


@pytest.mark.parametrize(
    ("message", "cause"),
    [
        (
            'connection failed: connection to server at "127.0.0.1", port 1 failed: '
            "Connection refused\n\tIs the server running on that host?",
            "Connection refused",
        ),
        (
            'connection failed: connection to server at "h", port 5432 failed: FATAL:  '
            'password authentication failed for user "u"',
            'password authentication failed for user "u"',
        ),
        (
            "Error 111 connecting to 127.0.0.1:1. Connection refused.",
            "Error 111 connecting to 127.0.0.1:1. Connection refused",
        ),
        ("", "OSError"),
    ],
)
def test_reason_is_the_cause_on_one_line(message, cause):
    assert reason(OSError(message) if message else OSError()) == cause


@pytest.mark.django_db
def test_sqlite_cuts_its_wal_file_back_after_a_checkpoint():
    """journal_size_limit: a burst of writes must not leave a WAL of gigabytes for good."""
    assert connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_size_limit")
        assert cursor.fetchone()[0] == 64 * 1024 * 1024
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("redis://127.0.0.1:6379/9", "dispatch.db9."),
        ("redis://127.0.0.1:6379", "dispatch.db0."),
        ("rediss://:pw@redis.example.com:6380/1", "dispatch.db1."),
        ("unix:///run/redis.sock?db=3", "dispatch.db3."),
        ("unix:///run/redis.sock", "dispatch.db0."),
    ],
)
def test_the_broadcast_layer_is_prefixed_with_the_redis_database(url, prefix):
    """Pub/sub channels are the Redis server's, whatever the database: two installations
    on two databases of one server must not hear each other's user groups (user.1)."""
    assert redis_channel_layers(url)["broadcast"]["CONFIG"]["prefix"] == prefix


@pytest.mark.scaled
@pytest.mark.asyncio
async def test_two_databases_broadcast_layers_do_not_hear_each_other():
    require_services()
    with scratch_redis() as one, scratch_redis() as two:
        configs = [redis_channel_layers(url)["broadcast"]["CONFIG"] for url in (one, two, one)]
        mine, other, same = (RedisPubSubChannelLayer(**config) for config in configs)
        channel = await mine.new_channel()
        await mine.group_add("user.1", channel)
        try:
            await other.group_send("user.1", {"type": "user.tab", "from": "other"})
            await same.group_send("user.1", {"type": "user.tab", "from": "same"})
            assert (await asyncio.wait_for(mine.receive(channel), 5))["from"] == "same"
        finally:
            for each in (mine, other, same):
                await each.flush()
