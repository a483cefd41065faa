"""TabSocket: one per open tab page. TurnWorker: the background consumer that runs turns."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

from channels.consumer import AsyncConsumer
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from chat import log, render, turns
from chat.agent import TurnRunner
from chat.models import RunningTurn, Tab
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


class TabSocket(AsyncWebsocketConsumer):
    """Streams a tab's ops to one page, with no gap and no duplicate (DESIGN §5).

    The socket joins the tab's group at connect and buffers ops. When the page
    says what it holds ("hello": last sealed seq, open chunk id and length), the
    socket sends the sealed chunks it lacks and the running turn's exact open
    block, then drains the buffer, dropping whatever that already covered. From
    then on every op is checked against what the page holds: a seal at or
    below `sent_seq` and delta text before `open_len` are never sent twice.
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
        self.group = turns.tab_group(tab_id)
        self.synced = False
        self.buffer: list[dict[str, Any]] = []
        self.sent_seq = 0
        self.open_id: str | None = None
        self.open_len = 0
        self.pending_hello: dict[str, Any] | None = None
        self.snapshot_timer: asyncio.TimerHandle | None = None
        # Join before reading anything: ops from here on are buffered, not lost.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

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
        self.synced = False
        self.pending_hello = hello
        if self.snapshot_timer is not None:
            # A hello while an earlier one waited: only the newest is answered.
            self.snapshot_timer.cancel()
            self.snapshot_timer = None
        running = await RunningTurn.objects.filter(tab_id=self.tab_id).aexists()
        if not running:
            await self._catch_up(None)
            return
        # Ask the worker holding the turn for its open block; the answer comes
        # back as a "tab.snapshot" message (never await it here: a consumer
        # handles one message at a time).
        await self.channel_layer.group_send(
            turns.control_group(self.tab_id),
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
        await self._catch_up(message)

    async def tab_snapshot_timeout(self, message: dict[str, Any]) -> None:
        if self.pending_hello is None:
            return
        self.snapshot_timer = None
        running = await RunningTurn.objects.filter(tab_id=self.tab_id).afirst()
        snapshot = None
        if running is not None and running.open_chunk:
            snapshot = {"open": running.open_chunk, "status": None}
        await self._catch_up(snapshot)

    async def _catch_up(self, snapshot: dict[str, Any] | None) -> None:
        hello, self.pending_hello = self.pending_hello, None
        chunks = await database_sync_to_async(log.tail)(self.tab_id, after=hello["last_seq"])
        frames = []
        if chunks:
            frames.append(render.fragment_chunks(chunks))
        self.sent_seq = chunks[-1].seq if chunks else hello["last_seq"]
        self.open_id, self.open_len = hello["open_id"], hello["open_len"]
        open_fields = snapshot.get("open") if snapshot else None
        if open_fields is not None and not any(str(c.id) == open_fields["id"] for c in chunks):
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
        status = await database_sync_to_async(turns.status)(self.tab_id)
        if snapshot and snapshot.get("status"):
            status = {**status, **snapshot["status"]}
        frames.append(render.fragment_status(status))
        for frame in frames:
            await self.send(text_data=frame)
        buffered, self.buffer = self.buffer, []
        self.synced = True
        for op in buffered:
            await self._forward(op)

    async def tab_op(self, message: dict[str, Any]) -> None:
        if not self.synced:
            self.buffer.append(message)
            if len(self.buffer) > MAX_BUFFERED_OPS:
                # The page reconnects by itself and starts over with a hello.
                self.buffer = []
                await self.close(code=CLOSE_RESYNC)
            return
        await self._forward(message)

    async def _forward(self, message: dict[str, Any]) -> None:
        frame = self._frame(message)
        if frame:
            await self.send(text_data=frame)

    def _frame(self, message: dict[str, Any]) -> str | None:
        match message["op"]:
            case "open":
                block = Block.from_dict(message["block"])
                if str(block.id) == self.open_id:
                    return None
                self.open_id, self.open_len = str(block.id), len(block.text)
                return render.fragment_open(block)
            case "delta":
                if message["chunk_id"] != self.open_id:
                    return None
                text, offset = message["text"], message["offset"]
                skip = self.open_len - offset
                if skip < 0:
                    # Text is missing between what the page has and this delta:
                    # cannot happen with ordered delivery; log it loudly.
                    logger.error(
                        "delta gap on tab %s: have %s, got offset %s",
                        self.tab_id,
                        self.open_len,
                        offset,
                    )
                    return None
                if skip >= len(text):
                    return None
                text = text[skip:]
                self.open_len += len(text)
                return render.fragment_delta(uuid.UUID(message["chunk_id"]), text)
            case "seal":
                block = Block.from_dict(message["block"])
                if block.seq is not None and block.seq <= self.sent_seq:
                    return None
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


class TurnWorker(AsyncConsumer):
    """Runs turns, on the worker channel: in the web process (embedded) or in runworker."""

    async def __call__(self, scope, receive, send):
        self.runners: dict[uuid.UUID, TurnRunner] = {}
        self.tasks: set[asyncio.Task] = set()
        try:
            await super().__call__(scope, receive, send)
        finally:
            # The consumer is going away (shutdown, or the channel layer failed):
            # its turns are interrupted, not cancelled by anyone.
            for runner in self.runners.values():
                runner.cancel(stopping=True)
            if self.tasks:
                # Let interrupted turns write their notice and release their lease.
                await asyncio.wait(list(self.tasks), timeout=turns.INTERRUPT_WAIT_SECONDS)
            for task in list(self.tasks):
                task.cancel()

    async def dispatch(self, message: dict[str, Any]) -> None:
        # One bad message must not take down the consumer and every turn it runs.
        try:
            await super().dispatch(message)
        except Exception:
            logger.exception("turn worker could not handle %r", message.get("type"))

    async def turn_start(self, message: dict[str, Any]) -> None:
        if not turns.accepting_turns:
            return
        tab_id = uuid.UUID(message["tab_id"])
        worker = turns.worker_id(self.channel_name)
        # Claimed before the lease commits: the recovery scan must never find
        # this process's fresh lease unclaimed and take it for a dead one's.
        turns.claim(tab_id)
        try:
            turn_id = await database_sync_to_async(turns.acquire)(tab_id, worker)
        except BaseException:
            turns.unclaim(tab_id)
            raise
        if turn_id is None:
            turns.unclaim(tab_id)
            return  # another turn holds the tab; it takes queued messages itself
        group = turns.tab_group(tab_id)

        async def publish(op: dict[str, Any]) -> None:
            await self.channel_layer.group_send(group, {"type": "tab.op", **op})

        runner = TurnRunner(
            tab_id, turn_id, publish, auto_approve=bool(message.get("auto_approve"))
        )
        self.runners[tab_id] = runner
        await self.channel_layer.group_add(turns.control_group(tab_id), self.channel_name)
        task = asyncio.create_task(self._run(runner))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, runner: TurnRunner) -> None:
        try:
            await runner.run()
        except Exception as exc:
            # run() ends its own crashes; one that still escapes (handing a
            # turn back failed) gets the same ending, not a stuck tab whose
            # lease recovery would later call a server that stopped.
            logger.exception("runner for tab %s crashed", runner.tab_id)
            await runner.abort(exc)
        finally:
            # After run(): the lease is released (or recovered by someone else).
            turns.unclaim(runner.tab_id)
            if self.runners.get(runner.tab_id) is runner:
                del self.runners[runner.tab_id]
                await self.channel_layer.group_discard(
                    turns.control_group(runner.tab_id), self.channel_name
                )

    def _runner(self, message: dict[str, Any]) -> TurnRunner | None:
        return self.runners.get(uuid.UUID(message["tab_id"]))

    async def turn_cancel(self, message: dict[str, Any]) -> None:
        runner = self._runner(message)
        if runner is None or message.get("turn_id") not in (None, str(runner.turn_id)):
            return
        runner.cancel()

    async def turn_approve(self, message: dict[str, Any]) -> None:
        if runner := self._runner(message):
            runner.approve(message["call_id"], bool(message["approved"]))

    async def turn_snapshot(self, message: dict[str, Any]) -> None:
        runner = self._runner(message)
        if runner is None:
            return  # the asker falls back to the checkpoint after its timeout
        await self.channel_layer.send(
            message["reply_to"], {"type": "tab.snapshot", **runner.snapshot()}
        )
