"""A fake model provider: a real HTTP server on 127.0.0.1 that speaks both wire formats.

The adapters under test talk to it through the real SDKs, so what is tested is
the real wire: Anthropic SSE frames with `event:` lines on `/v1/messages`,
OpenAI `data:` lines ending with `[DONE]` on `.../chat/completions`, and OpenAI's
Responses API on `.../responses` (`event:` lines, no `[DONE]`; `ResponsesStream`
builds its streams).

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
over.

Usage like the API's: `FakeProviderServer(cache=SimulatedCache())` bills each
Anthropic request from its body (a prompt cache keyed by prefix, see SimulatedCache)
and puts that usage in the stream. Replies that depend on the request:
`FakeProviderServer(respond=fn)` answers `fn(request)` when nothing is scripted.

Pacing: `Reply(rate=200)` sends its data frames on a fixed schedule, the n-th at
start + n / 200 s, however late the machine got to one (no drift). Stamping:
`Reply(stamp=True)` replaces `STAMP` in each frame with the wall clock (ns) at the
moment it is written, for measuring how long a delta takes to reach a client.

In its own process (`FakeProviderProcess`, or `python -m harness.fakeprovider`),
so that what it costs is not counted as the measured process's CPU; replies are
then scripted over HTTP (`CONTROL_REPLIES`, `Reply.to_json`). The tests' fixtures
`fake_server` and `fake_server_factory` are in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import select
import signal
import socket
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from harness.servers import LISTENING_LINE, ROOT, Proc, clean_env

# The recorded and derived provider streams (data files; nothing here imports tests/).
FIXTURES = ROOT / "tests" / "fixtures"
# How often a paused reply looks at its socket and at the stop flag: short
# enough that a client's close is seen at once, long enough not to spin.
POLL_SECONDS = 0.02
# Bound on every wait in this module, so a broken test fails instead of hanging.
WAIT_SECONDS = 10.0
# The last chunk of a chunked body.
END_OF_BODY = b"0\r\n\r\n"
# In a stamped reply, replaced in every frame by the time it is written (ns since the epoch).
STAMP = "@stamp@"
_STAMP_BYTES = STAMP.encode()
# The fake server's own paths: script replies (POST a JSON list of `Reply.to_json()`), and
# read what it was asked (GET: method, path, JSON body, completed, disconnected per request).
CONTROL_REPLIES = "/__fake__/replies"
CONTROL_REQUESTS = "/__fake__/requests"
# One control request to a fake server in another process.
CONTROL_TIMEOUT = 10.0
# A fake server in its own process exits within this after SIGTERM.
PROCESS_STOP_TIMEOUT = 5.0


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
    # The body of a non-200 reply, or of a whole (not streamed) 200 one: a dict is sent
    # as JSON.
    body: Any = None
    # Seconds before each event.
    delay: float = 0.0
    # OpenAI format: end with `data: [DONE]`.
    done: bool = True
    # Data frames per second on a fixed schedule (0: as fast as the socket takes them).
    rate: float = 0.0
    # Replace STAMP in each frame with the time it is written.
    stamp: bool = False

    @classmethod
    def error(
        cls, status: int, kind: str, message: str, headers: dict[str, str] | None = None
    ) -> Reply:
        """An error reply in the shape both APIs use."""
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return cls(status=status, body=body, headers=dict(headers or {}))

    def to_json(self) -> dict[str, Any]:
        """The reply as JSON, for a fake server in another process (`from_json` reads it)."""
        return {
            "events": [_event_to_json(item) for item in self.events],
            "status": self.status,
            "headers": self.headers,
            "body": self.body,
            "delay": self.delay,
            "done": self.done,
            "rate": self.rate,
            "stamp": self.stamp,
        }

    @classmethod
    def from_json(cls, data: Any) -> Reply:
        """The reply `to_json` wrote; ValueError saying what is wrong with anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"a reply is a JSON object, not {type(data).__name__}")
        unknown = sorted(set(data) - _REPLY_FIELDS)
        if unknown:
            raise ValueError(f"unknown reply field(s) {', '.join(unknown)}")
        events = data.get("events", [])
        if not isinstance(events, list):
            raise ValueError(f"a reply's events are a list, not {type(events).__name__}")
        fields = {k: v for k, v in data.items() if k != "events"}
        return cls(events=[_event_from_json(i, item) for i, item in enumerate(events)], **fields)


_REPLY_FIELDS = {"events", "status", "headers", "body", "delay", "done", "rate", "stamp"}
_EVENT_KINDS = {"pause", "cut", "raw", "line", "json"}


def _event_to_json(item: Any) -> dict[str, Any]:
    if isinstance(item, Pause):
        return {"pause": item.seconds}
    if item is CUT:
        return {"cut": True}
    if isinstance(item, Raw):
        return {"raw": item.data, "event": item.event}
    if isinstance(item, str):
        return {"line": item}
    if isinstance(item, dict):
        return {"json": item}
    raise TypeError(f"cannot send a {type(item).__name__} event to a fake server: {item!r}")


def _event_from_json(index: int, item: Any) -> Any:
    kinds = sorted(set(item) & _EVENT_KINDS) if isinstance(item, dict) else []
    if len(kinds) != 1:
        raise ValueError(
            f"event {index}: expected an object with one of pause, cut, raw, line, json; "
            f"got {item!r}"
        )
    kind = kinds[0]
    if kind == "pause":
        return Pause(float(item["pause"]))
    if kind == "cut":
        return CUT
    if kind == "raw":
        return Raw(str(item["raw"]), str(item.get("event", "content_block_delta")))
    if kind == "line":
        return str(item["line"])
    if not isinstance(item["json"], dict):
        raise ValueError(f"event {index}: a json event is an object, got {item['json']!r}")
    return item["json"]


def pacing(rate: float, clock: Callable[[], float] = time.monotonic) -> Iterator[float]:
    """Seconds to wait before each frame so that frame n goes at start + n / rate, `start`
    being the first call: a late frame waits nothing and the next ones catch up."""
    start = clock()
    n = 0
    while True:
        yield max(0.0, start + n / rate - clock())
        n += 1


def openai_text(
    deltas: Iterable[str], *, model: str = "gpt-4.1", prompt_tokens: int = 100
) -> list[dict[str, Any]]:
    """An OpenAI chat completion stream of these text deltas: the role, one chunk per
    delta, the finish reason, then the usage chunk (`stream_options.include_usage`)."""
    head = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**head, "choices": [choice], "usage": None}

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": text}) for text in deltas]
    count = len(events) - 1
    events.append(chunk({}, "stop"))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": count,
        "total_tokens": prompt_tokens + count,
    }
    events.append({**head, "choices": [], "usage": usage})
    return events


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    disconnected: threading.Event = field(default_factory=threading.Event)
    completed: threading.Event = field(default_factory=threading.Event)
    # What the server's SimulatedCache billed the request (None: no cache, or no stream).
    usage: CacheUsage | None = None

    def wait_disconnected(self, timeout: float = WAIT_SECONDS) -> bool:
        return self.disconnected.wait(timeout)


def recorded(name: str) -> list[str]:
    """The lines of a stream file under tests/fixtures/ (one JSON event per line)."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line.strip()]


# --- A simulated Anthropic prompt cache ------------------------------------------

# Anthropic looks for a cached prefix at each breakpoint and at the block boundaries
# up to this many blocks before it; an older entry is not found from there.
CACHE_LOOKBACK_BLOCKS = 20
# The shortest prefix the API caches for Claude Sonnet 4.5 (Sonnet 4 and Opus 4.1
# too; Haiku 4.5 and Opus 4.5 need 4096): a shorter one is neither written nor read.
CACHE_MIN_TOKENS = 1024
# How long an entry lives after it was last written or read (the API's 5-minute
# ephemeral cache; a read refreshes it).
CACHE_LIFETIME = 300.0
# The simulation counts a token as this many characters of a block's JSON.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class CacheUsage:
    """A request's input as the API bills it, and how much of it the cache matched."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    # Blocks of the request (tools, system, message content, in that order) and how
    # many of the first were read from the cache.
    blocks: int
    read_blocks: int

    def as_dict(self) -> dict[str, int]:
        """The usage fields of the API's message_start."""
        return {
            "input_tokens": self.input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
        }


class SimulatedCache:
    """Anthropic's prompt cache, from request bodies alone, so that a fake server can
    report usage as the API does (`FakeProviderServer(cache=SimulatedCache())`).

    A request is a sequence of blocks in the order the API caches them: tools, system,
    then each message's content blocks. A prefix's key is the model and those blocks
    (their JSON without `cache_control`; a message block with its role, and with the
    request's `thinking` and `tool_choice`, whose change the API says invalidates the
    messages' cache). A request reads the longest live prefix found at a breakpoint
    (a block with `cache_control`) or at most CACHE_LOOKBACK_BLOCKS boundaries before
    one; then it writes the prefix at each of its breakpoints. Usage: the read prefix
    is `cache_read_input_tokens`, the rest up to the last breakpoint
    `cache_creation_input_tokens`, what follows `input_tokens`. Tokens are characters
    / CHARS_PER_TOKEN. Entries expire `lifetime` seconds after their last write or
    read, on `clock`.
    """

    def __init__(
        self,
        *,
        lifetime: float = CACHE_LIFETIME,
        min_tokens: int = CACHE_MIN_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lifetime = lifetime
        self.min_tokens = min_tokens
        self.clock = clock
        self._expiry: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def usage(self, body: dict[str, Any]) -> CacheUsage:
        keys, tokens, marks = _prefixes(body)
        with self._lock:
            now = self.clock()
            read = 0
            for mark in marks:
                for n in range(mark, max(mark - CACHE_LOOKBACK_BLOCKS, 1) - 1, -1):
                    if n <= read:
                        break
                    if self._expiry.get(keys[n], now) > now:
                        read = n
                        break
            if read:
                self._expiry[keys[read]] = now + self.lifetime
            written = [m for m in marks if tokens[m] >= self.min_tokens]
            for mark in written:
                self._expiry[keys[mark]] = now + self.lifetime
        cached = tokens[written[-1]] if written else 0
        return CacheUsage(
            input_tokens=tokens[-1] - max(cached, tokens[read]),
            cache_read_input_tokens=tokens[read],
            cache_creation_input_tokens=max(cached - tokens[read], 0),
            blocks=len(keys) - 1,
            read_blocks=read,
        )


def _prefixes(body: dict[str, Any]) -> tuple[list[bytes], list[int], list[int]]:
    """For n = 0..blocks: the key of the first n blocks and their tokens; and the
    breakpoints (n of each block with cache_control)."""
    settings = json.dumps(
        {k: body.get(k) for k in ("thinking", "tool_choice")}, sort_keys=True
    ).encode()
    system = body.get("system") or []
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    blocks: list[tuple[bytes, dict[str, Any]]] = [(b"tool", t) for t in body.get("tools") or []]
    blocks += [(b"system", b) for b in system]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        role = str(message.get("role")).encode()
        blocks += [(settings + role, b) for b in content]
    key = hashlib.sha256(str(body.get("model")).encode()).digest()
    keys, tokens, marks, chars = [key], [0], [], 0
    for n, (salt, block) in enumerate(blocks, 1):
        text = json.dumps(
            {k: v for k, v in block.items() if k != "cache_control"},
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )
        key = hashlib.sha256(key + salt + text.encode()).digest()
        chars += len(text)
        keys.append(key)
        tokens.append(chars // CHARS_PER_TOKEN)
        if "cache_control" in block:
            marks.append(n)
    return keys, tokens, marks


def output_tokens(events: Iterable[Any]) -> int:
    """The tokens of a reply's content (text, thinking, tool arguments), as the cache counts."""
    chars = 0
    for item in events:
        if isinstance(item, dict) and item.get("type") == "content_block_delta":
            delta = item.get("delta") or {}
            for name in ("text", "thinking", "partial_json"):
                chars += len(str(delta.get(name) or ""))
    return max(chars // CHARS_PER_TOKEN, 1)


def with_usage(events: list[Any], usage: CacheUsage) -> list[Any]:
    """Anthropic events with `usage` in message_start and the output's tokens in
    message_delta, in place of what they were scripted with."""
    out = []
    for item in events:
        if isinstance(item, dict) and item.get("type") == "message_start":
            message = {**item.get("message", {}), "usage": {**usage.as_dict(), "output_tokens": 1}}
            item = {**item, "message": message}
        elif isinstance(item, dict) and item.get("type") == "message_delta":
            item = {**item, "usage": {"output_tokens": output_tokens(events)}}
        out.append(item)
    return out


# --- An Anthropic endpoint for Claude Code ---------------------------------------------
#
# Claude Code (through @zed-industries/claude-code-acp) makes more than its turn's
# requests: POST /v1/messages/count_tokens, and side requests on a small model (a title,
# a topic check), streamed or not. `ClaudeCodeEndpoint` answers each by its content: the
# agent's own turns (requests offering tools) take the scripted turns in order (a default
# text when none is left); everything else gets a short answer in the shape asked for.

# The tokens count_tokens reports, whatever it is asked.
AGENT_COUNT_TOKENS = 12


def anthropic_blocks(*blocks: dict[str, Any], stop_reason: str = "end_turn") -> list[Any]:
    """The SSE events of one streamed message holding `blocks`: {"type": "text", "text"},
    {"type": "thinking", "thinking"} or {"type": "tool_use", "id", "name", "input"}."""
    events: list[Any] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": "claude-fake",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1},
            },
        }
    ]
    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            {"type": "content_block_start", "index": index, "content_block": start},
            {"type": "content_block_delta", "index": index, "delta": delta},
        ]
        if kind == "thinking":
            signature = {"type": "signature_delta", "signature": "c2lnbmF0dXJl"}
            events.append({"type": "content_block_delta", "index": index, "delta": signature})
        events.append({"type": "content_block_stop", "index": index})
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    return events


class ClaudeCodeEndpoint:
    """`FakeProviderServer(respond=ClaudeCodeEndpoint(...))`: see above. `turns` are
    lists of events (anthropic_blocks) or Replies, for the agent's turn requests."""

    def __init__(self, *turns: list[Any] | Reply, default: str = "Done.") -> None:
        self.turns: deque[list[Any] | Reply] = deque(turns)
        self.default = default
        self.lock = threading.Lock()

    def add(self, *turns: list[Any] | Reply) -> None:
        with self.lock:
            self.turns.extend(turns)

    def __call__(self, request: Recorded) -> Reply:
        body = request.json if isinstance(request.json, dict) else {}
        if request.path.split("?")[0].endswith("/count_tokens"):
            return Reply(body={"input_tokens": AGENT_COUNT_TOKENS})
        if not body.get("stream"):
            return Reply(body=_whole_message(body.get("model", "claude-fake"), self.default))
        if body.get("tools"):
            with self.lock:
                turn = self.turns.popleft() if self.turns else None
            if isinstance(turn, Reply):
                return turn
            if turn is not None:
                return Reply(events=turn)
        return Reply(events=anthropic_blocks({"type": "text", "text": self.default}))


def _whole_message(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }


class FakeProviderServer:
    """With `cache`, Anthropic streams report the usage it computes from each request
    (whatever usage they were scripted with). With `respond`, a request nothing is
    scripted for is answered with `respond(request)`."""

    def __init__(
        self,
        *,
        cache: SimulatedCache | None = None,
        respond: Callable[[Recorded], Reply] | None = None,
    ) -> None:
        self.cache = cache
        self.respond = respond
        self.replies: deque[Reply] = deque()
        # The answers to GET …/models (a key's test), apart from the streams' replies.
        self.model_lists: deque[Reply] = deque()
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
        """The OpenAI base URL (the SDK adds /chat/completions, or /responses)."""
        return f"{self.url}/v1"

    # --- script and records ---

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def add_models(self, *replies: Reply) -> None:
        """Answers to the next GET …/models requests (then one model, unscripted)."""
        with self._lock:
            self.model_lists.extend(replies)

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

    def do_GET(self) -> None:
        if self.path.partition("?")[0].rstrip("/").endswith("/models"):
            self._models()
            return
        if self.path != CONTROL_REQUESTS:
            self._answer(404, {"error": f"fake server: nothing at GET {self.path}"})
            return
        with self.fake._lock:
            requests = list(self.fake.requests)
        self._answer(
            200,
            [
                {
                    "method": r.method,
                    "path": r.path,
                    "json": r.json,
                    "completed": r.completed.is_set(),
                    "disconnected": r.disconnected.is_set(),
                }
                for r in requests
            ],
        )

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        if self.path == CONTROL_REPLIES:
            self._script(body)
            return
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
        if reply is None and self.fake.respond is not None:
            reply = self.fake.respond(record)
        if reply is None:
            reply = Reply.error(500, "api_error", f"fake server: no reply scripted for {self.path}")
        if reply.status != 200 or reply.body is not None:
            # An error, or a whole (not streamed) answer: a 200 with a body.
            self._send_whole(reply)
            record.completed.set()
            return
        # Claude Code asks for /v1/messages?beta=true.
        anthropic = self.path.partition("?")[0].rstrip("/").endswith("/messages")
        if anthropic and self.fake.cache is not None and isinstance(parsed, dict):
            record.usage = self.fake.cache.usage(parsed)
            reply = replace(reply, events=with_usage(reply.events, record.usage))
        try:
            # The Responses API names its events as Anthropic does (`event:` lines, no
            # `[DONE]`): the same frames.
            self._stream(reply, anthropic or is_responses_path(self.path), record)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            record.disconnected.set()
            self.close_connection = True

    def _models(self) -> None:
        """A models list (what Settings' key test asks for): the next `add_models` reply,
        else one model, in the shape both APIs use (Anthropic's paging fields, OpenAI's
        object). A scripted reply's `delay` is waited before it is sent; one with `events` is
        dripped, an event at a time."""
        record = Recorded(
            "GET", self.path, {k.lower(): v for k, v in self.headers.items()}, b"", None
        )
        self.fake._record(record)
        with self.fake._lock:
            scripted = self.fake.model_lists.popleft() if self.fake.model_lists else None
        reply = scripted or Reply(
            body={
                "object": "list",
                "data": [
                    {
                        "id": "fake-model",
                        "object": "model",
                        "type": "model",
                        "display_name": "Fake model",
                        "created": 0,
                        "created_at": "2025-01-01T00:00:00Z",
                        "owned_by": "fake",
                    }
                ],
                "has_more": False,
                "first_id": "fake-model",
                "last_id": "fake-model",
            }
        )
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if reply.events:
                self._drip(reply)
            elif not (reply.delay and self.fake._stopping.wait(reply.delay)):
                self._send_whole(reply)
        record.completed.set()

    def _drip(self, reply: Reply) -> None:
        """A body sent a piece at a time (each event's JSON), `delay` before each: every
        read comes soon, the whole body late."""
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for item in reply.events:
            if self.fake._stopping.wait(reply.delay):
                return
            data = (item if isinstance(item, str) else json.dumps(item)).encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def _script(self, body: bytes) -> None:
        """Replies sent by another process: all of them queued, or none and a 400 saying why."""
        try:
            items = json.loads(body)
            if not isinstance(items, list):
                raise ValueError(f"expected a JSON list of replies, got {type(items).__name__}")
            replies = []
            for i, item in enumerate(items):
                try:
                    replies.append(Reply.from_json(item))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"reply {i}: {exc}") from None
        except ValueError as exc:
            self._answer(400, {"error": f"fake server: {exc}"})
            return
        self.fake.add(*replies)
        self._answer(200, {"queued": len(replies)})

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
        waits = pacing(reply.rate) if reply.rate else None
        for i, frame in enumerate(frames):
            if isinstance(frame, Pause):
                if not self._pause(frame.seconds, record):
                    return
            elif frame is CUT:
                self._cut()
                return
            else:
                if waits is not None and not self._pause(next(waits), record):
                    return
                if reply.stamp:
                    frame = frame.replace(_STAMP_BYTES, str(time.time_ns()).encode())
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


# --- OpenAI's Responses API (POST /v1/responses) ---------------------------------


def is_responses_path(path: str) -> bool:
    """Whether `path` is the Responses API's (the SDK posts to <base_url>/responses)."""
    return path.split("?")[0].rstrip("/").endswith("/responses")


class ResponsesStream:
    """A Responses API stream, item by item, with the documented event shapes:
    `response.created`, each output item (`.added`, its deltas, `.done`) with its
    `output_index` and a `sequence_number` on every event, then `response.completed`
    (or `.incomplete` / `.failed`). For replies built from a request (`respond=`).

        ResponsesStream().reasoning("rs_1", ["Two cities."], "enc-1").call(
            "call_1", "weather", {"location": "Paris"}).events()
    """

    def __init__(self, model: str = "gpt-5", response_id: str = "resp_fake") -> None:
        self.model = model
        self.id = response_id
        self.items: list[dict[str, Any]] = []
        # The events of the items, numbered when the stream is put together.
        self.body: list[dict[str, Any]] = []

    def _add(self, event: dict[str, Any]) -> None:
        self.body.append(event)

    def _item(
        self, added: dict[str, Any], deltas: list[dict[str, Any]], done: dict[str, Any]
    ) -> None:
        index = len(self.items)
        self._add({"type": "response.output_item.added", "output_index": index, "item": added})
        for delta in deltas:
            self._add({**delta, "output_index": index})
        self._add({"type": "response.output_item.done", "output_index": index, "item": done})
        self.items.append(done)

    def reasoning(self, item_id: str, summary: list[str], encrypted: str) -> ResponsesStream:
        """A reasoning item: its summary parts streamed, its final id and encrypted
        content (which .added does not have yet) in .done."""
        deltas: list[dict[str, Any]] = []
        for n, text in enumerate(summary):
            part = {"item_id": item_id, "summary_index": n}
            deltas.append(
                {
                    "type": "response.reasoning_summary_part.added",
                    **part,
                    "part": {"type": "summary_text", "text": ""},
                }
            )
            deltas.append({"type": "response.reasoning_summary_text.delta", **part, "delta": text})
            deltas.append({"type": "response.reasoning_summary_text.done", **part, "text": text})
        done = {
            "id": item_id,
            "type": "reasoning",
            "encrypted_content": encrypted,
            "summary": [{"type": "summary_text", "text": t} for t in summary],
        }
        added = {"id": item_id + "_pending", "type": "reasoning", "summary": []}
        self._item(added, deltas, done)
        return self

    def text(self, text: str, item_id: str = "msg_fake") -> ResponsesStream:
        words = text.split(" ")
        pieces = [w + " " for w in words[:-1]] + words[-1:]
        part = {"item_id": item_id, "content_index": 0}
        deltas = [
            {"type": "response.output_text.delta", **part, "delta": p, "logprobs": []}
            for p in pieces
            if p
        ]
        content = [{"type": "output_text", "text": text, "annotations": []}]
        done = {
            "id": item_id,
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": content,
        }
        added = {**done, "status": "in_progress", "content": []}
        self._item(added, deltas, done)
        return self

    def call(self, call_id: str, name: str, arguments: dict[str, Any]) -> ResponsesStream:
        raw = json.dumps(arguments)
        item_id = "fc_" + call_id
        half = len(raw) // 2
        deltas = [
            {"type": "response.function_call_arguments.delta", "item_id": item_id, "delta": piece}
            for piece in (raw[:half], raw[half:])
        ]
        deltas.append(
            {"type": "response.function_call_arguments.done", "item_id": item_id, "arguments": raw}
        )
        done = {
            "id": item_id,
            "type": "function_call",
            "status": "completed",
            "arguments": raw,
            "call_id": call_id,
            "name": name,
        }
        self._item({**done, "status": "in_progress", "arguments": ""}, deltas, done)
        return self

    def events(
        self,
        *,
        input_tokens: int = 100,
        cached: int = 0,
        reasoning_tokens: int = 0,
        end: str = "completed",
        reason: str | None = None,
    ) -> list[dict[str, Any]]:
        """The whole stream, ending `end` (completed, incomplete: `reason`)."""
        output = sum(len(json.dumps(i)) for i in self.items) // CHARS_PER_TOKEN
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output + reasoning_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output + reasoning_tokens,
        }
        response = {
            "id": self.id,
            "object": "response",
            "created_at": 0,
            "model": self.model,
            "status": "in_progress",
            "output": [],
            "usage": None,
            "error": None,
            "incomplete_details": None,
        }
        final = {
            **response,
            "status": end,
            "output": self.items,
            "usage": usage,
            "incomplete_details": {"reason": reason} if reason else None,
        }
        stream = [
            {"type": "response.created", "response": response},
            *self.body,
            {"type": f"response.{end}", "response": final},
        ]
        return [{**event, "sequence_number": n} for n, event in enumerate(stream)]


def _event_name(line: str) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        return "content_block_delta"
    return value.get("type", "message") if isinstance(value, dict) else "message"


class FakeProviderProcess:
    """A fake server in a process of its own, scripted over HTTP: what it spends on
    pacing and writing frames is not counted in the CPU of the process being measured."""

    def __init__(self, log_path: Path) -> None:
        self.proc = Proc(
            "fakeprovider",
            [sys.executable, "-m", "harness.fakeprovider"],
            clean_env(PYTHONUNBUFFERED="1"),
            log_path,
            stop_timeout=PROCESS_STOP_TIMEOUT,
        )

    def start(self) -> FakeProviderProcess:
        self.proc.start().listening()
        return self

    def stop(self) -> None:
        self.proc.stop()

    def __enter__(self) -> FakeProviderProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The Anthropic base URL (the SDK adds /v1/messages)."""
        return self.proc.url

    @property
    def openai_url(self) -> str:
        """The OpenAI base URL (the SDK adds /chat/completions)."""
        return f"{self.url}/v1"

    def add(self, *replies: Reply) -> None:
        body = json.dumps([reply.to_json() for reply in replies]).encode()
        request = urllib.request.Request(
            self.url + CONTROL_REPLIES, data=body, headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT) as response:
            json.loads(response.read())

    def requests(self) -> list[dict[str, Any]]:
        """What it was asked so far: method, path, json, completed, disconnected."""
        with urllib.request.urlopen(self.url + CONTROL_REQUESTS, timeout=CONTROL_TIMEOUT) as r:
            return json.loads(r.read())


async def collect(stream: Any) -> list[Any]:
    """Every event of a provider stream, closing it whatever happens."""
    async with contextlib.aclosing(stream) as events:
        return [event async for event in events]


def main() -> None:
    """Serve on a port the OS chooses, say which, and run until SIGTERM or SIGINT."""
    server = FakeProviderServer().start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    host, port = server._server.server_address[:2]
    print(LISTENING_LINE.format(host=host, port=port), flush=True)
    stop.wait()
    server.stop()


if __name__ == "__main__":
    main()
