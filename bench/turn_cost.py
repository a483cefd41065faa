"""The fixed cost of a turn: server CPU and SQL statements for a one-token turn (the POST
to the idle status, the tab's page open), against the bare consumer streaming one token to
a socket it accepts; and what opening the tab's page costs (its GET, its socket's connect
and catch-up). Measured in ROUNDS rounds of TURNS of each, alternately, on one server."""

from __future__ import annotations

import asyncio
import os
import re
import time
import urllib.request

import websockets

from bench.common import IDLE_RE, bench_server, bench_session, bench_tab, cpu_seconds, summary
from bench.server import STAMPED_MODEL
from bench.streaming import _csrf, _post
from harness.login import cookie_header

# Turns per round, and rounds: the CPU clock counts in 10 ms ticks, so a round's total
# is divided by its turns.
TURNS = 10
ROUNDS = 3
# The tab's own status saying it runs (IDLE_RE's counterpart).
RUNNING_RE = re.compile(r'<div id="status"[^>]*data-state="running"')


def statements(base: str) -> int:
    with urllib.request.urlopen(f"{base}/bench/statements/", timeout=30) as response:
        return int(response.read())


async def _page_and_turn(server, cookie: str, tab_id: str) -> dict:
    """Open the tab's page (GET, socket, hello), then one turn on it: the cost of each."""
    base, port = server.url, server.port
    cpu, sql = cpu_seconds(server.pid), await asyncio.to_thread(statements, base)
    token, cookies = await asyncio.to_thread(_csrf, base, cookie, tab_id)
    headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
    async with websockets.connect(
        f"ws://127.0.0.1:{port}/ws/tabs/{tab_id}/", additional_headers=headers, max_size=None
    ) as ws:
        await ws.send('{"type": "hello", "last_seq": 0}')
        while not IDLE_RE.search(await ws.recv()):
            pass
        opened_cpu, opened_sql = cpu_seconds(server.pid), await asyncio.to_thread(statements, base)
        start = time.perf_counter()
        status = await asyncio.to_thread(_post, f"{base}/t/{tab_id}/send/", token, cookies)
        assert status == 200, status
        # The idle status after the turn's own running one (the catch-up said idle too).
        running = False
        while True:
            frame = await ws.recv()
            running = running or bool(RUNNING_RE.search(frame))
            if running and IDLE_RE.search(frame):
                break
        seconds = time.perf_counter() - start
    # The socket's close is the page's, not the turn's; read the counters after it settles.
    turn_cpu, turn_sql = cpu_seconds(server.pid), await asyncio.to_thread(statements, base)
    return {
        "page_cpu_ms": (opened_cpu - cpu) * 1000,
        "page_statements": opened_sql - sql,
        "turn_cpu_ms": (turn_cpu - opened_cpu) * 1000,
        "turn_statements": turn_sql - opened_sql,
        "turn_seconds": seconds,
    }


async def _bare(server) -> None:
    async with websockets.connect(f"ws://127.0.0.1:{server.port}/bare/") as ws:
        async for frame in ws:
            if frame == "END":
                break


def _round(server, cookie: str) -> dict:
    """TURNS turns, each on a fresh tab with its page open, then TURNS bare sockets: the
    CPU of each side in total (the clock counts in ticks of 10 ms), per turn."""
    tab_ids = [str(bench_tab(STAMPED_MODEL).pk) for _ in range(TURNS)]
    rows = [asyncio.run(_page_and_turn(server, cookie, tab_id)) for tab_id in tab_ids]
    before = cpu_seconds(server.pid)
    for _ in range(TURNS):
        asyncio.run(_bare(server))
    bare_ms = (cpu_seconds(server.pid) - before) * 1000 / TURNS
    totals = {key: sum(r[key] for r in rows) / TURNS for key in rows[0]}
    return {**totals, "bare_cpu_ms": bare_ms}


def run() -> dict:
    cookie = cookie_header(bench_session())
    with bench_server("1", "100", os.environ["DISPATCH_DATA_DIR"]) as server:
        # Untimed: the first turn imports and warms what every later one reuses.
        asyncio.run(_page_and_turn(server, cookie, str(bench_tab(STAMPED_MODEL).pk)))
        rounds = [_round(server, cookie) for _ in range(ROUNDS)]
    result = {key: summary([r[key] for r in rounds]) for key in rounds[0]}
    result["turn_cpu_ratio"] = round(
        result["turn_cpu_ms"]["median"] / max(result["bare_cpu_ms"]["median"], 1e-9), 1
    )
    result["turns"] = TURNS
    print(f"  {result}", flush=True)
    return result
