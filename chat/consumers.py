"""TabSocket: one per open tab page, streaming the tab's ops to it as htmx fragments.

The sync itself (catch-up, snapshot, gap checks) is chat.follow's Follower,
shared with the API's server-sent events.
"""

from __future__ import annotations

import json
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

from chat import bus
from chat.follow import Follower, HtmlRenderer
from chat.models import Tab

# Close codes the page can tell apart from a network drop.
CLOSE_FORBIDDEN = 4403
CLOSE_RESYNC = 4409


class TabSocket(AsyncWebsocketConsumer):
    """Streams a tab's ops to one page, with no gap and no duplicate (DESIGN §5)."""

    follower: Follower | None = None

    async def connect(self) -> None:
        user = self.scope["user"]
        tab_id = self.scope["url_route"]["kwargs"]["tab_id"]
        if (
            not user.is_authenticated
            or not await Tab.objects.filter(pk=tab_id, owner=user).aexists()
        ):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.group = bus.tab_group(tab_id)
        self.follower = Follower(
            tab_id, self.channel_layer, self.channel_name, HtmlRenderer(), self._send, self._resync
        )
        # Join before reading anything: ops from here on are buffered, not lost.
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def _send(self, frame: str) -> None:
        await self.send(text_data=frame)

    async def _resync(self) -> None:
        # The page reconnects by itself and starts over with a hello.
        await self.close(code=CLOSE_RESYNC)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale database connections before every handler, a
        # thread-pool hop per message. Forwarding an op touches no database and
        # is nearly all of a socket's messages: the follower's messages skip the
        # hop; its catch-up, which reads the database, closes them itself.
        if message["type"] in ("tab.op", "tab.snapshot", "tab.snapshot_timeout"):
            if self.follower is not None:
                await self.follower.on_message(message)
        else:
            await super().dispatch(message)

    async def disconnect(self, code: int) -> None:
        if self.follower is not None:
            self.follower.stop()
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "")
        except json.JSONDecodeError:
            return
        if not isinstance(message, dict) or message.get("type") != "hello":
            return
        try:
            hello = {
                "last_seq": int(message.get("last_seq") or 0),
                "open_id": str(message.get("open_id") or "") or None,
                "open_len": int(message.get("open_len") or 0),
            }
        except (TypeError, ValueError):
            return
        if self.follower is not None:
            await self.follower.hello(hello)
