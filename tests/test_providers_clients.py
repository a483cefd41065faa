"""The SDK clients the adapters share (chat.providers.clients): one per endpoint and
event loop, reused across turns, closed when evicted or when their loop shuts down."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from chat.providers.anthropic import AnthropicProvider
from chat.providers.base import Message, Request, TextDelta, TextPart
from chat.providers.clients import CLIENTS, ClientPool
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import model_info
from harness.fakeprovider import STALL, FakeProviderServer, Reply, collect, openai_text

REQUEST = Request("", (), (Message("user", (TextPart("hi"),)),))
# Bound on waiting for a stream to reach a point.
WAIT = 5.0


class FakeClient:
    """Stands for an SDK client: the pool only ever closes one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def maker(made: list[FakeClient], name: str):
    def make() -> FakeClient:
        made.append(FakeClient(name))
        return made[-1]

    return make


def anthropic_text(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {"id": "m", "content": [], "usage": {"input_tokens": 3}},
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
        {"type": "message_stop"},
    ]


def provider(wire: str, server: FakeProviderServer, key: str = "k") -> Any:
    if wire == "anthropic":
        return AnthropicProvider(
            model_info("anthropic/claude-haiku-4-5"), api_key=key, base_url=server.url
        )
    return OpenAIProvider(model_info("openai/gpt-4.1"), api_key=key, base_url=server.openai_url)


def reply(wire: str, text: str) -> Reply:
    return Reply(events=anthropic_text(text) if wire == "anthropic" else openai_text([text]))


def count_connections(server: FakeProviderServer, monkeypatch) -> list[Any]:
    """The client addresses of the TCP connections the fake server accepts from now on."""
    accepted: list[Any] = []
    inner = server._server.process_request

    def process_request(request: Any, address: Any) -> None:
        accepted.append(address)
        inner(request, address)

    monkeypatch.setattr(server._server, "process_request", process_request)
    return accepted


def text(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


# --- Through the adapters ---------------------------------------------------------


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_turns_to_one_endpoint_share_a_client_and_its_connection(
    fake_server, monkeypatch, wire
):
    """Two providers of one endpoint (the runner makes one per step) stream through one
    SDK client, and the second request goes over the first one's connection: the body
    was read to its end, so the connection went back to the pool."""
    accepted = count_connections(fake_server, monkeypatch)
    fake_server.add(reply(wire, "one"), reply(wire, "two"))
    assert text(await collect(provider(wire, fake_server).stream(REQUEST))) == "one"
    assert text(await collect(provider(wire, fake_server).stream(REQUEST))) == "two"
    assert len(accepted) == 1
    assert CLIENTS.count(asyncio.get_running_loop()) == 1


async def test_a_changed_key_or_url_gets_a_client_of_its_own(fake_server_factory):
    """A key or base URL changed in Settings is another endpoint: its own client, and
    its requests carry the new key."""
    first, second = fake_server_factory(), fake_server_factory()
    first.add(reply("openai", "a"), reply("openai", "b"))
    second.add(reply("openai", "c"))
    await collect(provider("openai", first, key="key-a").stream(REQUEST))
    await collect(provider("openai", first, key="key-b").stream(REQUEST))
    await collect(provider("openai", second, key="key-b").stream(REQUEST))
    assert [r.headers["authorization"] for r in first.requests] == [
        "Bearer key-a",
        "Bearer key-b",
    ]
    assert second.last.headers["authorization"] == "Bearer key-b"
    assert CLIENTS.count(asyncio.get_running_loop()) == 3


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_each_event_loop_has_clients_of_its_own(fake_server, wire):
    """A client's connections belong to the loop that opened them: a provider used
    from a second loop (each test, each `asyncio.run`) streams through a new client,
    and the first loop's clients were closed when it shut down."""
    fake_server.add(reply(wire, "first"), reply(wire, "second"))
    shared = provider(wire, fake_server)
    loops: list[asyncio.AbstractEventLoop] = []

    async def stream() -> str:
        loops.append(asyncio.get_running_loop())
        return text(await collect(shared.stream(REQUEST)))

    assert asyncio.run(stream()) == "first"
    assert asyncio.run(stream()) == "second"
    assert [CLIENTS.count(loop) for loop in loops] == [0, 0]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_each_stream_reports_its_own_liveness_on_a_shared_client(fake_server, wire):
    """alive_at is stamped by each stream's own reads: a stream waiting on a silent
    server keeps its last time while another stream on the same client receives bytes."""
    stalled, lively = provider(wire, fake_server), provider(wire, fake_server)
    head = reply(wire, "waiting").events[: 3 if wire == "anthropic" else 2]
    fake_server.add(Reply(events=[*head, STALL]), reply(wire, "lively"))
    async with contextlib.aclosing(stalled.stream(REQUEST)) as events:
        assert await asyncio.wait_for(anext(events), WAIT) == TextDelta("waiting")
        silent_since = stalled.alive_at
        assert silent_since is not None
        waiting = asyncio.ensure_future(anext(events))  # as the runner waits on it
        assert text(await collect(lively.stream(REQUEST))) == "lively"
        assert lively.alive_at > silent_since
        assert stalled.alive_at == silent_since
        assert not waiting.done()
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting


# --- The pool ---------------------------------------------------------------------


async def test_a_key_gets_one_client_made_once():
    pool, made = ClientPool(), []
    async with pool.use("a", maker(made, "a")) as first:
        pass
    async with pool.use("a", maker(made, "a")) as again, pool.use("b", maker(made, "b")) as b:
        assert again is first and b is not first
    assert [c.name for c in made] == ["a", "b"]
    assert not any(c.closed for c in made)


async def test_the_least_recently_used_client_is_closed_past_the_size():
    pool, made = ClientPool(size=2), []
    for key in ("a", "b", "c", "b", "d"):
        async with pool.use(key, maker(made, key)):
            pass
    closed = {c.name: c.closed for c in made}
    assert closed == {"a": True, "b": False, "c": True, "d": False}
    assert pool.count(asyncio.get_running_loop()) == 2


async def test_an_evicted_client_in_use_is_closed_after_its_stream():
    pool, made = ClientPool(size=1), []
    async with pool.use("a", maker(made, "a")) as a:
        async with pool.use("b", maker(made, "b")):
            pass
        assert not a.closed  # a stream is still reading through it
    assert a.closed


async def test_aclose_closes_the_loops_clients_and_a_new_one_is_made_after():
    pool, made = ClientPool(), []
    async with pool.use("a", maker(made, "a")):
        pass
    await pool.aclose()
    assert made[0].closed and pool.count(asyncio.get_running_loop()) == 0
    async with pool.use("a", maker(made, "a")) as again:
        assert again is made[1] and not again.closed


def test_a_loops_clients_are_closed_when_it_shuts_down():
    """asyncio.run closes the async generators left open, the pool's keeper among them."""
    pool, made = ClientPool(), []
    loops = []

    async def use() -> None:
        loops.append(asyncio.get_running_loop())
        async with pool.use("a", maker(made, "a")):
            pass

    asyncio.run(use())
    assert made[0].closed
    assert pool.count(loops[0]) == 0


def test_a_loop_closed_without_shutting_down_is_forgotten():
    """A loop closed bare cannot close its clients; the next loop's first use drops them."""
    pool, made = ClientPool(), []
    bare = asyncio.new_event_loop()

    async def use(key: str) -> None:
        async with pool.use(key, maker(made, key)):
            pass

    bare.run_until_complete(use("a"))
    bare.close()
    assert pool.count(bare) == 1
    asyncio.run(use("b"))
    assert pool.count(bare) == 0


def test_a_pool_without_room_is_refused():
    with pytest.raises(ValueError, match="at least one client per loop, not 0"):
        ClientPool(size=0)
