"""ScriptedProvider: the scripted test double of the turn engine."""

from __future__ import annotations

import asyncio

import pytest

from chat.providers.base import (
    Finish,
    Message,
    ProviderError,
    Request,
    TextDelta,
    TextPart,
    ToolCallEvent,
)
from chat.providers.replay import ScriptedProvider, ScriptExhausted
from harness.fakeprovider import collect

# Bound on waiting for the scripted stream to reach a point.
WAIT = 5.0


def ask(text: str) -> Request:
    return Request("", (), (Message("user", (TextPart(text),)),))


async def test_it_plays_one_step_per_call_and_records_the_requests():
    """Each stream() call yields the next step's events and keeps its request."""
    provider = ScriptedProvider(
        [
            [TextDelta("a"), ToolCallEvent("c1", "shell", {"command": "ls"}), Finish()],
            [TextDelta("b"), Finish()],
        ]
    )
    first, second = ask("one"), ask("two")
    assert await collect(provider.stream(first)) == [
        TextDelta("a"),
        ToolCallEvent("c1", "shell", {"command": "ls"}),
        Finish(),
    ]
    assert provider.remaining == 1
    assert await collect(provider.stream(second)) == [TextDelta("b"), Finish()]
    assert provider.requests == [first, second]
    assert provider.outcomes == ["done", "done"]
    assert provider.remaining == 0


async def test_it_raises_a_scripted_exception_after_the_events_before_it():
    """An exception item is raised where it stands; the events before it were yielded."""
    error = ProviderError("overloaded", status_code=529, retryable=True)
    provider = ScriptedProvider([[TextDelta("partial"), error, TextDelta("never")]])
    seen = []
    with pytest.raises(ProviderError) as raised:
        async for event in provider.stream(ask("x")):
            seen.append(event)
    assert raised.value is error
    assert seen == [TextDelta("partial")]
    assert provider.outcomes == ["raised"]


async def test_it_refuses_a_call_past_the_end_of_the_script():
    """One call too many is a ScriptExhausted saying how many steps there were."""
    provider = ScriptedProvider([[Finish()]])
    await collect(provider.stream(ask("x")))
    with pytest.raises(ScriptExhausted, match="only 1 step"):
        await collect(provider.stream(ask("y")))
    assert len(provider.requests) == 1


async def test_it_holds_at_an_event_until_it_is_set():
    """An asyncio.Event item holds the stream there until the test sets it."""
    gate = asyncio.Event()
    provider = ScriptedProvider([[TextDelta("before"), gate, TextDelta("after"), Finish()]])
    stream = provider.stream(ask("x"))
    assert await anext(stream) == TextDelta("before")
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert not pending.done()
    gate.set()
    assert await asyncio.wait_for(pending, WAIT) == TextDelta("after")
    await stream.aclose()
    assert provider.outcomes == ["closed"]


async def test_it_records_a_stream_cancelled_while_held_as_closed():
    """Cancelling the task reading a held stream ends it as "closed"."""
    provider = ScriptedProvider([[TextDelta("x"), asyncio.Event(), Finish()]])
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in provider.stream(ask("x")):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert provider.outcomes == ["closed"]


async def test_its_delay_paces_the_items_without_changing_them():
    """With a delay the same events come out; a negative delay is refused."""
    provider = ScriptedProvider([[TextDelta("a"), Finish()]], delay=0.001)
    assert await collect(provider.stream(ask("x"))) == [TextDelta("a"), Finish()]
    with pytest.raises(ValueError, match="delay"):
        ScriptedProvider([], delay=-1)


async def test_an_exception_class_is_raised_too():
    """An exception class in the script is raised like an instance."""
    provider = ScriptedProvider([[ConnectionResetError]])
    with pytest.raises(ConnectionResetError):
        await collect(provider.stream(ask("x")))
