"""TabSocket: one per open tab page, streaming the tab's ops to it."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from channels.db import aclose_old_connections, database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from chat import bus, lease, log, preferences, render
from chat.models import Chunk, RunningTurn, Tab
from chat.stream import Block

logger = logging.getLogger(__name__)

# How long a socket waits for the running turn's snapshot before it falls back
# to the checkpoint in the database (the worker may have just died).
SNAPSHOT_TIMEOUT = 2.0
# Close codes the page can tell apart from a network drop.
CLOSE_FORBIDDEN = 4403
CLOSE_RESYNC = 4409
# Ops held for a page that has not said what it holds yet. A page says so at
# once; one that never does must not grow the server's memory for a whole turn.
MAX_BUFFERED_OPS = 5000
# The largest frame a catch-up sends (characters of HTML). A typical page of
# 200 chunks is well under it; a browser parses this much in a few
# milliseconds, and a frame this size never holds up the socket's other frames
# for long. Only a single chunk larger than this makes a larger frame.
CATCH_UP_FRAME_CHARS = 256 * 1024


class _Gap(Exception):
    """An op shows that an earlier one never arrived (the channel layer dropped it)."""


@dataclass
class CatchUp:
    frames: list[str]
    chunks: list[Chunk]
    # The page's log was replaced: it holds `chunks` and nothing else.
    replaced: bool


def catch_up(tab_id: uuid.UUID, last_seq: int) -> CatchUp:
    """What a page holding the log up to `last_seq` lacks, as frames. Sync: database and
    rendering, run off the event loop (a catch-up renders up to a page of chunks).

    At most one page: a page further behind gets its whole log replaced by the
    latest page (older ones load as it scrolls up, as after a page load), so
    the work and the frames are bounded whatever the tab's length. The latest
    page shrinks (newest chunks kept) until its frame fits CATCH_UP_FRAME_CHARS.
    """
    conf = preferences.load()
    chunks = log.tail(tab_id, after=last_seq, limit=conf.page_size + 1)
    if len(chunks) <= conf.page_size:
        return CatchUp(render.catch_up_frames(chunks, CATCH_UP_FRAME_CHARS), chunks, False)
    limit = conf.page_size
    while True:
        chunks = log.page(tab_id, limit=limit)
        has_more, continues = log.page_bounds(tab_id, chunks)
        frame = render.fragment_log(
            chunks,
            tab_id=tab_id,
            has_more=has_more,
            continues=continues,
            dom_window=conf.dom_window,
            expand_thinking=conf.expand_thinking,
        )
        if len(frame) <= CATCH_UP_FRAME_CHARS or limit == 1:
            return CatchUp([frame], chunks, True)
        limit = max(1, limit // 2)


class TabSocket(AsyncWebsocketConsumer):
    """Streams a tab's ops to one page, with no gap and no duplicate (DESIGN §5).

    The socket joins the tab's group at connect and buffers ops. When the page
    says what it holds ("hello": last sealed seq, open chunk id and length), the
    socket sends the sealed chunks it lacks (at most a page) and the running
    turn's exact open block, then drains the buffer, dropping whatever that
    already covered. From then on every op is checked against what the page
    holds: a seal at or below `sent_seq` and delta text before `open_len` are
    never sent twice.

    The channel layer drops messages for a channel that is full, silently. The
    stream checks itself: a seal whose seq skips one, a delta past the end of
    the open text, or a delta for a chunk the page never got opened means ops
    were lost, and the socket catches the page up again from what it holds, as
    for a hello.
    """

    async def connect(self) -> None:
        user = self.scope["user"]
        tab_id = self.scope["url_route"]["kwargs"]["tab_id"]
        if (
            not user.is_authenticated
            or not await Tab.objects.filter(pk=tab_id, owner=user).aexists()
        ):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.tab_id = tab_id
        self.group = bus.tab_group(tab_id)
        self.synced = False
        self.buffer: deque[dict[str, Any]] = deque()
        self.sent_seq = 0
        self.open_id: str | None = None
        self.open_len = 0
        # Chunks the last catch-up sent sealed: buffered ops about them are stale.
        self.done_ids: set[str] = set()
        self.pending_hello: dict[str, Any] | None = None
        self.snapshot_timer: asyncio.TimerHandle | None = None
        # Join before reading anything: ops from here on are buffered, not lost.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale database connections before every handler, a
        # thread-pool hop per message. Forwarding an op touches no database and
        # is nearly all of a socket's messages: it skips the hop; the catch-up,
        # which reads the database, closes them itself (_sync_page).
        if message["type"] == "tab.op":
            await self.tab_op(message)
        else:
            await super().dispatch(message)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "snapshot_timer", None) is not None:
            self.snapshot_timer.cancel()
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "")
        except json.JSONDecodeError:
            return
        if not isinstance(message, dict) or message.get("type") != "hello":
            return
        try:
            hello = {
                "last_seq": int(message.get("last_seq") or 0),
                "open_id": str(message.get("open_id") or "") or None,
                "open_len": int(message.get("open_len") or 0),
            }
        except (TypeError, ValueError):
            return
        await self._sync_page(hello)

    def _holding(self) -> dict[str, Any]:
        """What the page holds, as far as this socket sent it: a hello for a resync."""
        return {"last_seq": self.sent_seq, "open_id": self.open_id, "open_len": self.open_len}

    async def _sync_page(self, hello: dict[str, Any] | None) -> None:
        # A loop, not recursion: a catch-up whose buffered ops show another gap
        # starts over from what the page then holds.
        if hello is not None:
            await aclose_old_connections()
        while hello is not None:
            self.synced = False
            self.pending_hello = hello
            if self.snapshot_timer is not None:
                # A hello while an earlier one waited: only the newest is answered.
                self.snapshot_timer.cancel()
                self.snapshot_timer = None
            running = await RunningTurn.objects.filter(tab_id=self.tab_id).aexists()
            if running:
                await self._ask_snapshot()
                return
            hello = await self._catch_up(None)

    async def _ask_snapshot(self) -> None:
        # Ask the worker holding the turn for its open block; the answer comes
        # back as a "tab.snapshot" message (never await it here: a consumer
        # handles one message at a time).
        await self.channel_layer.group_send(
            bus.control_group(self.tab_id),
            {"type": "turn.snapshot", "reply_to": self.channel_name, "tab_id": str(self.tab_id)},
        )
        loop = asyncio.get_running_loop()
        self.snapshot_timer = loop.call_later(
            SNAPSHOT_TIMEOUT,
            lambda: asyncio.ensure_future(
                self.channel_layer.send(self.channel_name, {"type": "tab.snapshot_timeout"})
            ),
        )

    async def tab_snapshot(self, message: dict[str, Any]) -> None:
        if self.pending_hello is None:
            return
        if self.snapshot_timer is not None:
            self.snapshot_timer.cancel()
            self.snapshot_timer = None
        await self._sync_page(await self._catch_up(message))

    async def tab_snapshot_timeout(self, message: dict[str, Any]) -> None:
        if self.pending_hello is None:
            return
        self.snapshot_timer = None
        running = await RunningTurn.objects.filter(tab_id=self.tab_id).afirst()
        snapshot = None
        if running is not None and running.open_chunk:
            snapshot = {"open": running.open_chunk, "status": None}
        await self._sync_page(await self._catch_up(snapshot))

    async def _catch_up(self, snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
        """Send what the pending hello lacks, then the buffer. A hello to resync with if the
        buffer shows a gap, else None."""
        hello, self.pending_hello = self.pending_hello, None
        plan = await database_sync_to_async(catch_up)(self.tab_id, hello["last_seq"])
        chunks = plan.chunks
        frames = list(plan.frames)
        self.done_ids = {str(c.id) for c in chunks}
        if plan.replaced:
            # The page holds exactly the latest page now: its open chunk went with its old log.
            self.sent_seq = chunks[-1].seq if chunks else 0
            self.open_id, self.open_len = None, 0
        else:
            self.sent_seq = chunks[-1].seq if chunks else hello["last_seq"]
            self.open_id, self.open_len = hello["open_id"], hello["open_len"]
        open_fields = snapshot.get("open") if snapshot else None
        if open_fields is not None and open_fields["id"] not in self.done_ids:
            block = Block.from_dict(open_fields)
            if self.open_id == str(block.id) and self.open_len <= len(block.text):
                rest = block.text[self.open_len :]
                if rest:
                    frames.append(render.fragment_delta(block.id, rest))
            else:
                frames.append(render.fragment_open(block))
            self.open_id, self.open_len = str(block.id), len(block.text)
        elif self.open_id is not None and (chunks or snapshot is None):
            # The chunk the page had open was sealed meanwhile (its seal is in
            # `chunks`) or the turn is gone: nothing is open any more.
            self.open_id, self.open_len = None, 0
        status = await database_sync_to_async(lease.status)(self.tab_id)
        if snapshot and snapshot.get("status"):
            status = {**status, **snapshot["status"]}
        frames.append(render.fragment_status(status))
        for frame in frames:
            await self.send(text_data=frame)
        self.synced = True
        while self.buffer:
            if resync := await self._forward(self.buffer.popleft()):
                # The rest stays buffered, behind the next catch-up.
                return resync
        return None

    async def tab_op(self, message: dict[str, Any]) -> None:
        if not self.synced:
            self.buffer.append(message)
            if len(self.buffer) > MAX_BUFFERED_OPS:
                # The page reconnects by itself and starts over with a hello.
                self.buffer.clear()
                await self.close(code=CLOSE_RESYNC)
            return
        await self._sync_page(await self._forward(message))

    async def _forward(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Send an op's frame; on a gap, send nothing and return the hello to resync with."""
        try:
            frame = self._frame(message)
        except _Gap as gap:
            logger.warning("tab %s: %s; catching the page up again", self.tab_id, gap)
            self.synced = False
            return self._holding()
        if frame:
            await self.send(text_data=frame)
        return None

    def _frame(self, message: dict[str, Any]) -> str | None:
        match message["op"]:
            case "open":
                block = Block.from_dict(message["block"])
                if str(block.id) == self.open_id or str(block.id) in self.done_ids:
                    return None
                self.open_id, self.open_len = str(block.id), len(block.text)
                return render.fragment_open(block)
            case "delta":
                chunk_id = message["chunk_id"]
                if chunk_id in self.done_ids:
                    return None
                if chunk_id != self.open_id:
                    raise _Gap(f"a delta for chunk {chunk_id}, which the page never got opened")
                text, offset = message["text"], message["offset"]
                skip = self.open_len - offset
                if skip < 0:
                    raise _Gap(f"a delta at offset {offset}; the page has {self.open_len}")
                if skip >= len(text):
                    return None
                text = text[skip:]
                self.open_len += len(text)
                return render.fragment_delta(uuid.UUID(chunk_id), text)
            case "seal":
                block = Block.from_dict(message["block"])
                if block.seq is not None and block.seq <= self.sent_seq:
                    return None
                if block.seq is not None and block.seq > self.sent_seq + 1:
                    raise _Gap(f"the seal of seq {block.seq}; the page has up to {self.sent_seq}")
                self.sent_seq = block.seq or self.sent_seq
                if str(block.id) == self.open_id:
                    self.open_id, self.open_len = None, 0
                return render.fragment_seal(block)
            case "status":
                return render.fragment_status(message["status"])
            case "queued":
                return render.fragment_queued(message["id"], message["text"])
            case "taken":
                return render.fragment_taken(message["ids"])
        return None
