"""The SDK clients of this process: one per endpoint and event loop, reused across streams.

A client per turn would cost an SSL context (~20 ms of CPU to load the CA store) and a
new TCP and TLS handshake for every request; a pooled client keeps its connections open
between turns.

Keyed by the caller's endpoint key (the adapter, base URL, API key and timeouts), so a
key or URL changed in Settings gets a client of its own, and the old one ages out: at
most `CLIENTS_PER_LOOP` per loop, least recently used first out, each closed once its
last stream has ended.

Per event loop, because an HTTP client's connections belong to the loop that opened
them (each test runs in a loop of its own; a server has one). A loop's clients are
closed when it shuts down: `asyncio.run` and every runner close the async generators
still open at the end (`loop.shutdown_asyncgens`), and each loop's clients are held by
one such generator. A loop closed without that is forgotten the next time another
loop asks for a client; its sockets go with the garbage collector.

Stdlib only, so that `chat.providers` still imports no SDK and no HTTP library.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable
from typing import Any, Protocol

# Endpoints a process talks to: one per provider in practice (Anthropic, OpenAI,
# DeepSeek), a few more while keys are being changed. Past this the least recently
# used one is closed, so a churn of keys cannot grow without end.
CLIENTS_PER_LOOP = 8


class Closable(Protocol):
    async def close(self) -> None: ...


class _Entry:
    __slots__ = ("client", "streams", "retired", "closed")

    def __init__(self, client: Closable) -> None:
        self.client = client
        # Streams using the client now: a retired client is closed after the last one.
        self.streams = 0
        self.retired = False
        self.closed = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.client.close()


class _LoopClients:
    """One loop's clients, and the generator that closes them when the loop shuts down."""

    __slots__ = ("entries", "keeper")

    def __init__(self) -> None:
        self.entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.keeper: AsyncGenerator[None] | None = None


class ClientPool:
    def __init__(self, size: int = CLIENTS_PER_LOOP) -> None:
        if size < 1:
            raise ValueError(f"a client pool holds at least one client per loop, not {size}")
        self.size = size
        self._loops: dict[asyncio.AbstractEventLoop, _LoopClients] = {}
        # Loops may run in several threads (a test's loop, a server's): the table of
        # loops is shared, each loop's clients are only touched from its own thread.
        self._lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def use(self, key: Hashable, make: Callable[[], Any]) -> AsyncIterator[Any]:
        """The client of `key` on the running loop, made by `make()` the first time;
        held for the duration of the block, so that it is not closed under a stream."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = self._loops.get(loop)
            if mine is None:
                self._forget_closed_loops()
                mine = self._loops[loop] = _LoopClients()
        if mine.keeper is None:
            mine.keeper = self._until_shutdown(loop, mine)
            await anext(mine.keeper)
        entries = mine.entries
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = _Entry(make())
        else:
            entries.move_to_end(key)
        entry.streams += 1
        try:
            while len(entries) > self.size:
                _, old = entries.popitem(last=False)
                await _retire(old)
            yield entry.client
        finally:
            entry.streams -= 1
            if entry.retired and not entry.streams:
                await entry.close()

    async def aclose(self) -> None:
        """Close the running loop's clients now, as its shutdown would."""
        loop = asyncio.get_running_loop()
        with self._lock:
            mine = self._loops.get(loop)
        if mine is not None and mine.keeper is not None:
            await mine.keeper.aclose()

    def count(self, loop: asyncio.AbstractEventLoop) -> int:
        """How many clients `loop` holds."""
        with self._lock:
            mine = self._loops.get(loop)
        return len(mine.entries) if mine is not None else 0

    async def _until_shutdown(
        self, loop: asyncio.AbstractEventLoop, mine: _LoopClients
    ) -> AsyncGenerator[None]:
        try:
            yield
        finally:
            # The loop is shutting down (or `aclose` ran): no stream outlives it.
            with self._lock:
                if self._loops.get(loop) is mine:
                    del self._loops[loop]
            entries = list(mine.entries.values())
            mine.entries.clear()
            for entry in entries:
                entry.retired = True
                await entry.close()

    def _forget_closed_loops(self) -> None:
        for loop in [loop for loop in self._loops if loop.is_closed()]:
            del self._loops[loop]


async def _retire(entry: _Entry) -> None:
    entry.retired = True
    if not entry.streams:
        await entry.close()


CLIENTS = ClientPool()


async def aclose_clients() -> None:
    """Close the SDK clients of the running loop: for a process about to stop."""
    await CLIENTS.aclose()
