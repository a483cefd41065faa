"""The chunk log: the only code that writes Chunk rows.

Rows are appended sealed and never updated. `append` allocates seqs under the
tab row's lock (SELECT ... FOR UPDATE on PostgreSQL; on SQLite the IMMEDIATE
transaction already serialises writers), and the (tab, seq) unique constraint
is the last line of defence. The search index (chat.search) is written in
the same transaction as the chunks it indexes. All functions here are
synchronous ORM code: call them from async code through
`database_sync_to_async`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, cast

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from chat import search
from chat.chunks import Kind, body_key
from chat.models import CheckpointPiece, Chunk, RunningTurn, Tab
from chat.stream import Block


class LeaseLost(Exception):
    """The turn writing no longer holds the tab's lease: another worker recovered it, or
    (`gone`) the tab was deleted."""

    def __init__(self, tab_id: uuid.UUID, turn_id: uuid.UUID, *, gone: bool = False) -> None:
        what = "was deleted" if gone else f"is no longer held by turn {turn_id}"
        super().__init__(f"tab {tab_id} {what}")
        self.gone = gone


def fence(tab_id: uuid.UUID, turn_id: uuid.UUID) -> int:
    """Inside the caller's transaction: take the tab lock (which recovery takes too) and
    raise LeaseLost unless `turn_id` still holds the tab's lease. What a runner does to
    the tab's rows while it holds the lock is then its own to do: a runner stalled past
    its heartbeat, whose turn a recovery closed meanwhile, changes nothing. Returns the
    tab's last seq, read under the lock."""
    try:
        last = _lock(tab_id)
    except Tab.DoesNotExist:
        raise LeaseLost(tab_id, turn_id, gone=True) from None
    if not RunningTurn.objects.filter(tab_id=tab_id, turn_id=turn_id).exists():
        raise LeaseLost(tab_id, turn_id)
    return last


def _lock(tab_id: uuid.UUID) -> int:
    """The tab row's lock, for the rest of the transaction; its last seq."""
    return (
        Tab.objects.select_for_update().filter(pk=tab_id).values_list("last_seq", flat=True).get()
    )


def append(
    tab_id: uuid.UUID,
    blocks: Sequence[Block],
    *,
    clear_checkpoint: bool = False,
    turn_id: uuid.UUID | None = None,
) -> list[Chunk]:
    """Append sealed blocks in order, and index them; sets each block's seq. One transaction.

    `turn_id`: the running turn writing, which must still hold the tab's lease (`fence`:
    else LeaseLost, and nothing is written), so a runner whose lease was taken since its
    last heartbeat cannot add to the log its recovery closed. `clear_checkpoint` drops
    that turn's checkpoint in the same transaction, so sealing the open block is one
    write, not two.
    """
    if not blocks:
        return []
    with transaction.atomic():
        last = _lock(tab_id) if turn_id is None else fence(tab_id, turn_id)
        running = RunningTurn.objects.filter(tab_id=tab_id)
        if turn_id is not None:
            running = running.filter(turn_id=turn_id)
        rows = []
        for n, block in enumerate(blocks, start=last + 1):
            block.seq = n
            rows.append(
                Chunk(
                    id=block.id,
                    tab_id=tab_id,
                    seq=n,
                    turn_id=block.turn_id,
                    step=block.step,
                    role=block.role,
                    type=block.type,
                    data=block.data,
                )
            )
        Chunk.objects.bulk_create(rows)
        search.index(tab_id, rows)
        Tab.objects.filter(pk=tab_id).update(
            last_seq=F("last_seq") + len(rows), updated_at=timezone.now()
        )
        if clear_checkpoint:
            running.update(open_header=None, checkpointed_at=None)
            CheckpointPiece.objects.filter(running_id=tab_id).delete()
    return rows


def copy(source: uuid.UUID, target: uuid.UUID, *, through: int) -> int:
    """Copy `source`'s chunks with seq <= `through` into `target`, verbatim (seq,
    turn, step, role, type, data, time; new ids), with their index rows; returns
    how many. One INSERT ... SELECT: the database copies a 100,000-chunk log
    without a row passing through Python. The caller's transaction holds
    `target`'s last_seq, which it sets to `through`.
    """
    # Every column but the two a copy has its own of: a field added to Chunk is copied too.
    columns = ", ".join(
        # A concrete field is stored in a column: its `column` is set.
        cast(str, f.column)
        for f in Chunk._meta.concrete_fields
        if f.name not in ("id", "tab")
    )
    new_id = (
        "gen_random_uuid()" if connection.vendor == "postgresql" else "lower(hex(randomblob(16)))"
    )
    table = Chunk._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (id, tab_id, {columns}) "
            f"SELECT {new_id}, %s, {columns} FROM {table} "
            "WHERE tab_id = %s AND seq <= %s ORDER BY seq",
            [search.db_uuid(target), search.db_uuid(source), through],
        )
        copied = cursor.rowcount
    search.copy(source, target, through=through)
    return copied


def page(tab_id: uuid.UUID, *, before: int | None = None, limit: int) -> list[Chunk]:
    """The last `limit` chunks with seq < `before` (all, if None), in seq order."""
    qs = Chunk.objects.filter(tab_id=tab_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    return list(reversed(qs.order_by("-seq")[:limit]))


def page_bounds(tab_id: uuid.UUID, chunks: Sequence[Chunk]) -> tuple[bool, bool]:
    """(more chunks before this page, the first chunk's turn began before it)."""
    if not chunks:
        return False, False
    first = chunks[0]
    before = (
        Chunk.objects.filter(tab_id=tab_id, seq__lt=first.seq)
        .order_by("-seq")
        .values_list("turn_id", flat=True)[:1]
    )
    if not before:
        return False, False
    return True, first.turn_id is not None and before[0] == first.turn_id


def tail(tab_id: uuid.UUID, *, after: int = 0, limit: int | None = None) -> list[Chunk]:
    """Chunks with seq > `after`, in seq order."""
    qs = Chunk.objects.filter(tab_id=tab_id, seq__gt=after).order_by("seq")
    return list(qs[:limit] if limit is not None else qs)


def context_tail(tab_id: uuid.UUID) -> list[Chunk]:
    """What the next request is built from (chat.history.History.build): the
    newest compaction chunk and every chunk after the seq it summarises through,
    or the whole log when it was never compacted."""
    newest = (
        Chunk.objects.filter(tab_id=tab_id, type=Kind.COMPACTION)
        .order_by("-seq")
        .values_list("data", flat=True)
        .first()
    )
    through = newest.get("through_seq") if isinstance(newest, dict) else None
    return tail(tab_id, after=through if isinstance(through, int) else 0)


def count(tab_id: uuid.UUID) -> int:
    return Chunk.objects.filter(tab_id=tab_id).count()


def as_json(chunk: Chunk | Block) -> dict[str, Any]:
    """A chunk (a row, or a sealed Block) as the API, its events and exports write it."""
    fields: dict[str, Any] = {
        "id": str(chunk.id),
        "seq": chunk.seq,
        "turn_id": str(chunk.turn_id) if chunk.turn_id else None,
        "step": chunk.step,
        "role": chunk.role,
        "type": chunk.type,
        "data": chunk.data,
    }
    if (created := getattr(chunk, "created_at", None)) is not None:
        fields["created_at"] = created.isoformat()
    return fields


def turn_at(tab_id: uuid.UUID, seq: int) -> uuid.UUID | None:
    """The turn of the chunk at `seq` (None for no turn, or no such chunk)."""
    return Chunk.objects.filter(tab_id=tab_id, seq=seq).values_list("turn_id", flat=True).first()


def last_seq(tab_id: uuid.UUID) -> int:
    return Tab.objects.filter(pk=tab_id).values_list("last_seq", flat=True).get()


# --- The open block's checkpoint ------------------------------------------------
#
# The running turn's row holds the open block's header (the block without its
# streamed body); the body is in CheckpointPiece rows, each the text streamed
# between two checkpoints, so a checkpoint writes what is new, not the block
# again. `checkpointed` puts them back together.


def checkpoint(tab_id: uuid.UUID, block: Block, stored: int | None) -> None:
    """Checkpoint the open block: its body past the `stored` code points already
    checkpointed, or (`stored` None: a block not checkpointed yet) its header and
    whole body, in place of the previous block's. Refreshes the heartbeat.

    Writes only while the lease is the block's turn's: a worker whose turn was
    recovered must not write into the next turn's checkpoint.
    """
    now = timezone.now()
    body = block.text
    with transaction.atomic():
        # The open block is the running turn's: it has a turn id.
        mine = RunningTurn.objects.filter(tab_id=tab_id, turn_id=cast(uuid.UUID, block.turn_id))
        if stored is None:
            header = block.to_dict()
            header["data"] = {k: v for k, v in block.data.items() if k != body_key(block.type)}
            if not mine.update(open_header=header, checkpointed_at=now, heartbeat_at=now):
                return
            CheckpointPiece.objects.filter(running_id=tab_id).delete()
            stored = 0
        elif not mine.update(checkpointed_at=now, heartbeat_at=now):
            return
        if len(body) > stored:
            CheckpointPiece.objects.create(
                running_id=tab_id, chunk_id=block.id, offset=stored, text=body[stored:]
            )


def checkpointed(tab_id: uuid.UUID) -> Block | None:
    """The open block as last checkpointed, or None.

    One statement (the header joined with its pieces): read in two, a seal or a
    new block in between would mix two checkpoints.
    """
    return open_block(
        RunningTurn.objects.filter(tab_id=tab_id, open_header__isnull=False)
        .order_by("pieces__offset")
        .values_list("open_header", "pieces__chunk_id", "pieces__offset", "pieces__text")
    )


def open_block(rows: Iterable[tuple[Any, ...]]) -> Block | None:
    """The block a checkpoint's rows make: (header, piece's chunk id, offset, text)
    in offset order; a body with no piece is one row of Nones after the header.

    A piece may repeat text before its offset (a write whose commit was not
    acknowledged is sent again): only what is new is taken.
    """
    block = None
    body: list[str] = []
    length = 0
    for header, chunk_id, offset, text in rows:
        if block is None:
            block = Block.from_dict(header)
        if chunk_id != block.id:
            continue
        if offset > length:
            break  # never a body with a hole in it: the prefix before the gap
        body.append(text[length - offset :])
        length = max(length, offset + len(text))
    if block is not None:
        block.data[body_key(block.type)] = "".join(body)
    return block
