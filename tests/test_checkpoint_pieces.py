"""The open block's checkpoint in pieces (chat.log.checkpoint, chat.log.checkpointed):
each checkpoint writes only the text streamed since the previous one, the pieces
rebuild the block exactly (code point offsets, characters cut between pieces), and
nothing is left behind after a seal, a Stop, a recovery or a deleted tab."""

from __future__ import annotations

import uuid
from datetime import timedelta
from functools import partial

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from chat import log, turns
from chat.models import CheckpointPiece, RunningTurn, Tab
from chat.pacing import Debouncer
from chat.providers.base import (
    Finish,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallEvent,
)
from chat.stream import Block
from chat.turn import lease, outbox
from tests.engine import Watcher, chunks, kinds, make_tab, running_worker, submit

pytestmark = pytest.mark.django_db(transaction=True)

# Characters cut between two pieces: accented, CJK, an emoji outside the BMP (two
# UTF-16 units, four UTF-8 bytes), a flag (two code points) and a combining accent.
MIXED = "naïve 日本語 😀 🇫🇷 e\u0301 — ok\n"
BLOCKS = {
    "text": ("assistant", {}, "text"),
    "thinking": ("assistant", {}, "text"),
    "tool_result": ("tool", {"call_id": "c1", "name": "shell"}, "shell_output"),
}


@pytest.fixture
def tab() -> Tab:
    owner = User.objects.create_user("owner")
    return Tab.objects.create(owner=owner, title="Pieces")


@pytest.fixture
def running(tab) -> RunningTurn:
    return RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )


def open_block(running: RunningTurn, kind: str, body: str = "") -> Block:
    role, data, key = BLOCKS[kind]
    return Block(uuid.uuid4(), running.turn_id, 2, role, kind, {**data, key: body})


def pieces(running: RunningTurn) -> list[tuple[int, str]]:
    return list(running.pieces.order_by("offset").values_list("offset", "text"))


@pytest.mark.parametrize("kind", BLOCKS)
def test_pieces_rebuild_the_block_exactly_with_characters_cut_between_them(running, kind):
    """Cut at every code point of MIXED in turn: each checkpoint stores only the new
    text at its code point offset, and the block read back is the block written."""
    block = open_block(running, kind)
    key = BLOCKS[kind][2]
    stored, cuts = None, []
    for end in range(1, len(MIXED) + 1, 3):
        block.data[key] = MIXED[:end]
        log.checkpoint(running.tab_id, block, stored)
        cuts.append((stored or 0, MIXED[stored or 0 : end]))
        stored = end
        assert log.checkpointed(running.tab_id) == block
    assert pieces(running) == cuts
    header = RunningTurn.objects.get(pk=running.pk).open_header
    assert key not in header["data"] and header["data"] == BLOCKS[kind][1]


def test_a_block_with_no_text_yet_keeps_its_body_key(running):
    """A shell call that has printed nothing is still running: its output key is there."""
    block = open_block(running, "tool_result")
    log.checkpoint(running.tab_id, block, None)
    assert pieces(running) == []
    assert log.checkpointed(running.tab_id).data == {
        "call_id": "c1",
        "name": "shell",
        "shell_output": "",
    }


def test_a_new_block_replaces_the_previous_blocks_pieces(running):
    first = open_block(running, "thinking", "first ")
    log.checkpoint(running.tab_id, first, None)
    first.data["text"] += "block"
    log.checkpoint(running.tab_id, first, len("first "))
    second = open_block(running, "text", "second")
    log.checkpoint(running.tab_id, second, None)
    assert pieces(running) == [(0, "second")]
    assert log.checkpointed(running.tab_id) == second


def test_a_piece_sent_again_is_taken_once(running):
    """A write whose commit was not acknowledged is sent again from the same offset,
    perhaps with more text: the body has each character once."""
    block = open_block(running, "text", "abc")
    log.checkpoint(running.tab_id, block, None)
    block.data["text"] = "abcdef"
    log.checkpoint(running.tab_id, block, 3)
    log.checkpoint(running.tab_id, block, 3)
    block.data["text"] = "abcdefgh"
    log.checkpoint(running.tab_id, block, 3)
    assert log.checkpointed(running.tab_id).text == "abcdefgh"


def test_a_gap_in_the_pieces_ends_the_body_before_it(running):
    """Never a body with a hole in it: text after a missing piece is not shown."""
    block = open_block(running, "text", "abc")
    log.checkpoint(running.tab_id, block, None)
    block.data["text"] = "abcdefghij"
    log.checkpoint(running.tab_id, block, 6)
    assert log.checkpointed(running.tab_id).text == "abc"


def test_a_checkpoint_of_another_turn_writes_nothing(running):
    """A worker whose turn was recovered, still streaming, must not write into the
    lease's new turn."""
    before = RunningTurn.objects.get(pk=running.pk)
    stale = Block(uuid.uuid4(), uuid.uuid4(), 2, "assistant", "text", {"text": "late"})
    log.checkpoint(running.tab_id, stale, None)
    log.checkpoint(running.tab_id, stale, 2)
    after = RunningTurn.objects.get(pk=running.pk)
    assert after.open_header is None and after.heartbeat_at == before.heartbeat_at
    assert not CheckpointPiece.objects.exists()
    assert log.checkpointed(running.tab_id) is None


def test_the_seal_clears_the_pieces_in_its_transaction(running):
    block = open_block(running, "text", MIXED)
    log.checkpoint(running.tab_id, block, None)
    block.data["text"] += MIXED
    log.checkpoint(running.tab_id, block, len(MIXED))
    log.append(running.tab_id, [block], clear_checkpoint=True)
    assert not CheckpointPiece.objects.exists()
    assert log.checkpointed(running.tab_id) is None


def test_recovery_seals_the_rebuilt_block_and_leaves_no_pieces(running):
    block = open_block(running, "text", MIXED[:10])
    log.checkpoint(running.tab_id, block, None)
    block.data["text"] = MIXED
    log.checkpoint(running.tab_id, block, 10)
    RunningTurn.objects.update(heartbeat_at=timezone.now() - timedelta(minutes=5))

    assert lease.recover_stale() == [running.tab_id]

    rows = log.tail(running.tab_id)
    assert kinds(rows) == ["assistant/text", "system/system"]
    assert rows[0].data == {"text": MIXED, "interrupted": True}
    assert not CheckpointPiece.objects.exists()


@pytest.mark.parametrize("gone", ["released", "tab deleted"])
def test_the_pieces_go_with_the_lease(running, tab, gone):
    block = open_block(running, "text", "half")
    log.checkpoint(running.tab_id, block, None)
    if gone == "released":
        lease.release(tab.pk, running.turn_id)
    else:
        tab.delete()
    assert not CheckpointPiece.objects.exists()


# --- On the turn runner -------------------------------------------------------------


@pytest.fixture
def fast_checkpoints(monkeypatch):
    """Checkpoints every 0.15 s at most: several per block in a short stream."""
    monkeypatch.setattr(outbox, "Debouncer", partial(Debouncer, idle=0.05, max_wait=0.15))


@pytest.fixture
def script(script, tmp_path, settings):
    settings.DISPATCH_WORKSPACE = tmp_path
    return script


@pytest.fixture
def checkpoints(monkeypatch):
    """Every checkpoint the runner writes: (block, stored, the block read back after)."""
    written = []
    real = log.checkpoint

    def spy(tab_id, block, stored):
        real(tab_id, block, stored)
        written.append((block, stored, log.checkpointed(tab_id)))

    monkeypatch.setattr(log, "checkpoint", spy)
    return written


async def test_the_runner_writes_only_new_text_for_thinking_text_and_shell_output(
    script, fast_checkpoints, checkpoints
):
    """Each checkpoint of a block sends what the block gained since the previous one;
    what is read back is the block as the runner had it; the seals leave nothing."""
    command = "echo one; sleep 0.4; echo two; sleep 0.4; echo three"
    script(
        [
            *[ReasoningDelta("hmm ")] * 40,
            ReasoningEnd("sig"),
            *[TextDelta(MIXED[n % len(MIXED)]) for n in range(40)],
            ToolCallEvent("s", "shell", {"command": command}),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("done"), Finish()],
        delay=0.02,
    )
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until_idle()

    by_block: dict = {}
    for block, stored, read in checkpoints:
        assert read == block
        previous = by_block.get(block.id)
        assert stored == (len(previous.text) if previous else None)
        by_block[block.id] = block
    with_text = {}
    for block, stored, _ in checkpoints:
        if stored is not None and len(block.text) > stored:
            with_text[block.type] = with_text.get(block.type, 0) + 1
    assert set(with_text) == {"thinking", "text", "tool_result"}
    rows = {str(c.id): c for c in await chunks(tab.pk)}
    for block in by_block.values():
        body = rows[str(block.id)].data[BLOCKS[block.type][2]]
        assert body.startswith(block.text)
    assert not await CheckpointPiece.objects.aexists()
    assert not await RunningTurn.objects.aexists()


async def test_a_stop_mid_text_leaves_no_pieces(script, fast_checkpoints, checkpoints):
    script([*[TextDelta("more ")] * 500, Finish()], delay=0.01)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "talk")
            await watcher.until(lambda m: m["op"] == "delta" and len(checkpoints) >= 2)
            assert await CheckpointPiece.objects.aexists()
            assert await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/text", "system/system"]
    assert rows[1].data["text"].startswith(checkpoints[-1][0].text)
    assert not await CheckpointPiece.objects.aexists()


# --- The migration --------------------------------------------------------------------


def test_the_migration_splits_a_checkpoint_into_its_header_and_one_piece_and_back(tab):
    """A lease left by a worker of the version before (its checkpoint the whole block)
    is recovered with its text after the upgrade; a downgrade puts the body back."""
    turn_id, block_id = uuid.uuid4(), uuid.uuid4()
    old = {
        "id": str(block_id),
        "turn_id": str(turn_id),
        "step": 1,
        "role": "tool",
        "type": "tool_result",
        "data": {"call_id": "c1", "name": "shell", "shell_output": MIXED},
        "seq": None,
    }
    executor = MigrationExecutor(connection)
    executor.migrate([("chat", "0007_context")])
    before = executor.loader.project_state([("chat", "0007_context")]).apps
    before.get_model("chat", "RunningTurn").objects.create(
        tab_id=tab.pk, turn_id=turn_id, worker="w", heartbeat_at=timezone.now(), open_chunk=old
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert log.checkpointed(tab.pk) == Block.from_dict(old)
    assert list(CheckpointPiece.objects.values_list("offset", "text")) == [(0, MIXED)]

    executor = MigrationExecutor(connection)
    executor.migrate([("chat", "0007_context")])
    back = executor.loader.project_state([("chat", "0007_context")]).apps
    assert back.get_model("chat", "RunningTurn").objects.get().open_chunk == old
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
