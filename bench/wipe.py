"""`wipe_history` on a SQLite database of about 500,000 chunks (~120 MB)."""

from __future__ import annotations

import io
import os
import time

from bench.common import bench_tab, fill_tab

CHUNKS = 500_000
TABS = 50


def run() -> dict:
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor != "sqlite":
        return {"skipped": "the wipe benchmark measures the embedded SQLite database"}
    path = settings.DATABASES["default"]["NAME"]
    start = time.perf_counter()
    for _ in range(TABS):
        fill_tab(bench_tab("offline/demo").pk, CHUNKS // TABS)
    fill_seconds = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = os.path.getsize(path)
    start = time.perf_counter()
    call_command("wipe_history", "--yes", stdout=io.StringIO())
    seconds = time.perf_counter() - start
    after = os.path.getsize(path)
    return {
        "chunks": CHUNKS,
        "fill_seconds": round(fill_seconds, 1),
        "wipe_seconds": round(seconds, 2),
        "size_before_mb": round(before / 1e6, 1),
        "size_after_mb": round(after / 1e6, 2),
    }
