"""Following a tab's log live, with no gap and no duplicate (ARCHITECTURE.md, One turn): one
implementation, two transports.

A `Follower` joins the tab's group before it reads anything, so ops from then on
are buffered, not lost. When its client says what it holds (a hello: last
sealed seq, open chunk id and length), it sends the sealed chunks the client
lacks and the running turn's exact open block, then drains the buffer,
dropping whatever that already covered. From then on every op is checked
against what the client holds: a seal at or below `sent_seq` and delta text
before `open_len` are never sent twice.

The channel layer drops messages for a channel that is full, silently. The
stream checks itself: a seal whose seq skips one, a delta past the end of the
open text, or a delta for a chunk never opened means ops were lost, and the
follower catches the client up again from what it holds, as for a hello.

The transports differ only in how an op is written (a `Renderer`): htmx
fragments over the page's WebSocket (consumers.TabSocket), server-sent events
for API clients (`sse_events`), whose event ids are the client's position, so
a reconnect with Last-Event-ID resumes exactly.

Ops reach followers through the tab's `_Feed`, this process's one member of the tab's
group (a chat.bus.Hub): one channel-layer message per op per process, none at all in
embedded mode. The feed renders each op once, with a renderer of its own that has seen
every op: a page whose renderer is in the state the feed's was in before the op (it has
seen the same ops since the last catch-up) is sent that frame, whose UTF-8 bytes are
made once too (`Frame`); any other renders its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from channels.db import aclose_old_connections, database_sync_to_async
from channels.layers import get_channel_layer

from chat import bus, log, preferences, render
from chat.models import Chunk, RunningTurn
from chat.stream import Block
from chat.turn import lease

logger = logging.getLogger(__name__)

# How long a follower waits for the running turn's snapshot before it falls
# back to the checkpoint in the database (the worker may have just died).
SNAPSHOT_TIMEOUT = 2.0
# Ops held for a client that has not said what it holds yet. A page says so at
# once; one that never does must not grow the server's memory for a whole turn.
MAX_BUFFERED_OPS = 5000
# The largest frame a page's catch-up sends (characters of HTML). A typical page
# of 200 chunks is well under it; a browser parses this much in a few
# milliseconds, and a frame this size never holds up the socket's other frames
# for long. Only a single chunk larger than this makes a larger frame.
CATCH_UP_FRAME_CHARS = 256 * 1024
# An SSE stream with nothing to say sends a comment this often, so proxies
# keep it open and the client can tell a quiet tab from a dead connection.
SSE_HEARTBEAT_SECONDS = 15.0


class Frame(str):
    """A frame sent to many pages: its UTF-8 bytes, which the server asks for to send it
    (daphne encodes every text frame), are made once."""

    def __new__(cls, text: str) -> Frame:
        frame = super().__new__(cls, text)
        frame.utf8 = str.encode(frame)
        return frame

    utf8: bytes

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        if encoding.lower().replace("-", "").replace("_", "") == "utf8":
            return self.utf8
        return str.encode(self, encoding, errors)


@dataclass(frozen=True)
class Shared:
    """An op as the feed rendered it once for every page: its block parsed, and its frame
    with the feed's renderer state before and after (None for an op whose frame depends
    on no state). No frame when no page follows the tab here."""

    block: Block | None
    frame: Frame | None = None
    before: tuple[Any, ...] | None = None
    after: tuple[Any, ...] | None = None


def _block(message: dict[str, Any], shared: Shared | None) -> Block:
    """An open's or seal's block: as the feed parsed it, else parsed here."""
    if shared is not None and shared.block is not None:
        return shared.block
    return Block.from_dict(message["block"])


class _Gap(Exception):
    """An op shows that an earlier one never arrived (the channel layer dropped it)."""


@dataclass
class CatchUp:
    frames: list[str]
    chunks: list[Chunk]
    # The turn of the last chunk the client then holds (the page groups by it).
    last_turn: uuid.UUID | None = None
    # The client's log was replaced: it holds `chunks` and nothing else.
    replaced: bool = False
    # More sealed chunks follow these: the follower catches up again from them.
    more: bool = False


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
        held = log.turn_at(tab_id, last_seq) if last_seq else None
        if not chunks:
            return CatchUp([], chunks, last_turn=held)
        continues = held is not None and chunks[0].turn_id == held
        frames = render.catch_up_frames(chunks, CATCH_UP_FRAME_CHARS, continues=continues)
        return CatchUp(frames, chunks, last_turn=chunks[-1].turn_id)
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
            last_turn = chunks[-1].turn_id if chunks else None
            return CatchUp([frame], chunks, replaced=True, last_turn=last_turn)
        limit = max(1, limit // 2)


class HtmlRenderer:
    """Ops as htmx out-of-band fragments, for the tab page.

    A chunk starts a bubble when the chunk before it on the page is another
    turn's, as a page render groups them: it keeps the turn of the last chunk it
    sent, so a turn that opens without a user message (a recovery notice, a crash
    before the messages were taken) starts its own bubble live, as after a reload.
    """

    def __init__(self) -> None:
        self.last_turn: uuid.UUID | None = None
        # The open chunk's id and whether it started a bubble: its seal keeps that.
        self.opened: tuple[uuid.UUID, bool] | None = None
        # The open text chunk's live Markdown: its text and where its stable part ends.
        self.live: render.LiveText | None = None

    def bind(self, follower: Follower) -> None:
        pass

    def state(self) -> tuple[Any, ...]:
        """What a frame depends on besides its op (the live text by identity: two
        renderers holding the same one have fed it the same deltas)."""
        return (self.last_turn, self.opened, self.live)

    def adopt(self, state: tuple[Any, ...]) -> None:
        self.last_turn, self.opened, self.live = state

    def catch_up(self, tab_id: uuid.UUID, last_seq: int) -> CatchUp:
        plan = catch_up(tab_id, last_seq)
        self.last_turn = plan.last_turn
        # A text block the page held is sent whole again (resumes): never fed here
        # again, least of all the feed's, which this renderer may hold.
        self.live = None
        return plan

    def _starts(self, block: Block) -> bool:
        starts = block.turn_id != self.last_turn
        self.last_turn = block.turn_id
        return starts

    def resumes(self, block: Block) -> bool:
        """Whether a page holding part of this open block can be sent the rest as a
        delta. Not a text block: its page holds rendered Markdown, which says nothing of
        where its stable part ends, so it gets the whole block again (replaced in place)."""
        return not render.is_live(block)

    def open(self, block: Block) -> str:
        starts = self._starts(block)
        self.opened = (block.id, starts)
        self.live = render.LiveText(block.id) if render.is_live(block) else None
        return render.fragment_open(block, turn_start=starts, live=self.live)

    def delta(self, chunk_id: str, offset: int, text: str) -> str:
        if self.live is not None and str(self.live.id) == chunk_id:
            return render.fragment_live(self.live, text)
        return render.fragment_delta(uuid.UUID(chunk_id), text)

    def seal(self, block: Block) -> str:
        if self.live is not None and self.live.id == block.id:
            self.live = None
        if self.opened is not None and self.opened[0] == block.id:
            starts, self.opened = self.opened[1], None
            self.last_turn = block.turn_id
        else:
            starts = self._starts(block)
        return render.fragment_seal(block, turn_start=starts)

    def status(self, status: dict[str, Any]) -> str:
        return render.fragment_status(status)

    def queued(self, id: int, text: str, *, compact: bool = False) -> str:
        return render.fragment_queued(id, text, compact=compact)

    def taken(self, ids: list[int]) -> str:
        return render.fragment_taken(ids)


class SseRenderer:
    """Ops as server-sent events with the chunk-log protocol's names, each with the
    client's position after it as its id: `seq`, or `seq:open_id:open_len`."""

    def __init__(self) -> None:
        self.follower: Follower | None = None
        self.running_turn: str | None = None

    def bind(self, follower: Follower) -> None:
        self.follower = follower

    @property
    def _bound(self) -> Follower:
        """The follower: it binds its renderer when it is made, before any event."""
        if self.follower is None:
            raise RuntimeError("the renderer is not bound to a follower")
        return self.follower

    def resumes(self, block: Block) -> bool:
        return True

    def _event(self, name: str, data: dict[str, Any], position: str | None = None) -> str:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        position = self._bound.position() if position is None else position
        return f"id: {position}\nevent: {name}\ndata: {body}\n\n"

    def catch_up(self, tab_id: uuid.UUID, last_seq: int) -> CatchUp:
        """Every sealed chunk after `last_seq`, a page at a time (`more` says a page
        follows): an API client wants them all, and memory stays one page."""
        page_size = preferences.load().page_size
        chunks = log.tail(tab_id, after=last_seq, limit=page_size + 1)
        more = len(chunks) > page_size
        chunks = chunks[:page_size]
        frames = []
        for chunk in chunks:
            body = json.dumps(log.as_json(chunk), ensure_ascii=False, separators=(",", ":"))
            frames.append(f"id: {chunk.seq}\nevent: chunk-seal\ndata: {body}\n\n")
        return CatchUp(frames, chunks, more=more)

    def open(self, block: Block) -> str:
        opened = self._event(
            "chunk-open",
            {
                "id": str(block.id),
                "turn_id": str(block.turn_id) if block.turn_id else None,
                "step": block.step,
                "role": block.role,
                "type": block.type,
            },
            # The client holds the block, none of its text yet.
            f"{self._bound.sent_seq}:{block.id}:0",
        )
        if not block.text:
            return opened
        # What the block already holds (a snapshot taken mid-block) follows as its
        # first delta: a client rebuilds the text from deltas alone.
        return opened + self._event(
            "chunk-delta", {"id": str(block.id), "offset": 0, "text": block.text}
        )

    def delta(self, chunk_id: str, offset: int, text: str) -> str:
        return self._event("chunk-delta", {"id": chunk_id, "offset": offset, "text": text})

    def seal(self, block: Block) -> str:
        return self._event("chunk-seal", log.as_json(block))

    def status(self, status: dict[str, Any]) -> str:
        frame = self._event("status", status)
        state, turn_id = status.get("state"), status.get("turn_id")
        if state != "idle":  # running, waiting for approval, compacting
            self.running_turn = turn_id
        elif self.running_turn is not None:
            frame += self._event("turn-done", {"turn_id": self.running_turn})
            self.running_turn = None
        return frame

    def queued(self, id: int, text: str, *, compact: bool = False) -> str:
        return self._event(
            "queued", {"id": id, "text": text, **({"compact": True} if compact else {})}
        )

    def taken(self, ids: list[int]) -> str:
        return self._event("taken", {"ids": list(ids)})


Renderer = HtmlRenderer | SseRenderer


class _Feed(bus.Hub):
    """This process's subscription to a tab's ops, shared by its followers here; it
    renders each op once for the pages among them (see the module's docstring)."""

    canonical: HtmlRenderer | None = None

    async def fan_out(self, message: dict[str, Any]) -> None:
        if message.get("type") != "tab.op":
            return
        shared = self._render(message)
        for member in list(self.members):
            try:
                await member.take(message, shared)
            except Exception:
                logger.exception("could not hand an op of tab group %s on", self.group)

    def _render(self, message: dict[str, Any]) -> Shared:
        op = message["op"]
        block = Block.from_dict(message["block"]) if op in ("open", "seal") else None
        if not any(isinstance(m.renderer, HtmlRenderer) for m in self.members):
            # Whatever it saw is not every op any more: a page starts it afresh.
            self.canonical = None
            return Shared(block)
        renderer = self.canonical = self.canonical or HtmlRenderer()
        before = renderer.state()
        match op:
            case "open" if block is not None:
                text = renderer.open(block)
            case "seal" if block is not None:
                text = renderer.seal(block)
            case "delta":
                text = renderer.delta(message["chunk_id"], message["offset"], message["text"])
            case "status":
                return Shared(None, Frame(renderer.status(message["status"])))
            case "queued":
                compact = message.get("compact") is True
                return Shared(
                    None, Frame(renderer.queued(message["id"], message["text"], compact=compact))
                )
            case "taken":
                return Shared(None, Frame(renderer.taken(message["ids"])))
            case _:
                return Shared(block)
        return Shared(block, Frame(text), before, renderer.state())


class Follower:
    """The sync of one client (a page's socket or an SSE stream) with a tab's log.

    `send` writes a frame to the client; `overflow` ends the connection when a
    client that never says what it holds lets too many ops pile up (it
    reconnects and starts over). Messages for the follower ("tab.op",
    "tab.snapshot", "tab.snapshot_timeout") arrive on `channel` of `layer`.
    """

    def __init__(
        self,
        tab_id: uuid.UUID,
        layer: Any,
        channel: str,
        renderer: Renderer,
        send: Callable[[str], Awaitable[None]],
        overflow: Callable[[], Awaitable[None]],
    ) -> None:
        self.tab_id = tab_id
        self.layer = layer
        self.channel = channel
        self.renderer = renderer
        self.send = send
        self.overflow = overflow
        self.synced = False
        self.buffer: deque[tuple[dict[str, Any], Shared | None]] = deque()
        self.sent_seq = 0
        self.open_id: str | None = None
        self.open_len = 0
        # Chunks the last catch-up sent sealed: buffered ops about them are stale.
        self.done_ids: set[str] = set()
        self.pending_hello: dict[str, Any] | None = None
        self.snapshot_timer: asyncio.TimerHandle | None = None
        self.feed: _Feed | None = None
        # Held by a sync (hello, snapshot, resync): ops meanwhile wait in the buffer.
        self._syncing = asyncio.Lock()
        self._resync: asyncio.Task[None] | None = None
        renderer.bind(self)

    async def join(self) -> None:
        """Follow the tab's ops from now on (buffered until the client says what it holds)."""
        group = bus.tab_group(self.tab_id)
        self.feed = cast(_Feed, await _Feed.join(bus.layer_for(group), group, self))

    async def leave(self) -> None:
        self.stop()
        feed, self.feed = self.feed, None
        if feed is not None:
            await feed.leave(self)

    def position(self) -> str:
        """What the client holds, as an SSE event id."""
        if self.open_id is None:
            return str(self.sent_seq)
        return f"{self.sent_seq}:{self.open_id}:{self.open_len}"

    def stop(self) -> None:
        if self.snapshot_timer is not None:
            self.snapshot_timer.cancel()
            self.snapshot_timer = None
        if self._resync is not None:
            self._resync.cancel()
            self._resync = None

    async def hello(self, hello: dict[str, Any]) -> None:
        async with self._syncing:
            await self._sync(hello)

    async def on_message(self, message: dict[str, Any]) -> None:
        """A message on the follower's own channel: its snapshot's answer."""
        match message["type"]:
            case "tab.op":
                await self.take(message)
            case "tab.snapshot":
                async with self._syncing:
                    await self.on_snapshot(message)
            case "tab.snapshot_timeout":
                async with self._syncing:
                    await self.on_snapshot_timeout()

    def _holding(self) -> dict[str, Any]:
        """What the client holds, as far as this follower sent it: a hello for a resync."""
        return {"last_seq": self.sent_seq, "open_id": self.open_id, "open_len": self.open_len}

    async def _sync(self, hello: dict[str, Any] | None) -> None:
        # Every catch-up reads the database: stale connections go first (the
        # per-op path skips Channels' per-message check, see TabSocket.dispatch).
        if hello is not None:
            await aclose_old_connections()
        # A loop, not recursion: a catch-up whose buffered ops show another gap
        # starts over from what the client then holds.
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
        # back as a "tab.snapshot" message (never await it here: messages are
        # handled one at a time).
        await self.layer.group_send(
            bus.control_group(self.tab_id),
            {"type": "turn.snapshot", "reply_to": self.channel, "tab_id": str(self.tab_id)},
        )
        loop = asyncio.get_running_loop()
        self.snapshot_timer = loop.call_later(
            SNAPSHOT_TIMEOUT,
            lambda: asyncio.ensure_future(
                self.layer.send(self.channel, {"type": "tab.snapshot_timeout"})
            ),
        )

    async def on_snapshot(self, message: dict[str, Any]) -> None:
        if self.pending_hello is None:
            return
        self.stop()
        await self._sync(await self._catch_up(message))

    async def on_snapshot_timeout(self) -> None:
        if self.pending_hello is None:
            return
        self.snapshot_timer = None
        block = await database_sync_to_async(log.checkpointed)(self.tab_id)
        snapshot = {"open": block.to_dict(), "status": None} if block is not None else None
        await self._sync(await self._catch_up(snapshot))

    async def _catch_up(self, snapshot: dict[str, Any] | None) -> dict[str, Any] | None:
        """Send what the pending hello lacks, then the buffer. A hello to sync again
        with if the buffer shows a gap (or more chunks follow), else None."""
        # Called only while a hello waits (each caller checks pending_hello first).
        hello, self.pending_hello = cast(dict[str, Any], self.pending_hello), None
        plan = await database_sync_to_async(self.renderer.catch_up)(self.tab_id, hello["last_seq"])
        chunks = plan.chunks
        frames = list(plan.frames)
        self.done_ids = {str(c.id) for c in chunks}
        if plan.replaced:
            # The client holds exactly the latest page now: its open chunk went with its old log.
            self.sent_seq = chunks[-1].seq if chunks else 0
            self.open_id, self.open_len = None, 0
        else:
            self.sent_seq = chunks[-1].seq if chunks else hello["last_seq"]
            self.open_id, self.open_len = hello["open_id"], hello["open_len"]
        if plan.more:
            # The next page first; the open block and the buffer wait behind it.
            self.open_id, self.open_len = None, 0
            for frame in frames:
                await self.send(frame)
            return self._holding()
        open_fields = snapshot.get("open") if snapshot else None
        if open_fields is not None and open_fields["id"] not in self.done_ids:
            block = Block.from_dict(open_fields)
            if (
                self.open_id == str(block.id)
                and self.open_len <= len(block.text)
                and self.renderer.resumes(block)
            ):
                rest = block.text[self.open_len :]
                if rest:
                    offset, self.open_len = self.open_len, len(block.text)
                    frames.append(self.renderer.delta(str(block.id), offset, rest))
            else:
                # Set before rendering: an SSE event's id is the position after it.
                self.open_id, self.open_len = str(block.id), len(block.text)
                frames.append(self.renderer.open(block))
        elif self.open_id is not None and (chunks or snapshot is None):
            # The chunk the client had open was sealed meanwhile (its seal is in
            # `chunks`) or the turn is gone: nothing is open any more.
            self.open_id, self.open_len = None, 0
        status = await database_sync_to_async(lease.status)(self.tab_id)
        if snapshot and snapshot.get("status"):
            status = {**status, **snapshot["status"]}
        frames.append(self.renderer.status(status))
        for frame in frames:
            await self.send(frame)
        self.synced = True
        while self.buffer:
            if resync := await self._forward(self.buffer.popleft()):
                # The rest stays buffered, behind the next catch-up.
                return resync
        return None

    async def take(self, message: dict[str, Any], shared: Shared | None = None) -> None:
        """An op, from the feed. It must not wait on the database (the feed hands each op
        to every follower in turn): while a sync runs, or its buffer drains, it waits in
        the buffer; a gap starts a sync of its own."""
        if not self.synced or self.buffer or self._syncing.locked():
            self.buffer.append((message, shared))
            if len(self.buffer) > MAX_BUFFERED_OPS:
                # The client reconnects by itself and starts over with a hello.
                self.buffer.clear()
                await self.overflow()
            return
        resync = await self._forward((message, shared))
        if resync is not None:
            self._resync = asyncio.ensure_future(self._sync_again(resync))

    async def _sync_again(self, hello: dict[str, Any]) -> None:
        async with self._syncing:
            await self._sync(hello)

    async def _forward(self, item: tuple[dict[str, Any], Shared | None]) -> dict[str, Any] | None:
        """Send an op's frame; on a gap, send nothing and return the hello to sync with."""
        try:
            frame = self._frame(*item)
        except _Gap as gap:
            logger.warning("tab %s: %s; catching the client up again", self.tab_id, gap)
            self.synced = False
            return self._holding()
        if frame:
            await self.send(frame)
        return None

    def _shared(self, shared: Shared | None) -> str | None:
        """The feed's frame, when this follower's renderer would render the same (its
        state is the one the feed's had before the op): it then moves to the state after."""
        renderer = self.renderer
        if shared is None or shared.frame is None or not isinstance(renderer, HtmlRenderer):
            return None
        if shared.before is not None:
            if renderer.state() != shared.before:
                return None
            renderer.adopt(cast(tuple[Any, ...], shared.after))
        return shared.frame

    def _frame(self, message: dict[str, Any], shared: Shared | None = None) -> str | None:
        match message["op"]:
            case "open":
                block = _block(message, shared)
                if str(block.id) == self.open_id or str(block.id) in self.done_ids:
                    return None
                self.open_id, self.open_len = str(block.id), len(block.text)
                return self._shared(shared) or self.renderer.open(block)
            case "delta":
                chunk_id = message["chunk_id"]
                if chunk_id in self.done_ids:
                    return None
                if chunk_id != self.open_id:
                    raise _Gap(f"a delta for chunk {chunk_id}, which the client never got opened")
                text, offset = message["text"], message["offset"]
                skip = self.open_len - offset
                if skip < 0:
                    raise _Gap(f"a delta at offset {offset}; the client has {self.open_len}")
                if skip >= len(text):
                    return None
                if skip == 0:
                    self.open_len += len(text)
                    return self._shared(shared) or self.renderer.delta(chunk_id, offset, text)
                text = text[skip:]
                offset = self.open_len
                self.open_len += len(text)
                return self.renderer.delta(chunk_id, offset, text)
            case "seal":
                block = _block(message, shared)
                if block.seq is not None and block.seq <= self.sent_seq:
                    return None
                if block.seq is not None and block.seq > self.sent_seq + 1:
                    raise _Gap(f"the seal of seq {block.seq}; the client has up to {self.sent_seq}")
                self.sent_seq = block.seq or self.sent_seq
                if str(block.id) == self.open_id:
                    self.open_id, self.open_len = None, 0
                return self._shared(shared) or self.renderer.seal(block)
            case "status":
                return self._shared(shared) or self.renderer.status(message["status"])
            case "queued":
                return self._shared(shared) or self.renderer.queued(
                    message["id"], message["text"], compact=message.get("compact") is True
                )
            case "taken":
                return self._shared(shared) or self.renderer.taken(message["ids"])
        return None


def parse_position(text: str) -> dict[str, Any]:
    """A hello from an SSE event id (`seq` or `seq:open_id:open_len`, see
    Follower.position) or an `after` seq. ValueError saying what is wrong."""
    parts = text.strip().split(":")
    try:
        last_seq = int(parts[0])
        if len(parts) == 1:
            open_id, open_len = None, 0
        elif len(parts) == 3:
            open_id, open_len = str(uuid.UUID(parts[1])), int(parts[2])
        else:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{text!r} is not a position: an event id (seq, or seq:chunk id:length)"
        ) from None
    if last_seq < 0 or open_len < 0:
        raise ValueError(f"{text!r} is not a position: negative numbers")
    return {"last_seq": last_seq, "open_id": open_id, "open_len": open_len}


async def sse_events(
    tab_id: uuid.UUID,
    hello: dict[str, Any],
    *,
    heartbeat: float | None = None,
    until: asyncio.Future[Any] | None = None,
) -> AsyncGenerator[str, None]:
    """The tab's log as server-sent events, from what `hello` holds on, until the
    client goes away or `until` resolves (chat.revocation: the credential the client
    was checked with ended); then a last `end` event carries the result's `as_dict()`
    and nothing else is sent. The caller has checked that the client may see the tab."""
    heartbeat = SSE_HEARTBEAT_SECONDS if heartbeat is None else heartbeat
    layer = get_channel_layer()
    # The follower's own channel: its snapshot's answer comes there; ops come from the feed.
    channel = await layer.new_channel()
    out: deque[str] = deque()
    wake = asyncio.Event()
    ended = False

    async def send(frame: str) -> None:
        out.append(frame)
        wake.set()

    async def overflow() -> None:
        nonlocal ended
        ended = True
        wake.set()

    follower = Follower(tab_id, layer, channel, SseRenderer(), send, overflow)
    # Joined before anything is read: ops from here on are buffered, not lost.
    await follower.join()
    receiving: asyncio.Future[Any] | None = None
    woken: asyncio.Future[Any] | None = None
    try:
        # How long a client waits before it reconnects, in milliseconds.
        yield "retry: 1000\n\n"
        await follower.hello(hello)
        while True:
            if until is not None and until.done():
                body = json.dumps(until.result().as_dict(), ensure_ascii=False)
                # No id: the client's position stays that of the last event it had.
                yield f"event: end\ndata: {body}\n\n"
                return
            while out:
                yield out.popleft()
            if ended:
                return
            wake.clear()
            # One receive kept across heartbeats: a receive cancelled mid-way could
            # lose its message on some channel layers.
            if receiving is None:
                receiving = asyncio.ensure_future(layer.receive(channel))
            if woken is None:
                woken = asyncio.ensure_future(wake.wait())
            waits = {receiving, woken} if until is None else {receiving, woken, until}
            done, _ = await asyncio.wait(
                waits, timeout=heartbeat, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                yield ": keep-alive\n\n"
                continue
            if woken in done:
                woken = None
            if receiving in done:
                message, receiving = receiving.result(), None
                await follower.on_message(message)
    finally:
        await follower.leave()
        for waiting in (receiving, woken):
            if waiting is not None:
                waiting.cancel()
