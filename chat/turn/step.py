"""One step: a request streamed from the provider into the reducer, with retries, the
fallback model and the idle watchdog. `Stepper.run` returns one `StepResult`.

The provider's stream is consumed in the runner's own task (`Stepper.stream`): no task
or queue between the SDK and the reducer. Stop and the idle watchdog interrupt only the
wait for its next event (`TurnState.interrupt` cancels the task while it waits there, and
what it waited for is raised in its place), never the ops being applied, so an op is never
half-applied: a seal is either in the log and broadcast, or neither. What produces events
on its own schedule (a running tool, an agent) runs in a *producer* task that feeds one
queue (`Stepper.produced`), which cancel cancels.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import aclosing, suppress
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from django.utils import timezone

from chat import blobs, context, retry, tools
from chat.chunks import SystemKind
from chat.models import Tab, UsageRecord
from chat.pacing import check_silence
from chat.providers import aget_provider
from chat.providers.base import Event, Finish, ProviderError, Request, Usage
from chat.providers.errors import STREAM_IDLE, explain
from chat.providers.registry import STREAM_IDLE_TIMEOUT
from chat.turn.ending import NOT_RUN_ERROR, NOT_RUN_UNREADABLE, End, end_ops
from chat.turn.outbox import Outbox
from chat.turn.state import TurnCancelled, TurnConfig, TurnState

# After this long with nothing new to show, the status line says "waiting for
# the model · N s": shorter pauses are normal before a first token.
WAITING_STATUS_AFTER = 10.0
# Bytes that make no event (pings) keep an attempt alive past the idle timeout,
# since a model may think silently, but not for longer than this without a
# single event: a server that only pings still ends within a bounded total.
# Ten minutes is past the longest silent thinking seen from a real model.
STREAM_SILENT_MAX = 600.0
# The error type of an attempt given up by the idle watchdog.
STALLED = STREAM_IDLE
# A stall the watchdog sees is looked at again this much later before the attempt is cut:
# after the event loop was blocked, the timer runs before the task that reads the bytes
# that came meanwhile, so a stream alive all along would look silent.
STALL_RECHECK = 0.1
# Stop reasons that cut the answer short, and the notice written after it.
STOP_NOTICES = {
    "max_tokens": (
        SystemKind.OUTPUT_LIMIT,
        "The model stopped at its output limit: the answer is cut short.",
    ),
    "model_context_window_exceeded": (
        SystemKind.CONTEXT_LIMIT,
        "The model stopped because the conversation filled its context window.",
    ),
}


async def provider_for(model: str) -> Any:
    """The provider for a model id. Tests replace this function."""
    return await aget_provider(model)


def request(state: TurnState, tab: Tab) -> Request:
    """The step's request: the frozen system prompt and tools, and the history."""
    return Request(
        system=tab.system_prompt,
        tools=tools.tab_specs(tab),
        messages=state.history_built.messages(),
        blobs=blobs.READER,
        cache_key=str(tab.pk),
    )


class Outcome(StrEnum):
    # The stream ended: `finish` says how, `model` which model answered.
    FINISHED = "finished"
    # Refused as too long for the context window, the log untouched: `error`, `tries`,
    # and the model asked (the fallback's, when the turn had switched to it).
    OVERFLOW = "overflow"
    # An error chunk ended the turn.
    ENDED = "ended"


@dataclass(frozen=True)
class StepResult:
    outcome: Outcome
    model: str
    finish: Finish | None = None
    error: ProviderError | None = None
    tries: int = 0


@dataclass
class _ProducerDone:
    error: BaseException | None = None


@dataclass(frozen=True)
class _Stalled:
    """The watchdog gave up on the stream."""

    message: str


@dataclass(frozen=True)
class _Silent:
    """The watchdog's word that the model has been silent for WAITING_STATUS_AFTER."""


@dataclass(frozen=True)
class Watch:
    """The idle watchdog of one stream: its timeout, when the provider last
    received bytes (loop time, None if it cannot tell), and the model's name."""

    idle: float
    alive_at: Callable[[], float | None]
    model: str

    @classmethod
    def of(cls, provider: Any, model: str) -> Watch:
        idle = getattr(provider, "idle_timeout", STREAM_IDLE_TIMEOUT)
        return cls(idle, lambda: getattr(provider, "alive_at", None), model)


Produce = Callable[["asyncio.Queue[Any]"], Coroutine[Any, Any, None]]


class Stepper:
    """Streams steps for one runner; also the producer machinery tools use."""

    def __init__(self, state: TurnState, outbox: Outbox) -> None:
        self.state = state
        self.outbox = outbox
        # The stream's watchdog timer, and the "waiting for the model" status it is
        # publishing (the next event's status waits for it: they go out in order).
        self._timer: asyncio.TimerHandle | None = None
        self._showing: asyncio.Future[None] | None = None
        # Loop time of the stream's last event (or of its start).
        self._last_event_at = 0.0
        # Loop time since when the runner waits for the stream's next event; None while
        # it is busy with one (that is not the stream's silence).
        self._wait_start: float | None = None
        # When the watchdog looks next (loop time), as its last look decided.
        self._wake_at: float | None = None
        # The last look saw a stall, to be confirmed by the next (STALL_RECHECK).
        self._stall_seen = False

    async def run(
        self, req: Request, model: str, config: TurnConfig, *, overflow: bool = True
    ) -> StepResult:
        """Stream one step, retrying as chat.retry decides. With `overflow`, a refusal for
        the context window comes back as OVERFLOW (nothing streamed before a 400), for the
        caller to compact."""
        state = self.state
        attempt = 0
        switched = False
        tries = 0
        while True:
            state.check_cancel()
            try:
                finish = await self.stream(req, model)
                await self.record_usage(model, finish.usage)
                return StepResult(Outcome.FINISHED, model, finish)
            except ProviderError as exc:
                tries += 1
                if overflow and context.is_overflow(exc) and state.reducer.open is None:
                    return StepResult(Outcome.OVERFLOW, model, error=exc, tries=tries)
                decision = retry.decide(
                    exc,
                    attempt,
                    model=model,
                    fallback=config.fallback_model,
                    switched=switched,
                    rand=random.random(),
                )
                if isinstance(decision, retry.GiveUp):
                    await self.give_up(exc, model, tries, attempt)
                    return StepResult(Outcome.ENDED, model, error=exc, tries=tries)
                await self._cut_attempt()
                if isinstance(decision, retry.Retry):
                    attempt += 1
                    await self.outbox.system(
                        SystemKind.NOTICE,
                        f"{_reason(exc)}; retrying in {decision.delay:g} s "
                        f"(attempt {attempt + 1} of {len(retry.RETRY_DELAYS) + 1}).",
                        retry=True,
                    )
                    await state.sleep(decision.delay)
                    continue
                switched = True
                attempt = 0
                await self.outbox.system(
                    SystemKind.MODEL_CHANGED,
                    f"Switched to {decision.model} ({_reason(exc).lower()}).",
                    retry=True,
                )
                model = decision.model
            except (ValueError, LookupError) as exc:
                # A misconfigured model (unknown provider, missing key), or a response
                # that could not be read.
                await self.outbox.apply(
                    end_ops(state.reducer, End.error(str(exc), NOT_RUN_UNREADABLE))
                )
                return StepResult(Outcome.ENDED, model, tries=tries)

    async def _cut_attempt(self) -> None:
        """The cut-off attempt stays in the log; the retry notice after it tells history
        not to send it, and its calls are never run."""
        self.state.reducer.pending_calls.clear()
        await self.outbox.apply(self.state.reducer.seal())
        await self.outbox.status()  # a "waiting" count ends with the attempt

    async def give_up(self, exc: ProviderError, model: str, tries: int, attempt: int = 0) -> None:
        """End the turn on `exc`: the open block and calls closed, the error chunk."""
        message = exc.message
        if exc.error_type == STALLED and attempt:
            message += (
                f", on each of {attempt + 1} attempts: the provider seems stalled. "
                "Try again later or pick another model."
            )
        details = explain(exc, model=model, attempts=tries).data()
        end = End.error(message, NOT_RUN_ERROR, exc.status_code, details)
        await self.outbox.apply(end_ops(self.state.reducer, end))

    async def stream(self, req: Request, model: str) -> Finish:
        """One attempt: the provider's events through the reducer, in this task. A timer
        looks at the silence now and then (pacing.check_silence): the status says since
        when the model is silent, and a stream silent past its idle timeout fails as a
        retryable ProviderError. A timer, not a timeout around each wait, which would make
        and cancel a timer per token."""
        state = self.state
        provider = await provider_for(model)
        watch = Watch.of(provider, model)
        finish = Finish()
        state.check_cancel()
        state.interrupted = None
        loop = asyncio.get_running_loop()
        self.start_watch()
        self._timer = loop.call_at(
            loop.time() + min(watch.idle, WAITING_STATUS_AFTER), self._watch, watch
        )
        try:
            async with aclosing(provider.stream(req)) as events:
                while (event := await self._next(events)) is not None:
                    await self.progress()
                    if isinstance(event, Finish):
                        finish = event
                    await self.outbox.apply(state.reducer.feed(event))
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            await self._shown()
            state.interrupted = None
            state.status.waiting_since = None
        await self.outbox.apply(state.reducer.seal())
        return finish

    async def _next(self, events: AsyncIterator[Event]) -> Event | None:
        """The stream's next event (None at its end), waited for where Stop and the
        watchdog can interrupt it."""
        state = self.state
        task = asyncio.current_task()
        state.check_cancel()
        self._raise_interrupt(task)
        self._wait_start = asyncio.get_running_loop().time()
        state.waiting = task
        try:
            event = await anext(events, None)
        except BaseException:
            self._raise_interrupt(task)
            raise
        finally:
            state.waiting = None
            self._wait_start = None
        # Interrupted as the event came (or a provider swallowed the cancel): dropped.
        self._raise_interrupt(task)
        return event

    def _raise_interrupt(self, task: asyncio.Task[Any] | None) -> None:
        why, self.state.interrupted = self.state.interrupted, None
        if why is None:
            return
        if task is not None and task.cancelling():
            task.uncancel()
        raise why

    def _watch(self, watch: Watch) -> None:
        loop = asyncio.get_running_loop()
        for seen in self._look(loop.time(), watch):
            if isinstance(seen, _Stalled):
                error = ProviderError(seen.message, error_type=STALLED, retryable=True)
                self.state.interrupt(error)
            elif self.state.waiting is not None:
                silent = timedelta(seconds=loop.time() - self._last_event_at)
                self.state.status.waiting_since = (timezone.now() - silent).isoformat()
                self._showing = asyncio.ensure_future(self.outbox.status())
        wake_at = self._wake_at
        self._timer = None if wake_at is None else loop.call_at(wake_at, self._watch, watch)

    async def _shown(self) -> None:
        """The "waiting" status being published is out (or failed: the next one says more)."""
        showing, self._showing = self._showing, None
        if showing is not None:
            with suppress(Exception):
                await showing

    async def progress(self) -> None:
        """An event came: the "waiting for the model" count ends."""
        self._last_event_at = asyncio.get_running_loop().time()
        await self._shown()
        if self.state.status.waiting_since is not None:
            self.state.status.waiting_since = None
            await self.outbox.status()

    def start_watch(self) -> None:
        """A stream starts: its silence counts from now."""
        self._last_event_at = asyncio.get_running_loop().time()
        self._stall_seen = False

    async def produced(
        self, produce: Produce, watch: Watch | None = None
    ) -> AsyncGenerator[Event, None]:
        """Run `produce` as a cancellable producer; yield what it queues, in order. With
        `watch`, a timer looks at the silence now and then (pacing.check_silence): the
        status says since when the model is silent, and a stream silent past its idle
        timeout fails as a retryable ProviderError (the finally cancels the producer).
        A timer, not a timeout around each wait, which would make and cancel a timer per
        token."""
        state = self.state
        # A cancel that came while no producer ran (between steps, during a DB call) must
        # stop the turn before the next producer starts.
        state.check_cancel()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        timer: asyncio.TimerHandle | None = None

        def done(task: asyncio.Task[None]) -> None:
            # From the task's outside: a task cancelled before its first step never runs
            # its body, so the body could not report it.
            error = asyncio.CancelledError() if task.cancelled() else task.exception()
            queue.put_nowait(_ProducerDone(error))

        def look(watch: Watch) -> None:
            nonlocal timer
            for item in self._look(loop.time(), watch):
                queue.put_nowait(item)
            wake_at = self._wake_at
            timer = None if wake_at is None else loop.call_at(wake_at, look, watch)

        producer = state.producer = asyncio.create_task(produce(queue))
        producer.add_done_callback(done)
        if watch is not None:
            timer = loop.call_at(loop.time() + min(watch.idle, WAITING_STATUS_AFTER), look, watch)
        try:
            while True:
                if self._wait_start is None and queue.empty():
                    self._wait_start = loop.time()
                item = await queue.get()
                if isinstance(item, _Silent):
                    silent = timedelta(seconds=loop.time() - self._last_event_at)
                    state.status.waiting_since = (timezone.now() - silent).isoformat()
                    await self.outbox.status()
                    continue  # still waiting: the silence goes on counting
                self._wait_start = None
                if isinstance(item, _Stalled):
                    raise ProviderError(item.message, error_type=STALLED, retryable=True)
                if isinstance(item, _ProducerDone):
                    if isinstance(item.error, asyncio.CancelledError):
                        raise TurnCancelled()
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            if timer is not None:
                timer.cancel()
            self._wait_start = None
            producer.cancel()
            with suppress(BaseException):
                await producer
            state.producer = None

    def _look(self, now: float, watch: Watch) -> list[_Silent | _Stalled]:
        """What the watchdog sees at `now`; sets when it looks next."""
        silence = check_silence(
            now,
            last_event=self._last_event_at,
            wait_start=self._wait_start,
            alive_at=watch.alive_at(),
            idle=watch.idle,
            waiting_shown=self.state.status.waiting_since is not None,
            waiting_after=WAITING_STATUS_AFTER,
            silent_max=STREAM_SILENT_MAX,
        )
        self._wake_at = silence.wake_at
        seen: list[_Silent | _Stalled] = [_Silent()] if silence.show_waiting else []
        stall_seen, self._stall_seen = self._stall_seen, bool(silence.stalled)
        if silence.stalled and not stall_seen:
            self._wake_at = now + STALL_RECHECK
        elif silence.stalled == "keep-alives":
            silent_for = now - self._last_event_at
            seen.append(_Stalled(f"{watch.model} sent only keep-alives for {silent_for:.0f} s"))
        elif silence.stalled:
            seen.append(_Stalled(f"{watch.model} sent nothing for {watch.idle:g} s"))
        return seen

    async def record_usage(
        self, model: str, usage: Usage, kind: str = UsageRecord.Kind.STEP
    ) -> None:
        """Record a request's tokens; a step's are also the tab's context size."""
        state = self.state
        state.status.usage = state.status.usage + usage
        owner_id = state.owner_id
        if owner_id is None:  # known once the turn has read its tab
            owner_id = (await Tab.objects.only("owner_id").aget(pk=state.tab_id)).owner_id
        await UsageRecord.objects.acreate(
            user_id=owner_id,
            tab_id=state.tab_id,
            turn_id=state.turn_id,
            step=state.reducer.step,
            model=model,
            kind=kind,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )
        if kind == UsageRecord.Kind.STEP:
            size = context.Size(
                usage.input_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.output_tokens,
                at=timezone.now().isoformat(),
            )
            await self.set_size(size, model)

    async def set_size(self, size: context.Size, model: str) -> None:
        state = self.state
        state.size = size
        state.status.context = context.meter(size, model).as_dict()
        await Tab.objects.filter(pk=state.tab_id).aupdate(context=size.as_dict())


def _reason(exc: ProviderError) -> str:
    if exc.error_type == STALLED:
        return exc.message
    if exc.status_code == 429:
        return "Rate limited (429)"
    if exc.status_code in (529, 503) or exc.error_type == "overloaded_error":
        return f"Provider overloaded ({exc.status_code or 'in-stream'})"
    if exc.status_code is None:
        return f"Connection failed: {exc.message}"
    return f"Provider error {exc.status_code}"
