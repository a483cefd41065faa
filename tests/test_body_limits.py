"""Request bodies are bounded before they are read (dispatch.bodylimit, dispatch.server):
by the route's own maximum on Content-Length, while a chunked body is counted, and to a
small size until the request is signed in. Refusals are JSON under /api/, text elsewhere.

The budget is pure (a table); the middleware is driven as ASGI with a receive that
counts what was taken; the daphne side with raw sockets against `manage.py serve`.
"""

from __future__ import annotations

import asyncio
import io
import json
import select
import socket
import tracemalloc
import uuid
from collections.abc import Iterable, Iterator

import pytest
from asgiref.sync import sync_to_async
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.core.asgi import get_asgi_application

from chat import blobs, transfer
from chat.api import MAX_BODY_BYTES
from chat.models import ApiToken
from dispatch.bodylimit import SMALL_BODY_BYTES, BodyLimitMiddleware, Budget, not_signed_in
from harness.login import cookie_header, session_for

MB = 1024 * 1024
# Fixed: xdist needs every process to collect the same parameter ids.
TAB = "3f1c2a9e-5b7d-4e8f-9a1b-2c3d4e5f6a7b"


def budget(path: str, length: int | None = None, **headers: str) -> Budget:
    pairs = [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    if length is not None:
        pairs.append((b"content-length", str(length).encode()))
    else:
        pairs.append((b"transfer-encoding", b"chunked"))
    return Budget(path, pairs)


@pytest.mark.parametrize(
    ("path", "content_type", "cap"),
    [
        (f"/t/{TAB}/attachments/", "multipart/form-data; boundary=x", blobs.MAX_REQUEST_BYTES),
        (f"/api/v1/tabs/{TAB}/messages", "multipart/form-data; b=x", blobs.MAX_REQUEST_BYTES),
        (f"/api/v1/tabs/{TAB}/messages", "application/json", MAX_BODY_BYTES),
        ("/api/v1/tabs/import", "application/x-ndjson", transfer.IMPORT_MAX_BYTES),
        ("/t/import/", "multipart/form-data", transfer.IMPORT_MAX_BYTES + transfer.MULTIPART_SLACK),
        ("/login/", "application/x-www-form-urlencoded", MAX_BODY_BYTES),
        ("/api/v1/tabs", "application/json", MAX_BODY_BYTES),
        (f"/t/{TAB}/send/", "application/x-www-form-urlencoded", MAX_BODY_BYTES),
        ("/admin/chat/tab/add/", "multipart/form-data", MAX_BODY_BYTES),
    ],
)
def test_each_route_has_its_own_cap(path, content_type, cap):
    assert budget(path, 0, content_type=content_type).limit.cap == cap


@pytest.mark.parametrize(
    ("path", "length", "credentials", "expected"),
    [
        ("/api/v1/tabs/import", 300 * MB, True, (413, "larger than 64.0 MB, the most an import")),
        ("/api/v1/tabs/import", 300 * MB, False, (413, "larger than 64.0 MB")),
        ("/api/v1/tabs", 3 * MB, True, (413, "larger than 2.0 MB, the most a request here")),
        (f"/t/{TAB}/attachments/", 201 * MB, True, (413, "the most a request of attachments")),
        ("/api/v1/tabs/import", 10 * MB, True, None),  # a session or token to check first
        ("/login/", 1000, False, None),
        ("/login/", SMALL_BODY_BYTES, False, None),
    ],
)
def test_a_declared_size_is_refused_before_reading(path, length, credentials, expected):
    extra = {"cookie": "sessionid=abc"} if credentials else {}
    refusal = budget(path, length, **extra).declared_refusal()
    got = (refusal.status, refusal.message) if refusal else None
    if expected is None:
        assert got is None
    else:
        assert got[0] == expected[0] and expected[1] in got[1]


def test_a_request_that_is_not_signed_in_is_held_to_a_small_body():
    # Declared: refused at once, before a byte is read.
    declared = budget("/api/v1/tabs/import", SMALL_BODY_BYTES + 1)
    assert declared.needs_sign_in()
    assert declared.signed_in(not_signed_in("/api/v1/tabs/import")).status == 401
    assert not budget("/login/", SMALL_BODY_BYTES).needs_sign_in()
    # Chunked: read up to the small size, refused past it.
    chunked = budget("/login/")
    assert chunked.needs_sign_in()
    assert chunked.signed_in(not_signed_in("/login/")) is None
    assert chunked.count(SMALL_BODY_BYTES) is None
    refusal = chunked.count(1)
    assert (refusal.status, refusal.message) == (
        413,
        "Sign in first: a request that is not signed in may send at most 64 KB.",
    )
    # Signed in: the route's cap.
    signed = budget("/api/v1/tabs/import")
    assert signed.signed_in(None) is None
    assert signed.count(transfer.IMPORT_MAX_BYTES) is None
    assert signed.count(1).status == 413


def test_refusals_are_json_under_the_api_and_text_elsewhere():
    status, headers, body = not_signed_in("/api/v1/tabs/import").response("/api/v1/tabs/import")
    assert status == 401
    assert dict(headers)[b"content-type"] == b"application/json"
    assert json.loads(body)["error"]["code"] == "unauthorized"
    status, headers, body = not_signed_in("/login/").response("/login/")
    assert (status, dict(headers)[b"content-type"]) == (413, b"text/plain; charset=utf-8")
    assert body.decode().startswith("Sign in first")


# --- the middleware in front of Django --------------------------------------------------


class Body:
    """An ASGI receive giving `total` bytes in `chunk`-sized messages; counts what it gave."""

    def __init__(self, total: int, chunk: int = 16 * 1024) -> None:
        self.total, self.chunk, self.given = total, chunk, 0

    async def __call__(self) -> dict:
        if self.given >= self.total and self.given:
            await asyncio.Event().wait()  # as a server does: nothing until a disconnect
        size = min(self.chunk, self.total - self.given)
        self.given += size
        return {"type": "http.request", "body": b"x" * size, "more_body": self.given < self.total}


async def call(path: str, body: Body, headers: Iterable[tuple[str, str]], declare: bool):
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")]
        + [(k.encode(), v.encode()) for k, v in headers]
        + [
            (b"content-length", str(body.total).encode())
            if declare
            else (b"transfer-encoding", b"chunked")
        ],
        "client": ("203.0.113.9", 5000),
        "server": ("127.0.0.1", 8000),
    }
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await BodyLimitMiddleware(get_asgi_application())(scope, body, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], content


@pytest.fixture
def alice(transactional_db):
    return get_user_model().objects.create_user("alice", password="correct horse battery")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("declare", [True, False])
async def test_an_import_that_is_not_signed_in_is_refused_unread(declare):
    body = Body(20 * MB if declare else 200 * MB)  # declared: within the import's cap
    status, content = await call("/api/v1/tabs/import", body, [], declare)
    assert status == 401
    assert json.loads(content)["error"]["message"].startswith("Sign in, or send Authorization")
    # Declared: nothing read. Chunked: the small size and the message that passed it.
    assert body.given <= (0 if declare else SMALL_BODY_BYTES + body.chunk)


@pytest.mark.django_db(transaction=True)
async def test_a_token_that_is_not_valid_is_refused_unread_and_counted(alice):
    body = Body(10 * MB)
    status, content = await call(
        "/api/v1/tabs/import", body, [("authorization", "Bearer nope")], True
    )
    assert (status, body.given) == (401, 0)
    assert json.loads(content)["error"]["code"] == "invalid_token"
    assert await AccessAttempt.objects.filter(ip_address="203.0.113.9").aexists()


@pytest.mark.django_db(transaction=True)
async def test_a_signed_in_request_gets_its_routes_cap(alice):
    token = (await sync_to_async(ApiToken.issue)(alice, name="t"))[1]
    session = await sync_to_async(session_for)(alice)
    # Past the import cap, counted while read: 413, the rest unread.
    body = Body(transfer.IMPORT_MAX_BYTES + MB, chunk=MB)
    status, content = await call(
        "/api/v1/tabs/import", body, [("authorization", f"Bearer {token}")], False
    )
    assert status == 413
    assert json.loads(content)["error"]["message"] == (
        "The request body is larger than 64.0 MB, the most an import may be."
    )
    assert body.given <= transfer.IMPORT_MAX_BYTES + MB
    # Within it, past the small size: the view reads it (and refuses this one as JSONL).
    body = Body(200 * 1024)
    status, content = await call(
        "/api/v1/tabs/import", body, [("authorization", f"Bearer {token}")], False
    )
    assert (status, body.given) == (422, 200 * 1024)
    assert json.loads(content)["error"]["code"] == "invalid_import"
    # A session too (the page's import: its form then fails the CSRF check, unread by us).
    body = Body(200 * 1024)
    status, _ = await call(
        "/t/import/",
        body,
        [("cookie", cookie_header(session)), ("content-type", "multipart/form-data; boundary=b")],
        True,
    )
    assert status == 403 and body.given == 200 * 1024


@pytest.mark.django_db(transaction=True)
async def test_a_session_that_is_not_valid_is_held_to_the_small_size(alice):
    body = Body(MB)
    status, content = await call(f"/t/{TAB}/attachments/", body, [("cookie", "sessionid=x")], True)
    assert (status, body.given) == (413, 0)
    assert content.decode().startswith("Sign in first")
    # A small body passes on to the view (whose CSRF check refuses this one).
    body = Body(100)
    status, _ = await call("/login/", body, [("cookie", "sessionid=x")], True)
    assert (status, body.given) == (403, 100)


# --- daphne, as `manage.py serve` runs it -----------------------------------------------


def chunked(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        part = b"x" * min(size, total - sent)
        sent += len(part)
        yield b"%x\r\n%s\r\n" % (len(part), part)
    yield b"0\r\n\r\n"


def exchange(port: int, head: str, body: Iterable[bytes] = ()) -> tuple[str, bytes, int]:
    """Send `head`, then `body` for as long as the server reads it; stop at its answer.
    (status line, answer body, bytes of body sent)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    parts = iter(body)
    pending, sent, answer = head.encode(), -len(head.encode()), b""
    try:
        while True:
            if not pending:
                pending = next(parts, b"")
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 60)
            assert readable or writable, "the server neither answered nor read for 60 s"
            if readable:
                data = sock.recv(1 << 16)
                answer += data
                head_end = answer.find(b"\r\n\r\n")
                if not data or head_end >= 0 and _complete(answer, head_end):
                    break
            elif writable:
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    pending = b""
                    continue
                sent, pending = sent + n, pending[n:]
    finally:
        sock.close()
    status, _, rest = answer.partition(b"\r\n")
    return status.decode(), rest.partition(b"\r\n\r\n")[2], max(sent, 0)


def _complete(answer: bytes, head_end: int) -> bool:
    for line in answer[:head_end].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(answer) - head_end - 4 >= int(line.split(b":")[1])
    return False


def request(path: str, *headers: str, length: int | None = None) -> str:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", size, *headers]
    return "\r\n".join(lines) + "\r\n\r\n"


@pytest.mark.django_db(transaction=True)
async def test_daphne_refuses_bodies_before_storing_them(serve, alice):
    server = await serve()
    token = (await sync_to_async(ApiToken.issue)(alice, name="t"))[1]
    # What the socket buffers on the way hold at most; far below what is offered.
    buffered = 16 * MB

    status, answer, sent = await sync_to_async(exchange)(
        server.port, request("/api/v1/tabs/import"), chunked(200 * MB)
    )
    assert status == "HTTP/1.1 401 Unauthorized"
    assert json.loads(answer)["error"]["code"] == "unauthorized"
    assert sent < buffered

    status, answer, sent = await sync_to_async(exchange)(
        server.port, request("/login/", length=300 * MB)
    )
    assert status == "HTTP/1.1 413 Content Too Large"
    assert (
        answer.decode()
        == "The request body is larger than 2.0 MB, the most a request here may be.\n"
    )

    status, answer, sent = await sync_to_async(exchange)(server.port, request("/login/", length=MB))
    assert status == "HTTP/1.1 413 Content Too Large"
    assert answer.decode().startswith("Sign in first")

    status, answer, _ = await sync_to_async(exchange)(
        server.port,
        request("/api/v1/tabs/import", f"Authorization: Bearer {token}", length=300 * MB),
    )
    assert status == "HTTP/1.1 413 Content Too Large"
    error = json.loads(answer)["error"]
    assert error["code"] == "import_too_large"  # the import view's own code
    assert "the most an import may be" in error["message"]

    # A cookie that names no session: held until checked, then refused.
    status, answer, sent = await sync_to_async(exchange)(
        server.port,
        request(f"/t/{TAB}/attachments/", "Cookie: sessionid=forged"),
        chunked(200 * MB),
    )
    assert status == "HTTP/1.1 413 Content Too Large"
    assert sent < buffered

    # A valid token: past the small size, read and given to the view.
    status, answer, sent = await sync_to_async(exchange)(
        server.port,
        request("/api/v1/tabs/import", f"Authorization: Bearer {token}"),
        chunked(300 * 1024),
    )
    assert status.startswith("HTTP/1.1 422 ")
    assert json.loads(answer)["error"]["code"] == "invalid_import"

    # A form body goes to the application unparsed (Twisted's parser costs many times a
    # body of empty parts, before any check): a broken one gets the API's JSON answer.
    status, answer, _ = await sync_to_async(exchange)(
        server.port,
        request(
            "/api/v1/tabs/import",
            f"Authorization: Bearer {token}",
            "Content-Type: multipart/form-data",  # no boundary: Twisted answered 400, empty
            length=len(b"--x\r\nbroken"),
        ),
        [b"--x\r\nbroken"],
    )
    assert json.loads(answer)["error"]["code"], (status, answer)


# --- import memory -------------------------------------------------------------------


def export(chunks: list[dict]) -> bytes:
    head = {
        "format": "dispatch-tab",
        "version": 1,
        "tab_id": str(uuid.uuid4()),
        "title": "t",
        "model": "offline/demo",
        "system_prompt": "",
        "created_at": None,
        "exported_at": None,
        "chunks": len(chunks),
    }
    lines = [head] + [
        {"id": str(uuid.uuid4()), "seq": seq, "step": 0, "created_at": None, **chunk}
        for seq, chunk in enumerate(chunks, start=1)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def turns(n: int, size: int) -> list[dict]:
    chunks = []
    for i in range(n):
        turn = str(uuid.uuid4())
        chunks.append(
            {"turn_id": turn, "role": "user", "type": "text", "data": {"text": "q" * size}}
        )
        chunks.append(
            {"turn_id": turn, "role": "assistant", "type": "text", "data": {"text": f"{i}" * size}}
        )
    return chunks


def import_peak(owner, data: bytes) -> tuple[int, Exception | None]:
    """The most memory an import of `data` held at once, and its refusal, if any."""
    tracemalloc.start()
    try:
        transfer.import_jsonl(owner, io.BytesIO(data))
        refused = None
    except transfer.ImportRefused as exc:
        refused = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, refused


@pytest.mark.django_db
def test_an_import_holds_at_most_twice_its_size(alice):
    # One 48 MB line (parsing it would take 300 MB, ten times more for many small values):
    # refused after MAX_LINE_BYTES, with the line and the limit.
    line = {"turn_id": None, "role": "user", "type": "text", "data": {"text": "x" * 48 * MB}}
    data = export([line])
    peak, refused = import_peak(alice, data)
    assert (
        str(refused)
        == "line 2: the line is longer than 4 MB, the most one chunk of an export may be"
    )
    assert peak <= 2 * len(data)
    # Many lines: kept on disk between checking and writing, written a few MB at a time.
    data = export(turns(200, 24 * 1024))
    peak, refused = import_peak(alice, data)
    assert refused is None
    assert peak <= 2 * len(data)
