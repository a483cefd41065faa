"""GET /api/v1/tabs/<id>/events in scaled mode: an API client's server-sent events from
the web processes of tests/test_scaled.py's cluster, the same one (tests/conftest.py: two
daphne web processes, two `manage.py runworker` processes, PostgreSQL and Redis), while
the turn runs on a worker.

The stream is read as an API client reads it: over HTTP with a Bearer token, its
events parsed by httpx2's EventSource, a reconnect carrying the last event's id.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx2
import pytest

from tests import test_scaled
from tests.procs import FRAME_TIMEOUT, HTTP_TIMEOUT, Cluster, seqs_are_gapless
from tests.test_scaled import (
    RECOVERY_BOUND,
    STORY_KINDS,
    STORY_MESSAGE,
    checkpointed_story,
    kinds,
    quoting,
)

# test_scaled's cluster (tests/conftest.py), on the same xdist worker.
pytestmark = pytest.mark.scaled

live = test_scaled.live

# The user tests/procs.py's Cluster.login creates.
USER = "scaled"
# What a turn's whole stream may take on a busy two-core machine (a reply takes about
# three seconds at the cluster's pace, the story about eight).
TURN_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def token(cluster) -> str:
    """A read-write API token of the cluster's user, created as an operator does."""
    return cluster.manage("create_api_token", USER, "--name", "scaled events").strip()


class Events:
    """One API client's /events stream on one web process, with every event it read.

    Events are {"id", "event", "data"} with the data decoded; the `retry:` line
    and keep-alive comments are not events.
    """

    def __init__(self, cluster: Cluster, tab_id: str, token: str) -> None:
        self.cluster = cluster
        self.tab_id = tab_id
        self.token = token
        self.events: list[dict[str, Any]] = []
        self._stack: contextlib.AsyncExitStack | None = None
        self._source = None

    async def connect(self, web: str, last_event_id: str | None = None) -> Events:
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self._stack = contextlib.AsyncExitStack()
        # No read timeout: a quiet stream is not an error; `until` bounds each wait.
        client = await self._stack.enter_async_context(
            httpx2.AsyncClient(timeout=httpx2.Timeout(HTTP_TIMEOUT, read=None))
        )
        url = f"{self.cluster.origin(web)}/api/v1/tabs/{self.tab_id}/events"
        response = await self._stack.enter_async_context(client.stream("GET", url, headers=headers))
        assert response.status_code == 200, (response.status_code, await response.aread())
        self._source = aiter(httpx2.EventSource(response))
        return self

    async def next(self) -> dict[str, Any]:
        while True:
            sse = await anext(self._source)
            if sse.event == "message" and not sse.data:
                continue  # the retry line
            event = {"id": sse.id, "event": sse.event, "data": sse.json()}
            self.events.append(event)
            return event

    async def until(self, predicate, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                event = await self.next()
                if predicate(event):
                    return event

    async def close(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()


@pytest.fixture
async def streams():
    """Opens /events streams; closes every one at the end of the test."""
    opened: list[Events] = []

    async def open_(
        cluster: Cluster, tab_id: str, token: str, web: str, last_event_id: str | None = None
    ) -> Events:
        stream = Events(cluster, tab_id, token)
        opened.append(stream)
        return await stream.connect(web, last_event_id)

    yield open_
    for stream in opened:
        with contextlib.suppress(Exception):
            await stream.close()


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e["data"] for e in events if e["event"] == name]


def text_of(events: list[dict[str, Any]], chunk_id: str) -> str:
    """A chunk's text as a client rebuilds it from its deltas, each at its offset."""
    text = ""
    for delta in named(events, "chunk-delta"):
        if delta["id"] == chunk_id:
            assert delta["offset"] == len(text), f"a gap or a duplicate at {delta}"
            text += delta["text"]
    return text


def body(row: dict[str, Any]) -> str:
    """The streamed body of a log row, as chat.stream.Block.text reads it."""
    return row["data"].get("shell_output" if row["type"] == "tool_result" else "text", "")


def seals_are_log(events: list[dict[str, Any]], log: list[dict[str, Any]]) -> None:
    """Every chunk of the log sealed once, in order, with the log's fields."""
    seals = named(events, "chunk-seal")
    assert [(s["seq"], s["id"], s["role"], s["type"], s["data"]) for s in seals] == [
        (r["seq"], str(r["id"]), r["role"], r["type"], r["data"]) for r in log
    ]


async def post_message(cluster: Cluster, web: str, tab_id: str, token: str, text: str) -> None:
    """POST /api/v1/tabs/<id>/messages as the API client."""
    async with httpx2.AsyncClient(timeout=HTTP_TIMEOUT) as client:
        response = await client.post(
            f"{cluster.origin(web)}/api/v1/tabs/{tab_id}/messages",
            json={"text": text},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert response.status_code == 202, (response.status_code, response.text)


def caught_up(event: dict[str, Any]) -> bool:
    # A catch-up ends with the tab's status.
    return event["event"] == "status"


async def test_an_api_client_on_web_a_follows_a_turn_run_by_a_worker(live, token, streams):
    """A message posted through the API on web B runs on a worker process; the /events
    stream on web A brings its chunks opened, streamed and sealed, its status and
    turn-done, and the text rebuilt from the deltas is the log's."""
    tab = live.new_tab("a")
    events = await streams(live, tab, token, "a")
    await events.until(caught_up)
    await post_message(live, "b", tab, token, "hello from the API")
    await events.until(lambda e: e["event"] == "chunk-open", TURN_TIMEOUT)
    running = live.running(tab)
    assert running is not None
    assert live.worker_by_id(running["worker"]) in ("w1", "w2")
    done = await events.until(lambda e: e["event"] == "turn-done", TURN_TIMEOUT)
    log = live.log(tab)
    assert kinds(log) == ["user/text", "assistant/thinking", "assistant/text"]
    assert log[0]["data"] == {"text": "hello from the API"}
    seals_are_log(events.events, log)
    # Every answer chunk was streamed live, and its deltas rebuild exactly the log's text.
    assert [o["id"] for o in named(events.events, "chunk-open")] == [str(r["id"]) for r in log[1:]]
    for row in log[1:]:
        assert text_of(events.events, str(row["id"])) == body(row) != ""
    states = [s["state"] for s in named(events.events, "status")]
    assert states[0] == "idle" and "running" in states and states[-1] == "idle"
    assert done["data"] == {"turn_id": str(log[-1]["turn_id"])}
    assert done["id"] == str(log[-1]["seq"])


async def test_a_client_cut_mid_answer_resumes_on_web_b_with_its_last_event_id(
    live, token, streams
):
    """Cut in the middle of the story's quote on web A, reconnected to web B with the
    last event id: the worker's snapshot (asked through the control group, answered
    on the stream's own Redis channel) gives exactly the rest of the open chunk, then
    the turn goes on; no delta repeated or skipped, every seal once."""
    tab = live.new_tab("a")
    first = await streams(live, tab, token, "a")
    await first.until(caught_up)
    await post_message(live, "a", tab, token, STORY_MESSAGE)

    def mid_quote(event: dict[str, Any]) -> bool:
        if event["event"] != "chunk-delta":
            return False
        return quoting(text_of(first.events, event["data"]["id"]))

    cut = await first.until(mid_quote, TURN_TIMEOUT)
    await first.close()
    last_id = first.events[-1]["id"]
    seq, open_id, open_len = last_id.split(":")
    assert open_id == cut["data"]["id"] and int(open_len) == len(text_of(first.events, open_id))

    second = await streams(live, tab, token, "b", last_id)
    status = await second.until(caught_up)
    # Only the worker's own status names the model (the database's lease status does
    # not): the catch-up used the worker's snapshot, not the checkpoint fallback.
    assert status["data"]["state"] == "running"
    assert status["data"].get("model") == "offline/demo", "the checkpoint, not the worker"
    await second.until(lambda e: e["event"] == "turn-done", TURN_TIMEOUT)
    # The second stream went on from the cut: the open chunk's next delta, at its length.
    resumed = next(e for e in second.events if e["event"].startswith("chunk-"))
    assert resumed["event"] == "chunk-delta"
    assert (resumed["data"]["id"], resumed["data"]["offset"]) == (open_id, int(open_len))

    log = live.log(tab)
    assert kinds(log) == STORY_KINDS
    assert open_id == str(log[-1]["id"])
    # The cut was mid-chunk, and the second stream began at it.
    assert int(seq) == log[-2]["seq"]
    assert int(open_len) < len(body(log[-1]))
    both = first.events + second.events
    seals_are_log(both, log)
    assert named(second.events, "chunk-open") == []
    opened = {o["id"] for o in named(first.events, "chunk-open")}
    assert open_id in opened
    for row in log:
        if str(row["id"]) in opened:
            assert text_of(both, str(row["id"])) == body(row)
    assert second.events[-1]["id"] == str(log[-1]["seq"])


async def test_a_stream_ends_the_turn_of_a_killed_worker_with_the_recovery(live, token, streams):
    """SIGKILL of the worker holding a turn mid-text: the /events stream on web A gets
    the other worker's recovery (the checkpointed text sealed as interrupted, then the
    notice), the idle status and turn-done, each chunk of the log sealed once."""
    tab = live.new_tab("a")
    events = await streams(live, tab, token, "a")
    await events.until(caught_up)
    await post_message(live, "a", tab, token, STORY_MESSAGE)
    running = await checkpointed_story(live, tab)
    holder = live.worker_by_id(running["worker"])
    live.procs[holder].kill()
    killed_at = time.monotonic()
    done = await events.until(lambda e: e["event"] == "turn-done", RECOVERY_BOUND + TURN_TIMEOUT)
    print(f"turn-done {time.monotonic() - killed_at:.2f} s after the SIGKILL")
    log = live.log(tab)
    assert kinds(log) == [*STORY_KINDS, "system/system"]
    text, notice = log[-2], log[-1]
    assert text["data"]["interrupted"] is True and quoting(text["data"]["text"])
    assert notice["data"]["kind"] == "interrupted"
    seals_are_log(events.events, log)
    # The stream had the quote open and streaming when the worker died.
    assert quoting(text_of(events.events, str(text["id"])))
    assert named(events.events, "status")[-1]["state"] == "idle"
    assert done["data"] == {"turn_id": str(log[0]["turn_id"])}
    assert done["id"] == str(notice["seq"])
    assert seqs_are_gapless(log)
