"""What the HTTP adapters share: timeouts and canonical JSON."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx2

# Every call has a timeout. Connecting takes well under a second on a sane
# network; ten covers a slow DNS or TLS handshake.
CONNECT_TIMEOUT = 10.0
# The longest silence the HTTP client allows between two pieces of a stream:
# only a backstop (a dead connection) behind the turn runner's idle watchdog
# (registry.STREAM_IDLE_TIMEOUT), which gives up on a stalled model sooner.
READ_TIMEOUT = 120.0
# Sending the request body: large histories are a few MB at most.
WRITE_TIMEOUT = 30.0
# Waiting for a free connection of the client's own pool.
POOL_TIMEOUT = 10.0


def default_timeout(idle_timeout: float = 0.0) -> httpx2.Timeout:
    """The HTTP timeouts of a stream whose runner allows `idle_timeout` seconds
    of silence: the read timeout is only the backstop behind that watchdog,
    so it never cuts a stream the endpoint's override allows."""
    return httpx2.Timeout(
        max(READ_TIMEOUT, idle_timeout),
        connect=CONNECT_TIMEOUT,
        write=WRITE_TIMEOUT,
        pool=POOL_TIMEOUT,
    )


class _Watched(httpx2.AsyncByteStream):
    """A response body that reports each piece of it as it arrives."""

    def __init__(self, inner: httpx2.AsyncByteStream, seen: Callable[[], None]) -> None:
        self._inner = inner
        self._seen = seen

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._seen()
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def watched_client(
    factory: Callable[..., httpx2.AsyncClient], seen: Callable[[], None]
) -> httpx2.AsyncClient:
    """An SDK's default HTTP client (`factory`) that calls `seen` whenever bytes
    of a response body arrive: pings and comment lines, which the SDKs drop
    before any event, still show that the server is there."""

    async def watch(response: httpx2.Response) -> None:
        response.stream = _Watched(response.stream, seen)

    return factory(event_hooks={"response": [watch]})


def canonical(value: Any) -> Any:
    """The same JSON value with every object's keys sorted, so that rebuilding a
    request gives the same bytes whatever order the keys were stored in."""
    if isinstance(value, Mapping):
        return {str(k): canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """Tool-call arguments as the OpenAI wire format wants them: a JSON string,
    with sorted keys for a byte-stable prefix."""
    return json.dumps(dict(arguments), sort_keys=True, ensure_ascii=False)


def parse_arguments(raw: str) -> dict[str, Any]:
    """Tool-call arguments streamed as JSON text; "" means no arguments.

    Raises ValueError when the text is not a JSON object.
    """
    if not raw.strip():
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"tool arguments are a JSON {type(value).__name__}, not an object")
    return value
