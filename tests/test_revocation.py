"""Live streams end when the credential they were opened with stops being valid (issue 28,
item 4): the tab socket, the user socket and the API's events (by session or by token),
on sign-out, password change, deactivation, token revocation and tab deletion.

Each cause runs twice where it can: through the app's own path (its nudge must end the
streams: the periodic check is set to an hour) and behind the app's back (a queryset
update or raw SQL, no signal: the periodic check, set short, must end them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from channels.db import database_sync_to_async
from channels.layers import channel_layers, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed

from chat import bus, consumers, revocation
from chat.models import ApiToken, Tab
from chat.preferences import new_tab
from dispatch import settings as project_settings
from dispatch.asgi import router
from harness.login import cookie_header, session_for
from tests.live import make_tab, make_user, open_page, synced
from tests.procs import require_services, scratch_redis

pytestmark = [pytest.mark.django_db(transaction=True)]

# Far above what ending a stream takes; a stream that is not ended fails the test here.
END_TIMEOUT = 10.0
# Only a nudge can end a stream within END_TIMEOUT.
NUDGE_ONLY = 3600.0
# Behind the app's back: the periodic check ends it.
PERIODIC = 0.05

User = get_user_model()


@database_sync_to_async
def owner_with_tab() -> tuple[Any, Tab, str]:
    """A user with a password, a tab of theirs and a signed-in session's key."""
    user = User.objects.create_user("alice", password="a long enough password")
    return user, new_tab(user, "scripted/test"), session_for(user)


def headers(session: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"origin", b"http://127.0.0.1:8000"),
        (b"host", b"127.0.0.1:8000"),
        (b"cookie", cookie_header(session).encode()),
    ]


async def tab_socket(tab: Tab, session: str) -> WebsocketCommunicator:
    """The tab page's socket through the real stack, caught up (so it streams)."""
    socket = WebsocketCommunicator(router, f"/ws/tabs/{tab.pk}/", headers=headers(session))
    connected, _ = await socket.connect()
    assert connected
    await socket.send_to(text_data=json.dumps({"type": "hello", "last_seq": 0}))
    assert "data-state" in await socket.receive_from(timeout=END_TIMEOUT)
    return socket


async def user_socket(session: str) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(router, "/ws/user/", headers=headers(session))
    connected, _ = await socket.connect()
    assert connected
    return socket


async def closed_with(socket: WebsocketCommunicator) -> int:
    """The code the server closed the socket with (frames before it are skipped)."""
    try:
        while True:
            output = await socket.receive_output(timeout=END_TIMEOUT)
            if output["type"] == "websocket.close":
                return output["code"]
    finally:
        await socket.disconnect()


class Events:
    """GET /api/v1/tabs/<id>/events through Django's stack, read until it ends."""

    def __init__(self, tab: Tab, *, session: str = "", token: str = "") -> None:
        self.tab, self.session, self.token = tab, session, token
        self.stream: Any = None

    async def open(self) -> Events:
        def get() -> Any:
            client = Client()
            if self.session:
                client.cookies[django_settings.SESSION_COOKIE_NAME] = self.session
            auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            return client.get(f"/api/v1/tabs/{self.tab.pk}/events", headers=auth)

        response = await database_sync_to_async(get)()
        assert response.status_code == 200, response.content
        self.stream = aiter(response.streaming_content)
        await self.until("status")  # caught up: under watch, and streaming
        return self

    async def until(self, name: str) -> dict[str, Any]:
        while True:
            frame = (await asyncio.wait_for(anext(self.stream), END_TIMEOUT)).decode()
            for part in frame.split("\n\n"):
                fields = dict(line.split(": ", 1) for line in part.split("\n") if ": " in line)
                if fields.get("event") == name:
                    return json.loads(fields["data"])

    async def ended_with(self) -> str:
        """The reason of the stream's last event, `end`; nothing follows it."""
        end = await self.until("end")
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(self.stream), END_TIMEOUT)
        return end["reason"]


async def session_streams(tab: Tab, session: str) -> tuple[Any, Any, Events]:
    return (
        await tab_socket(tab, session),
        await user_socket(session),
        await Events(tab, session=session).open(),
    )


async def assert_signed_out(streams: tuple[Any, Any, Events], reason: str) -> None:
    tab_sock, user_sock, events = streams
    assert await closed_with(tab_sock) == consumers.CLOSE_SIGNED_OUT
    assert await closed_with(user_sock) == consumers.CLOSE_SIGNED_OUT
    assert await events.ended_with() == reason


def sign_out(session: str) -> None:
    """The sign-out button's request, in that session."""
    client = Client()
    client.cookies[django_settings.SESSION_COOKIE_NAME] = session
    assert client.post("/logout/").status_code == 302


def raw_sql(sql: str, *params: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


# --- Sessions: sign-out, password change, deactivation ------------------------------------


@pytest.mark.asyncio
async def test_signing_out_ends_the_sessions_sockets_and_events(settings):
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY
    await sign_out_ends_the_streams()


async def sign_out_ends_the_streams() -> None:
    user, tab, session = await owner_with_tab()
    streams = await session_streams(tab, session)

    await database_sync_to_async(sign_out)(session)
    await assert_signed_out(streams, "signed_out")


@pytest.mark.parametrize("how", ["sign-out", "admin", "clearsessions"])
def test_the_nudge_leaves_once_the_session_is_gone(monkeypatch, how):
    """A process that checks when the nudge arrives must find the session deleted:
    Django sends user_logged_out before it deletes the session, so that signal's nudge
    raced the deletion across processes (the check found the session still valid)."""
    user = User.objects.create_user("bob", password="a long enough password")
    session = session_for(user)
    seen: list[tuple[int, bool]] = []
    monkeypatch.setattr(
        revocation,
        "_send_nudge",
        lambda user_id: seen.append((user_id, Session.objects.filter(pk=session).exists())),
    )
    if how == "sign-out":
        sign_out(session)
    elif how == "admin":
        Session.objects.get(pk=session).delete()
    else:
        Session.objects.filter(pk=session).update(expire_date=timezone.now())
        call_command("clearsessions")
    assert seen == [(user.pk, False)]


@pytest.mark.asyncio
async def test_a_session_deleted_behind_the_apps_back_ends_its_streams(settings):
    settings.STREAM_RECHECK_SECONDS = PERIODIC
    user, tab, session = await owner_with_tab()
    streams = await session_streams(tab, session)
    await database_sync_to_async(raw_sql)(
        f"DELETE FROM {Session._meta.db_table} WHERE session_key = %s", session
    )
    await assert_signed_out(streams, "signed_out")


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["save", "behind the app's back"])
async def test_a_password_change_ends_the_sessions_streams(settings, path):
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY if path == "save" else PERIODIC
    user, tab, session = await owner_with_tab()
    streams = await session_streams(tab, session)

    def change() -> None:
        # What `manage.py changepassword` and the admin's form do: set_password, save.
        user.set_password("another long enough password")
        if path == "save":
            user.save()
        else:
            User.objects.filter(pk=user.pk).update(password=user.password)

    await database_sync_to_async(change)()
    await assert_signed_out(streams, "password_changed")


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["save", "behind the app's back"])
async def test_deactivating_the_user_ends_the_sessions_streams(settings, path):
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY if path == "save" else PERIODIC
    user, tab, session = await owner_with_tab()
    streams = await session_streams(tab, session)

    def deactivate() -> None:
        if path == "save":  # the admin's change form
            user.is_active = False
            user.save()
        else:
            User.objects.filter(pk=user.pk).update(is_active=False)

    await database_sync_to_async(deactivate)()
    await assert_signed_out(streams, "deactivated")


# --- Tokens -------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["revoke page", "behind the app's back"])
async def test_revoking_a_token_ends_its_events(settings, path):
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY if path == "revoke page" else PERIODIC
    user, tab, session = await owner_with_tab()
    row, token = await database_sync_to_async(ApiToken.issue)(user, name="cli")
    events = await Events(tab, token=token).open()
    # Another token's stream of the same user goes on.
    _, other_token = await database_sync_to_async(ApiToken.issue)(user, name="other")
    other = await Events(tab, token=other_token).open()

    def revoke() -> None:
        if path == "revoke page":
            client = Client()
            client.cookies[django_settings.SESSION_COOKIE_NAME] = session
            assert client.post(f"/account/tokens/{row.pk}/revoke/").status_code == 302
        else:
            raw_sql(f"DELETE FROM {ApiToken._meta.db_table} WHERE id = %s", row.pk)

    await database_sync_to_async(revoke)()
    assert await events.ended_with() == "token_revoked"
    # The check that ended it covered the other token's stream too, which goes on.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(other.until("end"), 0.3)


@pytest.mark.asyncio
async def test_deactivating_the_user_ends_their_token_events(settings):
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY
    user, tab, _ = await owner_with_tab()
    _, token = await database_sync_to_async(ApiToken.issue)(user, name="cli")
    events = await Events(tab, token=token).open()
    user.is_active = False
    await database_sync_to_async(user.save)()
    assert await events.ended_with() == "deactivated"


# --- Tabs ---------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["delete page", "behind the app's back"])
async def test_deleting_a_tab_ends_its_socket_and_events_not_the_user_socket(settings, path):
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY if path == "delete page" else PERIODIC
    user, tab, session = await owner_with_tab()
    _, token = await database_sync_to_async(ApiToken.issue)(user, name="cli")
    tab_sock = await tab_socket(tab, session)
    user_sock = await user_socket(session)
    events = await Events(tab, token=token).open()

    def delete() -> None:
        if path == "delete page":
            client = Client()
            client.cookies[django_settings.SESSION_COOKIE_NAME] = session
            assert client.post(f"/t/{tab.pk}/delete/").status_code == 302
        else:
            raw_sql(f"DELETE FROM {Tab._meta.db_table} WHERE id = %s", tab.pk.hex)

    await database_sync_to_async(delete)()
    assert await closed_with(tab_sock) == consumers.CLOSE_TAB_GONE
    assert await events.ended_with() == "tab_deleted"
    # The sidebar's socket is the user's, not the tab's: it stays.
    assert await user_sock.receive_nothing(timeout=0.2)
    await user_sock.disconnect()


@pytest.mark.asyncio
async def test_giving_a_tab_to_another_account_ends_the_old_owners_streams(settings):
    """The admin can change a tab's owner: what its old owner had open stops there."""
    settings.STREAM_RECHECK_SECONDS = PERIODIC
    user, tab, session = await owner_with_tab()
    tab_sock, events = await tab_socket(tab, session), await Events(tab, session=session).open()
    other = await database_sync_to_async(User.objects.create_user)("other")
    await Tab.objects.filter(pk=tab.pk).aupdate(owner=other)
    assert await closed_with(tab_sock) == consumers.CLOSE_FORBIDDEN
    assert await events.ended_with() == "tab_not_yours"


# --- The check ----------------------------------------------------------------------------


def test_one_check_costs_the_same_queries_for_one_stream_or_a_hundred(
    django_assert_num_queries,
):
    """Batched: four queries (sessions, users, tokens, tabs) whatever the number."""
    users = [User.objects.create_user(f"u{i}") for i in range(10)]
    tabs = [new_tab(users[i % 10], "scripted/test") for i in range(100)]
    tokens = [ApiToken.issue(users[i % 10])[0] for i in range(50)]
    sessions = [Session.objects.get(pk=session_for(u)) for u in users]

    def credentials(count: int) -> list[revocation.Credential]:
        out = []
        for i in range(count):
            user = users[i % 10]
            if i % 2:
                out.append(revocation.Credential.of_token(tokens[i % 50], tabs[i].pk))
            else:
                out.append(revocation.Credential.of_session(sessions[i % 10], user, tabs[i].pk))
        return out

    for count in (2, 100):
        with django_assert_num_queries(4):
            assert revocation.check(credentials(count)) == [None] * count


def test_signing_in_elsewhere_and_other_users_changes_end_nothing():
    user = User.objects.create_user("bob", password="a long enough password")
    other = User.objects.create_user("carol", password="a long enough password")
    session = Session.objects.get(pk=session_for(user))
    credential = revocation.Credential.of_session(session, user)
    # A second sign-in saves last_login (and may rehash the password) of the same user.
    signed_in = Client().post("/login/", {"username": "bob", "password": "a long enough password"})
    assert signed_in.status_code == 302
    other.set_password("changed")
    other.is_active = False
    other.save()
    user.refresh_from_db()
    assert user.password == credential.password
    assert revocation.check([credential]) == [None]


# --- Scaled mode: the Redis channel layer --------------------------------------------------


@contextlib.asynccontextmanager
async def redis_layer(settings: Any) -> AsyncIterator[str]:
    """This process on the Redis channel layer of a scratch Redis database (its URL)."""
    require_services()
    with scratch_redis() as url:
        settings.CHANNEL_LAYERS = project_settings.redis_channel_layers(url)
        channel_layers.backends.clear()
        try:
            yield url
        finally:
            await get_channel_layer().close_pools()
            await get_channel_layer(bus.BROADCAST).flush()
            channel_layers.backends.clear()


@pytest.mark.scaled
@pytest.mark.asyncio
async def test_the_nudge_travels_through_the_redis_layer(settings):
    """Every stream of the sign-out test, with the nudge going through Redis."""
    settings.STREAM_RECHECK_SECONDS = NUDGE_ONLY
    async with redis_layer(settings):
        await sign_out_ends_the_streams()


@pytest.mark.scaled
@pytest.mark.asyncio
async def test_a_sign_out_in_one_process_ends_a_socket_in_another_at_once(settings, serve):
    """Scaled mode across processes: the socket is on a server process (its periodic check
    set to an hour), the sign-out happens in this one, as on another web process."""
    async with redis_layer(settings) as url:
        server = await serve(REDIS_URL=url, DISPATCH_STREAM_RECHECK_SECONDS=str(NUDGE_ONLY))
        user, tab, session = await owner_with_tab()
        socket = await websockets.connect(
            f"ws://{server.url.split('://', 1)[1]}/ws/tabs/{tab.pk}/",
            additional_headers={"Cookie": cookie_header(session), "Origin": server.url},
        )
        await socket.send(json.dumps({"type": "hello", "last_seq": 0}))
        assert "data-state" in await asyncio.wait_for(socket.recv(), END_TIMEOUT)
        await database_sync_to_async(sign_out)(session)
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(socket.recv(), END_TIMEOUT)
        assert socket.close_code == consumers.CLOSE_SIGNED_OUT


# --- The page -------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.asyncio(loop_scope="session")
async def test_pages_go_to_sign_in_when_signed_out_and_say_when_their_tab_is_deleted(
    browser, serve
):
    """Signed out in one page: the others (a tab page, a page with the sidebar only) go
    to the sign-in page, no reconnect loop; a deleted tab's page says so and stays."""
    # The deletion below is behind the server's back: a short check finds it.
    server = await serve(DISPATCH_STREAM_RECHECK_SECONDS="0.2")
    user = await database_sync_to_async(make_user)()
    doomed = await database_sync_to_async(make_tab)(user)
    kept = await database_sync_to_async(make_tab)(user)
    session = await database_sync_to_async(session_for)(user)
    doomed_page = (await open_page(browser, server, f"/t/{doomed.pk}/", session=session)).page
    await synced(doomed_page)
    context = doomed_page.context
    tab_page, wakes_page, sign_out_page = [await context.new_page() for _ in range(3)]
    await tab_page.goto(f"{server.url}/t/{kept.pk}/")
    await wakes_page.goto(f"{server.url}/wakes/")
    await sign_out_page.goto(f"{server.url}/wakes/")
    for page in (tab_page, wakes_page):
        await page.wait_for_function("window.__e2e.connects === 1")

    # This process has no channel layer in common with the embedded server.
    await database_sync_to_async(Tab.objects.filter(pk=doomed.pk).delete)()
    await doomed_page.wait_for_selector("#conn[data-state=gone]:has-text('This tab was deleted.')")
    assert await doomed_page.locator("#conn .conn-reload").is_hidden()

    await sign_out_page.click("button[title^='Log out']")
    await tab_page.wait_for_url(re.compile(rf"/login/\?next=/t/{kept.pk}/$"))
    await wakes_page.wait_for_url(re.compile(r"/login/\?next=/wakes/$"))
    assert await doomed_page.evaluate("window.__e2e.connects") == 1
