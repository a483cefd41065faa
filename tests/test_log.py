"""chat.log: seq allocation under concurrency, paging windows, checkpoints, and the schema."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, connections
from django.utils import timezone

from chat import log
from chat.models import Chunk, RunningTurn, Tab
from chat.stream import Block

pytestmark = pytest.mark.django_db(transaction=True)


def text(t: str, role: str = "user") -> Block:
    return Block(uuid.uuid4(), None, 0, role, "text", {"text": t})


@pytest.fixture
def tab() -> Tab:
    return Tab.objects.create(title="t")


def test_append_allocates_consecutive_seqs_and_sets_them_on_the_blocks(tab):
    first = [text("a"), text("b")]
    log.append(tab.pk, first)
    second = [text("c")]
    log.append(tab.pk, second)
    assert [b.seq for b in first + second] == [1, 2, 3]
    assert list(Chunk.objects.filter(tab=tab).values_list("seq", "data")) == [
        (1, {"text": "a"}),
        (2, {"text": "b"}),
        (3, {"text": "c"}),
    ]
    tab.refresh_from_db()
    assert tab.last_seq == 3


def test_append_of_nothing_writes_nothing(tab):
    assert log.append(tab.pk, []) == []
    assert log.count(tab.pk) == 0


# Enough threads and rounds that unserialised allocation would collide.
THREADS = 8
APPENDS_PER_THREAD = 15


def test_concurrent_appends_from_threads_give_unique_gapless_seqs(tab):
    """Several writers on one tab at once (SQLite here, PostgreSQL in scaled CI)."""
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def writer(n: int) -> None:
        try:
            start.wait()
            for i in range(APPENDS_PER_THREAD):
                log.append(tab.pk, [text(f"{n}-{i}"), text(f"{n}-{i}b")])
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    seqs = list(Chunk.objects.filter(tab=tab).order_by("seq").values_list("seq", flat=True))
    total = THREADS * APPENDS_PER_THREAD * 2
    assert seqs == list(range(1, total + 1))
    # Each append's pair stayed adjacent: one transaction per append.
    rows = list(Chunk.objects.filter(tab=tab).order_by("seq").values_list("data", flat=True))
    for a, b in zip(rows[::2], rows[1::2], strict=True):
        assert b["text"] == a["text"] + "b"


def test_the_unique_constraint_refuses_a_duplicate_seq(tab):
    from django.db import IntegrityError

    Chunk.objects.create(tab=tab, seq=1, role="user", type="text", data={})
    with pytest.raises(IntegrityError):
        Chunk.objects.create(tab=tab, seq=1, role="user", type="text", data={})


@pytest.mark.parametrize(
    ("total", "before", "limit", "expected"),
    [
        (0, None, 200, []),  # empty tab
        (5, None, 5, [1, 2, 3, 4, 5]),  # exactly one page
        (5, None, 200, [1, 2, 3, 4, 5]),  # less than a page
        (7, None, 3, [5, 6, 7]),  # the last page
        (7, 5, 3, [2, 3, 4]),  # a page before a seq
        (7, 3, 3, [1, 2]),  # a short first page
        (7, 1, 3, []),  # before=1: nothing older
        (7, 100, 2, [6, 7]),  # before past the end
    ],
)
def test_page_returns_the_right_window(tab, total, before, limit, expected):
    log.append(tab.pk, [text(str(i)) for i in range(total)])
    assert [c.seq for c in log.page(tab.pk, before=before, limit=limit)] == expected


def test_tail_and_count(tab):
    log.append(tab.pk, [text(str(i)) for i in range(6)])
    assert [c.seq for c in log.tail(tab.pk, after=4)] == [5, 6]
    assert [c.seq for c in log.tail(tab.pk, after=0, limit=2)] == [1, 2]
    assert log.tail(tab.pk, after=6) == []
    assert log.count(tab.pk) == 6
    assert log.last_seq(tab.pk) == 6


def test_pages_of_one_tab_never_include_another(tab):
    other = Tab.objects.create(title="other")
    log.append(other.pk, [text("theirs")])
    log.append(tab.pk, [text("mine")])
    assert [c.data["text"] for c in log.page(tab.pk, limit=200)] == ["mine"]


def test_checkpoint_stores_and_clears_the_open_block(tab):
    running = RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    block = Block(uuid.uuid4(), running.turn_id, 2, "assistant", "text", {"text": "half"})
    log.checkpoint(tab.pk, block, None)
    assert log.checkpointed(tab.pk) == block
    # Sealing clears the checkpoint in the same transaction as the append.
    log.append(tab.pk, [block], clear_checkpoint=True)
    running.refresh_from_db()
    assert running.open_header is None and running.checkpointed_at is None
    assert log.checkpointed(tab.pk) is None and not running.pieces.exists()


def test_the_migration_creates_the_chunk_table_with_its_columns_and_constraint():
    with connection.cursor() as cursor:
        columns = {
            c.name for c in connection.introspection.get_table_description(cursor, "chat_chunk")
        }
        constraints = connection.introspection.get_constraints(cursor, "chat_chunk")
    assert columns == {
        "id",
        "tab_id",
        "seq",
        "turn_id",
        "step",
        "role",
        "type",
        "data",
        "created_at",
    }
    unique = [c for c in constraints.values() if c["unique"] and c["columns"] == ["tab_id", "seq"]]
    assert unique, constraints
