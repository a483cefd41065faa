"""The user channel (chat.sidebar): every page of a user learns when one of their tabs
starts or ends a turn, starts or stops waiting for approval, or appears (a wake's new
tab), as its sidebar entry; another user's pages learn nothing; a page load shows the
same marks; a page that reconnects is sent what changed meanwhile."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from chat import bus, consumers, sidebar, turns
from chat.models import RunningTurn, Wake
from chat.preferences import new_tab
from chat.providers.base import Finish, TextDelta, ToolCallEvent
from chat.providers.replay import ScriptedProvider
from chat.turn import lease, step
from dispatch.asgi import router
from harness.login import cookie_header, session_for
from tests.engine import TURN_TIMEOUT, Watcher, make_tab, running_worker, submit
from tests.test_socket import refused
from tests.ui_helpers import parse

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# Frames arrive within this when anything is running.
FRAME_TIMEOUT = 10
# How long a socket that must get nothing is listened to after the owner's frame came
# (the same group send delivered both, so nothing is on its way any more).
NOTHING_SECONDS = 0.3


@pytest.fixture(autouse=True)
def workspace(tmp_path, settings):
    settings.DISPATCH_WORKSPACE = tmp_path
    return tmp_path


def shell_then_text():
    return (
        [ToolCallEvent("c1", "shell", {"command": "echo hi"}), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )


class Routed:
    """Scripted providers by a request's first user message: a parent's and its child's
    stream at the same time, each from its own script."""

    def __init__(self) -> None:
        self.by_prompt: dict[str, ScriptedProvider] = {}

    def script(self, prompt: str, *steps) -> None:
        self.by_prompt[prompt] = ScriptedProvider(list(steps))

    async def provider_for(self, model: str):
        return self

    async def stream(self, request):
        async for event in self.by_prompt[request.messages[0].parts[-1].text].stream(request):
            yield event


class UserWatcher:
    """Every message sent to a user's group."""

    def __init__(self, user_id: int) -> None:
        self.group = bus.user_group(user_id)
        self.messages: list[dict[str, Any]] = []

    async def __aenter__(self) -> UserWatcher:
        self.layer = get_channel_layer()
        self.channel = await self.layer.new_channel()
        await self.layer.group_add(self.group, self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.layer.group_discard(self.group, self.channel)

    async def until(self, predicate) -> dict[str, Any]:
        async with asyncio.timeout(TURN_TIMEOUT):
            while True:
                message = await self.layer.receive(self.channel)
                self.messages.append(message)
                if predicate(message):
                    return message

    async def nothing(self) -> bool:
        try:
            async with asyncio.timeout(NOTHING_SECONDS):
                self.messages.append(await self.layer.receive(self.channel))
        except TimeoutError:
            return True
        return False


def states(messages: list[dict[str, Any]]) -> list[str]:
    return [m["state"] for m in messages]


@database_sync_to_async
def other_user():
    return get_user_model().objects.create(username="other")


@database_sync_to_async
def owner_of(tab):
    return tab.owner


async def socket(user, path: str = "/ws/user/") -> WebsocketCommunicator:
    """A socket through the real stack (origin check, session cookie, routing)."""
    cookie = await database_sync_to_async(lambda: cookie_header(session_for(user)))()
    communicator = WebsocketCommunicator(
        router,
        path,
        headers=[
            (b"origin", b"http://127.0.0.1:8000"),
            (b"host", b"127.0.0.1:8000"),
            (b"cookie", cookie.encode()),
        ],
    )
    connected, _ = await communicator.connect()
    assert connected
    return communicator


def entry(frame: str, tab_id) -> Any:
    """The sidebar entry of `tab_id` in a frame, and the frame's insert target."""
    doc = parse(frame)
    link = doc.by_id(f"tablink-{tab_id}")
    assert link is not None, frame
    return link


def wait_mark(link) -> Any:
    return next((n for n in link.iter() if "wait-mark" in n.classes), None)


async def test_a_tab_that_waits_for_approval_tells_its_owners_group_once_per_change(script):
    script(*shell_then_text())
    tab = await make_tab(approve_tools=True)
    other = await other_user()
    async with (
        running_worker(),
        Watcher(tab.pk) as watcher,
        UserWatcher(tab.owner_id) as mine,
        UserWatcher(other.pk) as theirs,
    ):
        await submit(tab, "run it")
        waiting = await mine.until(lambda m: m["state"] == "waiting")
        entries = waiting.pop("entries")
        assert waiting == {
            "type": "user.tab",
            "tab_id": str(tab.pk),
            "state": "waiting",
            "approval": {"call_id": "c1", "name": "shell"},
            # The tabs of its conversation (issue 31): their pages mark the entry current.
            "versions": [str(tab.pk)],
        }
        # Rendered once here for every page: the tab's own page marks it current.
        assert 'data-state="waiting"' in entries["other"]
        assert 'data-tool="shell"' in entries["other"]
        assert "current" not in entries["other"] and 'aria-current="page"' in entries["current"]
        await database_sync_to_async(turns.approve)(tab.pk, "c1", True)
        await mine.until(lambda m: m["state"] == "idle")
        await watcher.until_idle()
        # A frame per change of state, not per status (the tab group got one per step).
        assert states(mine.messages) == ["running", "waiting", "running", "idle"]
        assert len([op for op in watcher.ops if op["op"] == "status"]) > 4
        assert await mine.nothing()
        assert await theirs.nothing()
        assert theirs.messages == []


async def test_the_owners_pages_get_the_entry_and_another_users_get_nothing(script):
    script(*shell_then_text())
    tab = await make_tab(approve_tools=True)
    owner = await owner_of(tab)
    other = await other_user()
    await database_sync_to_async(new_tab)(other, "scripted/test")
    home = await socket(owner)
    on_tab = await socket(owner, f"/ws/tabs/{tab.pk}/")
    theirs = await socket(other)
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "run it")
        await watcher.until(lambda m: m["op"] == "status" and m["status"]["state"] == "waiting")
        for page, current in ((home, False), (on_tab, True)):
            async with asyncio.timeout(FRAME_TIMEOUT):
                while True:
                    frame = await page.receive_from(FRAME_TIMEOUT)
                    if 'data-state="waiting"' in frame and f"tablink-{tab.pk}" in frame:
                        break
            link = entry(frame, tab.pk)
            assert "waiting" in link.classes and link.attrs["data-tool"] == "shell"
            assert link.attrs["data-call"] == "c1"
            assert ("current" in link.classes) is current
            assert wait_mark(link) is not None
            assert 'hx-swap-oob="afterbegin:#tab-list"' in frame
        assert await theirs.receive_nothing(NOTHING_SECONDS)
        await database_sync_to_async(turns.approve)(tab.pk, "c1", True)
        await watcher.until_idle()
    for page in (home, on_tab, theirs):
        await page.disconnect()


async def test_a_change_reads_the_tab_once_however_many_pages_are_open(script, monkeypatch):
    """The worker renders the entry once; each page only forwards it. When every socket
    read the tab itself, the bench's hundred open tabs of one user cost 145x a bare
    consumer's CPU (a query per page per change)."""
    script([TextDelta("hi"), Finish()])
    tab = await make_tab()
    owner = await owner_of(tab)
    reads: list[str] = []
    real_stated = sidebar.stated

    def counted_stated(tab_id):
        reads.append(str(tab_id))
        return real_stated(tab_id)

    monkeypatch.setattr(sidebar, "stated", counted_stated)
    pages = [await socket(owner) for _ in range(5)]
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "hello")
        await watcher.until_idle()
        for page in pages:
            async with asyncio.timeout(FRAME_TIMEOUT):
                while 'data-state="idle"' not in (frame := await page.receive_from(FRAME_TIMEOUT)):
                    pass
            assert f"tablink-{tab.pk}" in frame
    # running, then idle: one read each, not one per page.
    assert reads == [str(tab.pk)] * 2
    for page in pages:
        await page.disconnect()


async def test_a_slow_sidebar_read_holds_up_no_turn_and_the_states_keep_their_order(
    script, monkeypatch
):
    """The runner never waits for its owner's pages: if it did, a hundred turns starting
    at once would queue their entry reads ahead of their own writes and hold up their
    streams. The announcements still arrive in order once the reads go on."""
    script([TextDelta("hi"), Finish()])
    tab = await make_tab()
    gate = threading.Event()
    real = sidebar.with_entries

    def slow(change):
        gate.wait(TURN_TIMEOUT)
        return real(change)

    monkeypatch.setattr(sidebar, "with_entries", slow)
    async with (
        running_worker(),
        Watcher(tab.pk) as watcher,
        UserWatcher(tab.owner_id) as mine,
    ):
        await submit(tab, "hello")
        await watcher.until_idle()  # the turn ended while its first announcement waited
        assert mine.messages == []
        gate.set()
        await mine.until(lambda m: m["state"] == "idle")
    assert states(mine.messages) == ["running", "idle"]


async def test_a_users_pages_in_one_process_share_one_subscription():
    """A change reaches this process once and is handed to each of the user's pages here:
    a hundred pages of one user each in the group made every change a hundred deliveries
    (the bench's p99 token delay 2 s). The subscription ends with the last page."""
    tab = await make_tab()
    owner = await owner_of(tab)
    layer = get_channel_layer()
    group = bus.user_group(owner.pk)
    pages = [await socket(owner) for _ in range(4)]
    assert len(layer.groups.get(group, {})) == 1
    change = sidebar.message(tab.pk, "running", None)
    _, sent = await database_sync_to_async(sidebar.with_entries)(change)
    await layer.group_send(group, sent)
    for page in pages:
        assert f'id="tablink-{tab.pk}"' in await page.receive_from(FRAME_TIMEOUT)
    for page in pages[:-1]:
        await page.disconnect()
    assert len(layer.groups.get(group, {})) == 1
    await pages[-1].disconnect()
    assert len(layer.groups.get(group, {})) == 0


async def test_changes_that_come_together_reach_a_page_as_one_frame():
    """A hundred tabs starting turns at once must not cost each open page a hundred
    frames: what changes within SIDEBAR_BATCH_SECONDS goes out as one, each tab's latest
    entry once."""
    tabs = [await make_tab() for _ in range(3)]
    owner = await owner_of(tabs[0])
    for tab in tabs[1:]:
        tab.owner = owner
        await tab.asave(update_fields=["owner"])
    page = await socket(owner)
    layer = get_channel_layer()
    for tab, state in [(tabs[0], "running"), (tabs[1], "running"), (tabs[2], "running")] + [
        (tabs[0], "idle")
    ]:
        change = sidebar.message(tab.pk, state, None)
        _, sent = await database_sync_to_async(sidebar.with_entries)(change)
        await layer.group_send(bus.user_group(owner.pk), sent)
    frame = await page.receive_from(FRAME_TIMEOUT)
    assert [frame.count(f'id="tablink-{tab.pk}"') for tab in tabs] == [1, 1, 1]
    assert await page.receive_nothing(consumers.SIDEBAR_BATCH_SECONDS * 2)
    await page.disconnect()


async def test_a_wake_into_a_new_tab_announces_the_tab_and_its_wait(script):
    script(*shell_then_text())
    tab = await make_tab(approve_tools=True)
    owner = await owner_of(tab)
    async with running_worker(), UserWatcher(owner.pk) as mine:
        await Wake.objects.acreate(
            owner=owner,
            name="nightly",
            new_tab=True,
            model="scripted/test",
            prompt="run it",
            kind="interval",
            interval_seconds=3600,
            next_run_at=timezone.now() - timedelta(seconds=1),
        )
        await database_sync_to_async(bus.wakes_changed)()
        waiting = await mine.until(lambda m: m["state"] == "waiting")
        assert waiting["tab_id"] != str(tab.pk)
        page = await socket(owner)
        # A page loaded now has it in its list, marked: its hello holds it as waiting,
        # so nothing is sent again.
        held = {waiting["tab_id"]: "waiting", str(tab.pk): "idle"}
        await page.send_to(text_data=json.dumps({"type": "sidebar", "held": held}))
        assert await page.receive_nothing(NOTHING_SECONDS)
        await database_sync_to_async(turns.approve)(uuid.UUID(waiting["tab_id"]), "c1", True)
        await mine.until(lambda m: m["state"] == "idle")
        await page.disconnect()


@database_sync_to_async
def waiting_row(tab) -> None:
    RunningTurn.objects.create(
        tab=tab,
        turn_id=uuid.uuid4(),
        worker="elsewhere",
        status=RunningTurn.Status.WAITING,
        heartbeat_at=timezone.now(),
    )


async def kept_tab():
    """A tab with a sidebar entry: a tab never sent to and untitled has none
    (chat.sidebar.kept; tests/test_versions_views.py)."""
    tab = await make_tab()
    tab.title = f"tab {tab.pk}"
    await tab.asave(update_fields=["title"])
    return tab


async def test_a_page_load_shows_the_waiting_mark(client: Client):
    tab = await kept_tab()
    idle = await kept_tab()
    await waiting_row(tab)
    owner = await owner_of(tab)
    await database_sync_to_async(client.force_login)(owner)
    for path in ("/wakes/", f"/t/{idle.pk}/"):
        response = await database_sync_to_async(client.get)(path)
        doc = parse(response.content.decode())
        link = doc.by_id(f"tablink-{tab.pk}")
        assert link.attrs["data-state"] == "waiting" and "waiting" in link.classes
        assert wait_mark(link).text == "approve?"
        calm = doc.by_id(f"tablink-{idle.pk}")
        assert calm.attrs["data-state"] == "idle" and wait_mark(calm) is None


async def test_a_reconnecting_page_is_sent_what_changed_and_bad_reports_lose_nothing():
    waiting, idle, unseen = await kept_tab(), await kept_tab(), await kept_tab()
    await waiting_row(waiting)
    owner = await owner_of(waiting)
    page = await socket(owner)
    held = {str(waiting.pk): "running", str(idle.pk): "idle"}
    await page.send_to(
        text_data=json.dumps({"type": "sidebar", "current": str(idle.pk), "held": held})
    )
    frame = await page.receive_from(FRAME_TIMEOUT)
    doc = parse(frame)
    assert doc.by_id(f"tablink-{waiting.pk}").attrs["data-state"] == "waiting"
    assert doc.by_id(f"tablink-{unseen.pk}").attrs["data-state"] == "idle"
    assert doc.by_id(f"tablink-{idle.pk}") is None
    assert await page.receive_nothing(NOTHING_SECONDS)
    # Reports a page should never send: what is not understood counts as not held.
    for report in (
        "not json",
        "[]",
        '{"type": "sidebar", "held": [1, 2]}',
        '{"type": "sidebar", "current": "x", "held": {"nope": "idle", "'
        + str(idle.pk)
        + '": "sleeping"}}',
    ):
        await page.send_to(text_data=report)
    frame = await page.receive_from(FRAME_TIMEOUT)
    doc = parse(frame)
    assert {doc.by_id(f"tablink-{t.pk}") is not None for t in (waiting, idle, unseen)} == {True}
    assert "current" in doc.by_id(f"tablink-{idle.pk}").classes
    await page.disconnect()


async def test_an_anonymous_user_socket_is_refused():
    communicator = WebsocketCommunicator(
        router,
        "/ws/user/",
        headers=[(b"origin", b"http://127.0.0.1:8000"), (b"host", b"127.0.0.1:8000")],
    )
    assert await refused(communicator) == consumers.CLOSE_SIGNED_OUT


async def test_a_recovered_turn_tells_the_owners_pages_it_is_over():
    tab = await make_tab()
    await waiting_row(tab)
    async with UserWatcher(tab.owner_id) as mine:
        await database_sync_to_async(lease.recover_stale)(everything=True)
        message = await mine.until(lambda m: True)
    assert (message["tab_id"], message["state"]) == (str(tab.pk), sidebar.IDLE)


async def test_a_sub_agents_new_tab_and_its_wait_reach_the_owners_group(monkeypatch):
    routed = Routed()
    monkeypatch.setattr(step, "provider_for", routed.provider_for)
    routed.script(
        "delegate it",
        [
            ToolCallEvent("a1", "agent", {"description": "Look", "prompt": "look around"}),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("the child looked"), Finish()],
    )
    routed.script("look around", *shell_then_text())
    parent = await make_tab(approve_tools=True)
    async with running_worker(), UserWatcher(parent.owner_id) as mine:
        await submit(parent, "delegate it")
        waiting = await mine.until(lambda m: m["state"] == "waiting")
        child = uuid.UUID(waiting["tab_id"])
        assert child != parent.pk and waiting["approval"]["name"] == "shell"
        # A page that loads now lists the child, marked, as the live entry was.
        owner = await owner_of(parent)
        [listed] = [t for t in await database_sync_to_async(sidebar.tabs)(owner) if t.pk == child]
        assert sidebar.state(listed) == sidebar.WAITING and listed.parent_call_id == "a1"
        await database_sync_to_async(turns.approve)(child, "c1", True)
        await mine.until(lambda m: m["tab_id"] == str(parent.pk) and m["state"] == "idle")
    assert [m["state"] for m in mine.messages if m["tab_id"] == str(child)][:2] == [
        "running",
        "waiting",
    ]
