"""Shared pieces of the benchmarks: timing, a throwaway data dir, bulk tab filling, the
bench server (started by the harness's launcher)."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.servers import Proc

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A tab page's frame carrying the tab's own idle status: the turn is over. Not any
# `data-state="idle"`: the page's sidebar entries of other tabs say it too.
IDLE_RE = re.compile(r'<div id="status"[^>]*data-state="idle"')


def setup_django(data_dir: str | None = None) -> str:
    """Configure Django on a fresh data dir (SQLite unless DATABASE_URL is set); migrate."""
    data_dir = data_dir or tempfile.mkdtemp(prefix="dispatch-bench-")
    os.environ["DISPATCH_DATA_DIR"] = data_dir
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch.settings")
    os.environ.setdefault("DISPATCH_OFFLINE_PACE", "0")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return data_dir


def measure(fn: Callable[[], Any], *, runs: int = 5, warmup: int = 1) -> dict[str, float]:
    """Seconds per call of `fn`: median, min and max over `runs` after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return summary(times)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def fill_tab(tab_id: uuid.UUID, n: int, *, batch: int = 5000) -> None:
    """Append `n` realistic chunks (turns of user, thinking, text, tool call and result)."""
    from chat.models import Chunk, Tab

    pattern = [
        ("user", "text", lambda i: {"text": f"Question {i}: what is in the workspace?"}),
        (
            "assistant",
            "thinking",
            lambda i: {"text": "Let me look at the files.", "signature": "s" * 64},
        ),
        ("assistant", "text", lambda i: {"text": f"Answer {i} with **markdown** and `code`."}),
        (
            "assistant",
            "tool_call",
            lambda i: {
                "call_id": f"c{(i - 1) // 5}",
                "name": "list_files",
                "arguments": {"path": "."},
            },
        ),
        (
            "tool",
            "tool_result",
            lambda i: {
                # The call's id: a result answers the call of its turn.
                "call_id": f"c{(i - 1) // 5}",
                "name": "list_files",
                "result": "file  12  notes.txt",
                "is_error": False,
            },
        ),
    ]
    rows = []
    turn_id = uuid.uuid4()
    for seq in range(1, n + 1):
        role, kind, data = pattern[(seq - 1) % len(pattern)]
        if role == "user":
            turn_id = uuid.uuid4()
        rows.append(
            Chunk(
                tab_id=tab_id,
                seq=seq,
                turn_id=turn_id,
                step=0 if role == "user" else 1,
                role=role,
                type=kind,
                data=data(seq),
            )
        )
        if len(rows) >= batch:
            Chunk.objects.bulk_create(rows)
            rows = []
    if rows:
        Chunk.objects.bulk_create(rows)
    Tab.objects.filter(pk=tab_id).update(last_seq=n)


async def run_turn(tab, text: str, on_op: Callable[[dict], None] | None = None) -> float:
    """Run one turn on an in-process worker; seconds from submit to idle."""
    import asyncio

    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer

    from chat import bus, turns, worker

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(bus.tab_group(tab.pk), channel)
    worker = asyncio.create_task(worker.run_worker())
    try:
        start = time.perf_counter()
        await database_sync_to_async(turns.submit)(tab, text, auto_approve=True)
        while True:
            message = await layer.receive(channel)
            if on_op is not None:
                on_op(message)
            if message["op"] == "status" and message["status"]["state"] == "idle":
                return time.perf_counter() - start
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await layer.group_discard(bus.tab_group(tab.pk), channel)


def bench_owner():
    """The bench user (made if missing): its tabs work in its own workspace."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get_or_create(username="bench")[0]


def bench_tab(model: str):
    """A fresh tab owned by the bench user."""
    from chat.preferences import new_tab

    return new_tab(bench_owner(), model)


def bench_session() -> str:
    """The session id of the bench user, logged in (the bench server shares the database)."""
    from django.contrib.auth import get_user_model

    from harness.login import session_for

    return session_for(get_user_model().objects.get_or_create(username="bench")[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@contextlib.contextmanager
def bench_server(*args: str, env: dict[str, str] | None = None) -> Iterator[Proc]:
    """`python -m bench.server 0 *args` on this bench's data dir (`env` on top of this
    process's environment); yields it once it listens, and stops it whatever happens."""
    log_dir = Path(os.environ["DISPATCH_DATA_DIR"])
    server = Proc(
        "bench-server",
        [sys.executable, "-m", "bench.server", "0", *args],
        {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        log_dir / "bench-server.log",
    )
    with server.start():
        yield server.listening()
