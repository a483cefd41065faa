"""Shared fixtures: a clean channel layer for every test, and the harness's servers, fake
providers and Chromium under the names the tests ask for."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from channels.layers import channel_layers, get_channel_layer

from chat.providers.replay import ScriptedProvider
from chat.turn import step
from harness import chromium
from harness.fakeprovider import FakeProviderServer
from harness.servers import Servers


@pytest.fixture(autouse=True)
async def _clean_channel_layer():
    """Each test starts with a new, empty channel layer: no groups, no messages.

    A new instance, not only a flush: the Redis layer binds its receive state
    to the event loop it first ran on, and each test has its own loop.
    """
    channel_layers.backends.clear()
    await get_channel_layer().flush()
    yield


@pytest.fixture
def script(monkeypatch) -> Callable[..., ScriptedProvider]:
    """Install a ScriptedProvider (each argument one step's events) as every model's
    provider, or, for the models `models` names, the provider given there; returns it."""

    def install(
        *steps: Any, delay: float = 0.0, models: dict[str, Any] | None = None
    ) -> ScriptedProvider:
        provider = ScriptedProvider(list(steps), delay=delay)
        by_model = models or {}

        async def provider_for(model: str):
            return by_model.get(model, provider)

        monkeypatch.setattr(step, "provider_for", provider_for)
        return provider

    return install


@pytest.fixture
def fake_server_factory() -> Iterator[Callable[[], FakeProviderServer]]:
    """A function starting a new fake provider server; all are stopped after the test."""
    servers: list[FakeProviderServer] = []

    def make() -> FakeProviderServer:
        server = FakeProviderServer().start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def fake_server(fake_server_factory: Callable[[], FakeProviderServer]) -> FakeProviderServer:
    """A running fake provider server."""
    return fake_server_factory()


@pytest.fixture
def serve(transactional_db, tmp_path) -> Iterator[Servers]:
    """`await serve(**env)`: a live `manage.py serve` on the test database; every one is
    stopped after the test, pass or fail, and its log is printed when the test fails."""
    servers = Servers(tmp_path)
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.fixture
async def browser(serve) -> AsyncIterator[Any]:
    """Chromium through Playwright, closed before the servers stop (daphne would wait for
    its open sockets). A missing Chromium fails the test: browser tests never skip."""
    missing = ""
    try:
        chromium.executable()
    except chromium.ChromiumMissing as exc:
        missing = str(exc)
    if missing:  # outside the except: the message alone, no chained traceback
        pytest.fail(missing, pytrace=False)
    async with chromium.browser() as launched:
        yield launched
