"""A paced stream: one tab streaming 200 deltas/s for 10 s through the real OpenAI SDK path,
against the bare consumer streaming 200 frames/s for 10 s on the same daphne, in the same run.

The app side is a turn on the app's `openai` provider, pointed at the fake OpenAI server
(harness.fakeprovider) running in a process of its own, so the CPU it spends pacing and
writing chunks is not counted as the server's. The fake server sends each chunk on a fixed
schedule and stamps it with the time it was written; the client reads the stamps out of the
delta frames, so the delay is from the provider's wire to the page's socket. The bare side is
bench/server.py's consumer: the same number of stamped frames at the same pace, no log, no
rendering. Both sides are measured RUNS times, alternating, after one untimed app turn that
imports the SDK and makes its client (a cost of the first turn only).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from bench.common import bench_server, bench_session, bench_tab, cpu_seconds, summary
from bench.streaming import app_run, bare_run, stats
from harness.fakeprovider import STAMP, FakeProviderProcess, Reply, openai_text
from harness.login import cookie_header

# Deltas per second: a fast hosted model's pace, as one user sees it.
RATE = 200.0
SECONDS = 10
DELTAS = int(RATE * SECONDS)
# Timed runs per side; the median is reported, with min and max.
RUNS = 3
# A real model id of the `openai` provider, so the registry's own path runs.
MODEL = "openai/gpt-4.1"
# The untimed first turn: enough deltas to open, stream and seal a block.
WARMUP_DELTAS = 20
# A run must deliver nearly every delta (each is counted once, in whatever frame brings it).
MIN_DELIVERED = 0.99


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _stamped(count: int) -> list[dict]:
    return openai_text([f"{STAMP} "] * count)


def _check(side: str, run: dict) -> None:
    if run["tokens"] < DELTAS * MIN_DELIVERED:
        raise RuntimeError(
            f"paced bench: the {side} side delivered {run['tokens']} of {DELTAS} deltas"
        )


def run() -> dict:
    data_dir = os.environ["DISPATCH_DATA_DIR"]
    cookie = cookie_header(bench_session())
    app_rows, bare_rows, ratios = [], [], []
    app_delays: list[float] = []
    bare_delays: list[float] = []
    with FakeProviderProcess(Path(data_dir) / "fakeprovider.log") as fake:
        env = {"OPENAI_API_KEY": "bench-key", "OPENAI_BASE_URL": fake.openai_url}
        with bench_server(str(DELTAS), str(RATE), data_dir, env=env) as server:
            fake.add(Reply(events=_stamped(WARMUP_DELTAS), stamp=True))
            tab = str(bench_tab(MODEL).pk)
            asyncio.run(app_run(server.url, server.port, cookie, [tab]))
            for i in range(1, RUNS + 1):
                fake.add(Reply(events=_stamped(DELTAS), rate=RATE, stamp=True))
                tab = str(bench_tab(MODEL).pk)
                before = cpu_seconds(server.pid)
                app = asyncio.run(app_run(server.url, server.port, cookie, [tab]))
                app_cpu = cpu_seconds(server.pid) - before
                before = cpu_seconds(server.pid)
                bare = asyncio.run(bare_run(server.port, 1))
                bare_cpu = cpu_seconds(server.pid) - before
                _check("app", app)
                _check("bare", bare)
                app_rows.append(stats(app, app_cpu))
                bare_rows.append(stats(bare, bare_cpu))
                app_delays += app["delays"]
                bare_delays += bare["delays"]
                ratios.append(
                    app_rows[-1]["cpu_ms_per_1k_tokens"]
                    / max(bare_rows[-1]["cpu_ms_per_1k_tokens"], 1e-9)
                )
                print(f"  run {i}: app {app_rows[-1]}, bare {bare_rows[-1]}", flush=True)
        requests = [r for r in fake.requests() if r["path"].endswith("/chat/completions")]
    if len(requests) != RUNS + 1 or not all(r["completed"] for r in requests):
        raise RuntimeError(f"paced bench: the fake OpenAI server saw {requests}")

    def side(rows: list[dict], delays: list[float]) -> dict:
        return {
            "cpu_ms_per_1k_tokens": summary([r["cpu_ms_per_1k_tokens"] for r in rows]),
            "tokens_per_second": summary([r["tokens_per_second"] for r in rows]),
            "delay_ms": {
                "p50": round(_percentile(delays, 0.5), 1),
                "p99": round(_percentile(delays, 0.99), 1),
            },
            "runs": rows,
        }

    return {
        "deltas": DELTAS,
        "rate": RATE,
        "model": MODEL,
        "app": side(app_rows, app_delays),
        "bare": side(bare_rows, bare_delays),
        "cpu_ratio": {k: round(v, 2) if k != "runs" else v for k, v in summary(ratios).items()},
    }
