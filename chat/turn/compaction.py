"""The context window (chat/context.py decides; this module acts): compaction at a
turn's start, before a step that overflows, and when asked for (`/compact`); elision of
old bulky tool results when the cache is cold anyway.

A compaction is an appended chunk, never a deletion: the summary request is the live
request plus one user message (a cache read of the whole conversation), streamed into
memory, not the log.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from chat import blobs, context, log, retry, tools
from chat.chunks import Kind, Role, SystemKind
from chat.history import History
from chat.models import Tab, UsageRecord
from chat.providers.base import Finish, ProviderError, Request, TextDelta, ToolCallEvent
from chat.providers.errors import explain
from chat.stream import Block
from chat.turn import step
from chat.turn.outbox import Outbox, appended_seq
from chat.turn.state import COMPACTING, TurnState
from chat.turn.step import STOP_NOTICES, Stepper, Watch

# A summary request answered with a tool call, or failing on a retryable error, is
# asked once more.
SUMMARY_ATTEMPTS = 2


@dataclass(frozen=True)
class _Summary:
    text: str


class Compactor:
    """Keeps one runner's requests inside the model's context window."""

    def __init__(self, state: TurnState, outbox: Outbox, stepper: Stepper) -> None:
        self.state = state
        self.outbox = outbox
        self.stepper = stepper

    async def rebuild_history(self) -> None:
        chunks = await database_sync_to_async(log.context_tail)(self.state.tab_id)
        self.state.history = History.build(chunks)

    async def fit_at_turn_start(self, tab: Tab, model: str) -> None:
        """Before a turn's messages go in: compact when the context is past
        COMPACT_AT of the window; else, when the cache has expired anyway, elide old
        bulky tool results (never step by step: each elision is a cache miss)."""
        state = self.state
        size = state.size
        if not size.known:
            # Never measured (a new branch, an import): the builder's estimate.
            req = step.request(state, tab)
            size = context.Size(
                context.estimate(req.system, req.tools, req.messages), estimated=True
            )
        win = context.window(model)[0]
        if context.due_at_turn_start(size, win):
            await self.compact(tab, model, "auto", None, "", tokens_before=size.next)
        elif size.next >= win * context.COMPACT_TO and context.cache_cold(size, timezone.now()):
            chunks = await database_sync_to_async(log.context_tail)(state.tab_id)
            seqs = context.plan_elision(chunks, state.history_built.elided)
            if context.elided_chars(chunks, seqs) >= context.ELIDE_MIN_TOTAL:
                await self._append([self._elide_block(chunks, seqs)])

    def overflowing(self, model: str) -> bool:
        return context.overflowing(self.state.size, context.window(model)[0])

    async def compact_before_turn(self, tab: Tab, model: str) -> bool:
        """A turn too big for the window on its own: everything before it is
        summarised, the turn stays verbatim (its signed thinking and calls intact).
        False when there is nothing before it to summarise (said once)."""
        state = self.state
        if state.overflow_tried:
            return False  # one try a turn: what failed once would fail again
        state.overflow_tried = True
        chunks = await database_sync_to_async(log.context_tail)(state.tab_id)
        through = context.plan_through(chunks, context.window(model)[0], keep_current=True)
        if through is None:
            await self.outbox.system(
                SystemKind.COMPACTION_FAILED,
                "This turn alone fills the model's context window: there is nothing "
                "before it left to summarise. Stop it, or start a new tab.",
            )
            return False
        return await self.compact(
            tab, model, "auto", through, "", tokens_before=state.size.next, keep_current=True
        )

    def _plan(self, chunks: list[Any], trigger: str, through: int | None, model: str) -> int | None:
        if through is None and trigger == "auto":
            return context.plan_through(chunks, context.window(model)[0])
        if through is None:
            return context.last_sendable(chunks)
        return context.turn_end(chunks, through)

    async def compact(
        self,
        tab: Tab,
        model: str,
        trigger: str,
        through: int | None,
        instructions: str,
        *,
        tokens_before: int = 0,
        keep_current: bool = False,
    ) -> bool:
        """Summarise the log through `through` (None: as planned for an automatic
        compaction, or everything for a manual one) and append the compaction chunk
        the builder starts from. With `keep_current` (a turn too big for the window)
        the live request would not fit either, so the request is the log through
        `through` (the previous turn's last request and answer, cached too) plus the
        question. A failure leaves the log as it was, with a notice saying why; True
        when compacted."""
        state = self.state
        chunks = await database_sync_to_async(log.context_tail)(state.tab_id)
        through = self._plan(chunks, trigger, through, model)
        if through is None:
            await self.outbox.system(
                SystemKind.COMPACTION_FAILED,
                "Nothing to compact: no message since the last compaction reaches that far."
                if chunks
                else "Nothing to compact yet.",
            )
            return False
        if keep_current:
            history = History.build([c for c in chunks if c.seq is not None and c.seq <= through])
            question = context.ask(instructions)
        else:
            history = state.history_built
            question = context.ask(instructions, context.kept_from(chunks, through))
        req = Request(
            system=tab.system_prompt,
            tools=tools.tab_specs(tab),
            messages=history.with_ask(question),
            blobs=blobs.READER,
            cache_key=str(tab.pk),
        )
        state.status.state = COMPACTING
        await self.outbox.status()
        try:
            summary = await self._summarise(req, model)
        finally:
            state.status.state = "running"
        if isinstance(summary, str):
            await self.outbox.system(SystemKind.COMPACTION_FAILED, summary)
            await self.outbox.status()
            return False
        data: dict[str, Any] = {
            "summary": summary.text,
            "through_seq": through,
            "model": model,
            "trigger": trigger,
            "tokens_before": tokens_before or state.size.next,
        }
        if instructions.strip():
            data["instructions"] = instructions.strip()
        blocks = [
            Block(
                uuid.uuid4(), state.turn_id, state.reducer.step, Role.SYSTEM, Kind.COMPACTION, data
            )
        ]
        kept = [c for c in chunks if c.seq is not None and c.seq > through]
        if seqs := context.plan_elision(kept, state.history_built.elided):
            blocks.append(self._elide_block(kept, seqs))
        await self._append(blocks)
        req = step.request(state, tab)
        estimate = context.estimate(req.system, req.tools, req.messages)
        await self.stepper.set_size(context.Size(estimate, at=state.size.at, estimated=True), model)
        await self.outbox.status()
        return True

    def _elide_block(self, chunks: list[Any], seqs: list[int]) -> Block:
        chars = context.elided_chars(chunks, seqs)
        text = (
            f"Removed {len(seqs)} old tool output{'s' if len(seqs) != 1 else ''} "
            f"({chars:,} characters) from what the model is sent, to save context; "
            "they stay in the log."
        )
        data = {"kind": context.ELIDE, "text": text, "seqs": seqs, "chars": chars}
        state = self.state
        return Block(
            uuid.uuid4(), state.turn_id, state.reducer.step, Role.SYSTEM, Kind.SYSTEM, data
        )

    async def _append(self, blocks: list[Block]) -> None:
        """Append compaction/elide chunks and build the history again from the log
        (they change what earlier chunks send)."""
        await self.outbox.flush_deltas()
        await self.outbox.append(blocks)
        for block in blocks:
            self.state.last_seq = appended_seq(block)
            await self.outbox.publish({"op": "seal", "block": block.to_dict()})
        await self.rebuild_history()

    async def _summarise(self, req: Request, model: str) -> _Summary | str:
        """The summary's text, or why there is none. A stray tool call is ignored and
        the request asked again (the same bytes: the cache holds them), once; so is
        a retryable error."""
        why = ""
        for attempt in range(SUMMARY_ATTEMPTS):
            self.state.check_cancel()
            try:
                text, finish, called = await self._summary_stream(req, model)
            except ProviderError as exc:
                why = explain(exc, model=model, attempts=attempt + 1).summary or exc.message
                if context.is_overflow(exc) and req.max_tokens is None:
                    # Some models refuse input + max_tokens past the window: a summary
                    # needs far less room than an answer (the cache ignores max_tokens).
                    req = replace(req, max_tokens=context.SUMMARY_MAX_TOKENS)
                    continue
                if not exc.retryable:
                    break
                decision = retry.decide(
                    exc, attempt, model=model, fallback="", switched=True, rand=random.random()
                )
                if isinstance(decision, retry.Retry):
                    await self.state.sleep(decision.delay)
                continue
            await self.stepper.record_usage(model, finish.usage, UsageRecord.Kind.SUMMARY)
            if finish.stop_reason in STOP_NOTICES:
                why = "the summary was cut off at the model's output limit"
                break
            if text.strip():
                return _Summary(text.strip())
            if not called:
                why = "the summary came back empty"
                break
            why = "the model called a tool instead of writing the summary"
        return f"Could not compact the conversation: {why}. It goes on uncompacted."

    async def _summary_stream(self, req: Request, model: str) -> tuple[str, Finish, bool]:
        """One summary request: its text (thinking is not kept), how it ended, and
        whether it called a tool. Nothing goes to the log while it streams."""
        provider = await step.provider_for(model)

        async def produce(queue: asyncio.Queue[Any]) -> None:
            async with aclosing(provider.stream(req)) as events:
                async for event in events:
                    await queue.put(event)

        pieces: list[str] = []
        called = False
        finish = Finish()
        stepper = self.stepper
        stepper.start_watch()
        try:
            async with aclosing(stepper.produced(produce, Watch.of(provider, model))) as events:
                async for event in events:
                    await stepper.progress()
                    match event:
                        case TextDelta(text=text):
                            pieces.append(text)
                        case ToolCallEvent():
                            called = True
                        case Finish():
                            finish = event
        finally:
            self.state.status.waiting_since = None
        return "".join(pieces), finish, called
