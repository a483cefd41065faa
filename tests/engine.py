"""Helpers to run turns in a test: an in-process worker and a watcher on the tab's group."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model

from chat import bus, log, turns, worker
from chat.models import Chunk, Setting, Tab
from chat.preferences import new_tab
from chat.tools.workdir import user_workspace

# Long enough for any scripted turn here, short enough that a hang fails fast.
TURN_TIMEOUT = 30.0


@contextlib.asynccontextmanager
async def running_worker(count: int = 1):
    """`count` turn workers in this event loop."""
    tasks = [asyncio.create_task(worker.run_worker()) for _ in range(count)]
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Watcher:
    """Collects every op sent to a tab's group."""

    def __init__(self, tab_id: uuid.UUID) -> None:
        self.tab_id = tab_id
        self.ops: list[dict[str, Any]] = []

    async def __aenter__(self) -> Watcher:
        self.layer = get_channel_layer()
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(bus.tab_group(self.tab_id), self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.layer.group_discard(bus.tab_group(self.tab_id), self.channel)

    async def next(self, timeout: float = TURN_TIMEOUT) -> dict[str, Any]:
        message = await asyncio.wait_for(self.layer.receive(self.channel), timeout)
        self.ops.append(message)
        return message

    async def until(self, predicate, timeout: float = TURN_TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                message = await self.next()
                if predicate(message):
                    return message

    async def until_idle(self, timeout: float = TURN_TIMEOUT) -> dict[str, Any]:
        return await self.until(
            lambda m: m["op"] == "status" and m["status"]["state"] == "idle", timeout
        )


@database_sync_to_async
def make_tab(model: str = "scripted/test", *, approve_tools: bool = False) -> Tab:
    owner, _ = get_user_model().objects.get_or_create(username="owner")
    Setting.objects.update_or_create(key="approve_tools", defaults={"value": approve_tools})
    return new_tab(owner, model)


def owner_workspace(settings: Any, top: Path) -> Path:
    """With DISPATCH_WORKSPACE at `top`: the workspace of make_tab's owner, where its
    tabs' tools work (made now, with the owner)."""
    settings.DISPATCH_WORKSPACE = top
    owner, _ = get_user_model().objects.get_or_create(username="owner")
    return user_workspace(owner.pk)


@database_sync_to_async
def submit(tab: Tab, text: str, **kwargs) -> int:
    return turns.submit(tab, text, **kwargs).pk


@database_sync_to_async
def chunks(tab_id: uuid.UUID) -> list[Chunk]:
    return log.tail(tab_id)


def kinds(rows: list[Chunk]) -> list[str]:
    """`role/type` of each chunk, the shape most assertions compare."""
    return [f"{c.role}/{c.type}" for c in rows]
