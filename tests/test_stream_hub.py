"""A tab's ops reach a process's pages through one subscription (chat.follow's feed, a
chat.bus.Hub): rendered and encoded once per process, with no channel-layer hop in
embedded mode and one channel-layer message per op per process on a layer of queues."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer, channel_layers, get_channel_layer

from chat import bus, follow, log, render
from chat.stream import Block
from tests.engine import make_tab
from tests.test_socket import FRAME_TIMEOUT, open_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PAGES = 3


@pytest.fixture
def queued_layer(settings):
    """Channels' in-memory layer: every channel a queue, as on Redis."""
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 100}}
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def _ops(tab_id) -> list[dict]:
    """A turn's ops as a runner publishes them: open, two deltas, the seal."""
    turn = uuid.uuid4()
    block = Block(uuid.uuid4(), turn, 1, "assistant", "text", {"text": ""})
    opened = {"op": "open", "block": block.to_dict()}
    deltas = [
        {"op": "delta", "chunk_id": str(block.id), "offset": 0, "text": "Hello "},
        {"op": "delta", "chunk_id": str(block.id), "offset": 6, "text": "**world**"},
    ]
    block = Block(block.id, turn, 1, "assistant", "text", {"text": "Hello **world**"})
    log.append(tab_id, [block])
    return [opened, *deltas, {"op": "seal", "block": block.to_dict()}]


async def _pages(tab):
    owner = await database_sync_to_async(lambda: tab.owner)()
    sockets = [await open_socket(tab.pk, owner) for _ in range(PAGES)]
    for socket in sockets:
        await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
        assert 'id="status"' in await socket.receive_from(FRAME_TIMEOUT)
    return sockets


async def _stream(tab, sockets) -> list[list[str]]:
    """Publish the ops as the worker does; each page's frames."""
    ops = await database_sync_to_async(_ops)(tab.pk)
    group = bus.tab_group(tab.pk)
    for op in ops:
        await bus.layer_for(group).group_send(group, {"type": "tab.op", **op})
    frames = [[await s.receive_from(FRAME_TIMEOUT) for _ in ops] for s in sockets]
    for socket in sockets:
        assert await socket.receive_nothing(0.1)
        await socket.disconnect()
    return frames


def _count(monkeypatch, module, name: str) -> list[int]:
    calls = [0]
    real = getattr(module, name)

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


async def test_embedded_pages_get_each_op_rendered_once_with_no_channel_layer_hop(monkeypatch):
    tab = await make_tab()
    sockets = await _pages(tab)
    queued: list[str] = []
    real_send = InMemoryChannelLayer.send

    async def send(self, channel, message):
        queued.append(message["type"])
        await real_send(self, channel, message)

    monkeypatch.setattr(InMemoryChannelLayer, "send", send)
    opens = _count(monkeypatch, render, "fragment_open")
    seals = _count(monkeypatch, render, "fragment_seal")
    lives = _count(monkeypatch, render, "fragment_live")
    frames = await _stream(tab, sockets)
    assert "tab.op" not in queued
    assert (opens[0], lives[0], seals[0]) == (1, 2, 1)
    assert frames[0] == frames[1] == frames[2]
    # One encoding for every page: the frame the server encodes is the feed's.
    assert all(isinstance(frame, follow.Frame) for frame in frames[0])


async def test_on_a_layer_of_queues_a_process_gets_one_message_per_op(queued_layer, monkeypatch):
    tab = await make_tab()
    sockets = await _pages(tab)
    sent: list[str] = []
    real_send = InMemoryChannelLayer.send

    async def send(self, channel, message):
        if message["type"] == "tab.op":
            sent.append(channel)
        await real_send(self, channel, message)

    monkeypatch.setattr(InMemoryChannelLayer, "send", send)
    opens = _count(monkeypatch, render, "fragment_open")
    frames = await _stream(tab, sockets)
    assert len(sent) == 4 and len(set(sent)) == 1
    assert opens[0] == 1
    assert frames[0] == frames[1] == frames[2]


@pytest.fixture
def broadcast_layer(settings):
    """Queues on both layers, as the scaled mode's (pub/sub for the broadcast groups)."""
    queues = {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 100}}
    settings.CHANNEL_LAYERS = {"default": queues, bus.BROADCAST: queues}
    channel_layers.backends.clear()
    yield get_channel_layer(bus.BROADCAST)
    channel_layers.backends.clear()


async def test_with_a_broadcast_layer_a_tabs_ops_and_sidebar_go_over_it(broadcast_layer):
    """Pages hear the tab's group and their user's on the broadcast layer; the workers'
    channel and a tab's control group stay on the default layer's queues."""
    default = get_channel_layer()
    assert broadcast_layer is not default
    for group in (bus.tab_group(uuid.uuid4()), bus.user_group(1), bus.access_group(1)):
        assert bus.layer_for(group) is broadcast_layer
    assert bus.layer_for(bus.control_group(uuid.uuid4())) is default
    tab = await make_tab()
    sockets = await _pages(tab)
    assert bus.tab_group(tab.pk) in broadcast_layer.groups
    assert bus.user_group(tab.owner_id) in broadcast_layer.groups
    assert not any(g.startswith(bus.BROADCAST_GROUPS) for g in default.groups)
    frames = await _stream(tab, sockets)
    assert frames[0] == frames[1] == frames[2] and len(frames[0]) == 4


async def test_only_an_in_process_layer_knows_that_nobody_listens():
    class Remote:
        groups: dict = {}  # a pub/sub layer's groups are this process's subscriptions

    assert bus.listened(Remote(), "user.1")
    local = InMemoryChannelLayer()
    assert not bus.listened(local, "user.1")
    local.groups["user.1"] = {"specific.x": 0}
    assert bus.listened(local, "user.1")


async def test_a_page_that_joined_mid_block_renders_its_own_frames_until_the_seal():
    """Its renderer has not seen the block's open: the feed's frames are not its frames
    until the seal, after which both have seen the same."""
    tab = await make_tab()
    ops = await database_sync_to_async(_ops)(tab.pk)
    feed = follow._Feed((None, None, "x"), _NoLayer(), "x")
    feed.ready.cancel()
    renderer = follow.HtmlRenderer()
    follower = follow.Follower(tab.pk, None, "", renderer, _discard, _discard)
    feed.members.add(follower)
    follower.synced = True
    shared = [feed._render({"type": "tab.op", **op}) for op in ops]
    # The page joined after the open: it gets the open block from a snapshot.
    opened = Block.from_dict(ops[0]["block"])
    follower.open_id, follower.open_len = str(opened.id), 0
    renderer.open(opened)
    assert follower._frame(ops[1], shared[1]) is not shared[1].frame
    assert follower._frame(ops[3], shared[3]) is not shared[3].frame
    follower.sent_seq = 0
    assert renderer.state() == shared[3].after


class _NoLayer:
    pass


async def _discard(*args) -> None:
    pass


async def test_a_hub_whose_layer_fails_to_receive_keeps_listening(queued_layer, monkeypatch):
    """A receive that raises (Redis restarting) is retried: the watchers keep getting the
    group's messages instead of nothing until the last one leaves."""
    monkeypatch.setattr(bus, "RECEIVE_RETRY_SECONDS", 0.01)
    layer = get_channel_layer()
    real = layer.receive
    failures = [ConnectionError("redis went away")]

    async def flaky(channel: str) -> dict:
        if failures:
            raise failures.pop()
        return await real(channel)

    monkeypatch.setattr(layer, "receive", flaky)
    got: list[dict] = []

    class Watcher:
        async def take(self, message: dict) -> None:
            got.append(message)

    watcher = Watcher()
    hub = await bus.Hub.join(layer, "tab.flaky", watcher)
    try:
        await layer.group_send("tab.flaky", {"type": "tab.op", "n": 1})
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.01)
        assert got == [{"type": "tab.op", "n": 1}] and not failures
    finally:
        await hub.leave(watcher)
