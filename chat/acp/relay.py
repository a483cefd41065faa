"""The host's side of an agent's endpoint: a Unix socket bound into its sandbox, every
connection to it forwarded to the one base URL the agent is given, and nowhere else.

The sandbox has no network of its own (its own loopback only), so this is the agent's
only way out: a local model server on the host's loopback works as its endpoint, and
nothing else on the host (or beyond) is reachable. The sandbox's side
(chat/acp/inside.py) carries the agent's TCP connections to 127.0.0.1:PORT onto the
socket; the agent speaks plain HTTP to it, and this side speaks to the endpoint as it
is (TLS for https, with its host name).

Each connection carries one request: its head is rewritten (the target under the base
URL's path, `Host` the endpoint's, the agent's credentials, a placeholder, replaced by
the provider's key, `Connection: close` both ways, so a client never sends a second
request down a connection that this side has closed), then the bytes are relayed as
they come, the streamed answer included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

# A request's or response's head (the line and the headers); agents send a few hundred
# bytes, a bigger one is refused rather than kept.
MAX_HEAD_BYTES = 64 * 1024
# One read of a relayed connection.
CHUNK = 64 * 1024
# How long the endpoint may take to accept a connection, and the head to arrive.
CONNECT_TIMEOUT = 30.0
# The socket's name in its (private, 0700) folder.
SOCKET_NAME = "endpoint.sock"
# Headers a relay owns: they describe one hop, not the request.
HOP_HEADERS = frozenset(
    {b"host", b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te"}
)
# Credentials: the agent holds only a placeholder key (the real one never enters its
# sandbox), so whatever it sends is dropped and the relay's own `auth` set instead.
CREDENTIAL_HEADERS = frozenset({b"x-api-key", b"authorization", b"api-key"})


@dataclass(frozen=True, slots=True)
class Endpoint:
    scheme: str
    host: str
    port: int
    # The base URL's path, put before every request's target ("" for none).
    path: str

    @classmethod
    def of(cls, url: str) -> Endpoint:
        """ValueError when `url` is not an http(s) URL with a host."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the endpoint {url!r} is not an http:// or https:// URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def authority(self) -> bytes:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return (host if self.port == default else f"{host}:{self.port}").encode()


class Relay:
    """A listening Unix socket in a private folder of its own; `close()` always."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        auth: tuple[tuple[bytes, bytes], ...] = (),
        context: ssl.SSLContext | None = None,
    ) -> None:
        """`auth`: the headers carrying the provider's key, put on every request in
        place of the agent's credentials. `context`: for an https endpoint, the TLS
        settings (the system's trusted certificates unless given)."""
        self.endpoint = endpoint
        self._auth = auth
        self.folder = Path(tempfile.mkdtemp(prefix="dispatch-acp-"))
        self.path = self.folder / SOCKET_NAME
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._ssl = None
        if endpoint.scheme == "https":
            self._ssl = context or ssl.create_default_context()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=MAX_HEAD_BYTES
        )
        # Only the server's user (and the sandbox, which runs as it) may connect.
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._relay(reader, writer)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            logger.info("agent endpoint relay: %s", exc)
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            head = await _head(reader)
            line, headers = _split(head)
            method, target, version = line.split(b" ", 2)
            if not target.startswith(b"/"):
                raise ValueError("a request target that is not a path")
            end = self.endpoint
            line = b" ".join((method, end.path.encode() + target, version))
            headers = [
                (b"Host", end.authority),
                *((n, v) for n, v in headers if n.lower() not in CREDENTIAL_HEADERS),
                *self._auth,
                (b"Connection", b"close"),
            ]
            up_reader, up_writer = await asyncio.open_connection(
                end.host,
                end.port,
                ssl=self._ssl,
                server_hostname=end.host if self._ssl else None,
                limit=MAX_HEAD_BYTES,
            )
        try:
            up_writer.write(_join(line, headers))
            # The answer ends the exchange: the agent may keep its side open meanwhile.
            forward = asyncio.create_task(_pipe(reader, up_writer))
            try:
                await _answer(up_reader, writer)
            finally:
                forward.cancel()
        finally:
            up_writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await up_writer.wait_closed()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CONNECT_TIMEOUT)
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self.folder.rmdir()


async def _head(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise ValueError(f"a head of more than {MAX_HEAD_BYTES} bytes") from None


def _split(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The first line and the headers but the hop-by-hop ones."""
    line, *rest = head[:-4].split(b"\r\n")
    headers = []
    for field in rest:
        name, sep, value = field.partition(b":")
        if not sep:
            raise ValueError("a header line without a colon")
        if name.strip().lower() not in HOP_HEADERS:
            headers.append((name.strip(), value.strip()))
    return line, headers


def _join(line: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"\r\n".join([line, *(name + b": " + value for name, value in headers)]) + b"\r\n\r\n"


async def _answer(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    """The endpoint's answer to the agent, its head saying `Connection: close`."""
    line, headers = _split(await _head(source))
    target.write(_join(line, [*headers, (b"Connection", b"close")]))
    await _pipe(source, target)


async def _pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    while data := await source.read(CHUNK):
        target.write(data)
        await target.drain()
    if target.can_write_eof():
        with contextlib.suppress(OSError):
            target.write_eof()
