"""Scaled mode across real processes: two daphne web processes and two turn workers on one
PostgreSQL database and one Redis, with browsers' sockets on both web processes.

The processes are the Procfile's, on OS-assigned ports; every one is stopped by its PID
when the module ends. The tests skip when PostgreSQL or Redis is not reachable, and fail
instead when DISPATCH_REQUIRE_SERVICES=1 (as in CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import runpy
import signal
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from chat import worker
from tests.procs import (
    ROOT,
    STORY,
    STORY_LINES,
    Cluster,
    PageSocket,
    assert_page_is_log,
    seqs_are_gapless,
    turns_do_not_interleave,
    without_clock,
)

# One cluster (tests/conftest.py's `cluster`) for this module and test_scaled_events:
# their tests run on one xdist worker (tests/conftest.py's ONE_WORKER).
pytestmark = pytest.mark.scaled

# A recovery scan runs on every worker each SCAN_SECONDS, and a dead pid on this
# host is recovered at the next one. The slack covers the scan's own queries and
# a busy two-core machine. (On another host the lease must first go stale:
# LEASE_STALE_SECONDS + SCAN_SECONDS, about 20 s; see the README.)
RECOVERY_SLACK = 5.0
RECOVERY_BOUND = worker.SCAN_SECONDS + RECOVERY_SLACK
STORY_MESSAGE = f"read {STORY}"
# How the quoting text chunk begins, to tell it from the first step's text.
STORY_TEXT_START = f"`{STORY}` is {STORY_LINES} lines long."
STORY_KINDS = [
    "user/text",
    "assistant/thinking",
    "assistant/text",
    "assistant/tool_call",
    "tool/tool_result",
    "assistant/thinking",
    "assistant/text",
]
# Quoted text the page (or checkpoint) must hold before a process is killed.
MID_TEXT_CHARS = 40
# The seq race: this many processes each append this many chunks to one tab, one
# transaction each, released together so that their appends interleave.
RACE_PROCESSES = 2
RACE_APPENDS = 100
RACE_SCRIPT = """
import pathlib, time, uuid
from chat import log
from chat.stream import Block
barrier = pathlib.Path({barrier!r})
(barrier / {name!r}).touch()
deadline = time.monotonic() + 30
while len(list(barrier.iterdir())) < {processes} and time.monotonic() < deadline:
    time.sleep(0.002)
for i in range({appends}):
    data = {{"kind": "notice", "text": f"{name} {{i}}"}}
    log.append(uuid.UUID({tab!r}), [Block(uuid.uuid4(), None, 0, "system", "system", data)])
"""


@pytest.fixture
def live(cluster, request):
    """The cluster with all four processes up (an earlier test may have killed one).

    After a failed test, the processes' output is printed with the failure.
    """
    failed = request.session.testsfailed
    cluster.ensure_running()
    yield cluster
    if request.session.testsfailed > failed:
        print(cluster.outputs())


@pytest.fixture
async def sockets():
    """Opens page sockets; closes every one at the end of the test."""
    opened: list[PageSocket] = []

    async def open_(cluster: Cluster, tab_id: str, web: str) -> PageSocket:
        socket = PageSocket(cluster, tab_id)
        opened.append(socket)
        return await socket.connect(web)

    yield open_
    for socket in opened:
        with contextlib.suppress(Exception):
            await socket.close()


def kinds(log) -> list[str]:
    return [f"{r['role']}/{r['type']}" for r in log]


def quoting(text: str) -> bool:
    """The text is the story's quote, with at least MID_TEXT_CHARS of it streamed (as written,
    or as a page shows it: Markdown, whose `code` loses its backticks)."""
    start = STORY_TEXT_START if text.startswith("`") else STORY_TEXT_START.replace("`", "")
    return text.startswith(start) and len(text) >= len(start) + MID_TEXT_CHARS


async def streaming_story(socket: PageSocket) -> str:
    """Wait until the page streams the story's quote, in the middle of it; its chunk id."""

    def mid_text(page) -> bool:
        chunk = page.open_chunk
        return chunk is not None and chunk.tag == "div" and quoting(page.streamed[chunk.id])

    await socket.until_page(mid_text, timeout=30)
    return socket.page.open_chunk.id


async def checkpointed_story(cluster: Cluster, tab_id: str) -> dict:
    """Wait until the running turn's checkpoint holds part of the story's quote."""
    async with asyncio.timeout(30):
        while True:
            running = cluster.running(tab_id)
            block = running and running["open_chunk"]
            if block and block["type"] == "text" and quoting(block["data"]["text"]):
                return running
            await asyncio.sleep(0.05)


async def test_it_runs_a_turn_on_a_worker_and_streams_it_to_both_web_processes(live, sockets):
    """A message sent through web A runs on a worker process (never a web process); sockets
    on web A and web B receive the same frames, and each rebuilds exactly the log."""
    tab = live.new_tab("a")
    a = await sockets(live, tab, "a")
    b = await sockets(live, tab, "b")
    synced = len(a.frames), len(b.frames)
    await live.asend("a", tab, "hello from web A")
    await a.until(lambda frame: 'data-seq=""' in frame)  # the first open chunk
    running = live.running(tab)
    assert running is not None
    assert live.worker_by_id(running["worker"]) in ("w1", "w2")
    await a.settle()
    await b.settle()
    log = live.log(tab)
    assert kinds(log) == ["user/text", "assistant/thinking", "assistant/text"]
    assert log[0]["data"] == {"text": "hello from web A"}

    # The tab's frames; the sidebar's (the user channel, another group) may still be on
    # their way to one page when the other has settled.
    def tab_frames(frames: list[str]) -> list[str]:
        return [without_clock(f) for f in frames if "afterbegin:#tab-list" not in f]

    frames_a = tab_frames(a.frames[synced[0] :])
    assert frames_a == tab_frames(b.frames[synced[1] :])
    assert any('data-state="running"' in f for f in frames_a)
    assert_page_is_log(a.page, log)
    assert_page_is_log(b.page, log)
    # Every text was streamed live to both pages, not only sent sealed.
    assert set(a.page.streamed) == {str(r["id"]) for r in log[1:]}


async def test_the_same_tab_asked_from_both_web_processes_at_once_runs_one_turn_at_a_time(
    live, sockets
):
    """Messages posted through web A and web B at the same moment: all are kept, each
    enters the log once, turns never overlap, and the seqs are unique and gapless."""
    tab = live.new_tab("a")
    a = await sockets(live, tab, "a")
    b = await sockets(live, tab, "b")
    messages = {"a": ["one via A", "two via A"], "b": ["one via B", "two via B"]}

    async def post_all(web: str) -> None:
        for text in messages[web]:
            await live.asend(web, tab, text)

    await asyncio.gather(post_all("a"), post_all("b"))
    await a.settle()
    await b.settle()
    log = live.log(tab)
    sent = sorted(text for texts in messages.values() for text in texts)
    users = [r["data"]["text"] for r in log if r["role"] == "user"]
    assert sorted(users) == sent
    # Each web process's messages keep the order they were posted in.
    for texts in messages.values():
        assert [u for u in users if u in texts] == texts
    assert seqs_are_gapless(log)
    assert turns_do_not_interleave(log)
    assert all(r["type"] != "system" for r in log)
    assert live.running(tab) is None and live.queued(tab) == []
    assert_page_is_log(a.page, log)
    assert_page_is_log(b.page, log)


async def test_approval_and_cancel_reach_the_worker_holding_the_turn(live, sockets):
    """A tool approval posted through web B and a cancel posted through web A reach the
    worker process that holds the turn."""
    tab = live.new_tab("a")
    a = await sockets(live, tab, "a")
    await live.asend("a", tab, "run `echo scaled-hello`")
    await a.until_page(lambda page: page.approval is not None)
    status, _ = await live.apost("b", f"/t/{tab}/approve/", {"approve": a.page.approval})
    assert status == 302
    await a.settle()
    log = live.log(tab)
    result = next(r for r in log if r["type"] == "tool_result")
    assert result["data"]["is_error"] is False
    assert "scaled-hello" in result["data"]["result"]

    await live.asend("b", tab, STORY_MESSAGE)
    await streaming_story(a)
    status, _ = await live.apost("a", f"/t/{tab}/stop/")
    assert status == 302
    await a.settle()
    log = live.log(tab)
    assert kinds(log)[-3:] == ["assistant/thinking", "assistant/text", "system/system"]
    assert log[-1]["data"]["kind"] == "cancelled"
    assert seqs_are_gapless(log)
    assert_page_is_log(a.page, log)


async def test_a_page_on_a_killed_web_process_reconnects_to_the_other_with_no_gap(live, sockets):
    """SIGKILL of web A mid-text: its page reconnects to web B saying what it holds (last
    seq, open chunk and length) and ends with exactly the log, every character once."""
    tab = live.new_tab("b")
    a = await sockets(live, tab, "a")
    b = await sockets(live, tab, "b")
    await live.asend("b", tab, STORY_MESSAGE)
    open_id = await streaming_story(a)
    live.procs["a"].kill()
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                await a.next()
    hello = a.page.hello()
    await a.connect("b")
    await a.settle()
    await b.settle()
    log = live.log(tab)
    assert kinds(log) == STORY_KINDS
    # The page reconnected in the middle of the text chunk, holding part of it.
    assert hello["open_id"] == open_id == str(log[-1]["id"])
    assert MID_TEXT_CHARS < hello["open_len"] < len(log[-1]["data"]["text"])
    assert hello["last_seq"] == log[-2]["seq"]
    assert_page_is_log(a.page, log)
    assert_page_is_log(b.page, log)


async def test_a_turn_whose_worker_is_killed_is_recovered_by_the_other_worker(live, sockets):
    """SIGKILL of the worker holding a turn mid-text: the other worker's scan recovers it
    within RECOVERY_BOUND (the checkpointed text sealed as interrupted, then a notice);
    both pages end with exactly the log; the tab then runs its next message."""
    tab = live.new_tab("a")
    a = await sockets(live, tab, "a")
    b = await sockets(live, tab, "b")
    await live.asend("a", tab, STORY_MESSAGE)
    running = await checkpointed_story(live, tab)
    holder = live.worker_by_id(running["worker"])
    survivor = next(name for name in live.workers() if name != holder)
    live.procs[holder].kill()
    killed_at = time.monotonic()
    async with asyncio.timeout(RECOVERY_BOUND + 10):
        while live.running(tab) is not None:
            await asyncio.sleep(0.05)
    recovered_after = time.monotonic() - killed_at
    print(f"recovered {recovered_after:.2f} s after the SIGKILL (bound {RECOVERY_BOUND} s)")
    assert recovered_after <= RECOVERY_BOUND
    # The survivor's scan did it (it logs after broadcasting, so wait for the line).
    live.procs[survivor].wait_for(f"recovered interrupted turn .* on tab {tab}", timeout=10)
    await a.settle()
    await b.settle()
    log = live.log(tab)
    assert kinds(log) == [*STORY_KINDS, "system/system"]
    text = log[-2]["data"]
    assert text["interrupted"] is True and quoting(text["text"])
    assert log[-1]["data"]["kind"] == "interrupted"
    assert_page_is_log(a.page, log)
    assert_page_is_log(b.page, log)

    await live.asend("b", tab, "hello again")
    await a.settle()
    await b.settle()
    log = live.log(tab)
    assert kinds(log)[-3:] == ["user/text", "assistant/thinking", "assistant/text"]
    assert seqs_are_gapless(log)
    assert_page_is_log(a.page, log)
    assert_page_is_log(b.page, log)


async def test_a_worker_stopped_with_sigterm_finishes_its_turn_and_hands_back_the_next(
    live, sockets
):
    """SIGTERM to the worker holding a turn mid-text: it takes no new turn, finishes the
    running one, leaves the message queued meanwhile to the other worker, and exits 0."""
    tab = live.new_tab("a")
    a = await sockets(live, tab, "a")
    await live.asend("a", tab, STORY_MESSAGE)
    running = await checkpointed_story(live, tab)
    holder = live.worker_by_id(running["worker"])
    survivor = next(name for name in live.workers() if name != holder)
    live.procs[holder].proc.send_signal(signal.SIGTERM)
    await live.asend("b", tab, "and one more thing")

    holders: dict = {}

    async def sample() -> None:
        while True:
            if row := live.running(tab):
                holders.setdefault(row["turn_id"], live.worker_by_id(row["worker"]))
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    try:
        await a.settle()
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
    assert await asyncio.to_thread(live.procs[holder].proc.wait, 30) == 0
    log = live.log(tab)
    assert kinds(log) == [*STORY_KINDS, "user/text", "assistant/thinking", "assistant/text"]
    assert "interrupted" not in log[6]["data"]
    assert seqs_are_gapless(log)
    turn_ids = [log[0]["turn_id"], log[7]["turn_id"]]
    assert [holders.get(t) for t in turn_ids] == [holder, survivor]
    assert_page_is_log(a.page, log)


async def test_processes_appending_to_one_tab_at_once_get_unique_gapless_seqs(live, tmp_path):
    """Several processes appending to the same tab on PostgreSQL at the same moment: the
    tab row lock gives every chunk its own seq, with no gap, in each writer's order."""
    tab = live.new_tab("a")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    names = [f"p{i}" for i in range(RACE_PROCESSES)]
    scripts = [
        RACE_SCRIPT.format(
            barrier=str(barrier), name=name, processes=RACE_PROCESSES, appends=RACE_APPENDS, tab=tab
        )
        for name in names
    ]
    await asyncio.to_thread(live.shell_together, scripts)
    log = live.log(tab)
    assert len(log) == RACE_PROCESSES * RACE_APPENDS
    assert seqs_are_gapless(log)
    assert live.sql("SELECT last_seq FROM chat_tab WHERE id = %s", tab) == [(len(log),)]
    writers = [r["data"]["text"].split()[0] for r in log]
    for name in names:
        mine = [r["data"]["text"] for r in log if r["data"]["text"].startswith(name + " ")]
        assert mine == [f"{name} {i}" for i in range(RACE_APPENDS)]
    # The writers really raced: their appends interleave.
    switches = sum(a != b for a, b in zip(writers, writers[1:], strict=False))
    assert switches > len(names) - 1


def layer_timeouts(monkeypatch, tmp_path, redis_url: str) -> tuple[float | None, float]:
    """(read timeout, blocking-pop timeout) of the channel layer that dispatch/settings.py
    configures for `redis_url`. Nothing connects to Redis."""
    from channels_redis.utils import create_pool
    from django.utils.module_loading import import_string

    monkeypatch.setenv("REDIS_URL", redis_url)
    monkeypatch.setenv("DISPATCH_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("SECRET_KEY", "only-read-here")
    conf = runpy.run_path(str(ROOT / "dispatch" / "settings.py"))["CHANNEL_LAYERS"]["default"]
    layer = import_string(conf["BACKEND"])(**conf["CONFIG"])
    pool = create_pool(layer.hosts[0])
    return pool.connection_class(**pool.connection_kwargs).socket_timeout, layer.brpop_timeout


def test_a_plain_redis_url_gives_reads_that_outlast_the_blocking_pop(monkeypatch, tmp_path):
    """With REDIS_URL as an operator writes it, the channel layer's reads wait longer than
    the blocking pop it issues on an idle channel."""
    read, blocking_pop = layer_timeouts(monkeypatch, tmp_path, "redis://127.0.0.1:6379/0")
    assert read is None or read > blocking_pop


def test_a_socket_timeout_in_the_url_still_wins(monkeypatch, tmp_path):
    """An operator's own read timeout in REDIS_URL is kept."""
    url = "redis://127.0.0.1:6379/0?socket_timeout=30"
    read, blocking_pop = layer_timeouts(monkeypatch, tmp_path, url)
    assert read == 30 > blocking_pop


async def test_a_tab_waiting_for_approval_reaches_the_users_pages_on_the_other_web_process(
    live, sockets
):
    """The user channel across processes: a turn on a worker process waits for approval,
    and a page with no socket on that tab (the Wakes page, ws/user/) on web B gets the
    tab's sidebar entry marked waiting, then idle once web A's approval lets it finish."""
    tab = live.new_tab("a")
    port = live.procs["b"].port
    headers = {"Cookie": live.cookie, "Origin": live.origin("b")}
    async with connect(f"ws://127.0.0.1:{port}/ws/user/", additional_headers=headers) as user:

        async def entry(state: str) -> str:
            async with asyncio.timeout(30):
                while True:
                    frame = await user.recv()
                    if f'id="tablink-{tab}"' in frame and f'data-state="{state}"' in frame:
                        return frame

        a = await sockets(live, tab, "a")
        await live.asend("a", tab, "run `echo scaled-sidebar`")
        waiting = await entry("waiting")
        assert 'data-tool="shell"' in waiting and "wait-mark" in waiting
        await a.until_page(lambda page: page.approval is not None)
        status, _ = await live.apost("a", f"/t/{tab}/approve/", {"approve": a.page.approval})
        assert status == 302
        await entry("idle")
        await a.settle()
