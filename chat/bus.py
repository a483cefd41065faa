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
thread); async code awaits the channel layer itself.
"""

from __future__ import annotations

import uuid
from contextlib import suppress
from typing import Any

from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer

WORKER_CHANNEL = "dispatch-turns"


def tab_group(tab_id: uuid.UUID | str) -> str:
    return f"tab.{tab_id}"


def control_group(tab_id: uuid.UUID | str) -> str:
    return f"tabctl.{tab_id}"


def user_group(user_id: int | str) -> str:
    return f"user.{user_id}"


def access_group(user_id: int | str) -> str:
    return f"access.{user_id}"


def send(channel: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().send)(channel, message)


def group_send(group: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().group_send)(group, message)


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
