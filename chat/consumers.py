"""TabSocket: one per open tab page, streaming the tab's ops to it as htmx fragments;
UserSocket: one per other page with the sidebar (home, Wakes, settings...).

Both carry the user channel (chat.sidebar): the process subscribes once per user to
their group (a chat.bus.Hub) and hands each change, its sidebar entry, to every page of
theirs it serves, so a tab page needs no second socket. A tab's ops come the same way,
through the tab's hub (chat.follow), never through a channel of the socket's own. The
tab's sync itself (catch-up, snapshot, gap checks) is chat.follow's Follower, shared with
the API's server-sent events.

A socket is under chat.revocation's watch from connect on: when the session it was opened
in ends (signed out, password changed, user deactivated) or its tab is deleted, it closes
with a code that tells the page why.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from autobahn.exception import Disconnected
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from chat import bus, revocation, sidebar
from chat.follow import Follower, HtmlRenderer
from chat.models import Tab

# Close codes the page can tell apart from a network drop. A refused socket is accepted
# and then closed with its code: refused at the handshake, the page would see only 1006,
# which the ws extension retries for ever (a signed-out page reconnecting every 5 s).
# Not the user's tab, or no such tab: nothing to reconnect to.
CLOSE_FORBIDDEN = 4403
CLOSE_RESYNC = 4409
# No session, or the socket's session ended (signed out, password changed, user
# deactivated): the page reloads, and the sign-in page is where that leads.
CLOSE_SIGNED_OUT = 4401
# An open socket's tab was deleted.
CLOSE_TAB_GONE = 4404
# Sidebar entries reach a page at most this often, as one frame holding each changed tab's
# latest entry: a user whose hundred tabs start turns together, with as many pages open,
# would otherwise cost ten thousand frames.
SIDEBAR_BATCH_SECONDS = 0.2


class UserSocket(AsyncWebsocketConsumer):
    """The user channel of one page: its sidebar's entries, live."""

    hub: bus.Hub | None = None
    # The tab the page shows (its sidebar entry is marked current).
    current: uuid.UUID | None = None
    # Entries waiting for the next batch, by tab (the latest wins), and its timer.
    batch: dict[str, str] | None = None
    flush: asyncio.Task[None] | None = None
    # Under chat.revocation's watch, until the credential ends (then `ended`).
    watched: revocation.Stream | None = None
    ended = False

    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            await self.refuse(CLOSE_SIGNED_OUT)
            return
        await self.watch(None)
        await self.join_user()
        await self.accept()

    async def refuse(self, code: int) -> None:
        self.ended = True
        await self.accept()
        await self.close(code=code)

    async def watch(self, tab_id: uuid.UUID | None) -> None:
        credential = revocation.Credential.of_session(
            self.scope.get("session"), self.scope["user"], tab_id
        )
        self.watched = await revocation.watch(credential, self.revoked)

    async def revoked(self, ended: revocation.Ended) -> None:
        """The credential ended: nothing more is sent, and the close says why."""
        self.ended = True
        codes = {revocation.TAB_DELETED: CLOSE_TAB_GONE, revocation.TAB_NOT_YOURS: CLOSE_FORBIDDEN}
        await self.close(code=codes.get(ended, CLOSE_SIGNED_OUT))

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        # A frame already on its way when the credential ended (a catch-up, a batch).
        if self.ended:
            return
        try:
            await super().send(text_data, bytes_data, close)
        except Disconnected:
            # The page went away before its disconnect reached this consumer: a sidebar
            # batch's task failed with nobody to tell, and an op's fan-out logged it.
            self.ended = True

    async def join_user(self) -> None:
        # Joined before the page's sidebar hello is read: a change from here on is sent.
        group = bus.user_group(self.scope["user"].pk)
        self.hub = await bus.Hub.join(bus.layer_for(group), group, self)

    async def leave_user(self) -> None:
        hub, self.hub = self.hub, None
        if hub is not None:
            await hub.leave(self)

    async def disconnect(self, code: int) -> None:
        # Out of the hub first: a change taken while this awaits would start a batch
        # that sends on the closed socket.
        await self.leave_user()
        if self.flush is not None:
            self.flush.cancel()
        if self.watched is not None:
            await revocation.unwatch(self.watched)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        message = _json(text_data)
        if message is not None and message.get("type") == "sidebar":
            await self.sidebar_hello(message)

    async def sidebar_hello(self, message: dict[str, Any]) -> None:
        """The page's list as it holds it ({tab id: state}): the entries that differ
        from the database's, changed while this socket was not connected."""
        if self.current is None:
            self.current = _uuid(message.get("current"))
        held = sidebar.held(message.get("held"))
        catch_up = database_sync_to_async(sidebar.catch_up)
        frames = await catch_up(self.scope["user"], held, self.current)
        if frames:
            await self.send(text_data="".join(frames))

    async def take(self, message: dict[str, Any]) -> None:
        """A change from the hub, rendered once by the worker that announced it
        (chat.sidebar.with_entries): no query here, however many pages are open."""
        if message.get("type") != "user.tab":
            return
        # Any version of the page's conversation (chat.sidebar.with_entries).
        shown = message.get("versions") or [message["tab_id"]]
        mine = self.current is not None and str(self.current) in shown
        if self.batch is None:
            self.batch = {}
        # Moved to the end: an entry new to the page goes on top after the older ones.
        self.batch.pop(message["tab_id"], None)
        self.batch[message["tab_id"]] = message["entries"]["current" if mine else "other"]
        if self.flush is None:
            self.flush = asyncio.create_task(self.send_batch())

    async def send_batch(self) -> None:
        await asyncio.sleep(SIDEBAR_BATCH_SECONDS)
        entries, self.batch, self.flush = self.batch or {}, None, None
        await self.send(text_data="".join(entries.values()))


def _json(text_data: str | None) -> dict[str, Any] | None:
    try:
        message = json.loads(text_data or "")
    except json.JSONDecodeError:
        return None
    return message if isinstance(message, dict) else None


def _uuid(value: Any) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


class TabSocket(UserSocket):
    """Streams a tab's ops to one page, with no gap and no duplicate (ARCHITECTURE.md,
    One turn), and the user channel."""

    follower: Follower | None = None

    async def connect(self) -> None:
        user = self.scope["user"]
        tab_id = self.scope["url_route"]["kwargs"]["tab_id"]
        if not user.is_authenticated:
            await self.refuse(CLOSE_SIGNED_OUT)
            return
        if not await Tab.objects.filter(pk=tab_id, owner=user).aexists():
            await self.refuse(CLOSE_FORBIDDEN)
            return
        await self.watch(tab_id)
        self.current = tab_id
        self.follower = Follower(
            tab_id, self.channel_layer, self.channel_name, HtmlRenderer(), self._send, self._resync
        )
        # Join before reading anything: ops from here on are buffered, not lost.
        await self.follower.join()
        await self.join_user()
        await self.accept()

    async def _send(self, frame: str) -> None:
        # A frame shared by the process's pages (chat.follow.Frame) is encoded once.
        await self.send(text_data=frame)

    async def _resync(self) -> None:
        # The page reconnects by itself and starts over with a hello; the ops the feed
        # hands this socket until its disconnect are not sent on the closing socket.
        self.ended = True
        await self.close(code=CLOSE_RESYNC)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels closes stale database connections before every handler, a
        # thread-pool hop per message. The follower's messages (its snapshot's answer)
        # skip the hop; its catch-up, which reads the database, closes them itself.
        if message["type"] in ("tab.snapshot", "tab.snapshot_timeout"):
            if self.follower is not None:
                await self.follower.on_message(message)
        else:
            await super().dispatch(message)

    async def disconnect(self, code: int) -> None:
        if self.follower is not None:
            await self.follower.leave()
        await super().disconnect(code)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        message = _json(text_data)
        if message is None:
            return
        if message.get("type") == "sidebar":
            await self.sidebar_hello(message)
            return
        if message.get("type") != "hello":
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
