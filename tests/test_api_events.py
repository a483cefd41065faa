"""GET /api/v1/tabs/<id>/events: the log as server-sent events, resumable exactly."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection

from chat import follow, log
from chat.preferences import new_tab
from chat.providers.base import Finish, TextDelta
from chat.stream import Block
from tests.api_helpers import ApiClient
from tests.engine import chunks, make_tab, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True)]

# Far above what any event here takes; a lost event fails the test instead of hanging it.
EVENT_TIMEOUT = 10.0


def parse(frame: str) -> dict | None:
    """One SSE frame as {id, event, data}; None for a comment or the retry line."""
    fields: dict = {}
    for line in frame.strip("\n").split("\n"):
        name, _, value = line.partition(": ")
        if name in ("id", "event", "data"):
            fields[name] = value
    if "event" not in fields:
        return None
    fields["data"] = json.loads(fields["data"])
    return fields


class Reader:
    """Reads a follower's events (one SSE frame may hold several) up to a predicate."""

    def __init__(self, tab_id: uuid.UUID, position: str = "0", **kwargs) -> None:
        self.stream = follow.sse_events(tab_id, follow.parse_position(position), **kwargs)
        self.events: list[dict] = []
        self.comments: list[str] = []

    async def until(self, predicate) -> dict:
        while True:
            frame = await asyncio.wait_for(anext(self.stream), EVENT_TIMEOUT)
            for part in frame.split("\n\n"):
                if not part:
                    continue
                event = parse(part + "\n\n")
                if event is None:
                    self.comments.append(part)
                    continue
                self.events.append(event)
                if predicate(event):
                    return event

    async def close(self) -> None:
        await self.stream.aclose()


def text_of(events: list[dict], chunk_id: str) -> str:
    """The open chunk's text as a client rebuilds it from deltas at their offsets."""
    text = ""
    for event in events:
        if event["event"] == "chunk-delta" and event["data"]["id"] == chunk_id:
            assert event["data"]["offset"] == len(text), "a gap or a duplicate"
            text += event["data"]["text"]
    return text


async def cut_after_the_first_delta(tab) -> tuple[Reader, str]:
    """A client that sends a message, reads up to the answer's first delta and goes
    away: its reader and the last event id it saw."""
    first = Reader(tab.pk)
    await first.until(lambda e: e["event"] == "status")
    await submit(tab, "go")
    await first.until(lambda e: e["event"] == "chunk-delta")
    await first.close()
    return first, first.events[-1]["id"]


@pytest.mark.asyncio
async def test_a_turn_streams_as_chunk_events_and_ends_with_turn_done(script):
    script([TextDelta("Hel"), TextDelta("lo "), TextDelta("there."), Finish()])
    tab = await make_tab()
    reader = Reader(tab.pk)
    try:
        await reader.until(lambda e: e["event"] == "status")  # caught up: idle
        async with running_worker():
            await submit(tab, "hi")
            done = await reader.until(lambda e: e["event"] == "turn-done")
    finally:
        await reader.close()
    rows = await chunks(tab.pk)
    seals = [e["data"] for e in reader.events if e["event"] == "chunk-seal"]
    assert [(s["seq"], s["role"], s["type"], s["data"]) for s in seals] == [
        (r.seq, r.role, r.type, r.data) for r in rows
    ]
    answer = next(s for s in seals if s["role"] == "assistant")
    opened = [e["data"] for e in reader.events if e["event"] == "chunk-open"]
    assert [o["id"] for o in opened] == [answer["id"]]
    assert text_of(reader.events, answer["id"]) == answer["data"]["text"] == "Hello there."
    assert done["data"]["turn_id"] == str(rows[-1].turn_id)
    assert reader.events[-1]["id"] == str(rows[-1].seq)


@pytest.mark.asyncio
async def test_a_client_that_reconnects_mid_chunk_with_its_last_event_id_misses_nothing(script):
    """Cut after some of an answer's deltas; the reconnect from the last event id gets
    the rest of that chunk from exactly where it stopped, then everything after."""
    gate = asyncio.Event()
    script([TextDelta("first half, "), gate, TextDelta("second half."), Finish()])
    tab = await make_tab()
    async with running_worker():
        first, last_id = await cut_after_the_first_delta(tab)
        assert last_id.count(":") == 2, "an id inside the open chunk"
        second = Reader(tab.pk, last_id)
        try:
            await second.until(lambda e: e["event"] == "status")  # caught up, still open
            gate.set()
            await second.until(lambda e: e["event"] == "turn-done")
        finally:
            await second.close()
    rows = await chunks(tab.pk)
    answer = next(r for r in rows if r.role == "assistant")
    both = first.events + second.events
    assert text_of(both, str(answer.id)) == answer.data["text"]
    seqs = [e["data"]["seq"] for e in both if e["event"] == "chunk-seal"]
    assert seqs == [r.seq for r in rows], "each seal once, in order"


@pytest.mark.asyncio
async def test_a_chunk_sealed_while_the_client_was_away_comes_back_whole_and_once(script):
    gate = asyncio.Event()
    script([TextDelta("first half, "), gate, TextDelta("second half."), Finish()])
    tab = await make_tab()
    async with running_worker():
        first, last_id = await cut_after_the_first_delta(tab)
        gate.set()
        while (await chunks(tab.pk))[-1].role != "assistant":
            await asyncio.sleep(0.01)
        second = Reader(tab.pk, last_id)
        try:
            await second.until(lambda e: e["event"] == "status")
        finally:
            await second.close()
    rows = await chunks(tab.pk)
    answer = next(r for r in rows if r.role == "assistant")
    assert [e["event"] for e in second.events if e["event"].startswith("chunk-")] == [
        "chunk-seal"
    ], "the sealed chunk, no delta repeated"
    assert second.events[0]["data"]["data"] == answer.data
    assert second.events[0]["id"] == str(answer.seq)


@pytest.mark.asyncio
async def test_a_client_far_behind_gets_every_chunk_a_page_at_a_time():
    tab = await make_tab()
    blocks = [Block(uuid.uuid4(), None, 0, "user", "text", {"text": f"m{n}"}) for n in range(450)]
    await database_sync_to_async(log.append)(tab.pk, blocks)
    reader = Reader(tab.pk, "10")
    try:
        await reader.until(lambda e: e["event"] == "status")
    finally:
        await reader.close()
    seals = [e for e in reader.events if e["event"] == "chunk-seal"]
    assert [int(e["id"]) for e in seals] == list(range(11, 451))
    assert [e["data"]["data"]["text"] for e in seals[:2]] == ["m10", "m11"]


@pytest.mark.asyncio
async def test_a_quiet_tab_sends_keep_alive_comments():
    tab = await make_tab()
    reader = Reader(tab.pk, heartbeat=0.01)
    try:
        await reader.until(lambda e: e["event"] == "status")
        frame = await asyncio.wait_for(anext(reader.stream), EVENT_TIMEOUT)
    finally:
        await reader.close()
    assert frame == ": keep-alive\n\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", {"last_seq": 0, "open_id": None, "open_len": 0}),
        (" 12 ", {"last_seq": 12, "open_id": None, "open_len": 0}),
        (
            "3:00000000-0000-0000-0000-000000000001:7",
            {"last_seq": 3, "open_id": "00000000-0000-0000-0000-000000000001", "open_len": 7},
        ),
    ],
)
def test_positions_parse(text, expected):
    assert follow.parse_position(text) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "1:2", "1:not-a-uuid:3", "-1", "1:00000000-0000-0000-0000-000000000001:-2"]
)
def test_a_bad_position_says_what_a_position_is(text):
    with pytest.raises(ValueError, match="is not a position"):
        follow.parse_position(text)


def test_the_route_checks_the_client_and_the_position_before_it_streams():
    from chat.preferences import new_tab

    owner = get_user_model().objects.create_user("events-owner", password="x" * 12)
    other = get_user_model().objects.create_user("events-other", password="x" * 12)
    tab = new_tab(owner)
    url = f"/api/v1/tabs/{tab.pk}/events"
    assert ApiClient().get(url).status_code == 401
    assert ApiClient(user=other).get(url).status_code == 404
    bad = ApiClient(user=owner).get(url, {"after": "abc"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_position"
    response = ApiClient(user=owner).get(url, **{"Last-Event-ID": "0"})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"


def test_an_open_stream_holds_no_database_connection_of_its_request():
    """The stream reads in threads of its own: the request's connection goes back (to
    PostgreSQL's pool) when the view returns, not when the stream ends, so ten open
    streams do not hold a process's whole pool."""
    owner = get_user_model().objects.create_user("events-owner", password="x" * 12)
    tab = new_tab(owner)
    client = ApiClient(user=owner)
    response = client.get(f"/api/v1/tabs/{tab.pk}/events")
    assert response.status_code == 200 and response.streaming
    assert connection.connection is None
    response.close()
