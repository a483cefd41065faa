"""Test settings: the project's settings, with a throwaway data directory."""

import os
import tempfile

os.environ.setdefault("DISPATCH_DATA_DIR", tempfile.mkdtemp(prefix="dispatch-test-"))
os.environ.setdefault("DISPATCH_OFFLINE_PACE", "0")
# Workspaces start empty, as the tests' assertions about them expect (tests/test_page_first_run.py
# turns the sample project on).
os.environ.setdefault("DISPATCH_SAMPLE_PROJECT", "0")

from dispatch.settings import *  # noqa: E402, F403
from dispatch.settings import DATA_DIR, DATABASES  # noqa: E402

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not memory: threads and live-server subprocesses share it.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.db")}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
