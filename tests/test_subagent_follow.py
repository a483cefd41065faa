"""A parent following its child (chat.turn.agents.wait) when the child's ops and the
snapshot it asked for travel on two channel layers (the scaled mode's pub/sub and
queues): the order they arrive in is not the order they were sent in."""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import channel_layers, get_channel_layer

from chat import bus
from chat.models import QueuedMessage
from chat.turn import agents
from tests.engine import make_tab

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def two_layers(settings):
    queues = {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 100}}
    settings.CHANNEL_LAYERS = {"default": queues, bus.BROADCAST: queues}
    channel_layers.backends.clear()
    yield get_channel_layer(), get_channel_layer(bus.BROADCAST)
    channel_layers.backends.clear()


def _status(call_id: str) -> dict:
    return {"state": "waiting", "step": 1, "approval": {"call_id": call_id, "name": "shell"}}


async def test_a_snapshot_that_comes_after_a_newer_status_is_not_shown(two_layers):
    queues, broadcast = two_layers
    child = await make_tab()
    # Queued for the call: the database says the child's turn has not ended.
    await QueuedMessage.objects.acreate(tab=child, text="work", origin={"call_id": "c1"})
    worker = await queues.new_channel()
    await queues.group_add(bus.control_group(child.pk), worker)
    seen: list[dict] = []

    async def on_status(live: dict) -> None:
        seen.append(live)

    stop = asyncio.Event()
    following = asyncio.create_task(
        agents.wait(child.pk, "c1", on_status, timeout=60, cancelled=stop)
    )
    asked = await asyncio.wait_for(queues.receive(worker), 5)
    assert asked["type"] == "turn.snapshot"
    # The runner answered with approval "old", then its approval changed to "new"; the
    # change's op overtakes the answer.
    group = bus.tab_group(child.pk)
    await broadcast.group_send(group, {"type": "tab.op", "op": "status", "status": _status("new")})
    await asyncio.sleep(0.05)
    reply = {"type": "tab.snapshot", "tab_id": str(child.pk), "status": _status("old")}
    await queues.send(asked["reply_to"], reply)
    await asyncio.sleep(0.1)
    stop.set()
    _, why = await following
    assert why == agents.STOPPED
    approvals = [live["approval"]["call_id"] for live in seen if live.get("approval")]
    assert approvals == ["new"], seen
