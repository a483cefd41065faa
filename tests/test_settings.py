"""Settings: typed environment helpers fail loudly; defaults need nothing but a data dir."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from dispatch.settings import envbool, envfloat, envint, envlist

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


def test_the_defaults_are_sqlite_in_the_data_dir_and_the_in_memory_layer(tmp_path):
    import json

    done = _settings_in_subprocess(tmp_path)
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)
    assert values["db"] == "django.db.backends.sqlite3"
    assert values["name"] == str(tmp_path / "dispatch.db")
    assert values["layer"] == "chat.layers.EmbeddedChannelLayer"
    assert values["debug"] is False
    assert values["hosts"] == ["localhost", "127.0.0.1"]
    # The secret key is generated once, kept with mode 0600, and reused.
    key_file = tmp_path / "secret_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    again = json.loads(_settings_in_subprocess(tmp_path).stdout)
    assert again["key"] == values["key"] == key_file.read_text()


def test_redis_url_and_database_url_switch_the_backends(tmp_path):
    import json

    done = _settings_in_subprocess(
        tmp_path, REDIS_URL="redis://127.0.0.1:6379/9", DATABASE_URL="postgres://u@h/db"
    )
    assert done.returncode == 0, done.stderr
    values = json.loads(done.stdout)
    assert values["layer"] == "channels_redis.core.RedisChannelLayer"
    assert values["db"] == "django.db.backends.postgresql"


def test_a_bad_environment_value_stops_start_up_with_its_name(tmp_path):
    done = _settings_in_subprocess(tmp_path, DEBUG="perhaps")
    assert done.returncode != 0
    assert "DEBUG='perhaps' is not a boolean" in done.stderr
