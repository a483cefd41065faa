"""`make bench`: run the benchmarks, write bench/results.json and bench/results.md.

python -m bench                 # everything
python -m bench pages cache     # some of them
"""

from __future__ import annotations

import json
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import setup_django

HERE = Path(__file__).parent
# In the order they run: the wipe empties the database, so it goes after those that
# read it; search builds its own million-chunk index after it (the wipe's figure is
# then of the chat tables alone).
BENCHMARKS = [
    "request_build",
    "pages",
    "writes",
    "checkpoint",
    "cache",
    "compaction",
    "streaming",
    "scaled",
    "turn_cost",
    "paced",
    "live_markdown",
    "browser",
    "export",
    "attachments",
    "branch",
    "wipe",
    "search",
    "revocation",
]


def main(argv: list[str]) -> int:
    chosen = argv or BENCHMARKS
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
        return 2
    setup_django()
    results_path = HERE / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() and argv else {}
    results["machine"] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": __import__("os").cpu_count(),
    }
    for name in BENCHMARKS:
        if name not in chosen:
            continue
        module = __import__(f"bench.{name}", fromlist=["run"])
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        results[name] = module.run()
        results[name]["bench_seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(results[name], indent=2), flush=True)
        # After each section: a later one that fails keeps what ran (rerun it by name).
        results_path.write_text(json.dumps(results, indent=2) + "\n")
    from bench.report import markdown

    (HERE / "results.md").write_text(markdown(results))
    print(f"wrote {results_path} and {HERE / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
