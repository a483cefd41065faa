"""Export of a 10k and a 100k-chunk tab (JSONL and Markdown): time and peak memory.

The goal is peak memory flat from 10k to 100k chunks: the export reads the log
a page at a time. Time is measured without tracemalloc (it slows allocation
several times), peak memory in a second run with it: the Python heap's peak
while the export runs, above what was allocated before it began. The import
of the same JSONL is timed once per size for reference.
"""

from __future__ import annotations

import io
import time
import tracemalloc

from bench.common import bench_tab, fill_tab

SIZES = [10_000, 100_000]


def _drain(parts) -> int:
    size = 0
    for part in parts:
        size += len(part.encode())
    return size


def _export(tab, writer) -> dict:
    start = time.perf_counter()
    size = _drain(writer(tab))
    seconds = time.perf_counter() - start
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _drain(writer(tab))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return {
        "seconds": round(seconds, 3),
        "peak_mb": round(peak / 1e6, 2),
        "mb": round(size / 1e6, 1),
    }


def run() -> dict:
    from django.contrib.auth import get_user_model

    from chat import transfer

    owner, _ = get_user_model().objects.get_or_create(username="bench-export")
    by_size: dict[str, dict] = {}
    for n in SIZES:
        tab = bench_tab("offline/demo")
        fill_tab(tab.pk, n)
        tab.refresh_from_db()
        row = {
            "jsonl": _export(tab, transfer.export_jsonl),
            "markdown": _export(tab, transfer.export_markdown),
        }
        data = "".join(transfer.export_jsonl(tab)).encode()
        start = time.perf_counter()
        copy = transfer.import_jsonl(owner, io.BytesIO(data))
        row["import_seconds"] = round(time.perf_counter() - start, 2)
        assert copy.last_seq == n
        by_size[str(n)] = row
    small, large = by_size[str(SIZES[0])], by_size[str(SIZES[-1])]
    return {
        "by_size": by_size,
        "jsonl_peak_ratio": round(large["jsonl"]["peak_mb"] / small["jsonl"]["peak_mb"], 2),
        "markdown_peak_ratio": round(
            large["markdown"]["peak_mb"] / small["markdown"]["peak_mb"], 2
        ),
    }
