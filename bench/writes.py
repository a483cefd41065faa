"""Database writes for one turn of 5,000 deltas in 20 chunks, against one write per delta."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

from bench.common import bench_tab, run_turn

DELTAS = 5000
BLOCKS = 20
# The stream's pace: fast enough to finish in seconds, slow enough that the
# checkpoint debounce has real time to act on (about 5 s of streaming).
DELTA_INTERVAL = 0.001

WRITE = re.compile(r'^\s*(INSERT INTO|UPDATE|DELETE FROM)\s+"?(\w+)"?', re.I)


def run() -> dict:
    from channels.db import database_sync_to_async
    from django.db import connection

    from chat import search
    from chat.models import Tab
    from chat.providers.base import Finish, ReasoningDelta, ReasoningEnd, TextDelta
    from chat.providers.replay import ScriptedProvider
    from chat.turn import step

    per_block = DELTAS // BLOCKS
    events = []
    for b in range(BLOCKS):
        if b % 2 == 0:
            events += [ReasoningDelta("t ") for _ in range(per_block)] + [ReasoningEnd("sig")]
        else:
            events += [TextDelta("w ") for _ in range(per_block)]
    provider = ScriptedProvider([[*events, Finish()]], delay=DELTA_INTERVAL)

    async def provider_for(model):
        return provider

    original, step.provider_for = step.provider_for, provider_for
    writes: Counter = Counter()
    real_index = search.index

    def index(tab_id, chunks):
        # On SQLite the index writes on the driver's connection, which Django's
        # execute wrappers (the counter below) do not see: counted here instead.
        rows = real_index(tab_id, chunks)
        if connection.vendor == "sqlite":
            writes[("INSERT", search.TABLE)] += rows
            writes[("INSERT", search.FTS_TABLE)] += rows * (search.SQLITE_STATEMENTS_PER_ROW - 1)
        return rows

    search.index = index

    def counter(execute, sql, params, many, context):
        if m := WRITE.match(sql):
            writes[(m.group(1).split()[0].upper(), m.group(2))] += 1
        return execute(sql, params, many, context)

    async def main():
        await database_sync_to_async(lambda: connection.execute_wrappers.append(counter))()
        tab = await database_sync_to_async(bench_tab)("scripted/bench")
        writes.clear()
        frames = Counter()
        elapsed = await run_turn(tab, "go", lambda m: frames.update([m["op"]]))
        chunks = await Tab.objects.filter(pk=tab.pk).values_list("last_seq", flat=True).aget()
        return elapsed, frames["delta"], chunks

    try:
        elapsed, frames, chunks = asyncio.run(main())
    finally:
        step.provider_for = original
        search.index = real_index
    by_kind = {f"{verb} {table}": n for (verb, table), n in sorted(writes.items())}
    total = sum(writes.values())
    checkpoints = writes[("UPDATE", "chat_runningturn")]
    chunk_inserts = writes[("INSERT", "chat_chunk")]
    return {
        "deltas": DELTAS,
        "sealed_chunks": chunk_inserts,
        "chunks_in_log": chunks,
        "stream_seconds": round(elapsed, 2),
        "write_statements": total,
        "running_turn_updates": checkpoints,
        "checkpoint_updates_per_second": round(checkpoints / elapsed, 2),
        "naive_writes": DELTAS,
        "ratio_to_naive": round(total / DELTAS, 4),
        "delta_broadcasts": frames,
        "by_statement": by_kind,
    }
