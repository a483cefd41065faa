"""The outbox: how a turn's ops leave the runner.

Open and Delta go to the watchers (deltas coalesced by pacing.Coalescer: 30 ms or
4 KiB) and to the checkpoint (pacing.Debouncer: 250 ms idle, 1 s max); a Seal goes into
the log in one transaction that also clears the checkpoint, then to the watchers. Every
append is fenced by the turn's lease (log.fence): a runner recovered since its last
heartbeat writes nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from channels.db import database_sync_to_async
from django.db import transaction

from chat import log
from chat.chunks import Kind
from chat.pacing import Coalescer, Debouncer
from chat.providers.base import SystemEvent
from chat.stream import Block, Delta, Op, Open, Seal
from chat.turn.ending import last_sealed
from chat.turn.state import TurnState

Publish = Callable[[dict[str, Any]], Awaitable[None]]
# Told of each tool call before it is appended; True for the first call of its id in the
# step (its seq is then kept in TurnState.seqs).
OnCall = Callable[[Block], bool]


def appended_seq(block: Block) -> int:
    """The seq the log gave the block (log.append sets it)."""
    if block.seq is None:
        raise RuntimeError(f"block {block.id} is not in the log")
    return block.seq


class Outbox:
    """Publishes, checkpoints and appends one runner's ops, in order."""

    def __init__(self, state: TurnState, publish: Publish) -> None:
        self.state = state
        self.publish = publish
        self.on_call: OnCall | None = None
        self._debouncer = Debouncer()
        self._cp_timer: asyncio.TimerHandle | None = None
        self._cp_write: asyncio.Future[None] | None = None
        # The block the checkpoint holds and how much of its body: the next checkpoint
        # writes the rest (chat.log.checkpoint).
        self._cp_block: Any = None
        self._cp_stored = 0
        # A checkpoint was written since the last seal cleared it: the next seal clears
        # it (a block sealed before its first checkpoint leaves nothing to clear).
        self._cp_written = False
        self._coalescer = Coalescer()
        self._delta_timer: asyncio.TimerHandle | None = None
        # The last delta op being published: the next one waits for it (order).
        self._flushing: asyncio.Future[None] | None = None
        # The open block the watchers were told about (its open op published).
        self.shown: Any = None
        self._thinking_since: float | None = None

    def snapshot(self) -> dict[str, Any]:
        """The exact state a new watcher needs: last sealed seq and the open block."""
        state = self.state
        block = state.reducer.open
        if block is not None and block.id != self.shown:
            # Opened in the reducer but not yet announced (a seal before it is still
            # being written): the watcher gets it from the ops, in order.
            block = None
        return {
            "last_seq": state.last_seq,
            "open": block.to_dict() if block is not None else None,
            "status": state.status.as_dict(),
        }

    # --- ops ------------------------------------------------------------------------

    async def apply(self, ops: list[Op]) -> None:
        for op in ops:
            match op:
                case Delta():
                    # One clock read per delta, for both the coalescer and the debouncer.
                    now = asyncio.get_running_loop().time()
                    self._queue_delta(op, now)
                    self._checkpoint_soon(now)
                case Open(block=block):
                    await self.flush_deltas()
                    if block.type == Kind.THINKING:
                        self._thinking_since = time.monotonic()
                    await self.publish({"op": "open", "block": block.to_dict()})
                    self.shown = block.id
                    self._checkpoint_soon(asyncio.get_running_loop().time())
                case Seal(block=block):
                    await self.flush_deltas()
                    await self._seal(block)

    async def _seal(self, block: Block) -> None:
        state = self.state
        self.cancel_checkpoint()
        if block.type == Kind.THINKING and self._thinking_since is not None:
            # Shown as "thought for N s"; never sent to the model.
            block.data["duration_ms"] = round((time.monotonic() - self._thinking_since) * 1000)
            self._thinking_since = None
        await self.checkpoint_landed()
        first = False
        if block.type == Kind.TOOL_CALL and self.on_call is not None:
            first = self.on_call(block)
        await self.append([block], clear_checkpoint=self._cp_written)
        self._cp_written = False
        if first:
            state.seqs[block.data["call_id"]] = appended_seq(block)
        state.last_seq = appended_seq(block)
        state.history_built.add(block)
        await self.publish({"op": "seal", "block": block.to_dict()})
        if self.shown == block.id:
            self.shown = None

    async def system(self, kind: str, text: str, **extra: Any) -> None:
        ops = self.state.reducer.feed(SystemEvent(kind, text))
        last_sealed(ops).data.update(extra)
        await self.apply(ops)

    async def status(self) -> None:
        await self.flush_deltas()
        await self.publish({"op": "status", "status": self.state.status.as_dict()})

    async def sealed(self, blocks: list[Block]) -> None:
        """Blocks appended outside the reducer (taken messages, a compaction) go to the
        watchers; a history that has not been built yet takes them at its build."""
        state = self.state
        for block in blocks:
            state.last_seq = appended_seq(block)
            if state.history is not None:
                state.history.add(block)
            await self.publish({"op": "seal", "block": block.to_dict()})

    # --- delta coalescing (chat.pacing) ---------------------------------------------

    def _queue_delta(self, op: Delta, now: float) -> None:
        for message in self._coalescer.add(op.chunk_id, op.offset, op.text, now):
            self._send_delta(message)
        if self._coalescer.due_at is not None and self._delta_timer is None:
            self._delta_timer = asyncio.get_running_loop().call_at(
                self._coalescer.due_at, self._deltas_due
            )

    def _deltas_due(self) -> None:
        self._delta_timer = None
        due_at = self._coalescer.due_at
        if due_at is not None and due_at > asyncio.get_running_loop().time():
            # What this timer was for went out by size; the text waiting now is younger.
            self._delta_timer = asyncio.get_running_loop().call_at(due_at, self._deltas_due)
            return
        if message := self._coalescer.take():
            self._send_delta(message)

    def _send_delta(self, message: dict[str, Any]) -> None:
        previous = self._flushing

        async def send() -> None:
            if previous is not None:
                await previous  # keep deltas in order
            await self.publish(message)

        self._flushing = asyncio.ensure_future(send())

    def _cancel_delta_timer(self) -> None:
        if self._delta_timer is not None:
            self._delta_timer.cancel()
            self._delta_timer = None

    async def flush_deltas(self) -> None:
        self._cancel_delta_timer()
        if message := self._coalescer.take():
            self._send_delta(message)
        if self._flushing is not None:
            await self._flushing
            self._flushing = None

    def discard_deltas(self) -> None:
        """Forget deltas not yet broadcast: the seals that follow replace them."""
        self._cancel_delta_timer()
        self._coalescer.discard()
        self._flushing = None
        self._thinking_since = None

    # --- checkpoints (chat.pacing) --------------------------------------------------

    def _checkpoint_soon(self, now: float) -> None:
        check_at = self._debouncer.touch(now)
        if check_at is not None:
            self._cp_timer = asyncio.get_running_loop().call_at(check_at, self._checkpoint_due)

    def _checkpoint_due(self) -> None:
        loop = asyncio.get_running_loop()
        check_at = self._debouncer.check(loop.time())
        if check_at is not None:
            self._cp_timer = loop.call_at(check_at, self._checkpoint_due)
            return
        self._cp_timer = None
        snapshot = self.open_copy()
        if snapshot is not None:
            self._chain_write(snapshot)

    async def checkpoint_now(self) -> None:
        """Checkpoint the open block at once (a command's output block before it starts).
        After any write in flight: each write sends what the one before it stored."""
        snapshot = self.open_copy()
        if snapshot is not None:
            await self._chain_write(snapshot)

    def _chain_write(self, snapshot: Block) -> asyncio.Future[None]:
        previous = self._cp_write
        # Set before the write lands: a write that fails may still have written its part.
        self._cp_written = True

        async def write() -> None:
            if previous is not None:
                with suppress(Exception):
                    await previous
            await self._write_checkpoint(snapshot)

        self._cp_write = asyncio.ensure_future(write())
        return self._cp_write

    def open_copy(self) -> Block | None:
        """The open block as it is now, kept from the deltas that follow."""
        block = self.state.reducer.open
        if block is None:
            return None
        return Block(block.id, block.turn_id, block.step, block.role, block.type, dict(block.data))

    async def _write_checkpoint(self, snapshot: Block) -> None:
        # Counted once written: a write that fails is sent again by the next one.
        stored = self._cp_stored if snapshot.id == self._cp_block else None
        await database_sync_to_async(log.checkpoint)(self.state.tab_id, snapshot, stored)
        self._cp_block, self._cp_stored = snapshot.id, len(snapshot.text)

    async def checkpoint_landed(self) -> None:
        """A checkpoint write in flight lands before the seal (or crash) that clears it."""
        if self._cp_write is not None:
            with suppress(Exception):
                await self._cp_write

    def cancel_checkpoint(self) -> None:
        if self._cp_timer is not None:
            self._cp_timer.cancel()
        self._cp_timer = None
        self._debouncer.reset()

    # --- the log, fenced by the lease -----------------------------------------------

    @contextmanager
    def stopping_on_lease_lost(self) -> Iterator[None]:
        """Around a fenced database call: LeaseLost stops this runner, then goes on up."""
        try:
            yield
        except log.LeaseLost as exc:
            self.state.lose_lease(gone=exc.gone)
            raise

    async def append(self, blocks: list[Block], *, clear_checkpoint: bool = False) -> None:
        """Into the log, only while this turn holds the tab's lease: a recovery since the
        last heartbeat (a stalled process) closed the turn, and its log is not this
        runner's to add to any more."""
        state = self.state
        with self.stopping_on_lease_lost():
            await database_sync_to_async(log.append)(
                state.tab_id, blocks, clear_checkpoint=clear_checkpoint, turn_id=state.turn_id
            )

    async def fence(self) -> None:
        """LeaseLost (and this runner stops) unless this turn still holds the tab's lease."""
        with self.stopping_on_lease_lost():
            await database_sync_to_async(self._fence_sync)()

    def _fence_sync(self) -> None:
        with transaction.atomic():
            log.fence(self.state.tab_id, self.state.turn_id)
