"""The scaled mode (two web processes and two workers on PostgreSQL and Redis) against the
embedded one, in one run:

- 100 tabs streaming at 100 tokens/s, a page's socket open on each: server CPU per 1,000
  tokens over all four processes (and per kind) and the token delay, beside the embedded
  mode's same 100 tabs (one daphne process on SQLite, as bench/streaming.py runs them).
  Half the sockets are on each web process, and each tab's message is posted to the other
  one, so a turn's ops go from a worker through Redis to any web process.
- The memory of an open idle page: the web processes' RSS before and after 1,000 sockets
  (one per tab) that say hello and sit idle.

With PostgreSQL or Redis unreachable the section records why it was skipped.

    python -m bench.scaled prepare STREAM_TABS IDLE_TABS   # run by the bench itself
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import websockets

from bench.common import IDLE_RE, bench_server, bench_session, bench_tab, cpu_seconds, setup_django
from bench.server import STAMPED_MODEL
from bench.streaming import PACE, RUN_TIMEOUT, STAMP_RE, TOKENS, _csrf, _post, stats
from bench.worker import READY_LINE
from harness.login import cookie_header
from harness.servers import Proc, stop_all
from harness.services import (
    CHANNEL_LAYER_PREFIX,
    POSTGRES_ADMIN_URL,
    scratch_database,
    scratch_redis,
    unreachable_services,
)

STREAM_TABS = 100
IDLE_TABS = 1000
WEB_PROCESSES = 2
WORKERS = 2
# Messages posted at once, as bench/streaming.py posts them. (Each web process's
# PostgreSQL connections are a pool of DATABASE_POOL_SIZE; the peak is in the results,
# `pg_connections_peak`. Kept per request thread before, 32 at once reached PostgreSQL's
# limit of 100 clients.)
POST_THREADS = 32
# Sockets opened (and closed) at once: daphne's listen backlog is 50, and a burst past it waits on
# SYN retries (a second or more), which is not what this measures.
CONNECT_BATCH = 40
# After the last idle socket's hello, the web processes' catch-up and subscriptions settle
# within this (a hello on an empty tab is a few queries); RSS is read after it.
IDLE_SETTLE_SECONDS = 3.0
# Sockets opened and closed on each web process before the idle baseline is read, so the
# baseline holds what a first socket costs once (imports, caches, the user's hub).
WARM_SOCKETS = 10
# Turns run before the streaming run is timed: a few on each web process, most likely on
# each worker too (the first free one takes a turn).
WARM_TURNS = 4


# A page whose socket has brought nothing for this long, while no other page has either,
# will not see its turn end (its last ops were lost): the run stops waiting for it.
QUIET_SECONDS = 10.0
# How often the database's connections are counted while a phase runs.
PG_POLL_SECONDS = 0.1


@dataclass
class Prepared:
    """What `prepare` made in the scaled database: sessions and tab ids."""

    stream_session: str
    stream_tabs: list[str]
    idle_session: str
    idle_tabs: list[str]


def prepare(stream_tabs: int, idle_tabs: int) -> Prepared:
    """Run in a child on the scaled database (this process's Django is the embedded
    bench's): migrate, then a user with `stream_tabs` tabs on the stamped model and another
    with `idle_tabs` empty tabs, so the streaming user's sidebar holds its own tabs only."""
    from django.contrib.auth import get_user_model

    from chat.preferences import new_tab
    from harness.login import session_for

    stream = [str(bench_tab(STAMPED_MODEL).pk) for _ in range(stream_tabs)]
    idle_user = get_user_model().objects.create_user("idle")
    idle = [str(new_tab(idle_user, STAMPED_MODEL).pk) for _ in range(idle_tabs)]
    return Prepared(bench_session(), stream, session_for(idle_user), idle)


def rss_bytes(pid: int) -> int:
    """A process's resident set size now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Cluster:
    """The bench's scaled deployment: web processes (`bench.server`, daphne, no embedded
    worker with REDIS_URL set) and workers (`bench.worker`)."""

    webs: list[Proc]
    workers: list[Proc]

    @property
    def all(self) -> list[Proc]:
        return self.webs + self.workers

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far, by process name."""
        return {p.name: cpu_seconds(p.pid) for p in self.all}

    def log_counts(self) -> dict[str, int]:
        """Lines so far in all the processes' logs: errors, and pages caught up from the
        database because ops did not reach them (a full or expired channel drops them)."""
        logs = [p.log() for p in self.all]
        return {
            "errors": sum(log.count(" ERROR ") for log in logs),
            "catch_ups": sum(log.count("catching the client up again") for log in logs),
        }


class Services:
    """What PostgreSQL (this database's connections) and Redis (the whole server, which
    other users of this machine may share) do while a phase runs: the peak number of
    connections, and CPU seconds, polled in a thread."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database = urllib.parse.urlsplit(database_url).path.strip("/")
        self.redis_url = redis_url
        self.peak = self.backlog = 0
        self.pg_cpu: dict[int, tuple[float, float]] = {}  # pid: (first seen, last seen)

    def _redis(self) -> tuple[float, int]:
        """The Redis server's CPU seconds and commands so far."""
        import redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            cpu, stats = client.info("cpu"), client.info("stats")
        finally:
            client.close()
        return (
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            int(stats["total_commands_processed"]),
        )

    def _poll(self, admin, redis_client, first: bool) -> None:
        # All the channels of a process are one sorted set in Redis (channels_redis' design),
        # and a send finding CHANNEL_CAPACITY messages in it is dropped: the deepest backlog
        # says whether a process fell that far behind.
        for key in redis_client.scan_iter(match=f"{CHANNEL_LAYER_PREFIX}specific.*"):
            self.backlog = max(self.backlog, redis_client.zcard(key))
        query = "SELECT pid FROM pg_stat_activity WHERE datname = %s"
        pids = [pid for (pid,) in admin.execute(query, (self.database,)).fetchall()]
        self.peak = max(self.peak, len(pids))
        for pid in pids:
            with contextlib.suppress(OSError):
                now = cpu_seconds(pid)
                # A backend started during the phase counts from its start.
                start = self.pg_cpu.get(pid, (now if first else 0.0, 0.0))[0]
                self.pg_cpu[pid] = (start, now)

    @contextlib.contextmanager
    def watch(self) -> Iterator[dict]:
        """Yields a dict that holds, once the block is left, the phase's figures."""
        import psycopg
        import redis

        found: dict = {}
        stop = threading.Event()
        self.peak, self.backlog, self.pg_cpu = 0, 0, {}
        redis_before = self._redis()
        redis_client = redis.Redis.from_url(self.redis_url)
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            self._poll(admin, redis_client, first=True)

            def poll() -> None:
                while not stop.wait(PG_POLL_SECONDS):
                    self._poll(admin, redis_client, first=False)

            thread = threading.Thread(target=poll, daemon=True)
            thread.start()
            try:
                yield found
            finally:
                stop.set()
                thread.join()
                self._poll(admin, redis_client, first=False)
                redis_client.close()
        found["pg_connections_peak"] = self.peak
        found["pg_backends_cpu_seconds"] = round(sum(b - a for a, b in self.pg_cpu.values()), 2)
        redis_after = self._redis()
        found["redis_server_cpu_seconds"] = round(redis_after[0] - redis_before[0], 2)
        found["redis_commands"] = redis_after[1] - redis_before[1]
        found["redis_channel_backlog_peak"] = self.backlog


def cluster_env(workdir: Path, database_url: str, redis_url: str) -> dict[str, str]:
    """The environment of every process of the scaled deployment (and of `prepare`)."""
    return {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "DISPATCH_DATA_DIR": str(workdir),
        # One key for all processes: the sessions depend on it.
        "SECRET_KEY": secrets.token_urlsafe(40),
        "PYTHONUNBUFFERED": "1",
    }


@contextlib.contextmanager
def scaled_cluster(workdir: Path, env: dict[str, str]) -> Iterator[Cluster]:
    """The processes, started once `prepare` has migrated the database (each process's
    own migrate then finds nothing to do, and four at once never race on it)."""
    args = [str(TOKENS), str(PACE), str(workdir)]
    webs = [
        Proc(
            f"web{i}",
            [sys.executable, "-m", "bench.server", "0", *args],
            env,
            workdir / f"web{i}.log",
        )
        for i in range(WEB_PROCESSES)
    ]
    workers = [
        Proc(
            f"worker{i}",
            [sys.executable, "-m", "bench.worker", *args],
            env,
            workdir / f"worker{i}.log",
        )
        for i in range(WORKERS)
    ]
    try:
        for proc in webs + workers:
            proc.start()
        for web in webs:
            web.listening()
        for worker in workers:
            worker.wait_for(READY_LINE)
        yield Cluster(webs, workers)
    finally:
        stop_all(webs + workers)


def _prepare_in_child(cluster_env: dict[str, str], workdir: Path) -> Prepared:
    proc = Proc(
        "prepare",
        [sys.executable, "-m", "bench.scaled", "prepare", str(STREAM_TABS), str(IDLE_TABS)],
        cluster_env,
        workdir / "prepare.log",
    ).start()
    code = proc.reap(timeout=RUN_TIMEOUT)
    lines = proc.log().strip().splitlines()
    if code != 0 or not lines:
        raise RuntimeError(f"bench.scaled prepare exited {code}:\n{proc.log_tail()}")
    return Prepared(**json.loads(lines[-1]))


async def pages_run(cookie: str, targets: list[tuple[str, int, str]]) -> dict:
    """As bench.streaming.app_run, each tab's socket and POST where `targets` says:
    (tab id, its socket's port, the base URL its message is posted to). A page still
    waiting for its idle status after RUN_TIMEOUT is given up on, and counted."""
    delays: list[float] = []
    counts = dict.fromkeys((t for t, _, _ in targets), 0)
    last_frame = time.perf_counter()

    async def watch(tab_id: str, port: int, ready: asyncio.Event) -> None:
        nonlocal last_frame
        seen: set[str] = set()
        headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
        async with websockets.connect(
            f"ws://127.0.0.1:{port}/ws/tabs/{tab_id}/", additional_headers=headers, max_size=None
        ) as ws:
            await ws.send('{"type": "hello", "last_seq": 0}')
            ready.set()
            async for frame in ws:
                last_frame = time.perf_counter()
                now = time.time_ns()
                for stamp in STAMP_RE.findall(frame):
                    if stamp not in seen:
                        seen.add(stamp)
                        delays.append((now - int(stamp)) / 1e6)
                        counts[tab_id] += 1
                if counts[tab_id] and IDLE_RE.search(frame):
                    return

    readies = [asyncio.Event() for _ in targets]
    watchers = [
        asyncio.create_task(watch(tab_id, port, ready))
        for (tab_id, port, _), ready in zip(targets, readies, strict=True)
    ]
    await asyncio.gather(*(r.wait() for r in readies))
    tab_id, _, base = targets[0]
    token, cookies = await asyncio.to_thread(_csrf, base, cookie, tab_id)
    start = time.perf_counter()
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=POST_THREADS) as pool:
        statuses = await asyncio.gather(
            *(
                loop.run_in_executor(pool, _post, f"{base}/t/{t}/send/", token, cookies)
                for t, _, base in targets
            )
        )
    assert set(statuses) == {200}, statuses
    pending = set(watchers)
    while pending and time.perf_counter() - start < RUN_TIMEOUT:
        if time.perf_counter() - last_frame > QUIET_SECONDS:
            break
        _, pending = await asyncio.wait(pending, timeout=1.0)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in watchers:
        if not task.cancelled():
            task.result()
    return {
        "tokens": sum(counts.values()),
        "seconds": last_frame - start,
        "delays": delays,
        "pages_finished": len(watchers) - len(pending),
        "unfinished": [t for (t, _, _), w in zip(targets, watchers, strict=True) if w in pending],
    }


def _stream(cluster: Cluster, prepared: Prepared, services: Services) -> dict:
    webs = cluster.webs
    targets = [
        (tab_id, webs[i % len(webs)].port, webs[(i + 1) % len(webs)].url)
        for i, tab_id in enumerate(prepared.stream_tabs)
    ]
    # Untimed: a turn on each web process, so each process's first turn (its imports, its
    # templates) is not counted, as bench/streaming.py does; the idle user's tabs, so the
    # streaming user's sidebar holds its own tabs only.
    warm_tabs = prepared.idle_tabs[-WARM_TURNS:]
    warm = [(t, webs[i % len(webs)].port, webs[i % len(webs)].url) for i, t in enumerate(warm_tabs)]
    asyncio.run(pages_run(cookie_header(prepared.idle_session), warm))
    logs = cluster.log_counts()
    before = cluster.cpu()
    with services.watch() as found:
        run = asyncio.run(pages_run(cookie_header(prepared.stream_session), targets))
        after = cluster.cpu()
    used = {name: after[name] - before[name] for name in after}
    row = stats(run, sum(used.values()))
    row["pages_finished"] = run["pages_finished"]
    row["unfinished_tabs"] = run["unfinished"]
    per_1k = 1e6 / max(run["tokens"], 1)
    row["cpu_ms_per_1k_tokens_by_process"] = {n: round(s * per_1k, 1) for n, s in used.items()}
    for kind, procs in (("web", cluster.webs), ("worker", cluster.workers)):
        row[f"{kind}_cpu_ms_per_1k_tokens"] = round(sum(used[p.name] for p in procs) * per_1k, 1)
    row["services"] = found
    row["log_lines"] = {k: n - logs[k] for k, n in cluster.log_counts().items()}
    return row


async def _open_pages(cookie: str, targets: list[tuple[str, int]]) -> list:
    """A socket per (tab id, port), each having said hello, opened CONNECT_BATCH at a time."""
    gate = asyncio.Semaphore(CONNECT_BATCH)

    async def page(tab_id: str, port: int):
        headers = {"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"}
        async with gate:
            ws = await websockets.connect(
                f"ws://127.0.0.1:{port}/ws/tabs/{tab_id}/", additional_headers=headers
            )
            await ws.send('{"type": "hello", "last_seq": 0}')
        return ws

    return list(await asyncio.gather(*(page(t, p) for t, p in targets)))


async def _answered(sockets: list) -> int:
    """How many of `sockets` get a frame within IDLE_SETTLE_SECONDS (their hello's answer)."""

    async def one(ws) -> bool:
        try:
            async with asyncio.timeout(IDLE_SETTLE_SECONDS):
                await ws.recv()
        except TimeoutError:
            return False
        return True

    return sum(await asyncio.gather(*(one(ws) for ws in sockets)))


async def _close(sockets: list) -> None:
    """Close them CONNECT_BATCH at a time: each close is a few Redis commands on its web
    process, and redis-py's pool fails a command past 100 at once (MaxConnectionsError)."""
    gate = asyncio.Semaphore(CONNECT_BATCH)

    async def close(ws) -> None:
        async with gate:
            await ws.close()

    await asyncio.gather(*(close(ws) for ws in sockets))


def _idle_memory(cluster: Cluster, prepared: Prepared) -> dict:
    webs = cluster.webs
    cookie = cookie_header(prepared.idle_session)

    def rss() -> dict[str, int]:
        return {w.name: rss_bytes(w.pid) for w in cluster.all}

    async def measure() -> dict:
        warm = [(t, w.port) for t in prepared.idle_tabs[:WARM_SOCKETS] for w in webs]
        sockets = await _open_pages(cookie, warm)
        await _answered(sockets)
        await _close(sockets)
        await asyncio.sleep(IDLE_SETTLE_SECONDS)
        before = rss()
        targets = [(t, webs[i % len(webs)].port) for i, t in enumerate(prepared.idle_tabs)]
        sockets = await _open_pages(cookie, targets)
        answered = await _answered(sockets)
        await asyncio.sleep(IDLE_SETTLE_SECONDS)
        after = rss()
        await _close(sockets)
        # The web processes' own end of each close (leaving the tab's feed) runs after
        # the client's close returns; the next phase starts once it is done.
        await asyncio.sleep(IDLE_SETTLE_SECONDS)
        return {"sockets": len(sockets), "answered": answered, "before": before, "after": after}

    logs = cluster.log_counts()
    found = asyncio.run(measure())
    found["log_lines"] = {k: n - logs[k] for k, n in cluster.log_counts().items()}
    before, after = found.pop("before"), found.pop("after")
    web_delta = sum(after[w.name] - before[w.name] for w in webs)
    return {
        **found,
        "web_rss_mb_before": round(sum(before[w.name] for w in webs) / 2**20, 1),
        "web_rss_mb_after": round(sum(after[w.name] for w in webs) / 2**20, 1),
        "rss_delta_mb_by_process": {n: round((after[n] - before[n]) / 2**20, 1) for n in after},
        "web_kb_per_socket": round(web_delta / found["sockets"] / 1024, 1),
    }


def run() -> dict:
    if missing := unreachable_services():
        return {"skipped": "; ".join(missing)}
    embedded = _embedded()
    workdir = Path(tempfile.mkdtemp(prefix="dispatch-bench-scaled-"))
    with scratch_database() as database_url, scratch_redis() as redis_url:
        env = cluster_env(workdir, database_url, redis_url)
        prepared = _prepare_in_child(env, workdir)
        services = Services(database_url, redis_url)
        with scaled_cluster(workdir, env) as cluster:
            idle = _idle_memory(cluster, prepared)
            scaled = _stream(cluster, prepared, services)
    ratio = scaled["cpu_ms_per_1k_tokens"] / max(embedded["cpu_ms_per_1k_tokens"], 1e-9)
    return {
        "tabs": STREAM_TABS,
        "tokens_per_tab": TOKENS,
        "pace_per_tab": PACE,
        "web_processes": WEB_PROCESSES,
        "workers": WORKERS,
        "embedded": embedded,
        "scaled": scaled,
        "cpu_ratio": round(ratio, 2),
        "idle": idle,
    }


def _embedded() -> dict:
    """bench/streaming.py's 100-tab row, measured again in this run by this section's
    client (its messages posted POST_THREADS at a time, as the scaled mode's)."""
    cookie = cookie_header(bench_session())
    with bench_server(str(TOKENS), str(PACE), os.environ["DISPATCH_DATA_DIR"]) as server:
        # Untimed, as in bench/streaming.py: the process's first turn.
        warm = str(bench_tab(STAMPED_MODEL).pk)
        asyncio.run(pages_run(cookie, [(warm, server.port, server.url)]))
        tab_ids = [str(bench_tab(STAMPED_MODEL).pk) for _ in range(STREAM_TABS)]
        targets = [(tab_id, server.port, server.url) for tab_id in tab_ids]
        cpu = cpu_seconds(server.pid)
        app = asyncio.run(pages_run(cookie, targets))
        return {
            **stats(app, cpu_seconds(server.pid) - cpu),
            "pages_finished": app["pages_finished"],
        }


if __name__ == "__main__" and sys.argv[1:2] == ["prepare"]:
    setup_django(os.environ["DISPATCH_DATA_DIR"])
    print(json.dumps(prepare(int(sys.argv[2]), int(sys.argv[3])).__dict__), flush=True)
