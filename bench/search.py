"""Search over 1,000,000 indexed chunks on SQLite: query time, and what the index adds to a seal.

The corpus is written straight into the index tables in one transaction (bodies
made by chat.search.document from chunk data, so they are what log.append would
index), then the FTS table is built from them in one statement: minutes through
log.append, seconds this way. A query never reads chat_chunk, so the corpus has
no chunk rows, only the tabs the hits are joined to.

Words follow a Zipf law over a made-up vocabulary, so queries range from a word
in a third of the chunks to one in a handful, as in real logs.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid

from bench.common import bench_tab

CHUNKS = 1_000_000
TABS = 200
VOCABULARY = 20_000
# Of the shapes fill_tab uses: user text, thinking, answer, tool call, tool result.
WORDS_PER_CHUNK = (12, 60, 40, 4, 30)
BATCH = 20_000
QUERY_RUNS = 400
APPENDS = 300
SEED = 13


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < VOCABULARY:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))))
    return sorted(words, key=lambda w: rng.random())


def _chunk(kind: int, text: str) -> tuple[str, str, dict]:
    if kind == 0:
        return "user", "text", {"text": text}
    if kind == 1:
        return "assistant", "thinking", {"text": text, "signature": "s" * 64}
    if kind == 2:
        return "assistant", "text", {"text": text}
    if kind == 3:
        return "assistant", "tool_call", {"name": "shell", "arguments": {"command": text}}
    return "tool", "tool_result", {"name": "shell", "result": text, "is_error": False}


def _build(vocab: list[str], rng: random.Random) -> list[uuid.UUID]:
    from django.db import connection, transaction

    from chat import search

    weights = [1 / (rank + 1) for rank in range(len(vocab))]
    cum: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cum.append(total)
    tabs = [bench_tab("offline/demo").pk for _ in range(TABS)]
    seqs = dict.fromkeys(tabs, 0)
    with transaction.atomic(), connection.cursor() as cursor:
        rows = []
        for n in range(CHUNKS):
            # Tabs interleave, as when many are in use: a tab's chunks are spread over the index.
            tab = tabs[rng.randrange(TABS)]
            seqs[tab] += 1
            kind = n % len(WORDS_PER_CHUNK)
            text = " ".join(rng.choices(vocab, cum_weights=cum, k=WORDS_PER_CHUNK[kind]))
            role, type_, data = _chunk(kind, text)
            rows.append(
                (uuid.uuid4().hex, tab.hex, seqs[tab], role, type_, search.document(type_, data))
            )
            if len(rows) >= BATCH:
                cursor.executemany(
                    f"INSERT INTO {search.TABLE} (chunk_id, tab_id, seq, role, type, body) "
                    "VALUES (%s, %s, %s, %s, %s, %s)",
                    rows,
                )
                rows = []
        if rows:
            cursor.executemany(
                f"INSERT INTO {search.TABLE} (chunk_id, tab_id, seq, role, type, body) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                rows,
            )
        cursor.execute(
            f"INSERT INTO {search.FTS_TABLE} (rowid, body) SELECT id, body FROM {search.TABLE}"
        )
        cursor.execute(f"INSERT INTO {search.FTS_TABLE} ({search.FTS_TABLE}) VALUES ('optimize')")
    from chat.models import Tab

    for tab, last in seqs.items():
        Tab.objects.filter(pk=tab).update(last_seq=last)
    return tabs


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "runs": len(ordered),
    }


def _queries(vocab: list[str], tabs: list[uuid.UUID], rng: random.Random) -> dict:
    from django.contrib.auth import get_user_model

    from chat import search

    user = get_user_model().objects.get(username="bench")
    # Word ranks: the commonest words match a large share of the chunks, the rarest a few.
    kinds = {
        "common word": lambda: [vocab[rng.randrange(0, 10)]],
        "middling word": lambda: [vocab[rng.randrange(100, 1_000)]],
        "rare word": lambda: [vocab[rng.randrange(10_000, VOCABULARY)]],
        "two words": lambda: [vocab[rng.randrange(0, 100)], vocab[rng.randrange(100, 2_000)]],
        "no match": lambda: ["zzzzzzzzzz"],
        "common word, one tab": lambda: [vocab[rng.randrange(0, 10)]],
        "rare word, one tab": lambda: [vocab[rng.randrange(10_000, VOCABULARY)]],
    }
    every: list[float] = []
    by_kind: dict[str, dict] = {}
    hits_by_kind: dict[str, float] = {}
    for kind, words in kinds.items():
        times, hits = [], []
        for _ in range(QUERY_RUNS // len(kinds)):
            tab = rng.choice(tabs) if "one tab" in kind else None
            q = " ".join(words())
            start = time.perf_counter()
            found = search.search(user, q, tab=tab, limit=search.DEFAULT_LIMIT)
            times.append(time.perf_counter() - start)
            hits.append(len(found))
        every += times
        by_kind[kind] = _percentiles(times)
        hits_by_kind[kind] = statistics.mean(hits)
    return {
        "all": _percentiles(every),
        "by_kind": by_kind,
        "mean_hits": {k: round(v, 1) for k, v in hits_by_kind.items()},
    }


def _write_cost(vocab: list[str], rng: random.Random) -> dict:
    """log.append of one sealed chunk, with and without the index, interleaved in one run."""
    from chat import log, search
    from chat.stream import Block

    tab = bench_tab("offline/demo").pk
    real_index = search.index

    def no_index(tab_id, chunks):
        return 0

    with_index, without = [], []
    for n in range(APPENDS * 2):
        # A typical answer: some 150 words.
        text = " ".join(rng.choices(vocab[:5_000], k=150))
        block = Block(uuid.uuid4(), uuid.uuid4(), 1, "assistant", "text", {"text": text})
        indexed = n % 2 == 0
        search.index = real_index if indexed else no_index
        try:
            start = time.perf_counter()
            log.append(tab, [block])
            elapsed = time.perf_counter() - start
        finally:
            search.index = real_index
        (with_index if indexed else without).append(elapsed)
    w, wo = statistics.median(with_index), statistics.median(without)
    return {
        "appends": APPENDS,
        "with_index_ms": round(w * 1000, 3),
        "without_index_ms": round(wo * 1000, 3),
        "added_share": round((w - wo) / wo, 3),
    }


def run() -> dict:
    from django.db import connection

    if connection.vendor != "sqlite":
        return {"skipped": "the search benchmark measures the embedded SQLite database"}
    rng = random.Random(SEED)
    vocab = _vocabulary(rng)
    start = time.perf_counter()
    tabs = _build(vocab, rng)
    build_seconds = time.perf_counter() - start
    queries = _queries(vocab, tabs, rng)
    return {
        "chunks": CHUNKS,
        "tabs": TABS,
        "build_seconds": round(build_seconds, 1),
        "query": queries,
        "write": _write_cost(vocab, rng),
    }
