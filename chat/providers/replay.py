"""A provider that replays scripted events: the test double of the turn engine,
and the model of the benchmarks.

    provider = ScriptedProvider([
        [TextDelta("Let me look."), ToolCallEvent("c1", "list_files", {"path": "."}),
         Finish(stop_reason="tool_use")],
        [ProviderError("overloaded", status_code=529, retryable=True)],
        [TextDelta("Done."), Finish()],
    ])

Each `stream()` call consumes the next step of the script, in order, and
records the request it was given. In a step, an Event is yielded, an Exception
is raised there (events before it were already yielded), and an asyncio.Event
holds the stream until the test sets it (to cancel or inspect mid-stream, or,
never set, to stall it past `idle_timeout`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from chat.providers.base import Event, Request
from chat.providers.registry import STREAM_IDLE_TIMEOUT, ModelInfo

Item = Event | BaseException | asyncio.Event


class ScriptExhausted(AssertionError):
    """More stream() calls than scripted steps: a test expected fewer steps."""


class ScriptedProvider:
    def __init__(
        self,
        steps: Sequence[Sequence[Item]],
        delay: float = 0.0,
        *,
        model: ModelInfo | None = None,
        idle_timeout: float = STREAM_IDLE_TIMEOUT,
    ) -> None:
        """`delay` seconds are slept before each item (0: none); `idle_timeout`
        is what the turn runner allows between two events."""
        if delay < 0:
            raise ValueError(f"delay must be >= 0 seconds, not {delay}")
        self.idle_timeout = idle_timeout
        self.steps = [list(step) for step in steps]
        self.delay = delay
        self.model = model or ModelInfo("scripted/replay", "Scripted replay")
        self.requests: list[Request] = []
        # How each stream() ended, by call: "done" (script played to its end),
        # "raised" (a scripted exception), "closed" (the caller closed it
        # early or cancelled it). None while running.
        self.outcomes: list[str | None] = []

    def __repr__(self) -> str:
        return f"ScriptedProvider({len(self.requests)}/{len(self.steps)} steps used)"

    @property
    def remaining(self) -> int:
        """Steps not yet consumed."""
        return len(self.steps) - len(self.requests)

    async def stream(self, request: Request) -> AsyncIterator[Event]:
        n = len(self.requests)
        if n >= len(self.steps):
            raise ScriptExhausted(
                f"ScriptedProvider: stream() call #{n + 1}, but only "
                f"{len(self.steps)} step(s) were scripted"
            )
        self.requests.append(request)
        self.outcomes.append(None)
        outcome = "closed"
        try:
            for item in self.steps[n]:
                if self.delay:
                    await asyncio.sleep(self.delay)
                if isinstance(item, asyncio.Event):
                    await item.wait()
                elif isinstance(item, BaseException) or (
                    isinstance(item, type) and issubclass(item, BaseException)
                ):
                    outcome = "raised"
                    raise item
                else:
                    yield item
            outcome = "done"
        finally:
            self.outcomes[n] = outcome
