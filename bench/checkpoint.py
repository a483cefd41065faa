"""Bytes a running turn writes to the database for its open block's checkpoints.

Bytes are what the write statements carry: the sizes of their parameters (text
and JSON as UTF-8, timestamps and ids as the driver gets them), captured on
Django's connection. For comparison, a write of the whole block each time (as
JSON, on the lease row) is measured the same way, run on a second tab's lease
row next to each checkpoint.

- Per second, at 100 tokens/s, on the turn runner (its debounce, its thread):
  the open text block already 10 KB and 1 MB long, then 8 s of tokens; the
  bytes of every write between the first checkpoint after the long prefix and
  the last one before the seal (heartbeats included), over that time.
- In total, for a 500 KB block streamed at 100 tokens/s: log.checkpoint on the
  runner's schedule (chat.pacing.Debouncer on a simulated clock, 1,000 s of
  stream in a few seconds), then the rebuild a reconnecting socket reads.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import contextmanager
from typing import Any

from bench.common import bench_tab, run_turn

RATE = 100.0  # tokens per second
TOKEN_CHARS = 5
SIZES = (10_000, 1_000_000)
STREAM_SECONDS = 8
TOTAL_SIZE = 500_000


def _token(n: int) -> str:
    return f"w{n % 1000:03d} "


def _size(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return len(str(value).encode())


class Writes:
    """Write statements as they run: (time, bytes, whether it is the whole-block write)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, bool]] = []
        self.old = False

    def __call__(self, execute, sql, params, many, context):
        if sql.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            lists = params if many else [params]
            size = sum(_size(p) for ps in lists for p in (ps or ()))
            self.rows.append((time.monotonic(), size, self.old))
        return execute(sql, params, many, context)

    @contextmanager
    def as_old(self):
        self.old = True
        try:
            yield
        finally:
            self.old = False

    def between(self, start: float, end: float, *, old: bool) -> int:
        return sum(b for t, b, o in self.rows if start < t <= end and o == old)


def _shadow(owner_tab) -> Any:
    """A second tab with a lease row, for the whole-block write to land on."""
    from django.utils import timezone

    from chat.models import RunningTurn

    tab = bench_tab(owner_tab.model)
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="bench", heartbeat_at=timezone.now()
    )
    return tab


def _old_write(writes: Writes, shadow_id: uuid.UUID, block) -> None:
    """The checkpoint pieces are compared with: the whole block, as JSON, on the lease row."""
    from django.utils import timezone

    from chat.models import RunningTurn

    now = timezone.now()
    with writes.as_old():
        RunningTurn.objects.filter(tab_id=shadow_id).update(
            open_header=block.to_dict(), checkpointed_at=now, heartbeat_at=now
        )


def per_second(writes: Writes, size: int) -> dict:
    """One turn on the runner: a `size` prefix, then STREAM_SECONDS of tokens."""
    from chat import log
    from chat.providers.base import Finish, TextDelta
    from chat.providers.replay import ScriptedProvider
    from chat.turn import step

    prefix = "".join(_token(n) for n in range(size // TOKEN_CHARS))
    tokens = [TextDelta(_token(n)) for n in range(int(RATE * STREAM_SECONDS))]
    provider = ScriptedProvider([[TextDelta(prefix), *tokens, Finish()]], delay=1 / RATE)

    async def provider_for(model):
        return provider

    tab = bench_tab("scripted/bench")
    shadow = _shadow(tab)
    done: list[float] = []
    real_checkpoint = log.checkpoint

    def checkpoint(tab_id, block, stored):
        real_checkpoint(tab_id, block, stored)
        _old_write(writes, shadow.pk, block)
        done.append(time.monotonic())

    original, step.provider_for = step.provider_for, provider_for
    log.checkpoint = checkpoint
    try:
        elapsed = asyncio.run(run_turn(tab, "go"))
    finally:
        step.provider_for = original
        log.checkpoint = real_checkpoint
    # From the end of the checkpoint that wrote the prefix (not what streaming
    # costs) to the end of the last one.
    start, end = done[0], done[-1]
    seconds = end - start
    new = writes.between(start, end, old=False)
    old = writes.between(start, end, old=True)
    return {
        "block_chars": size,
        "checkpoints": len(done) - 1,
        "seconds": round(seconds, 2),
        "bytes_per_second": round(new / seconds),
        "old_bytes_per_second": round(old / seconds),
        "turn_seconds": round(elapsed, 2),
    }


def total(writes: Writes) -> dict:
    """A TOTAL_SIZE block at RATE tokens/s, checkpointed on the runner's schedule."""
    from django.utils import timezone

    from chat import log
    from chat.models import RunningTurn
    from chat.pacing import Debouncer
    from chat.stream import Block

    tab = bench_tab("scripted/bench")
    shadow = _shadow(tab)
    running = RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="bench", heartbeat_at=timezone.now()
    )
    block = Block(uuid.uuid4(), running.turn_id, 1, "assistant", "text", {"text": ""})
    debouncer, check_at = Debouncer(), None
    pending: list[str] = []
    stored: int | None = None
    checkpoints = 0
    start = time.monotonic()

    def flush() -> None:
        nonlocal stored, checkpoints
        block.data["text"] += "".join(pending)
        pending.clear()
        log.checkpoint(tab.pk, block, stored)
        stored = len(block.data["text"])
        _old_write(writes, shadow.pk, block)
        checkpoints += 1

    n = 0
    while len(block.data["text"]) + len(pending) * TOKEN_CHARS < TOTAL_SIZE:
        now = n / RATE
        while check_at is not None and check_at <= now:
            check_at = debouncer.check(check_at)
            if check_at is None:
                flush()
        pending.append(_token(n))
        n += 1
        if (due := debouncer.touch(now)) is not None:
            check_at = due
    flush()
    simulated = time.monotonic() - start
    new = writes.between(start, time.monotonic(), old=False)
    old = writes.between(start, time.monotonic(), old=True)

    read_start = time.perf_counter()
    rebuilt = log.checkpointed(tab.pk)
    read_ms = (time.perf_counter() - read_start) * 1000
    assert rebuilt == block, "the pieces do not rebuild the block"
    pieces = running.pieces.count()
    running.delete()
    return {
        "block_chars": len(block.data["text"]),
        "stream_seconds": round(n / RATE),
        "checkpoints": checkpoints,
        "pieces": pieces,
        "bytes": new,
        "old_bytes": old,
        "ratio_old_to_new": round(old / new, 1),
        "rebuild_ms": round(read_ms, 1),
        "simulated_in_seconds": round(simulated, 1),
    }


def run() -> dict:
    from channels.db import database_sync_to_async
    from django.db import connection

    writes = Writes()

    async def install() -> None:
        # The runner's writes go through the database thread's connection.
        await database_sync_to_async(lambda: connection.execute_wrappers.append(writes))()

    asyncio.run(install())
    connection.execute_wrappers.append(writes)
    by_size = {str(size): per_second(writes, size) for size in SIZES}
    small, large = (by_size[str(s)] for s in SIZES)
    return {
        "rate_tokens_per_second": RATE,
        "by_size": by_size,
        "ratio_1mb_to_10kb": round(large["bytes_per_second"] / small["bytes_per_second"], 2),
        "old_ratio_1mb_to_10kb": round(
            large["old_bytes_per_second"] / small["old_bytes_per_second"], 1
        ),
        "total_500kb": total(writes),
    }
