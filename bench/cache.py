"""Prompt-cache stability: a 10-step tool-use turn through the real Anthropic adapter and SDK
against the fake Anthropic server; how much of each request is an exact prefix of the next."""

from __future__ import annotations

import asyncio
import json
import os

from bench.common import bench_tab, run_turn
from harness.fakeprovider import FakeProviderServer, Reply

STEPS = 10


def _tool_step(n: int) -> list[dict]:
    call = {"type": "tool_use", "id": f"toolu_{n:02d}", "name": "list_files", "input": {}}
    return [
        {
            "type": "message_start",
            "message": {
                "id": f"msg_{n}",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-sonnet-4-5",
                "usage": {"input_tokens": 100, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": f"Step {n}: looking again."},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": call},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"path": "."}'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 12},
        },
        {"type": "message_stop"},
    ]


def _final_step() -> list[dict]:
    steps = _tool_step(STEPS)
    return [*steps[:4], steps[-2] | {"delta": {"stop_reason": "end_turn"}}, steps[-1]]


def _strip_cache_control(value):
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _content(body: dict) -> bytes:
    """What the cache matches on, in its order: tools, system, messages (markers removed)."""
    parts = {k: _strip_cache_control(body.get(k)) for k in ("tools", "system", "messages")}
    return json.dumps(parts, sort_keys=False, separators=(",", ":")).encode()


def _breakpoints(body: dict) -> list[str]:
    where = []
    for i, tool in enumerate(body.get("tools") or []):
        if "cache_control" in tool:
            where.append(f"tools[{i}]")
    system = body.get("system")
    if isinstance(system, list):
        for i, block in enumerate(system):
            if "cache_control" in block:
                where.append(f"system[{i}]")
    for m, message in enumerate(body.get("messages") or []):
        content = message.get("content")
        if isinstance(content, list):
            for b, block in enumerate(content):
                if "cache_control" in block:
                    where.append(f"messages[{m}].content[{b}]:{block.get('type')}")
    return where


def run() -> dict:
    server = FakeProviderServer().start()
    try:
        for n in range(1, STEPS):
            server.add(Reply(events=_tool_step(n)))
        server.add(Reply(events=_final_step()))
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        os.environ["ANTHROPIC_BASE_URL"] = server.url
        tab = bench_tab("anthropic/claude-sonnet-4-5")
        asyncio.run(run_turn(tab, "List the files again and again."))
        bodies = [r.body for r in server.requests]
        parsed = [json.loads(b) for b in bodies]
    finally:
        server.stop()
        os.environ.pop("ANTHROPIC_API_KEY", None)
        os.environ.pop("ANTHROPIC_BASE_URL", None)
    pairs = []
    for prev, cur, prev_json, cur_json in zip(bodies, bodies[1:], parsed, parsed[1:], strict=False):
        prev_content, cur_content = _content(prev_json), _content(cur_json)
        # Everything of the previous request except its closing brackets is "before the new step".
        before_new = len(prev_content) - len(b"]}")
        pairs.append(
            {
                "raw_prefix_share_of_previous": round(_prefix(prev, cur) / len(prev), 4),
                "content_prefix_share_of_previous": round(
                    min(_prefix(prev_content, cur_content), before_new) / before_new, 4
                ),
            }
        )
    return {
        "requests": len(bodies),
        "content_prefix_share_min": min(p["content_prefix_share_of_previous"] for p in pairs),
        "raw_prefix_share_min": min(p["raw_prefix_share_of_previous"] for p in pairs),
        "pairs": pairs,
        "breakpoints_last_request": _breakpoints(parsed[-1]),
        "breakpoint_counts": [len(_breakpoints(p)) for p in parsed],
        "goal": "100% of everything before the new step (content, cache markers aside)",
    }
