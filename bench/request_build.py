"""Time to build step N+1's request after step N, by tab length; and the cold build."""

from __future__ import annotations

import time
import uuid

from bench.common import summary

SIZES = (1_000, 10_000)
STEP_CHUNKS = 4  # thinking, text, tool call, tool result: one step's worth


def _log(n: int):
    from chat.stream import Block

    blocks, turn = [], uuid.uuid4()
    kinds = [
        ("user", "text", lambda i: {"text": f"question {i}"}),
        ("assistant", "thinking", lambda i: {"text": "hmm", "signature": "sig"}),
        ("assistant", "text", lambda i: {"text": f"answer {i}"}),
        (
            "assistant",
            "tool_call",
            lambda i: {"call_id": f"c{i}", "name": "ls", "arguments": {"p": i}},
        ),
        (
            "tool",
            "tool_result",
            lambda i: {"call_id": f"c{i}", "name": "ls", "result": "x", "is_error": False},
        ),
    ]
    for seq in range(1, n + 1):
        role, kind, data = kinds[(seq - 1) % len(kinds)]
        blocks.append(Block(uuid.uuid4(), turn, 1, role, kind, data(seq), seq))
    return blocks


def run() -> dict:
    from chat.history import History

    results = {}
    for n in SIZES:
        blocks = _log(n + STEP_CHUNKS * 50)
        base, extra = blocks[:n], blocks[n:]
        cold = []
        for _ in range(5):
            start = time.perf_counter()
            History.build(base).messages()
            cold.append(time.perf_counter() - start)
        history = History.build(base)
        history.messages()
        steps = []
        for i in range(0, len(extra), STEP_CHUNKS):
            start = time.perf_counter()
            history.extend(extra[i : i + STEP_CHUNKS])
            history.messages()
            steps.append(time.perf_counter() - start)
        results[n] = {"cold_build": summary(cold), "next_step": summary(steps)}
    small, large = results[SIZES[0]], results[SIZES[-1]]
    return {
        "by_size": {str(n): r for n, r in results.items()},
        "next_step_ratio_10k_to_1k": round(
            large["next_step"]["median"] / small["next_step"]["median"], 3
        ),
        "goal": "next step flat in tab length",
    }
