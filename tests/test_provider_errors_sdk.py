"""Provider errors through the real SDKs against the fake server (harness/fakeprovider.py),
for both adapters: each HTTP status and transport failure becomes a ProviderError that
knows the endpoint it was sent to, keeps no key in its message, and explains itself in
words with a way out; through the turn runner, the error chunk carries those words,
names where the registry really took the key and the URL from, and counts the attempts."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from channels.db import database_sync_to_async

from chat import retry
from chat.models import ApiKey, ProviderEndpoint
from chat.providers import errors
from chat.providers.anthropic import AnthropicProvider
from chat.providers.base import Message, ProviderError, Request, TextPart
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import PROVIDERS, endpoint_now, model_info
from harness.fakeprovider import STALL, FakeProviderServer, Reply, collect
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

KEY = "sk-test-secret-1234"
# Short enough that a timeout case takes a moment; the fake server answers at once.
CONNECT_TIMEOUT = 0.3
READ_TIMEOUT = 0.3
TIMEOUT = httpx2.Timeout(5.0, connect=CONNECT_TIMEOUT, read=READ_TIMEOUT)
ADAPTERS = ["anthropic", "openai"]
MODELS = {"anthropic": "anthropic/claude-sonnet-4-5", "openai": "openai/gpt-4.1"}
REQUEST = Request("", (), (Message("user", (TextPart("hi"),)),))

ANTHROPIC_START = {
    "type": "message_start",
    "message": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 1, "output_tokens": 0},
    },
}
OPENAI_START = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "gpt-4.1",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
}


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    for spec in PROVIDERS.values():
        for name in (spec.key_env, spec.url_env):
            if name:
                monkeypatch.delenv(name, raising=False)


def base_url(adapter: str, server: FakeProviderServer) -> str:
    return server.url if adapter == "anthropic" else server.openai_url


def make(adapter: str, url: str, *, key: str = KEY) -> Any:
    cls = AnthropicProvider if adapter == "anthropic" else OpenAIProvider
    return cls(model_info(MODELS[adapter]), api_key=key, base_url=url, timeout=TIMEOUT)


async def failure(provider: Any) -> ProviderError:
    with pytest.raises(ProviderError) as raised:
        await collect(provider.stream(REQUEST))
    return raised.value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def unanswered_port() -> Iterator[int]:
    """A port that takes no new connection: its listener never accepts and its queue
    is full, so a connect waits (for its timeout) instead of being refused."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield port
    finally:
        for s in [*fillers, listener]:
            s.close()


# name: (reply, status, summary contains, hint contains)
STATUS_CASES = {
    "401": (
        Reply.error(401, "authentication_error", f"invalid x-api-key {KEY}"),
        401,
        "did not accept the API key",
        "restart the server, then Retry.",
    ),
    "403": (
        Reply.error(403, "permission_error", "This key may not use this model."),
        403,
        "refused this key access",
        "is not allowed to use",
    ),
    "404 unknown model": (
        Reply.error(404, "not_found_error", "model: no-such-model"),
        404,
        "does not know the model",
        "was sent to `",
    ),
    "429 with retry-after": (
        Reply.error(429, "rate_limit_error", "Slow down.", headers={"retry-after": "7"}),
        429,
        "is rate-limiting this key",
        "Retry in 7 s: the server asked to wait that long.",
    ),
    "429 without retry-after": (
        Reply.error(429, "rate_limit_error", "Slow down."),
        429,
        "is rate-limiting this key",
        "Wait a minute, then Retry.",
    ),
    "500": (
        Reply.error(500, "api_error", "Internal server error"),
        500,
        "had an internal error",
        "Usually temporary",
    ),
    "502 from a gateway (not JSON)": (
        Reply(status=502, body="<html>502 Bad Gateway</html>"),
        502,
        "A gateway got no valid answer from 127.0.0.1:",
        "may be down or restarting",
    ),
    "503 with retry-after": (
        Reply.error(503, "api_error", "Unavailable", headers={"retry-after": "30"}),
        503,
        "is unavailable for now",
        "Retry in 30 s",
    ),
    "529 overloaded": (
        Reply.error(529, "overloaded_error", "Overloaded"),
        529,
        "The model is overloaded",
        "Retry in a minute, or pick another model.",
    ),
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("case", STATUS_CASES, ids=list(STATUS_CASES))
async def test_an_http_error_is_explained(fake_server, monkeypatch, adapter, case):
    reply, status, summary, hint = STATUS_CASES[case]
    spec = PROVIDERS[adapter]
    monkeypatch.setenv(spec.key_env, KEY)
    url = base_url(adapter, fake_server)
    monkeypatch.setenv(spec.url_env, url)
    fake_server.add(reply)
    error = await failure(make(adapter, url))
    assert error.status_code == status
    assert error.base_url == url and error.default_url is False
    assert KEY not in error.message
    explained = errors.explain(error, model=MODELS[adapter])
    assert summary in explained.summary
    assert hint in explained.hint
    if status == 401:
        assert error.message.endswith("invalid x-api-key ***")
        assert f"`{spec.key_env}`" in explained.hint
    assert len(fake_server.requests) == 1


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_connection_refused_names_the_host(adapter):
    port = free_port()
    url = f"http://127.0.0.1:{port}" + ("/v1" if adapter == "openai" else "")
    error = await failure(make(adapter, url))
    assert (error.transport, error.error_type, error.retryable) == (
        errors.REFUSED,
        "connection_error",
        True,
    )
    assert f"could not connect to 127.0.0.1:{port}: connection refused" in error.message
    explained = errors.explain(error, model=MODELS[adapter])
    assert explained.summary == f"Could not connect to 127.0.0.1:{port}"
    assert f"Nothing answers at `{url}`" in explained.hint


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_connect_timeout_names_the_host(adapter):
    with unanswered_port() as port:
        url = f"http://127.0.0.1:{port}" + ("/v1" if adapter == "openai" else "")
        error = await failure(make(adapter, url))
    assert (error.transport, error.error_type, error.retryable) == (
        errors.CONNECT_TIMEOUT,
        "timeout",
        True,
    )
    assert f"connecting to 127.0.0.1:{port} timed out after {CONNECT_TIMEOUT:g} s" in (
        error.message
    )
    explained = errors.explain(error, model=MODELS[adapter])
    assert explained.summary == f"Connecting to 127.0.0.1:{port} timed out"
    assert "reachable from this server" in explained.hint


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_read_timeout_says_how_long_the_server_was_silent(fake_server, adapter):
    start = ANTHROPIC_START if adapter == "anthropic" else OPENAI_START
    fake_server.add(Reply(events=[start, STALL]))
    error = await failure(make(adapter, base_url(adapter, fake_server)))
    host = fake_server.url.removeprefix("http://")
    assert (error.transport, error.error_type) == (errors.READ_TIMEOUT, "timeout")
    assert f"{host} sent nothing for {READ_TIMEOUT:g} s" in error.message
    explained = errors.explain(error, model=MODELS[adapter])
    assert explained.summary == f"{host} stopped answering"


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_the_sdk_default_url_is_recorded_as_the_default(adapter, monkeypatch):
    """No base URL configured: the error carries the SDK's own, marked as the default
    (nothing is sent: the pool's client is swapped for one that cannot connect)."""
    provider = make(adapter, None)  # type: ignore[arg-type]
    real = provider.client

    def unreachable():
        client = real()
        client._client = httpx2.AsyncClient(transport=Unreachable())
        return client

    monkeypatch.setattr(provider, "client", unreachable)
    error = await failure(provider)
    default = "https://api.anthropic.com" if adapter == "anthropic" else "https://api.openai.com/v1"
    assert error.base_url.rstrip("/") == default and error.default_url is True
    assert "the SDK's default" in errors.explain(error, model=MODELS[adapter]).hint


class Unreachable(httpx2.AsyncBaseTransport):
    async def handle_async_request(self, request):
        raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)


# --- Through the turn runner --------------------------------------------------------


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


async def run_one(tab, text: str) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        await watcher.until_idle()


@database_sync_to_async
def store_key(provider: str, key: str) -> None:
    row = ApiKey(provider=provider)
    row.set_key(key, endpoint=endpoint_now(provider))
    row.save()


@pytest.mark.django_db(transaction=True)
async def test_a_401_card_names_the_environment_variable_that_held_the_key(
    fake_server, monkeypatch, workspace
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    await store_key("anthropic", "sk-stored-but-not-used")
    fake_server.add(Reply.error(401, "authentication_error", "invalid x-api-key"))
    async with running_worker():
        tab = await make_tab("anthropic/claude-sonnet-4-5")
        await run_one(tab, "hi")
    data = (await chunks(tab.pk))[-1].data
    assert fake_server.last.headers["authorization"] == f"Bearer {KEY}"
    assert data["summary"] == "Anthropic did not accept the API key"
    assert data["hint"].startswith("The key comes from `ANTHROPIC_API_KEY`")
    assert "Settings" not in data["hint"]
    assert data["base_url"] == fake_server.url


@pytest.mark.django_db(transaction=True)
async def test_a_401_card_names_the_stored_key_when_the_environment_has_none(
    fake_server, monkeypatch, workspace
):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    await store_key("anthropic", "sk-stored-1234")
    fake_server.add(Reply.error(401, "authentication_error", "invalid x-api-key"))
    async with running_worker():
        tab = await make_tab("anthropic/claude-sonnet-4-5")
        await run_one(tab, "hi")
    data = (await chunks(tab.pk))[-1].data
    assert fake_server.last.headers["authorization"] == "Bearer sk-stored-1234"
    assert data["hint"] == (
        "The key is the Anthropic key saved in Settings → API keys: save a valid one "
        "there, then Retry."
    )


@pytest.mark.django_db(transaction=True)
async def test_an_overload_retried_to_the_end_says_how_many_attempts_and_how_long_to_wait(
    fake_server, monkeypatch, workspace
):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01, 0.01, 0.01))
    overloaded = Reply.error(
        529, "overloaded_error", "Overloaded", headers={"retry-after-ms": "20"}
    )
    fake_server.add(*[overloaded] * 4)
    async with running_worker():
        tab = await make_tab("anthropic/claude-sonnet-4-5")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows)[-1] == "assistant/error"
    assert len(fake_server.requests) == 4
    data = rows[-1].data
    assert data["summary"] == "The model is overloaded (after 4 attempts)"
    assert data["attempts"] == 4 and data["retry_after"] == 0.02
    assert data["hint"] == "Retry in 1 s: the server asked to wait that long."
    assert data["status_code"] == 529


@pytest.mark.django_db(transaction=True)
async def test_a_refused_connection_to_a_stored_endpoint_names_the_settings_entry(
    monkeypatch, workspace
):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01, 0.01, 0.01))
    url = f"http://127.0.0.1:{free_port()}/v1"
    await ProviderEndpoint.objects.acreate(provider="openai", base_url=url)
    async with running_worker():
        tab = await make_tab("openai/gpt-4.1")
        await run_one(tab, "hi")
    data = (await chunks(tab.pk))[-1].data
    host = url.removeprefix("http://").removesuffix("/v1")
    assert data["summary"] == f"Could not connect to {host} (after 4 attempts)"
    assert data["hint"] == (
        f"Nothing answers at `{url}` (connection refused): is the server running? The "
        "address is the OpenAI-compatible endpoint in Settings → Provider endpoints."
    )
    assert host in data["message"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_stalled_stream_names_the_idle_timeout_variable(
    fake_server, monkeypatch, workspace, adapter
):
    spec = PROVIDERS[adapter]
    monkeypatch.setenv(spec.key_env, KEY)
    monkeypatch.setenv(spec.url_env, base_url(adapter, fake_server))
    variable = f"{adapter.upper()}_STREAM_IDLE_TIMEOUT"
    monkeypatch.setenv(variable, "0.3")
    monkeypatch.setattr(retry, "RETRY_DELAYS", (0.01, 0.01, 0.01))
    start = ANTHROPIC_START if adapter == "anthropic" else OPENAI_START
    fake_server.add(*[Reply(events=[start, STALL])] * 4)
    async with running_worker():
        tab = await make_tab(MODELS[adapter])
        await run_one(tab, "hi")
    data = (await chunks(tab.pk))[-1].data
    assert data["summary"] == "The model stopped sending (after 4 attempts)"
    assert f"`{variable}` (now 0.3 s, at most 600)" in data["hint"]
