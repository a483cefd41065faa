"""The data dir and its files are the owner's only: a fresh data dir is 0700, the secret
key, the SQLite database (and its -wal/-shm) and stored blobs 0600; start-up warns about
an older, looser one."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from chat import blobs, startup
from tests.attachment_files import image
from tests.test_startup import run

# Made by the real settings in a real process: the modes must hold before any request.
FRESH = """
import json, os, stat
import django
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE t (x)")
    cursor.execute("INSERT INTO t VALUES (1)")
data = settings.DATA_DIR
names = ["", "secret_key", "dispatch.db", "dispatch.db-wal", "dispatch.db-shm"]
print(json.dumps({n: stat.S_IMODE(os.stat(data / n).st_mode) for n in names}))
os.chmod(data, 0o755)
os.chmod(data / "dispatch.db", 0o644)
from chat import startup
startup.check(services=False)
"""


def test_a_fresh_data_dir_is_the_owners_only_and_looser_modes_are_warned(tmp_path):
    done = run(tmp_path, [sys.executable, "-c", FRESH], SECRET_KEY="", DATABASE_URL="")
    assert done.returncode == 0, done.stderr
    modes = json.loads(done.stdout)
    assert modes == {
        "": 0o700,
        "secret_key": 0o600,
        "dispatch.db": 0o600,
        "dispatch.db-wal": 0o600,
        "dispatch.db-shm": 0o600,
    }
    data = tmp_path / "data"
    assert (
        f"{data} is mode 755: other local users can read it; run `chmod -R go-rwx {data}`."
        in done.stderr
    )
    db = data / "dispatch.db"
    assert f"{db} is mode 644: other local users can read it; run `chmod 600 {db}`." in (
        done.stderr
    )


@pytest.mark.django_db
def test_stored_blobs_are_the_owners_only(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    blob = blobs.store(blobs.normalise(image(size=(64, 48)), "a.png"))
    path = blobs.path_of(blob.sha256)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (blobs.root(), path.parent.parent, path.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_only_paths_others_can_read_are_named(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    tmp_path.chmod(0o700)
    key = Path(tmp_path / "secret_key")
    key.write_text("k")
    key.chmod(0o640)
    (tmp_path / "blobs").mkdir(mode=0o700)
    mine = [line for line in startup.loose_modes() if str(tmp_path) in line]
    assert mine == [f"{key} is mode 640: other local users can read it; run `chmod 600 {key}`."]
    key.chmod(0o600)
    assert not [line for line in startup.loose_modes() if str(tmp_path) in line]
    assert os.stat(tmp_path).st_mode & 0o077 == 0
