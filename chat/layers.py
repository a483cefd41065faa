"""The embedded channel layer: Channels' in-memory layer, with its expiry sweep bounded
and channels that a process-level hub (chat.bus.Hub) listens to attached.

The stock layer sweeps every channel and group for expired messages on every
send and receive: O(channels) per message, which dominated the server's CPU at
100 streaming tabs. Messages expire after a minute, so sweeping once a second
changes nothing a user can see.

An attached channel's messages are handed to its hub as a call: no deep copy, no queue,
no task and no receive loop, so an op reaches a page as it would with no channel layer
(one process is all there is in embedded mode). Its hub gets each message in the order
it was sent and, like a full queue, must not block the sender for long.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from channels.exceptions import ChannelFull
from channels.layers import InMemoryChannelLayer

# Expiry is measured in tens of seconds; a sweep per second is plenty.
SWEEP_INTERVAL = 1.0

Take = Callable[[dict[str, Any]], Awaitable[None]]


class EmbeddedChannelLayer(InMemoryChannelLayer):
    _last_sweep = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attached: dict[str, Take] = {}

    def attach(self, channel: str, take: Take) -> None:
        """Messages to `channel` are calls to `take` from now on."""
        self.attached[channel] = take

    def detach(self, channel: str) -> None:
        self.attached.pop(channel, None)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        take = self.attached.get(channel)
        if take is None:
            await super().send(channel, message)
        else:
            await take(message)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        # One member after the other, in this task: the stock layer makes a task per member.
        self.require_valid_group_name(group)
        self._clean_expired()
        for channel in list(self.groups.get(group, ())):
            take = self.attached.get(channel)
            if take is not None:
                await take(message)
                continue
            with suppress(ChannelFull):
                await super().send(channel, message)

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < SWEEP_INTERVAL:
            return
        self._last_sweep = now
        super()._clean_expired()
