"""The JSON API: tabs, chunk pages, messages, stop, approvals, auth and bad input.

Every response goes through tests.api_helpers.ApiClient, which validates it
against openapi.yaml.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat import api as chat_api
from chat import bus, log
from chat.models import ApiToken, Chunk, QueuedMessage, RunningTurn, Setting, Tab, UsageRecord
from chat.stream import Block
from tests.api_helpers import ApiClient

pytestmark = pytest.mark.django_db

User = get_user_model()
ADDRESS = "203.0.113.7"


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


@pytest.fixture
def token(alice) -> str:
    return ApiToken.issue(alice, name="laptop")[1]


@pytest.fixture
def api(token) -> ApiClient:
    return ApiClient(token=token)


@pytest.fixture
def tab(alice) -> Tab:
    return Tab.objects.create(owner=alice, title="notes", model="offline/demo", system_prompt="hi")


def seed(tab: Tab, n: int, *, turn_id: uuid.UUID | None = None) -> None:
    blocks = [
        Block(uuid.uuid4(), turn_id, 0, "user", "text", {"text": f"message {i}"}) for i in range(n)
    ]
    log.append(tab.id, blocks)
    tab.refresh_from_db()


def waiting_turn(tab: Tab, call_id: str = "call_1") -> RunningTurn:
    """A turn waiting for approval of `call_id`, after an earlier call that has its result."""
    turn_id = uuid.uuid4()
    log.append(
        tab.id,
        [
            Block(uuid.uuid4(), turn_id, 0, "user", "text", {"text": "list"}),
            Block(uuid.uuid4(), turn_id, 1, "assistant", "tool_call", tool_call("call_0")),
            Block(uuid.uuid4(), turn_id, 1, "tool", "tool_result", tool_result("call_0")),
            Block(uuid.uuid4(), turn_id, 2, "assistant", "tool_call", tool_call(call_id)),
        ],
    )
    return RunningTurn.objects.create(
        tab=tab,
        turn_id=turn_id,
        worker="w",
        heartbeat_at=timezone.now(),
        step=2,
        status=RunningTurn.Status.WAITING,
    )


def tool_call(call_id: str) -> dict:
    return {"call_id": call_id, "name": "shell", "arguments": {"command": "ls"}}


def tool_result(call_id: str) -> dict:
    return {"call_id": call_id, "name": "shell", "result": "a\nb", "is_error": False}


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def control_channel(tab: Tab) -> str:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(bus.control_group(tab.id), channel)
    return channel


# --- Tabs ------------------------------------------------------------------------------------


def test_it_lists_only_the_users_tabs_newest_first_in_pages(api, alice, bob):
    """GET /tabs pages by offset over the user's own tabs, most recently active first."""
    mine = [Tab.objects.create(owner=alice, title=f"t{i}") for i in range(3)]
    Tab.objects.create(owner=bob, title="bob's")
    first = api.get("/api/v1/tabs", {"limit": "2"}).json()
    assert [t["title"] for t in first["tabs"]] == ["t2", "t1"]
    assert first["has_more"] is True and first["next_offset"] == 2
    second = api.get("/api/v1/tabs", {"limit": "2", "offset": "2"}).json()
    assert [t["id"] for t in second["tabs"]] == [str(mine[0].id)]
    assert second["has_more"] is False and second["next_offset"] is None


def test_it_creates_a_tab_with_the_settings_defaults(api, alice):
    """POST /tabs with nothing takes the model and system prompt a new tab gets on the page."""
    Setting.objects.create(key="system_prompt", value="Answer in French.")
    Setting.objects.create(key="default_model", value="offline/demo")
    response = api.post("/api/v1/tabs", {})
    assert response.status_code == 201
    body = response.json()
    tab = Tab.objects.get(pk=body["id"])
    assert tab.owner == alice
    assert (tab.model, tab.system_prompt) == ("offline/demo", "Answer in French.")
    assert response["Location"] == f"/api/v1/tabs/{tab.id}"
    status = body["status"]
    assert (status["state"], status["queued"]) == ("idle", [])
    assert status["context"]["used"] == 0 and status["context"]["window_known"] is True


def test_it_creates_a_tab_as_asked(api):
    """Title, model and system prompt from the body; an explicit empty prompt stays empty."""
    body = {"title": " Plans ", "model": "offline/demo", "system_prompt": ""}
    created = api.post("/api/v1/tabs", body).json()
    tab = Tab.objects.get(pk=created["id"])
    assert (tab.title, tab.model, tab.system_prompt) == ("Plans", "offline/demo", "")


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": "gpt"}, "is not a model id"),
        ({"model": "nosuch/model"}, "Unknown provider “nosuch”"),
        ({"model": "offline/other"}, "The offline provider has one model"),
        ({"title": "x" * 201}, "at most 200 characters"),
        ({"system_prompt": "x" * 20_001}, "at most 20000 characters"),
    ],
)
def test_it_refuses_a_tab_it_cannot_create(api, body, message):
    """The model is checked as the Settings form checks it; nothing is created."""
    response = api.post("/api/v1/tabs", body)
    assert response.status_code == 422
    assert message in error_of(response)["message"]
    assert not Tab.objects.exists()


def test_it_shows_an_idle_tab(api, tab):
    seed(tab, 3)
    QueuedMessage.objects.create(tab=tab, text="later")
    body = api.get(f"/api/v1/tabs/{tab.id}").json()
    assert body["title"] == "notes" and body["model"] == "offline/demo"
    assert body["system_prompt"] == "hi"
    assert body["total"] == 3
    assert body["state"] == "idle"
    assert body["status"]["state"] == "idle" and len(body["status"]["queued"]) == 1


def test_it_shows_a_running_turn_with_its_step_and_usage(api, alice, tab):
    running = RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now(), step=3
    )
    UsageRecord.objects.create(
        user=alice,
        tab_id=tab.id,
        turn_id=running.turn_id,
        step=1,
        model="m",
        input_tokens=10,
        output_tokens=4,
    )
    status = api.get(f"/api/v1/tabs/{tab.id}").json()["status"]
    assert status["state"] == "running"
    assert status["turn_id"] == str(running.turn_id)
    assert status["step"] == 3
    assert status["usage"] == {"input": 10, "output": 4, "cache_read": 0, "cache_write": 0}
    assert "call" not in status
    listed = api.get("/api/v1/tabs").json()["tabs"]
    assert listed[0]["state"] == "running"


def test_it_shows_the_call_a_waiting_turn_asks_about(api, tab):
    """The first call of the turn without a result is the one waiting."""
    waiting_turn(tab, "call_9")
    status = api.get(f"/api/v1/tabs/{tab.id}").json()["status"]
    assert status["state"] == "waiting"
    assert status["call"] == tool_call("call_9")


def test_a_repeated_call_id_waits_on_its_second_use(tab):
    """Servers repeat call ids: a call id answered once is still waiting on its second call."""
    running = waiting_turn(tab, "call_0")
    assert chat_api.waiting_call(tab.id, running.turn_id) == tool_call("call_0")


# --- Chunks ----------------------------------------------------------------------------------


def test_it_pages_the_log_backwards(api, tab):
    seed(tab, 5)
    newest = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"limit": "2"}).json()
    assert [c["seq"] for c in newest["chunks"]] == [4, 5]
    assert newest["total"] == 5
    assert (newest["has_more"], newest["next_before"], newest["next_after"]) == (True, 4, None)
    chunk = newest["chunks"][0]
    stored = Chunk.objects.get(tab=tab, seq=4)
    assert chunk["id"] == str(stored.id)
    assert chunk["data"] == {"text": "message 3"}
    assert (chunk["role"], chunk["type"], chunk["step"], chunk["turn_id"]) == (
        "user",
        "text",
        0,
        None,
    )
    older = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"limit": "2", "before": "4"}).json()
    assert [c["seq"] for c in older["chunks"]] == [2, 3]
    oldest = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"limit": "2", "before": "2"}).json()
    assert [c["seq"] for c in oldest["chunks"]] == [1]
    assert (oldest["has_more"], oldest["next_before"], oldest["next_after"]) == (False, None, 1)


def test_it_pages_the_log_forwards(api, tab):
    seed(tab, 5)
    page = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"limit": "2", "after": "1"}).json()
    assert [c["seq"] for c in page["chunks"]] == [2, 3]
    assert (page["has_more"], page["next_after"], page["next_before"]) == (True, 3, 2)
    last = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"after": "3"}).json()
    assert [c["seq"] for c in last["chunks"]] == [4, 5]
    assert (last["has_more"], last["next_after"]) == (False, None)
    past = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"after": "9"}).json()
    assert past["chunks"] == [] and past["has_more"] is False


def test_an_empty_tab_has_an_empty_page(api, tab):
    body = api.get(f"/api/v1/tabs/{tab.id}/chunks").json()
    assert body == {
        "chunks": [],
        "total": 0,
        "has_more": False,
        "next_before": None,
        "next_after": None,
    }


def test_limit_defaults_to_200_and_is_clamped_to_1000(api, tab):
    seed(tab, 1005)
    default = api.get(f"/api/v1/tabs/{tab.id}/chunks").json()
    assert [c["seq"] for c in default["chunks"]] == list(range(806, 1006))
    clamped = api.get(f"/api/v1/tabs/{tab.id}/chunks", {"limit": "5000"}).json()
    assert [c["seq"] for c in clamped["chunks"]] == list(range(6, 1006))


def test_a_page_below_the_last_seq_is_immutable(api, tab):
    """Strong ETag and a long Cache-Control; the same ETag back gets a 304 without a body."""
    seed(tab, 10)
    url = f"/api/v1/tabs/{tab.id}/chunks"
    response = api.get(url, {"limit": "3", "before": "5"})
    etag = response["ETag"]
    assert etag.startswith('"') and not etag.startswith("W/")
    assert (
        "immutable" in response["Cache-Control"] and "max-age=31536000" in response["Cache-Control"]
    )
    again = api.get(url, {"limit": "3", "before": "5"}, **{"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    other = api.get(url, {"limit": "3", "before": "6"}, **{"If-None-Match": etag})
    assert other.status_code == 200 and other["ETag"] != etag
    forwards = api.get(url, {"limit": "3", "after": "2"})
    assert (
        api.get(
            url, {"limit": "3", "after": "2"}, **{"If-None-Match": forwards["ETag"]}
        ).status_code
        == 304
    )


def test_the_newest_page_is_never_cached(api, tab):
    """A page reaching the last seq grows with the next seal: no ETag, no-cache."""
    seed(tab, 10)
    url = f"/api/v1/tabs/{tab.id}/chunks"
    for params in ({}, {"before": "11"}, {"before": "99"}, {"after": "8"}):
        response = api.get(url, params)
        assert not response.has_header("ETag"), params
        assert response["Cache-Control"] == "private, no-cache"


# --- Turns -----------------------------------------------------------------------------------


def test_it_queues_a_message(api, tab):
    response = api.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "  hello  "})
    assert response.status_code == 202
    queued = QueuedMessage.objects.get(tab=tab)
    assert response.json() == {"id": queued.pk}
    assert queued.text == "hello"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "The message is empty."),
        ("\u200b \n", "The message is empty."),
        ("x" * 100_001, "too long (at most 100000 characters)"),
    ],
)
def test_it_refuses_a_message_it_cannot_send(api, tab, text, message):
    response = api.post(f"/api/v1/tabs/{tab.id}/messages", {"text": text})
    assert response.status_code == 422
    assert message in error_of(response)["message"]
    assert not QueuedMessage.objects.exists()


def test_it_stops_the_running_turn(api, tab):
    channel = control_channel(tab)
    running = RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    response = api.post(f"/api/v1/tabs/{tab.id}/stop", {"turn_id": str(running.turn_id)})
    assert response.status_code == 202
    assert RunningTurn.objects.get(tab=tab).cancel_requested is True
    message = async_to_sync(get_channel_layer().receive)(channel)
    assert message["type"] == "turn.cancel" and message["turn_id"] == str(running.turn_id)


def test_stop_without_a_turn_id_stops_whatever_runs(api, tab):
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    assert api.post(f"/api/v1/tabs/{tab.id}/stop").status_code == 202
    assert RunningTurn.objects.get(tab=tab).cancel_requested is True


def test_stop_of_another_turn_is_a_conflict(api, tab):
    """A stop naming an earlier turn leaves the running one alone, and says so."""
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    response = api.post(f"/api/v1/tabs/{tab.id}/stop", {"turn_id": str(uuid.uuid4())})
    assert response.status_code == 409
    assert "is not running on this tab" in error_of(response)["message"]
    assert RunningTurn.objects.get(tab=tab).cancel_requested is False


def test_stop_of_an_idle_tab_is_a_conflict(api, tab):
    response = api.post(f"/api/v1/tabs/{tab.id}/stop", {})
    assert response.status_code == 409
    assert error_of(response) == {
        "code": "not_running",
        "message": "No turn is running on this tab.",
    }


@pytest.mark.parametrize("approve", [True, False])
def test_it_answers_the_approval_a_turn_waits_for(api, tab, approve):
    waiting_turn(tab, "call_1")
    channel = control_channel(tab)
    response = api.post(f"/api/v1/tabs/{tab.id}/approvals/call_1", {"approve": approve})
    assert response.status_code == 202
    assert response.json() == {"call_id": "call_1", "approve": approve}
    message = async_to_sync(get_channel_layer().receive)(channel)
    assert message == {
        "type": "turn.approve",
        "tab_id": str(tab.id),
        "call_id": "call_1",
        "approved": approve,
    }


def test_an_approval_nobody_waits_for_is_a_conflict(api, tab):
    """Idle tab, running (not waiting) turn, or another call: 409, nothing sent."""
    url = f"/api/v1/tabs/{tab.id}/approvals/call_1"
    response = api.post(url, {"approve": True})
    assert response.status_code == 409
    assert "No turn on this tab waits for approval of 'call_1'" in error_of(response)["message"]
    running = waiting_turn(tab, "call_2")
    assert api.post(url, {"approve": True}).status_code == 409
    RunningTurn.objects.filter(pk=running.pk).update(status=RunningTurn.Status.RUNNING)
    assert api.post(f"/api/v1/tabs/{tab.id}/approvals/call_2", {"approve": True}).status_code == 409


# --- Bad input ---------------------------------------------------------------------------------


def write_routes(tab_id) -> list[tuple[str, dict]]:
    """Every POST route with a body it would accept."""
    return [
        ("/api/v1/tabs", {"title": "t"}),
        (f"/api/v1/tabs/{tab_id}/messages", {"text": "hi"}),
        (f"/api/v1/tabs/{tab_id}/stop", {"turn_id": None}),
        (f"/api/v1/tabs/{tab_id}/approvals/call_1", {"approve": True}),
    ]


def nothing_changed(tab: Tab) -> None:
    assert Tab.objects.count() == 1
    assert not QueuedMessage.objects.exists()
    assert not RunningTurn.objects.filter(cancel_requested=True).exists()


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"{", "not valid JSON: Expecting property name enclosed in double quotes"),
        (b"{'text': 'hi'}", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_it_refuses_a_body_that_is_not_a_json_object(api, tab, raw, message):
    for url, _ in write_routes(tab.id):
        response = api.post(url, raw=raw)
        assert response.status_code == 400, url
        assert message in error_of(response)["message"], url
    nothing_changed(tab)


def test_it_refuses_unknown_fields(api, tab):
    for url, body in write_routes(tab.id):
        response = api.post(url, {**body, "colour": "red"})
        assert response.status_code == 422, url
        assert error_of(response)["message"].startswith("Unknown field(s): colour (known: "), url
    nothing_changed(tab)


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("messages", {"text": 5}, "The field 'text' must be a string."),
        ("messages", {"text": None}, "The field 'text' must be a string."),
        ("messages", {}, "The field 'text' is required."),
        ("stop", {"turn_id": 7}, "The field 'turn_id' must be a UUID string or null."),
        ("stop", {"turn_id": "nope"}, "turn_id must be a UUID, not 'nope'."),
        ("approvals/call_1", {"approve": "yes"}, "The field 'approve' must be true or false."),
        ("approvals/call_1", {"approve": 1}, "The field 'approve' must be true or false."),
        ("approvals/call_1", {}, "The field 'approve' is required."),
    ],
)
def test_it_refuses_wrong_types(api, tab, path, body, message):
    RunningTurn.objects.create(
        tab=tab, turn_id=uuid.uuid4(), worker="w", heartbeat_at=timezone.now()
    )
    response = api.post(f"/api/v1/tabs/{tab.id}/{path}", body)
    assert response.status_code == 422
    assert error_of(response)["message"] == message
    nothing_changed(tab)


def test_it_refuses_wrong_types_for_a_new_tab(api, tab):
    for body in ({"title": 1}, {"model": ["offline/demo"]}, {"system_prompt": False}):
        response = api.post("/api/v1/tabs", body)
        assert response.status_code == 422
        assert error_of(response)["code"] == "wrong_type"
    nothing_changed(tab)


def test_it_refuses_a_new_tab_on_a_model_without_a_key(api, tab, monkeypatch):
    """Its first message would fail: refused at creation, saying where the key goes; with
    the key, the same request makes the tab."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    response = api.post("/api/v1/tabs", {"model": "anthropic/claude-sonnet-4-5"})
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "model_without_key"
    assert "Anthropic has no API key" in error["message"] and "Connections" in error["message"]
    nothing_changed(tab)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-for-this-test")
    assert api.post("/api/v1/tabs", {"model": "anthropic/claude-sonnet-4-5"}).status_code == 201


def test_it_refuses_an_empty_body_where_fields_are_required(api, tab):
    response = api.post(f"/api/v1/tabs/{tab.id}/messages", raw=b"")
    assert response.status_code == 400
    assert error_of(response)["message"] == "The request body is empty: send a JSON object."


def test_it_refuses_a_huge_body_without_reading_it(api, tab):
    limit = chat_api.MAX_BODY_BYTES
    huge = b'{"text": "' + b"x" * (limit + 1) + b'"}'
    response = api.post(f"/api/v1/tabs/{tab.id}/messages", raw=huge)
    assert response.status_code == 413
    assert f"larger than {limit} bytes" in error_of(response)["message"]
    nothing_changed(tab)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"limit": "-1"}, "?limit= must be at least 1."),
        ({"limit": "0"}, "?limit= must be at least 1."),
        ({"limit": "ten"}, "?limit= must be a whole number, not 'ten'."),
        ({"before": "abc"}, "?before= must be a whole number, not 'abc'."),
        ({"before": "0"}, "?before= must be at least 1."),
        ({"after": "-2"}, "?after= must be at least 0."),
        ({"after": "1.5"}, "?after= must be a whole number, not '1.5'."),
        ({"before": "3", "after": "1"}, "Send ?before= or ?after=, not both."),
    ],
)
def test_it_refuses_bad_page_parameters(api, tab, params, message):
    response = api.get(f"/api/v1/tabs/{tab.id}/chunks", params)
    assert response.status_code == 400
    assert error_of(response) == {"code": "invalid_parameter", "message": message}


def test_it_refuses_bad_tab_list_parameters(api):
    response = api.get("/api/v1/tabs", {"offset": "-1"})
    assert response.status_code == 400
    assert error_of(response)["message"] == "?offset= must be at least 0."


def test_another_users_tab_is_not_found(alice, bob):
    """Every route behind a tab id answers 404 for someone else's tab, and changes nothing."""
    theirs = Tab.objects.create(owner=bob, title="bob's")
    waiting_turn(theirs, "call_1")
    api = ApiClient(token=ApiToken.issue(alice)[1])
    for url in (f"/api/v1/tabs/{theirs.id}", f"/api/v1/tabs/{theirs.id}/chunks"):
        response = api.get(url)
        assert response.status_code == 404, url
        assert error_of(response) == {
            "code": "not_found",
            "message": f"No tab {theirs.id} (or it is not yours).",
        }
    for url, body in write_routes(theirs.id)[1:]:
        assert api.post(url, body).status_code == 404, url
    assert not QueuedMessage.objects.exists()
    assert RunningTurn.objects.get(tab=theirs).cancel_requested is False
    assert api.get(f"/api/v1/tabs/{uuid.uuid4()}").status_code == 404


def test_a_wrong_method_is_refused(api, tab):
    """The one response not validated: the spec has no operation for a method it refuses."""
    response = api.client.delete(f"/api/v1/tabs/{tab.id}", headers=api.headers)
    assert response.status_code == 405
    assert response["Allow"] == "GET"
    assert Tab.objects.filter(pk=tab.pk).exists()


# --- Authentication --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, code, message",
    [
        (None, "unauthorized", "Sign in, or send Authorization: Bearer <token>."),
        ("Token abc", "unauthorized", "The Authorization header must be: Bearer <token>."),
        ("Bearer ", "unauthorized", "The Authorization header must be: Bearer <token>."),
        ("Bearer dsp_nope", "invalid_token", "The API token is not valid (revoked or mistyped)."),
    ],
)
def test_it_refuses_a_missing_or_invalid_token(tab, header, code, message):
    api = ApiClient()
    headers = {"Authorization": header} if header else {}
    for response in (
        api.get("/api/v1/tabs", **headers),
        api.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "hi"}, **headers),
    ):
        assert response.status_code == 401
        assert error_of(response) == {"code": code, "message": message}
    assert not QueuedMessage.objects.exists()


def test_a_revoked_token_stops_working(alice, tab):
    row, plain = ApiToken.issue(alice)
    api = ApiClient(token=plain)
    assert api.get("/api/v1/tabs").status_code == 200
    row.delete()
    response = api.get("/api/v1/tabs")
    assert response.status_code == 401
    assert error_of(response)["code"] == "invalid_token"


def test_a_token_of_a_deactivated_user_stops_working(alice, api):
    User.objects.filter(pk=alice.pk).update(is_active=False)
    assert api.get("/api/v1/tabs").status_code == 401


def test_a_read_only_token_reads_but_never_writes(alice, tab):
    api = ApiClient(token=ApiToken.issue(alice, read_only=True)[1])
    assert api.get(f"/api/v1/tabs/{tab.id}").status_code == 200
    assert api.get(f"/api/v1/tabs/{tab.id}/chunks").status_code == 200
    waiting_turn(tab, "call_1")
    for url, body in write_routes(tab.id):
        response = api.post(url, body)
        assert response.status_code == 403, url
        assert error_of(response)["code"] == "read_only_token", url
    nothing_changed(tab)


def test_the_stored_token_is_a_hash_and_its_prefix(alice):
    row, plain = ApiToken.issue(alice, name="ci")
    assert plain.startswith("dsp_") and len(plain) > 40
    assert plain not in (row.token_hash, row.prefix)
    assert row.prefix == plain[:12]
    assert row.token_hash == ApiToken.hash(plain)


def test_last_used_is_written_at_most_once_a_minute(alice, token, api):
    row = ApiToken.objects.get()
    assert row.last_used_at is None
    api.get("/api/v1/tabs")
    row.refresh_from_db()
    first = row.last_used_at
    assert first is not None
    recent = timezone.now() - timedelta(seconds=30)
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=recent)
    api.get("/api/v1/tabs")
    row.refresh_from_db()
    assert row.last_used_at == recent
    stale = timezone.now() - timedelta(minutes=2)
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=stale)
    api.get("/api/v1/tabs")
    row.refresh_from_db()
    assert row.last_used_at > stale + timedelta(minutes=1)


def test_a_session_works_and_its_writes_need_the_csrf_token(alice, tab):
    """Same-origin pages use the session; without the CSRF token a write is refused."""
    session = ApiClient(user=alice, csrf=True)
    assert session.get("/api/v1/tabs").status_code == 200
    response = session.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "hi"})
    assert response.status_code == 403
    assert error_of(response)["message"].startswith("CSRF check failed: ")
    assert not QueuedMessage.objects.exists()
    session.client.get(f"/t/{tab.id}/")  # a page with a form sets the CSRF cookie
    csrf = session.client.cookies["csrftoken"].value
    ok = session.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "hi"}, **{"X-CSRFToken": csrf})
    assert ok.status_code == 202


def test_a_token_needs_no_csrf_token(token, tab):
    """A browser never adds an Authorization header by itself: no CSRF check for tokens."""
    api = ApiClient(token=token, csrf=True)
    assert api.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "hi"}).status_code == 202


LIMIT = django_settings.AXES_FAILURE_LIMIT


def test_token_failures_are_rate_limited_like_sign_ins(alice, token):
    """After the sign-in failure limit from one address, that address gets a JSON 429 with
    Retry-After, even with a good token; another address is not affected."""
    guesser = ApiClient(address=ADDRESS)
    for _ in range(LIMIT - 1):
        response = guesser.get("/api/v1/tabs", Authorization="Bearer dsp_guess")
        assert response.status_code == 401
    locking = guesser.get("/api/v1/tabs", Authorization="Bearer dsp_guess")
    assert locking.status_code == 429
    assert error_of(locking)["code"] == "too_many_attempts"
    assert int(locking["Retry-After"]) > 0
    locked = guesser.get("/api/v1/tabs", Authorization=f"Bearer {token}")
    assert locked.status_code == 429
    assert error_of(locked)["message"].startswith(
        "Too many failed API token attempts from this address. Try again in "
    )
    assert int(locked["Retry-After"]) > 0
    elsewhere = ApiClient(token=token, address="198.51.100.1").get("/api/v1/tabs")
    assert elsewhere.status_code == 200


def test_a_json_body_counts_whatever_its_content_type(api, tab):
    """curl -d sends form encoding's content type: the body is read as JSON all the same."""
    response = api.post(
        f"/api/v1/tabs/{tab.id}/messages",
        raw=b'{"text": "hi"}',
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 202
    assert QueuedMessage.objects.get().text == "hi"
