"""The queue into the turn: waiting messages moved into the log (at a turn's start and
after each step's results), and a compaction asked for at the head of the queue.

Every driver takes its messages this way: a message is in the log before anything
answers it, and a message from someone present makes the turn attended.
"""

from __future__ import annotations

import logging
import uuid
from itertools import takewhile

from channels.db import database_sync_to_async
from django.db import transaction

from chat import blobs, log
from chat.chunks import Kind, Role
from chat.models import QueuedMessage
from chat.stream import Block
from chat.tools import workdir
from chat.tools.base import ToolError
from chat.turn.outbox import Outbox
from chat.turn.state import TurnState, unattended_message

logger = logging.getLogger(__name__)


class Messages:
    def __init__(self, state: TurnState, outbox: Outbox) -> None:
        self.state = state
        self.outbox = outbox
        # A message (not a compaction) was at the head of the queue when take_compaction
        # last looked: the turn will take it.
        self.message_waiting = False

    async def take_queued(self) -> bool:
        """Move waiting user messages into the log, in order. True if there were any."""
        state = self.state
        with self.outbox.stopping_on_lease_lost():
            blocks, ids = await database_sync_to_async(self.take_queued_sync)()
        if ids:
            # A message from someone present (not a deny wake) makes the turn attended.
            denied = bool(blocks) and all(unattended_message(b.data) for b in blocks)
            state.unattended = denied and (state.unattended or not state.took_queued)
        state.took_queued = state.took_queued or bool(ids)
        await self.outbox.sealed(blocks)
        if ids:
            await self.outbox.publish({"op": "taken", "ids": ids})
        return bool(ids)

    def take_queued_sync(self) -> tuple[list[Block], list[int]]:
        state = self.state
        with transaction.atomic():
            queued = list(QueuedMessage.objects.select_for_update().filter(tab_id=state.tab_id))
            # A compaction asked for waits for the turn's end, and what was sent after it
            # for the compaction (take_compaction).
            queued = list(takewhile(lambda q: not q.compact, queued))
            if not queued:
                return [], []
            # A rerun row (a regenerated branch) starts the turn and adds nothing.
            blocks = [
                Block(uuid.uuid4(), state.turn_id, 0, Role.USER, Kind.TEXT, q.chunk_data())
                for q in queued
                if not q.rerun
            ]
            if blocks:
                # Fenced by the lease (log.append with the turn): a stale runner takes
                # nothing.
                log.append(state.tab_id, blocks, turn_id=state.turn_id)
            else:
                # Rerun rows alone append nothing: the fence is still what lets this turn
                # take them (a second recovery's rerun is the next runner's).
                log.fence(state.tab_id, state.turn_id)
            QueuedMessage.objects.filter(pk__in=[q.pk for q in queued]).delete()
        refs = [ref for q in queued for ref in q.attachments]
        if refs:
            try:
                root = workdir.ensure(state.workspace, state.cwd)
            except ToolError as exc:
                logger.warning("tab %s: files not placed: %s", state.tab_id, exc)
                refs = []
        for ref in refs:
            blobs.place(root, ref)
        return blocks, [q.pk for q in queued]

    def take_compaction_sync(self) -> tuple[int, int | None, str] | None:
        state = self.state
        # Looked at without the lock first: nearly every turn starts with a message, not a
        # compaction, and a write transaction serialises every writer on SQLite. What is
        # queued after the look is taken by take_queued, as after the locked one.
        head = QueuedMessage.objects.filter(tab_id=state.tab_id).values_list("compact").first()
        self.message_waiting = head is not None and not head[0]
        if head is None or not head[0]:
            return None
        with transaction.atomic():
            first = QueuedMessage.objects.select_for_update().filter(tab_id=state.tab_id).first()
            if first is None or not first.compact:
                self.message_waiting = first is not None
                return None
            log.fence(state.tab_id, state.turn_id)
            taken = (first.pk, first.compact_through, first.text)
            first.delete()
            return taken

    async def take_compaction(self) -> tuple[int | None, str] | None:
        """A compaction asked for (`/compact`, "summarise up to here") at the head of the
        queue: taken, as (through seq or None for everything, instructions)."""
        with self.outbox.stopping_on_lease_lost():
            taken = await database_sync_to_async(self.take_compaction_sync)()
        if taken is None:
            return None
        pk, through, instructions = taken
        self.state.took_queued = True
        await self.outbox.publish({"op": "taken", "ids": [pk]})
        return through, instructions
