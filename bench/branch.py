"""Branching a 10k and a 100k-chunk tab: time, statements and Python memory.

A branch copies the parent's log up to the cut in the database (one INSERT ...
SELECT for the chunks, one for their index rows): the statements must not grow
with the log and no row should pass through Python, so peak memory stays flat.
The parents are indexed for search first, as a real log is.
"""

from __future__ import annotations

import time
import tracemalloc

from bench.common import bench_tab, fill_tab

SIZES = [10_000, 100_000]
INDEX_BATCH = 5_000


def _index(tab) -> None:
    from chat import search
    from chat.models import Chunk

    chunks = Chunk.objects.filter(tab=tab).order_by("seq")
    for start in range(0, tab.last_seq, INDEX_BATCH):
        search.index(tab.pk, list(chunks.filter(seq__gt=start, seq__lte=start + INDEX_BATCH)))


def run() -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat import turns
    from chat.models import Chunk

    by_size: dict[str, dict] = {}
    for n in SIZES:
        parent = bench_tab("offline/demo")
        fill_tab(parent.pk, n)
        parent.refresh_from_db()
        _index(parent)
        start = time.perf_counter()
        with CaptureQueriesContext(connection) as captured:
            branch = turns.branch(parent, n).tab
        seconds = time.perf_counter() - start
        assert Chunk.objects.filter(tab=branch).count() == n + 1
        # Memory in a second branch (another action: not the repeat of the first).
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            turns.branch(parent, n, action=turns.Action.REGENERATE)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        by_size[str(n)] = {
            "seconds": round(seconds, 3),
            "statements": len(captured.captured_queries),
            "peak_mb": round(peak / 1e6, 2),
        }
    small, large = by_size[str(SIZES[0])], by_size[str(SIZES[-1])]
    return {
        "by_size": by_size,
        "statements_equal": small["statements"] == large["statements"],
        "peak_ratio": round(large["peak_mb"] / max(small["peak_mb"], 0.01), 2),
    }
