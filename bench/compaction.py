"""Context compaction over a long session (issue 16; ARCHITECTURE.md, Context management): a
scripted 300-turn session of a tab whose model has a 30k-token window, through the real turn
runner, Anthropic adapter and SDK, against the fake Anthropic server billing each request
from its body (harness.fakeprovider.SimulatedCache: a prefix cache with breakpoints,
Anthropic's 20-block look-back and its 1,024-token minimum; its 5-minute lifetime runs on
the real clock, so nothing expires: requests follow each other within seconds, as for a user
who answers within 5 minutes).

Each turn: the user asks about a workspace file, the model reads it (read_file, 2 to
6 KB of real tool output), then answers. A summary request (the one ending with
chat.context.ASK) is answered with a summary of about 1.5k tokens. The same session
runs twice, on two tabs: as Dispatch compacts (the summary request is the live
request plus one message), and with a naive compaction that sends the same messages
with no system prompt and no tools, as peers do (only in this process: the product
is not changed for it). The figures are ratios of the two, so the window is small to
make the session compact many times.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import bench_owner, bench_tab
from chat import context
from harness.fakeprovider import FakeProviderServer, Recorded, Reply, SimulatedCache

TURNS = 300
MODEL = "anthropic/claude-sonnet-4-5"
# Small enough that 300 turns of ~1k tokens each cross COMPACT_AT many times.
WINDOW = 30_000
# Files the questions go round; sizes spread over 2 to 6 KB, some past
# context.ELIDE_MIN_CHARS (elided when a compaction keeps them).
FILES = 24
FILE_CHARS = (2_000, 6_000)
ANSWER_CHARS = 700
# About 1.5k tokens: a summary of a long working session.
SUMMARY_CHARS = 6_000
# Billing weights of Anthropic's 5-minute cache: a write costs 1.25x an input
# token, a read 0.1x.
WRITE_WEIGHT = 1.25
READ_WEIGHT = 0.1
# A request that read less than this share of its prompt from the cache is a miss.
MISS_BELOW = 0.5
# Bound on one turn (a few requests to a local server).
TURN_TIMEOUT = 60.0
SETTLE_POLL = 0.02

QUESTION = re.compile(r"`(src/[\w.]+)`")


def _file_text(i: int) -> str:
    lo, hi = FILE_CHARS
    size = lo + (hi - lo) * ((i * 7) % FILES) // (FILES - 1)
    lines, n = [], 0
    while sum(len(line) + 1 for line in lines) < size:
        lines.append(f"def step_{i}_{n}(value: int) -> int:  # line {n} of module {i}")
        lines.append(f"    return value * {n + 3} + {i}")
        n += 1
    return "\n".join(lines)[:size]


def _path(i: int) -> str:
    return f"src/module_{i % FILES:02d}.py"


def _question(turn: int) -> str:
    return (
        f"Turn {turn}: read `{_path(turn)}` and tell me what its functions do and "
        "whether any of them could overflow."
    )


def _events(*blocks: dict[str, Any], stop: str) -> list[dict[str, Any]]:
    """A Messages API stream of these content blocks; usage is the server's."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 1},
            },
        }
    ]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": block["json"]}
        events += [
            {"type": "content_block_start", "index": index, "content_block": start},
            {"type": "content_block_delta", "index": index, "delta": delta},
            {"type": "content_block_stop", "index": index},
        ]
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    return events


def _repeat(sentence: str, chars: int) -> str:
    return (sentence * (chars // len(sentence) + 1))[:chars]


def respond(request: Recorded) -> Reply:
    """The model of the session: a summary for a summary request, a read_file call for
    a question, an answer after the file's content."""
    messages = request.json["messages"]
    last = messages[-1]["content"][-1]
    if last["type"] == "text" and last["text"].startswith(context.ASK):
        head = f"Summary of a session of {len(messages)} messages. "
        sentence = (
            "The user is reviewing the modules under src/ one by one for overflow; each "
            "function multiplies its argument by a small constant and adds the module "
            "number, so none can overflow Python integers. "
        )
        summary = head + _repeat(sentence, SUMMARY_CHARS - len(head))
        return Reply(events=_events({"type": "text", "text": summary}, stop="end_turn"))
    if last["type"] == "tool_result":
        answer = _repeat(
            "Each function returns its argument times a constant plus the module number: "
            "plain integer arithmetic, which cannot overflow in Python. ",
            ANSWER_CHARS,
        )
        return Reply(events=_events({"type": "text", "text": answer}, stop="end_turn"))
    path = QUESTION.search(last["text"]).group(1)
    call = {
        "type": "tool_use",
        "id": f"toolu_{len(messages):04d}",
        "name": "read_file",
        "json": f'{{"path": "{path}"}}',
    }
    return Reply(events=_events(call, stop="tool_use"))


def _naive_summaries():
    """Make the runner's summary request the peers' kind: the same messages, no system
    prompt and no tools (a cache miss of the whole conversation). Returns the undo."""
    from chat.turn.compaction import Compactor

    original = Compactor._summarise

    async def naive(self, request, model):
        return await original(self, replace(request, system="", tools=()), model)

    Compactor._summarise = naive
    return lambda: setattr(Compactor, "_summarise", original)


async def _session(tab, server: FakeProviderServer) -> float:
    from channels.db import database_sync_to_async
    from channels.layers import get_channel_layer

    from chat import bus, turns, worker
    from chat.models import RunningTurn

    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(bus.tab_group(tab.pk), channel)
    task = asyncio.create_task(worker.run_worker())
    start = time.perf_counter()
    try:
        for turn in range(1, TURNS + 1):
            await database_sync_to_async(turns.submit)(tab, _question(turn))
            async with asyncio.timeout(TURN_TIMEOUT):
                while True:
                    op = await layer.receive(channel)
                    if op["op"] == "status" and op["status"]["state"] == "idle":
                        break
        seconds = time.perf_counter() - start
        # The runner releases the lease after its idle status: let it, before stopping.
        while await RunningTurn.objects.filter(tab_id=tab.pk).aexists():
            await asyncio.sleep(SETTLE_POLL)
        return seconds
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await layer.group_discard(bus.tab_group(tab.pk), channel)


def _run(naive: bool) -> dict[str, Any]:
    server = FakeProviderServer(cache=SimulatedCache(), respond=respond).start()
    os.environ["ANTHROPIC_API_KEY"] = "bench-key"
    os.environ["ANTHROPIC_BASE_URL"] = server.url
    undo = _naive_summaries() if naive else None
    try:
        tab = bench_tab(MODEL)
        seconds = asyncio.run(_session(tab, server))
    finally:
        if undo is not None:
            undo()
        server.stop()
        os.environ.pop("ANTHROPIC_API_KEY", None)
        os.environ.pop("ANTHROPIC_BASE_URL", None)
    return _figures(tab, server.requests, seconds)


def _asks_summary(request: Recorded) -> bool:
    last = request.json["messages"][-1]["content"][-1]
    return last["type"] == "text" and last["text"].startswith(context.ASK)


def _kinds(requests: list[Recorded]) -> list[str]:
    """What each request was: the session's first, a summary request, the first step
    after one (the compacted conversation), or any other step."""
    kinds: list[str] = []
    for request in requests:
        if _asks_summary(request):
            kinds.append("summary")
        elif not kinds:
            kinds.append("first")
        elif kinds[-1] == "summary":
            kinds.append("compacted")
        else:
            kinds.append("step")
    return kinds


def _figures(tab, requests: list[Recorded], seconds: float) -> dict[str, Any]:
    from chat.models import Chunk, UsageRecord

    records = list(UsageRecord.objects.filter(tab_id=tab.pk).order_by("id"))
    billed = [r.usage for r in requests]
    # What the app recorded is what the server billed: the adapter read it right.
    assert [(r.input_tokens, r.cache_read_tokens, r.cache_write_tokens) for r in records] == [
        (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) for u in billed
    ], "the usage records differ from what the fake server billed"
    compactions = Chunk.objects.filter(tab=tab, type="compaction").count()
    kinds = _kinds(requests)
    assert compactions == kinds.count("summary"), "a summary request did not compact"
    errors = Chunk.objects.filter(tab=tab, type="error").count()
    assert not errors, f"the session ended {errors} turn(s) on an error"
    by_kind: dict[str, dict[str, int]] = {}
    for usage, kind in zip(billed, kinds, strict=True):
        row = by_kind.setdefault(
            kind, {"requests": 0, "cache_read": 0, "cache_write": 0, "uncached": 0, "misses": 0}
        )
        prompt = (
            usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        )
        row["requests"] += 1
        row["cache_read"] += usage.cache_read_input_tokens
        row["cache_write"] += usage.cache_creation_input_tokens
        row["uncached"] += usage.input_tokens
        row["misses"] += usage.cache_read_input_tokens < MISS_BELOW * prompt
    prompts = [r.input_tokens + r.cache_read_tokens + r.cache_write_tokens for r in records]
    read = sum(r.cache_read_tokens for r in records)
    write = sum(r.cache_write_tokens for r in records)
    uncached = sum(r.input_tokens for r in records)
    return {
        "seconds": round(seconds, 1),
        "requests": len(records),
        "compactions": compactions,
        "elisions": Chunk.objects.filter(tab=tab, data__kind=context.ELIDE).count(),
        "peak_context": max(prompts),
        "peak_share_of_window": round(max(prompts) / WINDOW, 3),
        "input_tokens": uncached + read + write,
        "cache_read": read,
        "cache_write": write,
        "uncached": uncached,
        "cache_read_share": round(read / (uncached + read + write), 4),
        "weighted_input": round(uncached + WRITE_WEIGHT * write + READ_WEIGHT * read),
        "output_tokens": sum(r.output_tokens for r in records),
        "by_kind": by_kind,
    }


def run() -> dict[str, Any]:
    from chat.providers import registry
    from chat.tools.workdir import user_workspace

    workspace = user_workspace(bench_owner().pk) / "src"
    workspace.mkdir(parents=True, exist_ok=True)
    for i in range(FILES):
        (workspace / Path(_path(i)).name).write_text(_file_text(i))
    model = registry.MODELS[MODEL]
    registry.MODELS[MODEL] = replace(model, context_window=WINDOW)
    try:
        designed = _run(naive=False)
        naive = _run(naive=True)
    finally:
        registry.MODELS[MODEL] = model
    return {
        "window": WINDOW,
        "turns": TURNS,
        "designed": designed,
        "naive": naive,
        "weighted_ratio_naive_to_designed": round(
            naive["weighted_input"] / designed["weighted_input"], 3
        ),
        "goal": "cache reads >= 90% of input; peak context under the window",
    }
