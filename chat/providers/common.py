"""What the HTTP adapters share: timeouts, reading server-sent events, canonical JSON,
and how a request's files are given to a model."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import httpx2

from chat.providers.base import BlobReader, DocumentPart, ImagePart

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


def json_loads(text: str | bytes) -> Any:
    """json.loads for what a server sent: JSON nested past the parser's recursion
    limit is a ValueError like any other malformed JSON, not a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc


# The longest line, and the most data one event may carry, before the stream is
# refused: far past any real event (a long answer is many small events), and a
# bound on what a server that never ends a line can make this process hold.
MAX_LINE_BYTES = 16 * 1024 * 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024


class SSEError(ValueError):
    """A body that is not a stream of server-sent events this reader will hold."""


class SSEDecoder:
    """Server-sent events out of a response body, as the SDKs read them: lines end
    with LF, CRLF or CR (split anywhere between two pieces of the body), `:` starts a
    comment, a blank line ends an event, an event ends only with its blank line.

    `feed(piece)` yields the events the piece completes, as (event name or None,
    data), one at a time: the events before a bad line still go out before it
    raises. As the spec says, an event without a `data:` line is not dispatched;
    `id:` and `retry:` are for reconnecting, which a turn never does. Raises
    ValueError at a line that is not UTF-8 (UnicodeDecodeError), or a line or an
    event larger than MAX_LINE_BYTES / MAX_EVENT_BYTES. Linear in the body: only
    each new piece is searched for line ends.
    """

    __slots__ = ("_partial", "_after_cr", "_event", "_data", "_size")

    def __init__(self) -> None:
        self._partial = bytearray()
        self._after_cr = False
        self._event: str | None = None
        self._data: list[str] | None = None
        self._size = 0

    def feed(self, piece: bytes) -> Iterator[tuple[str | None, str]]:
        if self._after_cr:
            # The previous piece ended with a CR: a LF starting this one ends no line.
            self._after_cr = False
            if piece[:1] == b"\n":
                piece = piece[1:]
        if b"\n" not in piece and b"\r" not in piece:
            self._partial += piece
            if len(self._partial) > MAX_LINE_BYTES:
                raise SSEError(f"a line longer than {MAX_LINE_BYTES} bytes")
            return
        if b"\r" in piece:
            self._after_cr = piece[-1:] == b"\r"
            piece = piece.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = piece.split(b"\n")
        if self._partial:
            lines[0] = bytes(self._partial) + lines[0]
        self._partial = bytearray(lines.pop())
        if len(self._partial) > MAX_LINE_BYTES:
            raise SSEError(f"a line longer than {MAX_LINE_BYTES} bytes")
        for raw in lines:
            if not raw:
                data = self._data
                event = self._event
                self._event = self._data = None
                self._size = 0
                if data is not None:
                    yield event, "\n".join(data)
                continue
            if len(raw) > MAX_LINE_BYTES:
                raise SSEError(f"a line longer than {MAX_LINE_BYTES} bytes")
            line = raw.decode("utf-8")
            if line[0] == ":":
                continue
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                self._size += len(value)
                if self._size > MAX_EVENT_BYTES:
                    raise SSEError(f"an event larger than {MAX_EVENT_BYTES} bytes")
                if self._data is None:
                    self._data = [value]
                else:
                    self._data.append(value)
            elif name == "event":
                self._event = value or None


# After the last event of a body that the server still has to end (OpenAI's
# `[DONE]`), how long the rest may take to arrive: read to its end, the connection
# goes back to the pool for the next turn instead of being closed.
DRAIN_SECONDS = 0.1


async def drain(pieces: AsyncIterator[bytes]) -> None:
    """Read what is left of a body, for at most DRAIN_SECONDS; a failure here costs
    only the connection's reuse, never the response already read."""
    with contextlib.suppress(TimeoutError, httpx2.HTTPError, httpx2.StreamError):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in pieces:
                pass


async def read_body(
    body: Any,
    reader: Any,
    classify: Callable[[BaseException], Exception],
    seen: Callable[[], None],
) -> AsyncGenerator[Any, None]:
    """The events of a streaming response `body` (an httpx2 response), piece by piece
    through the adapter's `reader` (feed(piece) -> events; `done` once the answer is
    complete). `seen()` on every piece: bytes are life, events or not (see
    base.Provider). A transport failure becomes the adapter's `classify`d error; what
    follows the end is read for the connection's reuse, for a moment at most."""
    async with contextlib.aclosing(body.aiter_bytes()) as pieces:
        while not reader.done:
            try:
                piece = await anext(pieces)
            except StopAsyncIteration:
                break
            except Exception as exc:
                raise classify(exc) from exc
            seen()
            for event in reader.feed(piece):
                yield event
        if reader.done:
            await drain(pieces)


def endpoint_key(
    adapter: str, base_url: str | None, api_key: str, timeout: httpx2.Timeout | float
) -> tuple[Any, ...]:
    """What makes two providers share an SDK client: every option the client is built
    with. A timeout is an httpx2.Timeout (not hashable) or seconds."""
    if isinstance(timeout, httpx2.Timeout):
        parts = (timeout.connect, timeout.read, timeout.write, timeout.pool)
        return (adapter, base_url, api_key, parts)
    return (adapter, base_url, api_key, timeout)


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
    value = json_loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"tool arguments are a JSON {type(value).__name__}, not an object")
    return value


# --- Files (images and PDFs in a request) ---------------------------------------

# The most of a PDF's text sent in its place to a model that cannot read PDFs: about
# 25k tokens, a large part of a small model's window; the whole file is in the workspace.
MAX_DOCUMENT_TEXT_CHARS = 100_000


class Files:
    """How one model is given a request's files: base64 of their bytes when it takes
    that kind of file, else a line of text saying what and where the file is (a PDF's
    text after it). The same part always gives the same bytes: the blob never changes."""

    def __init__(self, model: Any, blobs: BlobReader | None) -> None:
        self.images = bool(getattr(model, "images", False))
        self.pdf = bool(getattr(model, "pdf", False))
        self.blobs = blobs

    def encoded(self, part: ImagePart | DocumentPart) -> str | None:
        """The part's bytes as base64; None when the model does not take it or the
        bytes are gone (`instead` says which)."""
        if not (self.images if isinstance(part, ImagePart) else self.pdf):
            return None
        data = self.blobs.data(part.sha256) if self.blobs is not None else None
        return base64.b64encode(data).decode("ascii") if data is not None else None

    def instead(self, part: ImagePart | DocumentPart) -> str:
        """The text sent in the part's place."""
        if isinstance(part, ImagePart):
            what = f"image {part.name}, {part.width}×{part.height}"
            takes = self.images
        else:
            pages = "1 page" if part.pages == 1 else f"{part.pages} pages"
            what = f"document {part.name}, {pages}"
            takes = self.pdf
        if takes:
            return f"[{what}: no longer stored, so it cannot be shown]"
        where = f"[{what}, saved in the workspace at {part.path}"
        if isinstance(part, ImagePart):
            return where + "]"
        text = self.blobs.text(part.sha256) if self.blobs is not None else None
        if text is None:
            return where + "]"
        if not text.strip():
            return where + "; it has no text layer (a scan?): read it with the tools]"
        if len(text) > MAX_DOCUMENT_TEXT_CHARS:
            shown = text[:MAX_DOCUMENT_TEXT_CHARS]
            return (
                f"{where}; the first {MAX_DOCUMENT_TEXT_CHARS:,} of its {len(text):,} "
                f"characters of text, extracted with pypdf, follow]\n{shown}"
            )
        return f"{where}; its text, extracted with pypdf, follows]\n{text}"
