"""What the HTTP adapters share: timeouts and canonical JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx2

# Every call has a timeout. Connecting takes well under a second on a sane
# network; ten covers a slow DNS or TLS handshake.
CONNECT_TIMEOUT = 10.0
# The longest silence allowed between two pieces of a stream. Anthropic pings
# idle streams and thinking models stream their reasoning, so two minutes of
# nothing means a dead connection, not a slow model.
READ_TIMEOUT = 120.0
# Sending the request body: large histories are a few MB at most.
WRITE_TIMEOUT = 30.0
# Waiting for a free connection of the client's own pool.
POOL_TIMEOUT = 10.0


def default_timeout() -> httpx2.Timeout:
    return httpx2.Timeout(
        READ_TIMEOUT, connect=CONNECT_TIMEOUT, write=WRITE_TIMEOUT, pool=POOL_TIMEOUT
    )


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
