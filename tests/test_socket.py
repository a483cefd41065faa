"""TabSocket: access, the fragments it sends, and the gapless reconnect protocol."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat import bus, consumers, follow, log, render
from chat.models import RunningTurn, set_setting
from chat.providers.base import Finish, TextDelta
from chat.stream import Block
from dispatch.asgi import router
from harness.login import cookie_header, session_for
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.ui_helpers import parse, top

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# Frames arrive within this when anything is streaming.
FRAME_TIMEOUT = 10


async def connect(tab_id, cookie: str = "", *, origin: str = "http://127.0.0.1:8000"):
    """A socket to the real ASGI stack (origin check, auth, routing) with `cookie`."""
    headers = [(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(router, f"/ws/tabs/{tab_id}/", headers=headers)


@database_sync_to_async
def session_cookie(user) -> str:
    return cookie_header(session_for(user))


class AsUser:
    """Puts a user into the scope below the auth middleware, as a logged-in session would."""

    def __init__(self, app, user):
        self.app, self.user = app, user

    async def __call__(self, scope, receive, send):
        return await self.app({**scope, "user": self.user}, receive, send)


async def open_socket(tab_id, user):
    from channels.routing import URLRouter

    from chat.routing import websocket_urlpatterns

    app = AsUser(URLRouter(websocket_urlpatterns), user)
    communicator = WebsocketCommunicator(app, f"/ws/tabs/{tab_id}/")
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def refused(communicator: WebsocketCommunicator) -> int:
    """The code of a refusal: accepted and closed at once, nothing sent between (refused
    at the handshake, a page would see 1006 and retry for ever)."""
    connected, _ = await communicator.connect()
    assert connected
    output = await communicator.receive_output(timeout=FRAME_TIMEOUT)
    await communicator.disconnect()
    assert output["type"] == "websocket.close", output
    return output["code"]


async def test_it_refuses_an_anonymous_socket():
    tab = await make_tab()
    assert await refused(await connect(tab.pk)) == consumers.CLOSE_SIGNED_OUT


async def test_the_session_cookie_opens_the_owners_socket_and_nothing_else():
    """The real stack reads the user from the session cookie, once, at connect."""
    tab = await make_tab()
    owner = await database_sync_to_async(get_user_model().objects.get)(pk=tab.owner_id)
    cookie = await session_cookie(owner)
    communicator = await connect(tab.pk, cookie)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
    assert "data-state" in await communicator.receive_from(timeout=FRAME_TIMEOUT)
    await communicator.disconnect()
    for bad in ("sessionid=not-a-session", "othercookie=1", cookie.replace("=", "=x")):
        assert await refused(await connect(tab.pk, bad)) == consumers.CLOSE_SIGNED_OUT, bad


async def test_cookies_split_over_several_headers_are_read_like_a_page_request():
    tab = await make_tab()
    owner = await database_sync_to_async(get_user_model().objects.get)(pk=tab.owner_id)
    cookie = await session_cookie(owner)
    communicator = WebsocketCommunicator(
        router,
        f"/ws/tabs/{tab.pk}/",
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", b"theme=dark"),
            (b"cookie", cookie.encode()),
        ],
    )
    connected, _ = await communicator.connect()
    assert connected
    await communicator.disconnect()


async def test_a_session_from_before_a_password_change_no_longer_opens_a_socket():
    tab = await make_tab()
    owner = await database_sync_to_async(get_user_model().objects.get)(pk=tab.owner_id)
    cookie = await session_cookie(owner)

    def change_password():
        owner.set_password("a new password entirely")
        owner.save()

    await database_sync_to_async(change_password)()
    assert await refused(await connect(tab.pk, cookie)) == consumers.CLOSE_SIGNED_OUT


async def test_it_refuses_another_users_tab():
    tab = await make_tab()
    other = await database_sync_to_async(get_user_model().objects.create)(username="other")
    from channels.routing import URLRouter

    from chat.routing import websocket_urlpatterns

    communicator = WebsocketCommunicator(
        AsUser(URLRouter(websocket_urlpatterns), other), f"/ws/tabs/{tab.pk}/"
    )
    assert await refused(communicator) == consumers.CLOSE_FORBIDDEN


def _session_cookie(user) -> bytes:
    return cookie_header(session_for(user)).encode()


@pytest.mark.parametrize(
    ("origin", "accepted"), [("http://127.0.0.1:8000", True), ("http://evil.example", False)]
)
async def test_it_checks_the_origin_of_a_logged_in_socket(origin, accepted):
    """Through the real stack (origin check, session, auth): only the app's own origin."""
    tab = await make_tab()
    owner = await database_sync_to_async(lambda: tab.owner)()
    cookie = await database_sync_to_async(_session_cookie)(owner)
    communicator = WebsocketCommunicator(
        router,
        f"/ws/tabs/{tab.pk}/",
        headers=[(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000"), (b"cookie", cookie)],
    )
    connected, _ = await communicator.connect()
    assert connected is accepted
    await communicator.disconnect()


async def test_hello_on_an_idle_tab_sends_what_the_page_lacks_and_the_status(script):
    script([TextDelta("Hi there."), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "hello")
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 1}))
    catch_up = await socket.receive_from(FRAME_TIMEOUT)
    assert [catch_up] == render.catch_up_frames(rows[1:], follow.CATCH_UP_FRAME_CHARS)
    status = await socket.receive_from(FRAME_TIMEOUT)
    assert 'id="status"' in status
    assert await socket.receive_nothing(0.2)
    await socket.disconnect()


async def test_live_ops_become_open_delta_and_seal_fragments(script):
    script([TextDelta("one "), TextDelta("two"), Finish()], delay=0.05)
    async with running_worker():
        tab = await make_tab()
        owner = await database_sync_to_async(lambda: tab.owner)()
        socket = await open_socket(tab.pk, owner)
        await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
        await socket.receive_from(FRAME_TIMEOUT)  # status: idle
        await submit(tab, "go")
        frames = []
        while True:
            frame = await socket.receive_from(FRAME_TIMEOUT)
            frames.append(frame)
            if 'data-state="idle"' in frame:
                break
        await socket.disconnect()
    rows = await chunks(tab.pk)
    text = rows[-1]
    # The turn's first chunk starts a bubble; its answer joins it.
    sealed_user = render.fragment_seal(Block.from_dict(_fields(rows[0])), turn_start=True)
    assert sealed_user in frames
    assert render.fragment_seal(Block.from_dict(_fields(text))) in frames
    # A text chunk's deltas are live Markdown: its tail replaced, or text appended to it.
    deltas = [f for f in frames if f"body-{text.id}-" in f and "chunk-" not in f]
    assert deltas, "no delta frame"
    open_frames = [f for f in frames if f'id="chunk-{text.id}" data-seq=""' in f]
    assert open_frames, "no open frame"


def _fields(chunk) -> dict:
    return {
        "id": str(chunk.id),
        "turn_id": str(chunk.turn_id),
        "step": chunk.step,
        "role": chunk.role,
        "type": chunk.type,
        "data": chunk.data,
        "seq": chunk.seq,
    }


# --- The reconnect protocol, with frames reduced to what they say -------------------


@pytest.fixture
def plain_frames(monkeypatch):
    """Frames as JSON facts instead of HTML, to reconstruct the page's text exactly."""
    monkeypatch.setattr(
        render, "fragment_open", lambda b, **kw: json.dumps({"open": str(b.id), "text": b.text})
    )
    monkeypatch.setattr(
        render, "fragment_delta", lambda i, t: json.dumps({"delta": str(i), "text": t})
    )
    monkeypatch.setattr(
        render, "fragment_live", lambda live, t: json.dumps({"delta": str(live.id), "text": t})
    )
    monkeypatch.setattr(
        render,
        "fragment_seal",
        lambda b, **kw: json.dumps({"seal": str(b.id), "seq": b.seq, "text": b.text}),
    )
    monkeypatch.setattr(
        render,
        "catch_up_frames",
        lambda cs, max_chars, **kw: (
            [json.dumps({"chunks": [{"seal": str(c.id), "seq": c.seq} for c in cs]})] if cs else []
        ),
    )
    monkeypatch.setattr(
        render,
        "fragment_log",
        lambda cs, **kw: json.dumps({"log": [c.seq for c in cs], "has_more": kw["has_more"]}),
    )
    monkeypatch.setattr(render, "fragment_status", lambda s: json.dumps({"status": s["state"]}))
    monkeypatch.setattr(render, "fragment_queued", lambda i, t: json.dumps({"queued": i}))
    monkeypatch.setattr(render, "fragment_taken", lambda ids: json.dumps({"taken": ids}))


WORDS = [f"w{i} " for i in range(150)]


@pytest.mark.parametrize("page_had", ["nothing open", "a prefix of the open chunk"])
async def test_a_connect_landing_mid_chunk_gets_exactly_the_text(script, plain_frames, page_had):
    """No gap and no duplicate: the page's text plus what the socket sends is the log's text."""
    script([*[TextDelta(w) for w in WORDS], Finish()], delay=0.005)
    async with running_worker():
        tab = await make_tab()
        owner = await database_sync_to_async(lambda: tab.owner)()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            # Let the stream run a while, as if the page rendered now.
            opened = await watcher.until(
                lambda m: m["op"] == "open" and m["block"]["role"] == "assistant"
            )
            chunk_id = opened["block"]["id"]
            seen = ""
            while len(seen) < 100:
                m = await watcher.until(lambda m: m["op"] == "delta")
                seen += m["text"]
            socket = await open_socket(tab.pk, owner)
            if page_had == "nothing open":
                page_text, hello = "", {"type": "hello", "last_seq": 1}
            else:
                page_text = seen[:37]
                hello = {
                    "type": "hello",
                    "last_seq": 1,
                    "open_id": chunk_id,
                    "open_len": len(page_text),
                }
            await socket.send_to(text_data=json.dumps(hello))
            text, seals = page_text, []
            while True:
                frame = json.loads(await socket.receive_from(FRAME_TIMEOUT))
                if "open" in frame:
                    # A page holding part of an open text chunk gets all of it again: its
                    # rendered Markdown does not say where the stable part ends.
                    assert frame["open"] == chunk_id
                    text = frame["text"]
                elif "delta" in frame:
                    assert frame["delta"] == chunk_id
                    text += frame["text"]
                elif "seal" in frame:
                    seals.append(frame["seq"])
                elif frame.get("status") == "idle":
                    break
            await socket.disconnect()
    rows = await chunks(tab.pk)
    assert text == rows[-1].data["text"] == "".join(WORDS)
    assert seals == [rows[-1].seq]


async def test_a_dead_worker_falls_back_to_the_checkpoint(plain_frames, monkeypatch):
    """No runner answers the snapshot: the checkpoint in the database (a header and two
    pieces) is sent after a timeout."""
    monkeypatch.setattr(follow, "SNAPSHOT_TIMEOUT", 0.2)
    from django.utils import timezone

    tab = await make_tab()
    running = await RunningTurn.objects.acreate(
        tab_id=tab.pk, turn_id=uuid.uuid4(), worker="gone:1:x", heartbeat_at=timezone.now()
    )
    block = Block(uuid.uuid4(), running.turn_id, 1, "assistant", "text", {"text": "saved "})
    chunk_id = block.id
    await database_sync_to_async(log.checkpoint)(tab.pk, block, None)
    block.data["text"] += "so far"
    await database_sync_to_async(log.checkpoint)(tab.pk, block, len("saved "))
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
    frame = json.loads(await socket.receive_from(FRAME_TIMEOUT))
    assert frame == {"open": str(chunk_id), "text": "saved so far"}
    await socket.disconnect()


async def test_malformed_hello_is_ignored(plain_frames):
    tab = await make_tab()
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    for bad in ["not json", json.dumps([1]), json.dumps({"type": "hello", "last_seq": "x"})]:
        await socket.send_to(text_data=bad)
    assert await socket.receive_nothing(0.2)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
    assert json.loads(await socket.receive_from(FRAME_TIMEOUT)) == {"status": "idle"}
    await socket.disconnect()


async def test_a_page_that_never_says_hello_is_closed_before_its_buffer_grows(monkeypatch):
    monkeypatch.setattr(follow, "MAX_BUFFERED_OPS", 3)
    tab = await make_tab()
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    layer = get_channel_layer()
    for n in range(5):
        await layer.group_send(
            bus.tab_group(tab.pk), {"type": "tab.op", "op": "queued", "id": n, "text": "x"}
        )
    output = await socket.receive_output(FRAME_TIMEOUT)
    assert output == {"type": "websocket.close", "code": consumers.CLOSE_RESYNC}
    await socket.disconnect()


# --- Bounded catch-up --------------------------------------------------------------------

LONG_TAB_CHUNKS = 3_500


def _seed(tab_id, count: int, text: str = "a line of the long conversation, number {n}") -> None:
    turn = uuid.uuid4()
    blocks = [
        Block(uuid.uuid4(), turn, n // 40, "assistant", "text", {"text": text.format(n=n)})
        for n in range(count)
    ]
    log.append(tab_id, blocks)


def _older(tab, before: int) -> tuple[list[int], int | None]:
    """The seqs of the page the browser loads when its "older" sentinel is revealed."""
    client = Client()
    client.force_login(tab.owner)
    response = client.get(reverse("tab_older", args=[tab.id]), {"before": before})
    assert response.status_code == 200
    tree = parse(response.content.decode())
    return _seqs(tree), _sentinel(tree)


def _seqs(tree) -> list[int]:
    return [int(n.get("data-seq")) for n in tree.find_all(lambda n: n.get("data-seq"))]


def _sentinel(tree) -> int | None:
    older = tree.by_id("older")
    return int(older.get("hx-get").rpartition("before=")[2]) if older is not None else None


async def test_a_hello_far_behind_gets_the_latest_page_in_one_bounded_frame():
    """A page with nothing (last_seq 0) on a tab of three and a half pages: the socket
    replaces its log with the newest chunks that fit one frame, and "load older" then
    brings every other chunk exactly once."""
    tab = await make_tab()
    await database_sync_to_async(set_setting)("page_size", 1000)
    await database_sync_to_async(_seed)(tab.pk, LONG_TAB_CHUNKS, text="{n} " + "words " * 50)
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
    first = await socket.receive_from(FRAME_TIMEOUT)
    assert len(first) <= follow.CATCH_UP_FRAME_CHARS
    status = await socket.receive_from(FRAME_TIMEOUT)
    assert 'id="status"' in status
    assert await socket.receive_nothing(0.2)
    await socket.disconnect()

    [log_el] = top(first)
    assert log_el.get("id") == "log" and log_el.get("hx-swap-oob") == "true"
    shown = _seqs(log_el)
    # The newest chunks, as many as fit (a page of 1000 is too big for one frame here).
    assert shown == list(range(LONG_TAB_CHUNKS - len(shown) + 1, LONG_TAB_CHUNKS + 1))
    assert 100 <= len(shown) < 1000
    before = _sentinel(log_el)
    assert before == shown[0]
    while before is not None:
        older, before = await database_sync_to_async(_older)(tab, before)
        shown = older + shown
    assert shown == list(range(1, LONG_TAB_CHUNKS + 1))


async def test_a_page_one_page_behind_gets_inserts_in_bounded_frames():
    """Within a page, the missing chunks come as inserts after what the page has, split
    into frames under the size bound when they are large."""
    tab = await make_tab()
    await database_sync_to_async(_seed)(tab.pk, 150, text="{n} " + "x" * 5000)
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 20}))
    frames = []
    while 'id="status"' not in (frame := await socket.receive_from(FRAME_TIMEOUT)):
        frames.append(frame)
    await socket.disconnect()
    assert len(frames) > 1
    assert all(len(f) <= follow.CATCH_UP_FRAME_CHARS for f in frames)
    seqs = []
    for frame in frames:
        for wrapper in top(frame):
            assert wrapper.get("hx-swap-oob") == "beforeend:#log"
            seqs += _seqs(wrapper)
    assert seqs == list(range(21, 151))


# --- A channel layer that drops ops -------------------------------------------------------

# So small that a burst of ops overflows the socket's channel.
TINY_CAPACITY = 3


@pytest.fixture
def tiny_layer(settings):
    # Channels' own in-memory layer, whose channels are queues (as Redis's are): the
    # embedded layer hands the tab's feed its ops as calls, which nothing drops.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": TINY_CAPACITY, "expiry": 60},
        }
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


async def _burst(tab_id, ops: list[dict]) -> None:
    """Send ops at once, as a fast runner does: the socket's full channel drops the rest."""
    group = bus.tab_group(tab_id)
    await asyncio.gather(
        *(get_channel_layer().group_send(group, {"type": "tab.op", **op}) for op in ops)
    )


def _append(tab_id, count: int) -> list[dict]:
    blocks = [
        Block(uuid.uuid4(), None, 0, "system", "system", {"kind": "notice", "text": str(n)})
        for n in range(count)
    ]
    log.append(tab_id, blocks)
    return [{"op": "seal", "block": b.to_dict()} for b in blocks]


async def test_a_dropped_seal_is_noticed_at_the_next_one_and_the_page_caught_up(
    tiny_layer, plain_frames
):
    tab = await make_tab()
    await database_sync_to_async(_append)(tab.pk, 2)
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 2}))
    assert json.loads(await socket.receive_from(FRAME_TIMEOUT)) == {"status": "idle"}

    await _burst(tab.pk, await database_sync_to_async(_append)(tab.pk, 10))
    # Seqs 3..12 went out; the channel held TINY_CAPACITY of them. The next seal shows the gap.
    await _burst(tab.pk, await database_sync_to_async(_append)(tab.pk, 1))
    page: list[int] = []
    while (frame := json.loads(await socket.receive_from(FRAME_TIMEOUT))) != {"status": "idle"}:
        page += [c["seq"] for c in frame["chunks"]] if "chunks" in frame else [frame["seq"]]
    assert await socket.receive_nothing(0.2)
    await socket.disconnect()
    assert page == list(range(3, 14))


@pytest.mark.parametrize("lost", ["deltas", "the open op"])
async def test_lost_stream_text_is_noticed_and_resent_from_the_snapshot(
    tiny_layer, plain_frames, monkeypatch, lost
):
    """A delta past the end of the page's text, or one for a chunk the page never got opened,
    means ops were dropped: the socket resyncs, and the page's text is the open block's."""
    monkeypatch.setattr(follow, "SNAPSHOT_TIMEOUT", 0.2)
    tab = await make_tab()
    # Thinking: its page takes the rest as a delta (an open text chunk is sent whole again).
    block = Block(uuid.uuid4(), uuid.uuid4(), 1, "assistant", "thinking", {"text": ""})
    words = [f"word{n} " for n in range(12)]
    full = "".join(words)
    # No runner answers the snapshot here: the socket falls back to the checkpoint.
    await RunningTurn.objects.acreate(
        tab_id=tab.pk, turn_id=block.turn_id, worker="gone:1:x", heartbeat_at=timezone.now()
    )
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
    assert "status" in json.loads(await socket.receive_from(FRAME_TIMEOUT))

    deltas, offset = [], 0
    for word in words:
        deltas.append({"op": "delta", "chunk_id": str(block.id), "offset": offset, "text": word})
        offset += len(word)
    opened = {"op": "open", "block": block.to_dict()}
    if lost == "deltas":
        await _burst(tab.pk, [opened, *deltas[:-1]])
    else:
        running = {"op": "status", "status": {"state": "running"}}
        await _burst(tab.pk, [*[running] * TINY_CAPACITY, opened, *deltas[:-1]])
    # By the time the last delta goes out, the checkpoint holds the whole text.
    block.data["text"] = full
    await database_sync_to_async(log.checkpoint)(tab.pk, block, None)
    await _burst(tab.pk, deltas[-1:])
    text, opens = "", 0
    async with asyncio.timeout(FRAME_TIMEOUT):
        while text != full:
            frame = json.loads(await socket.receive_from(FRAME_TIMEOUT))
            if "open" in frame:
                opens += 1
                text = frame["text"]
            elif "delta" in frame:
                text += frame["text"]
    assert text == full and opens == 1
    await socket.receive_from(FRAME_TIMEOUT)  # the resync's status
    assert await socket.receive_nothing(0.3)
    await socket.disconnect()


async def test_a_live_chunk_of_a_turn_without_a_user_message_starts_its_own_bubble():
    """A recovery notice (or a crash's error) opens a turn with no user chunk: live, as
    after a reload, it starts a bubble instead of joining the previous turn's answer."""
    tab = await make_tab()
    first, second = uuid.uuid4(), uuid.uuid4()
    held = [
        Block(uuid.uuid4(), first, 0, "user", "text", {"text": "hi"}),
        Block(uuid.uuid4(), first, 1, "assistant", "text", {"text": "hello"}),
    ]
    await database_sync_to_async(log.append)(tab.pk, held)
    renderer = follow.HtmlRenderer()
    plan = await database_sync_to_async(renderer.catch_up)(tab.pk, 2)
    assert plan.frames == [] and plan.last_turn == first
    notice = Block(uuid.uuid4(), second, 0, "system", "system", {"kind": "interrupted"}, 3)
    error = Block(uuid.uuid4(), second, 0, "assistant", "error", {"message": "x"}, 4)

    def classes(frame: str) -> set[str]:
        return top(frame)[0].children[0].classes

    assert "turn-start" in classes(renderer.seal(notice))
    assert "turn-start" not in classes(renderer.seal(error))
    page = render.group([*held, notice, error])
    assert [item.turn_start for item in page] == [True, False, True, False]


async def test_a_sidebar_batch_for_a_page_already_gone_fails_nothing(monkeypatch):
    """The page's connection closed before its disconnect reached the consumer: the batch's
    send finds the protocol closed (daphne's autobahn raises), the socket counts as ended
    and the batch's task ends without an error nobody would retrieve."""

    async def closed(self, *args, **kwargs):
        raise Disconnected("Attempt to send on a closed protocol")

    monkeypatch.setattr(AsyncWebsocketConsumer, "send", closed)
    monkeypatch.setattr(consumers, "SIDEBAR_BATCH_SECONDS", 0)
    socket = consumers.UserSocket()
    await socket.take(
        {"type": "user.tab", "tab_id": "t1", "entries": {"other": "<a>", "current": "<a>"}}
    )
    flush = socket.flush
    await asyncio.wait_for(flush, 5)
    assert flush.exception() is None
    assert socket.ended
    await socket.send(text_data="nothing more")  # ended: not tried again
