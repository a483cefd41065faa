"""The channel layer's names and the sync ways to reach them.

- `WORKER_CHANNEL`: "turn.start" — some worker should run this tab.
- `control_group(tab_id)`: "turn.cancel", "turn.approve", "turn.snapshot" — only
  the worker holding the tab's lease is in this group, wherever it runs.
- `tab_group(tab_id)`: "tab.op" — every op of the tab, for the sockets watching it.
- `user_group(user_id)`: "user.tab" — one of the user's tabs changed state (idle,
  running, waiting for approval) or appeared: every page of theirs updates its
  sidebar (chat.sidebar).
- `access_group(user_id)`: "access.check" — one of the user's credentials may have
  changed (signed out, token revoked, deactivated, tab deleted): every process with
  a live stream of theirs checks its streams now (chat.revocation).
- `WORKER_CHANNEL`: "wakes.changed" — a wake was added or changed: the worker that
  takes it looks at the wakes again now instead of at its next capped wake-up.

The sync helpers are for ORM code (views, commands, the lease's database
thread); async code awaits the channel layer itself, the one `layer_for` the group
names: in the scaled mode the tab, user and access groups, which every listener hears,
go over Redis's pub/sub (the settings' "broadcast" layer), the rest over the queues of
the default layer, which hand a message to one reader and keep it for a reader that is
busy. A reply to a channel (a snapshot's) goes over the layer the channel was made on.

A process listens to a group of many watchers (a tab's pages, a user's pages) once: a
`Hub` is its one member of the group, handing each message to every watcher it serves
here. On Redis that is one message per process, not one per socket; on the embedded
layer (chat.layers) the hub's channel is attached, so a message reaches it as a call,
with no queue, no copy and no task.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from contextlib import suppress
from typing import Any, Protocol

from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings

logger = logging.getLogger(__name__)

WORKER_CHANNEL = "dispatch-turns"
# A hub whose layer failed to receive (Redis restarting) tries again this much later.
RECEIVE_RETRY_SECONDS = 1.0


def tab_group(tab_id: uuid.UUID | str) -> str:
    return f"tab.{tab_id}"


def control_group(tab_id: uuid.UUID | str) -> str:
    return f"tabctl.{tab_id}"


def user_group(user_id: int | str) -> str:
    return f"user.{user_id}"


def access_group(user_id: int | str) -> str:
    return f"access.{user_id}"


# The channel layer (settings.CHANNEL_LAYERS) of the groups below, where there is one.
BROADCAST = "broadcast"
# Groups every listener of hears, none of which needs a message kept for it: a page that
# misses an op sees the gap and catches up from the log.
BROADCAST_GROUPS = ("tab.", "user.", "access.")


def layer_for(group: str) -> Any:
    """The channel layer that carries `group`'s messages (see the module's docstring)."""
    if group.startswith(BROADCAST_GROUPS) and BROADCAST in settings.CHANNEL_LAYERS:
        return get_channel_layer(BROADCAST)
    return get_channel_layer()


def listened(layer: Any, group: str) -> bool:
    """Whether anything may be listening to `group`: on the embedded layer, whether the
    group has a member (this process is all there is); on another, always (who listens on
    Redis is not known without asking it)."""
    if not isinstance(layer, InMemoryChannelLayer):
        return True
    return bool(layer.groups.get(group))


def send(channel: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().send)(channel, message)


def group_send(group: str, message: dict[str, Any]) -> None:
    async_to_sync(layer_for(group).group_send)(group, message)


def publish(tab_id: uuid.UUID | str, op: dict[str, Any]) -> None:
    """One op to every page watching the tab."""
    group_send(tab_group(tab_id), {"type": "tab.op", **op})


def request_run(tab_id: uuid.UUID | str, *, auto_approve: bool = False) -> None:
    """Ask the workers to run this tab's queued messages."""
    start: dict[str, Any] = {"type": "turn.start", "tab_id": str(tab_id)}
    if auto_approve:
        start["auto_approve"] = True
    send(WORKER_CHANNEL, start)


def wakes_changed() -> None:
    """Tell a worker's wake scheduler to look again (chat.wakes): one is enough, since
    any worker may fire any wake."""
    # A hint only: when the channel is full, the scheduler's capped sleep ends anyway.
    with suppress(ChannelFull):
        send(WORKER_CHANNEL, {"type": "wakes.changed"})


class Member(Protocol):
    def take(self, message: dict[str, Any]) -> Awaitable[None]: ...


class Hub:
    """This process's one subscription to a group, shared by every watcher of it here.

    `fan_out` hands a message to each member in turn, in the order messages come: a
    member must not block (one that needs the database buffers and works in a task of
    its own). Members must not change the message: they all get the same dict."""

    def __init__(self, key: tuple[Any, ...], layer: Any, group: str) -> None:
        self.key, self.layer, self.group = key, layer, group
        self.members: set[Any] = set()
        self.channel = ""
        self.listening: asyncio.Task[None] | None = None
        self.ready = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        self.channel = await self.layer.new_channel()
        attach = getattr(self.layer, "attach", None)
        if attach is not None:
            attach(self.channel, self.fan_out)
        else:
            self.listening = asyncio.create_task(self._listen())
        await self.layer.group_add(self.group, self.channel)

    async def _listen(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except Exception:
                # Redis gone for a moment: this process's watchers would hear nothing more
                # until the last one left. Their pages resync from the log when it is back.
                logger.exception("could not receive from %s; trying again", self.group)
                await asyncio.sleep(RECEIVE_RETRY_SECONDS)
                continue
            await self.fan_out(message)

    async def fan_out(self, message: dict[str, Any]) -> None:
        for member in list(self.members):
            try:
                await member.take(message)
            except Exception:
                # One watcher's failure (a socket gone mid-send) is not the others'.
                logger.exception("could not hand %s a message of %s", member, self.group)

    async def stop(self) -> None:
        await asyncio.wait([self.ready])
        if not self.channel:
            return  # it never started
        if self.listening is not None:
            self.listening.cancel()
        detach = getattr(self.layer, "detach", None)
        if detach is not None:
            detach(self.channel)
        await self.layer.group_discard(self.group, self.channel)

    @classmethod
    async def join(cls, layer: Any, group: str, member: Member) -> Hub:
        """The hub of `group` in this event loop and layer (made if there is none), with
        `member` in it, listening: messages sent to the group from now on reach it."""
        key = (asyncio.get_running_loop(), layer, group)
        hub = _hubs.get(key)
        if hub is None:
            hub = _hubs[key] = cls(key, layer, group)
        hub.members.add(member)
        try:
            await asyncio.shield(hub.ready)
        except Exception:
            await hub.leave(member)
            raise
        return hub

    async def leave(self, member: Member) -> None:
        """`member` gets no more messages; the last one out ends the subscription."""
        self.members.discard(member)
        if not self.members and _hubs.get(self.key) is self:
            del _hubs[self.key]
            await self.stop()


# By event loop, channel layer and group: a test's loop or layer never serves another's.
_hubs: dict[tuple[Any, ...], Hub] = {}
