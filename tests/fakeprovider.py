"""A fake model provider: a real HTTP server on 127.0.0.1 that speaks both wire formats.

The adapters under test talk to it through the real SDKs, so what is tested is
the real wire: Anthropic SSE frames with `event:` lines on `/v1/messages`,
OpenAI `data:` lines ending with `[DONE]` on `.../chat/completions`.

Script replies in order (each request takes the next one):

    fake.add(Reply(events=recorded("anthropic__anthropic-text.chunks.txt")))
    fake.add(Reply.error(429, "rate_limit_error", "slow down", headers={"retry-after": "7"}))
    fake.add(Reply(events=[..., CUT]))            # connection cut mid-stream
    fake.add(Reply(events=[..., Raw("{not json")]))  # a malformed line

Items of `Reply.events`: a dict (sent as JSON), a str (sent verbatim as the
data line: recorded lines keep their exact bytes), `Raw(data, event)` (a line
that need not be JSON), `Pause(seconds)`, `STALL` (send nothing more until the
client leaves or the server stops: a provider that hangs), or `CUT` (close the
socket without ending the chunked body). Every request is recorded (raw bytes, parsed JSON,
headers), and `disconnected` tells when the client closed before the reply was
over. Tests import the fixtures explicitly:

    from tests.fakeprovider import fake_server, fake_server_factory  # noqa: F401
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
# How often a paused reply looks at its socket and at the stop flag: short
# enough that a client's close is seen at once, long enough not to spin.
POLL_SECONDS = 0.02
# Bound on every wait in this module, so a broken test fails instead of hanging.
WAIT_SECONDS = 10.0
# The last chunk of a chunked body.
END_OF_BODY = b"0\r\n\r\n"


@dataclass(frozen=True)
class Raw:
    """A data line sent as it is; Anthropic frames get `event: <event>`."""

    data: str
    event: str = "content_block_delta"


@dataclass(frozen=True)
class Pause:
    seconds: float


class _Cut:
    def __repr__(self) -> str:
        return "CUT"


CUT = _Cut()
# A pause as long as every wait here is allowed: the client gives up first.
STALL = Pause(WAIT_SECONDS)


@dataclass
class Reply:
    events: list[Any] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    # The body of a non-200 reply: a dict is sent as JSON.
    body: Any = None
    # Seconds before each event.
    delay: float = 0.0
    # OpenAI format: end with `data: [DONE]`.
    done: bool = True

    @classmethod
    def error(
        cls, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> Reply:
        """An error reply in the shape both APIs use."""
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return cls(status=status, body=body, headers=dict(headers or {}))


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    disconnected: threading.Event = field(default_factory=threading.Event)
    completed: threading.Event = field(default_factory=threading.Event)

    def wait_disconnected(self, timeout: float = WAIT_SECONDS) -> bool:
        return self.disconnected.wait(timeout)


def recorded(name: str) -> list[str]:
    """The lines of a stream file under tests/fixtures/ (one JSON event per line)."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


class FakeProviderServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---

    def start(self) -> FakeProviderServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(WAIT_SECONDS)

    @property
    def url(self) -> str:
        """The Anthropic base URL (the SDK adds /v1/messages)."""
        assert self._server is not None, "start() the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def openai_url(self) -> str:
        """The OpenAI base URL (the SDK adds /chat/completions)."""
        return f"{self.url}/v1"

    # --- script and records ---

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def _next_reply(self) -> Reply | None:
        with self._lock:
            return self.replies.popleft() if self.replies else None

    def _record(self, record: Recorded) -> None:
        with self._lock:
            self.requests.append(record)

    @property
    def last(self) -> Recorded:
        assert self.requests, "the fake server got no request"
        return self.requests[-1]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeProviderServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test output is for the tests

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        record = Recorded(
            "POST",
            self.path,
            {k.lower(): v for k, v in self.headers.items()},
            body,
            parsed,
        )
        self.fake._record(record)
        reply = self.fake._next_reply()
        if reply is None:
            reply = Reply.error(500, "api_error", f"fake server: no reply scripted for {self.path}")
        if reply.status != 200:
            self._send_whole(reply)
            record.completed.set()
            return
        anthropic = self.path.rstrip("/").endswith("/messages")
        try:
            self._stream(reply, anthropic, record)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            record.disconnected.set()
            self.close_connection = True

    def _send_whole(self, reply: Reply) -> None:
        payload = reply.body
        if isinstance(payload, dict | list):
            data = json.dumps(payload).encode()
        elif isinstance(payload, str):
            data = payload.encode()
        else:
            data = payload or b""
        self.send_response(reply.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: Reply, anthropic: bool, record: Recorded) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()
        frames = list(self._frames(reply, anthropic))
        for i, frame in enumerate(frames):
            if isinstance(frame, Pause):
                if not self._pause(frame.seconds, record):
                    return
            elif frame is CUT:
                self._cut()
                return
            else:
                data = self._chunk(frame)
                if i == len(frames) - 1:
                    # The terminating chunk goes with the last frame: a client
                    # that stops reading at the last event must not be seen
                    # as one that left early.
                    data += END_OF_BODY
                self.wfile.write(data)
        if not frames or not isinstance(frames[-1], bytes):
            self.wfile.write(END_OF_BODY)
        record.completed.set()

    def _frames(self, reply: Reply, anthropic: bool) -> Iterator[bytes | Pause | _Cut]:
        for item in reply.events:
            if isinstance(item, Pause) or item is CUT:
                yield item
                continue
            if reply.delay:
                yield Pause(reply.delay)
            if isinstance(item, Raw):
                data, event = item.data, item.event
            elif isinstance(item, str):
                data, event = item, _event_name(item)
            else:
                data, event = json.dumps(item), item.get("type", "message")
            if anthropic:
                yield f"event: {event}\ndata: {data}\n\n".encode()
            else:
                yield f"data: {data}\n\n".encode()
        if not anthropic and reply.done:
            yield b"data: [DONE]\n\n"

    @staticmethod
    def _chunk(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    def _pause(self, seconds: float, record: Recorded) -> bool:
        """Wait, watching the socket: False when the client closed it meanwhile."""
        waited = 0.0
        while waited < seconds and not self.fake._stopping.is_set():
            step = min(POLL_SECONDS, seconds - waited)
            readable, _, _ = select.select([self.connection], [], [], step)
            if readable:
                try:
                    peek = self.connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    peek = b""
                if not peek:
                    record.disconnected.set()
                    self.close_connection = True
                    return False
            waited += step
        return not self.fake._stopping.is_set()

    def _cut(self) -> None:
        self.wfile.flush()
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _event_name(line: str) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        return "content_block_delta"
    return value.get("type", "message") if isinstance(value, dict) else "message"


@pytest.fixture
def fake_server_factory() -> Iterator[Any]:
    """A function starting a new fake server; all are stopped after the test."""
    servers: list[FakeProviderServer] = []

    def make() -> FakeProviderServer:
        server = FakeProviderServer().start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def fake_server(fake_server_factory: Any) -> FakeProviderServer:
    """A running fake provider server."""
    return fake_server_factory()


async def collect(stream: Any) -> list[Any]:
    """Every event of a provider stream, closing it whatever happens."""
    async with contextlib.aclosing(stream) as events:
        return [event async for event in events]
