"""TabSocket: access, the fragments it sends, and the gapless reconnect protocol."""

from __future__ import annotations

import json
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from chat import agent, consumers, render, turns
from chat.models import RunningTurn
from chat.providers.base import Finish, TextDelta
from chat.providers.replay import ScriptedProvider
from chat.stream import Block
from dispatch.asgi import router
from tests.engine import Watcher, chunks, make_tab, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# Frames arrive within this when anything is streaming.
FRAME_TIMEOUT = 10


async def connect(tab_id, user, *, origin: str = "http://127.0.0.1:8000"):
    """A socket to the real ASGI stack (origin check, auth, routing) as `user`."""
    communicator = WebsocketCommunicator(
        router,
        f"/ws/tabs/{tab_id}/",
        headers=[(b"origin", origin.encode()), (b"host", b"127.0.0.1:8000")],
    )
    if user is not None:
        communicator.scope["user"] = user
    return communicator


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


@pytest.fixture
def script(monkeypatch):
    def install(*steps, delay: float = 0.0) -> ScriptedProvider:
        provider = ScriptedProvider(list(steps), delay=delay)

        async def provider_for(model: str):
            return provider

        monkeypatch.setattr(agent, "provider_for", provider_for)
        return provider

    return install


async def test_it_refuses_an_anonymous_socket():
    tab = await make_tab()
    communicator = await connect(tab.pk, None)
    connected, code = await communicator.connect()
    assert not connected
    await communicator.disconnect()


async def test_it_refuses_another_users_tab():
    tab = await make_tab()
    other = await database_sync_to_async(get_user_model().objects.create)(username="other")
    from channels.routing import URLRouter

    from chat.routing import websocket_urlpatterns

    communicator = WebsocketCommunicator(
        AsUser(URLRouter(websocket_urlpatterns), other), f"/ws/tabs/{tab.pk}/"
    )
    connected, code = await communicator.connect()
    assert not connected and code == consumers.CLOSE_FORBIDDEN
    await communicator.disconnect()


def _session_cookie(user) -> bytes:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


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
    assert catch_up == render.fragment_chunks(rows[1:])
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
    sealed_user = render.fragment_seal(Block.from_dict(_fields(rows[0])))
    assert sealed_user in frames
    assert render.fragment_seal(Block.from_dict(_fields(text))) in frames
    deltas = [f for f in frames if f.startswith(render.fragment_delta(text.id, "")[:30])]
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
        render, "fragment_open", lambda b: json.dumps({"open": str(b.id), "text": b.text})
    )
    monkeypatch.setattr(
        render, "fragment_delta", lambda i, t: json.dumps({"delta": str(i), "text": t})
    )
    monkeypatch.setattr(
        render,
        "fragment_seal",
        lambda b: json.dumps({"seal": str(b.id), "seq": b.seq, "text": b.text}),
    )
    monkeypatch.setattr(
        render,
        "fragment_chunks",
        lambda cs: json.dumps({"chunks": [{"seal": str(c.id), "seq": c.seq} for c in cs]}),
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
                    assert frame["open"] == chunk_id and page_had == "nothing open"
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
    """No runner answers the snapshot: the checkpoint in the database is sent after a timeout."""
    monkeypatch.setattr(consumers, "SNAPSHOT_TIMEOUT", 0.2)
    from django.utils import timezone

    tab = await make_tab()
    chunk_id = uuid.uuid4()
    await RunningTurn.objects.acreate(
        tab_id=tab.pk,
        turn_id=uuid.uuid4(),
        worker="gone:1:x",
        heartbeat_at=timezone.now(),
        open_chunk={
            "id": str(chunk_id),
            "turn_id": None,
            "step": 1,
            "role": "assistant",
            "type": "text",
            "data": {"text": "saved so far"},
            "seq": None,
        },
    )
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
    monkeypatch.setattr(consumers, "MAX_BUFFERED_OPS", 3)
    tab = await make_tab()
    owner = await database_sync_to_async(lambda: tab.owner)()
    socket = await open_socket(tab.pk, owner)
    layer = get_channel_layer()
    for n in range(5):
        await layer.group_send(
            turns.tab_group(tab.pk), {"type": "tab.op", "op": "queued", "id": n, "text": "x"}
        )
    output = await socket.receive_output(FRAME_TIMEOUT)
    assert output == {"type": "websocket.close", "code": consumers.CLOSE_RESYNC}
    await socket.disconnect()
