"""Server cost per streamed token for 1, 10 and 100 concurrent tabs (one socket each), and the
delay from the provider yielding a token to the client receiving it; against a bare Channels
consumer on the same daphne streaming the same tokens with no log and no rendering."""

from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import websockets

from bench.common import IDLE_RE, bench_server, bench_session, bench_tab, cpu_seconds
from bench.server import STAMPED_MODEL
from harness.login import cookie_header

TABS = (1, 10, 100)
TOKENS = 500  # per tab
PACE = 100.0  # tokens per second per tab, about a fast hosted model
# A token's stamp (ns since the epoch), counted the first time a frame brings it: in text
# appended to an open body, or in an open text chunk's Markdown tail rendered again (which
# repeats the stamps before it), or in the open fragment.
STAMP_RE = re.compile(r"(?<![0-9])[0-9]{19}(?![0-9])")
# The whole run of one configuration must end by then, or the bench fails loudly.
RUN_TIMEOUT = 120


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _csrf(base: str, cookie: str, tab_id: str) -> tuple[str, str]:
    """The CSRF token and cookie a page gives, as the browser would get them."""
    request = urllib.request.Request(f"{base}/t/{tab_id}/", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=30) as response:
        page = response.read().decode()
        set_cookie = response.headers.get_all("Set-Cookie") or []
    token = re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)
    csrf_cookie = next((c.split(";")[0] for c in set_cookie if c.startswith("csrftoken=")), "")
    return token, f"{cookie}; {csrf_cookie}" if csrf_cookie else cookie


def _post(url: str, token: str, cookie: str) -> int:
    data = urllib.parse.urlencode({"text": "stream"}).encode()
    request = urllib.request.Request(
        url,
        data=data,
        headers={
            "Cookie": cookie,
            "X-CSRFToken": token,
            "HX-Request": "true",
        },
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status


async def app_run(base: str, port: int, cookie: str, tab_ids: list[str]) -> dict:
    """Send a message to every tab at once and read their sockets to the idle status: the
    tokens received, seconds, and each token's delay from its stamp to its arrival."""
    delays: list[float] = []
    headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}

    async def watch(tab_id: str, ready: asyncio.Event) -> int:
        count = 0
        seen: set[str] = set()
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/ws/tabs/{tab_id}/",
            additional_headers=headers,
            max_size=None,
        ) as ws:
            await ws.send('{"type": "hello", "last_seq": 0}')
            ready.set()
            async for frame in ws:
                now = time.time_ns()
                for stamp in STAMP_RE.findall(frame):
                    if stamp not in seen:
                        seen.add(stamp)
                        delays.append((now - int(stamp)) / 1e6)
                        count += 1
                if count and IDLE_RE.search(frame):
                    return count
        return count

    readies = [asyncio.Event() for _ in tab_ids]
    watchers = [asyncio.create_task(watch(t, r)) for t, r in zip(tab_ids, readies, strict=True)]
    await asyncio.gather(*(r.wait() for r in readies))
    token, cookies = await asyncio.to_thread(_csrf, base, cookie, tab_ids[0])
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(len(tab_ids), 32)) as pool:
        statuses = await asyncio.gather(
            *(
                asyncio.get_running_loop().run_in_executor(
                    pool, _post, f"{base}/t/{t}/send/", token, cookies
                )
                for t in tab_ids
            )
        )
    assert set(statuses) == {200}, statuses
    counts = await asyncio.wait_for(asyncio.gather(*watchers), RUN_TIMEOUT)
    return {"tokens": sum(counts), "seconds": time.perf_counter() - start, "delays": delays}


async def bare_run(port: int, n: int) -> dict:
    """`n` sockets on the bare consumer, read to its END: as `app_run`."""
    delays: list[float] = []

    async def watch() -> int:
        count = 0
        async with websockets.connect(f"ws://127.0.0.1:{port}/bare/") as ws:
            async for frame in ws:
                if frame == "END":
                    return count
                delays.append((time.time_ns() - int(frame)) / 1e6)
                count += 1
        return count

    start = time.perf_counter()
    counts = await asyncio.wait_for(asyncio.gather(*(watch() for _ in range(n))), RUN_TIMEOUT)
    return {"tokens": sum(counts), "seconds": time.perf_counter() - start, "delays": delays}


def stats(run: dict, cpu: float) -> dict:
    return {
        "tokens": run["tokens"],
        "tokens_per_second": round(run["tokens"] / run["seconds"], 1),
        "cpu_seconds": round(cpu, 2),
        "cpu_ms_per_1k_tokens": round(cpu / max(run["tokens"], 1) * 1e6, 1),
        "delay_ms": {
            "p50": round(_percentile(run["delays"], 0.5), 1),
            "p99": round(_percentile(run["delays"], 0.99), 1),
        },
    }


def run() -> dict:
    cookie = cookie_header(bench_session())
    results = {}
    with bench_server(str(TOKENS), str(PACE), os.environ["DISPATCH_DATA_DIR"]) as server:
        # Untimed: the process's first turn imports and warms what every later one
        # reuses (the templates, the provider path); the one-tab row counted it before.
        asyncio.run(app_run(server.url, server.port, cookie, [str(bench_tab(STAMPED_MODEL).pk)]))
        for n in TABS:
            tab_ids = [str(bench_tab(STAMPED_MODEL).pk) for _ in range(n)]
            cpu = cpu_seconds(server.pid)
            app = asyncio.run(app_run(server.url, server.port, cookie, tab_ids))
            app_cpu = cpu_seconds(server.pid) - cpu
            cpu = cpu_seconds(server.pid)
            bare = asyncio.run(bare_run(server.port, n))
            bare_cpu = cpu_seconds(server.pid) - cpu
            row = stats(app, app_cpu)
            baseline = stats(bare, bare_cpu)
            row["baseline"] = baseline
            row["baseline_cpu_ms_per_1k_tokens"] = baseline["cpu_ms_per_1k_tokens"]
            row["cpu_ratio"] = round(
                row["cpu_ms_per_1k_tokens"] / max(baseline["cpu_ms_per_1k_tokens"], 1e-9), 2
            )
            results[str(n)] = row
            print(f"  {n} tab(s): {row}", flush=True)
    return {"tokens_per_tab": TOKENS, "pace_per_tab": PACE, "by_tabs": results}
