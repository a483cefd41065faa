"""The API's branches and continue: POST /tabs/<id>/branch, POST /tabs/<id>/continue,
and a tab's `parent` and `branches`.

Every response goes through tests.api_helpers.ApiClient, which validates it
against openapi.yaml.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat import api as api_module
from chat import bus, cuts, log, resume, turns
from chat.models import ApiToken, Chunk, QueuedMessage, RunningTurn, Tab
from chat.stream import Block
from tests.api_helpers import ApiClient

pytestmark = pytest.mark.django_db

User = get_user_model()
# The fields a branch copies verbatim (ids and the tab are its own).
COPIED = ("seq", "turn_id", "step", "role", "type", "data")


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


@pytest.fixture
def api(alice) -> ApiClient:
    return ApiClient(token=ApiToken.issue(alice, name="laptop")[1])


@pytest.fixture
def tab(alice) -> Tab:
    """Two finished turns:

    1 user "list files"            turn 1, step 0
    2 assistant tool_call c1       turn 1, step 1
    3 tool result c1               turn 1, step 1
    4 assistant text "two files"   turn 1, step 2
    5 user "thanks"                turn 2, step 0
    6 assistant text "welcome"     turn 2, step 1

    Valid cuts: 0, 1, 3, 4, 5, 6; 2 is in the middle of step 1.
    """
    tab = Tab.objects.create(
        owner=alice, title="notes", model="offline/demo", system_prompt="Be brief."
    )
    first, second = uuid.uuid4(), uuid.uuid4()
    call = {"call_id": "c1", "name": "list_files", "arguments": {"path": "."}}
    result = {"call_id": "c1", "name": "list_files", "result": "a\nb", "is_error": False}
    log.append(
        tab.id,
        [
            Block(uuid.uuid4(), first, 0, "user", "text", {"text": "list files"}),
            Block(uuid.uuid4(), first, 1, "assistant", "tool_call", call),
            Block(uuid.uuid4(), first, 1, "tool", "tool_result", result),
            Block(uuid.uuid4(), first, 2, "assistant", "text", {"text": "two files"}),
            Block(uuid.uuid4(), second, 0, "user", "text", {"text": "thanks"}),
            Block(uuid.uuid4(), second, 1, "assistant", "text", {"text": "welcome"}),
        ],
    )
    tab.refresh_from_db()
    return tab


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def copied(chunks: list[dict]) -> list[tuple]:
    return [tuple(chunk[field] for field in COPIED) for chunk in chunks]


def log_of(api: ApiClient, tab_id) -> list[dict]:
    return api.get(f"/api/v1/tabs/{tab_id}/chunks").json()["chunks"]


# What the tests' requests sent to the turn workers (turn.start), in order.
_worker_messages: list[dict] = []


@pytest.fixture(autouse=True)
def _record_worker_messages(monkeypatch):
    """bus.send, recording what goes to the workers (nothing runs them here)."""
    send = bus.send

    def recording(channel: str, message: dict) -> None:
        if channel == bus.WORKER_CHANNEL:
            _worker_messages.append(message)
        send(channel, message)

    _worker_messages.clear()
    monkeypatch.setattr(bus, "send", recording)


def worker_channel_messages() -> list[dict]:
    return list(_worker_messages)


def turn_of(tab: Tab, seq: int) -> uuid.UUID:
    return Chunk.objects.get(tab=tab, seq=seq).turn_id


def running(tab: Tab, turn_id: uuid.UUID) -> RunningTurn:
    return RunningTurn.objects.create(
        tab=tab, turn_id=turn_id, worker="w", heartbeat_at=timezone.now()
    )


# --- Branch ------------------------------------------------------------------------------


def test_it_branches_a_tab_with_a_verbatim_copy_and_a_forked_chunk(api, tab):
    """201 with the new tab; its log is the parent's up to the cut, field for field,
    then one system `forked` chunk; the parent is untouched."""
    before = log_of(api, tab.id)
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert response.status_code == 201
    body = response.json()
    child = Tab.objects.get(pk=body["id"])
    assert response["Location"] == f"/api/v1/tabs/{child.id}"
    assert body["parent"] == {"id": str(tab.id), "at_seq": 4}
    assert body["branches"] == []
    assert body["total"] == 5
    assert (body["title"], body["model"], body["system_prompt"]) == (
        "notes",
        "offline/demo",
        "Be brief.",
    )
    assert (child.owner_id, child.parent_id, child.fork_seq) == (tab.owner_id, tab.id, 4)

    branch_log = log_of(api, child.id)
    assert copied(branch_log[:4]) == copied(before[:4])
    assert {c["id"] for c in branch_log[:4]}.isdisjoint(c["id"] for c in before)
    forked = branch_log[4]
    assert (forked["seq"], forked["turn_id"], forked["role"], forked["type"]) == (
        5,
        None,
        "system",
        "system",
    )
    assert forked["data"] == {
        "kind": "forked",
        "text": "Branched from “notes”.",
        "from_tab": str(tab.id),
        "at_seq": 4,
        "action": "branch",
        "run": False,
    }
    assert len(branch_log) == 5

    assert log_of(api, tab.id) == before
    tab.refresh_from_db()
    assert tab.last_seq == 6 and tab.parent_id is None
    assert not QueuedMessage.objects.exists()
    assert worker_channel_messages() == []


def test_a_tab_shows_its_branches_and_a_branch_its_parent(api, tab):
    """GET /tabs/<id> lists the branches by cut, then oldest first; the list of tabs
    shows each tab's parent and leaves branches out."""
    url = f"/api/v1/tabs/{tab.id}/branch"
    late = api.post(url, {"at_seq": 5}).json()
    early = api.post(url, {"at_seq": 1}).json()
    middle = api.post(url, {"at_seq": 4}).json()
    Tab.objects.filter(pk=early["id"]).update(
        title="the other way",
        created_at=timezone.now() - turns.REPEAT_WINDOW - timedelta(seconds=1),
    )
    early_again = api.post(url, {"at_seq": 1}).json()
    shown = api.get(f"/api/v1/tabs/{tab.id}").json()
    assert shown["parent"] is None
    assert [(b["id"], b["title"], b["at_seq"]) for b in shown["branches"]] == [
        (early["id"], "the other way", 1),
        (early_again["id"], "notes", 1),
        (middle["id"], "notes", 4),
        (late["id"], "notes", 5),
    ]
    assert shown["branches"][3]["created_at"] == late["created_at"]
    listed = {t["id"]: t for t in api.get("/api/v1/tabs").json()["tabs"]}
    assert listed[late["id"]]["parent"] == {"id": str(tab.id), "at_seq": 5}
    assert listed[str(tab.id)]["parent"] is None
    assert all("branches" not in t for t in listed.values())


def test_a_branch_outlives_its_parent(api, tab):
    """Deleting the parent leaves the branch whole; its parent id becomes null and
    the cut stays."""
    child = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 3}).json()
    tab.delete()
    shown = api.get(f"/api/v1/tabs/{child['id']}").json()
    assert shown["parent"] == {"id": None, "at_seq": 3}
    assert [c["seq"] for c in log_of(api, child["id"])] == [1, 2, 3, 4]


def test_a_branch_at_zero_starts_before_the_first_message(api, tab):
    body = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 0}).json()
    assert body["parent"]["at_seq"] == 0
    assert [c["data"]["kind"] for c in log_of(api, body["id"])] == ["forked"]


def test_the_same_branch_asked_again_soon_is_the_same_tab(api, tab):
    """A double click or a retried request within REPEAT_WINDOW: 200 with the branch
    made first, nothing new; after the window, a new branch."""
    first = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    again = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert not again.has_header("Location")
    assert Tab.objects.count() == 2
    other_cut = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 3})
    assert other_cut.status_code == 201
    Tab.objects.filter(pk=first.json()["id"]).update(
        created_at=timezone.now() - turns.REPEAT_WINDOW - timedelta(seconds=1)
    )
    later = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert later.status_code == 201
    assert later.json()["id"] not in (first.json()["id"], other_cut.json()["id"])
    assert Tab.objects.count() == 4


def test_run_starts_a_turn_answering_the_branch(api, tab):
    """run: true after a user message queues a rerun (never shown as a message) and asks
    the workers to run the new tab."""
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 5, "run": True})
    assert response.status_code == 201
    body = response.json()
    queued = QueuedMessage.objects.get()
    assert (str(queued.tab_id), queued.rerun, queued.text) == (body["id"], True, "")
    assert (body["status"]["state"], body["status"]["queued"]) == ("idle", [])
    assert worker_channel_messages() == [{"type": "turn.start", "tab_id": body["id"]}]
    assert not QueuedMessage.objects.filter(tab=tab).exists()


def test_run_false_is_a_plain_branch(api, tab):
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 5, "run": False})
    assert response.status_code == 201
    assert not QueuedMessage.objects.exists()
    assert worker_channel_messages() == []


def test_a_branch_before_the_running_turn_is_allowed(api, tab):
    """A turn running on the tab refuses only cuts inside it."""
    running(tab, turn_of(tab, 5))
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert response.status_code == 201


# --- Branch: bad input ---------------------------------------------------------------------


def nothing_changed(tab: Tab, before: list[tuple]) -> None:
    assert list(Tab.objects.values_list("id", flat=True)) == [tab.id]
    assert copied([log.as_json(c) for c in Chunk.objects.filter(tab=tab).order_by("seq")]) == before
    assert not QueuedMessage.objects.exists()
    assert worker_channel_messages() == []


@pytest.mark.parametrize(
    "body, status, code, message",
    [
        ({}, 422, "missing_field", "The field 'at_seq' is required."),
        ({"at_seq": "3"}, 422, "wrong_type", "The field 'at_seq' must be an integer."),
        ({"at_seq": 3.0}, 422, "wrong_type", "The field 'at_seq' must be an integer."),
        ({"at_seq": True}, 422, "wrong_type", "The field 'at_seq' must be an integer."),
        ({"at_seq": None}, 422, "wrong_type", "The field 'at_seq' must be an integer."),
        ({"at_seq": [3]}, 422, "wrong_type", "The field 'at_seq' must be an integer."),
        (
            {"at_seq": 3, "run": "yes"},
            422,
            "wrong_type",
            "The field 'run' must be true or false.",
        ),
        (
            {"at_seq": 3, "action": "edit"},
            422,
            "unknown_field",
            "Unknown field(s): action (known: at_seq, run).",
        ),
        (
            {"at_seq": -1},
            422,
            "invalid_value",
            "at_seq must be at least 0 (0: before the first chunk).",
        ),
        ({"at_seq": 7}, 422, "invalid_cut", "There is no message 7 in this tab."),
        # Past a 64-bit column: no such row, not a database error.
        ({"at_seq": 2**70}, 422, "invalid_cut", f"There is no message {2**70} in this tab."),
        ({"at_seq": 2}, 422, "invalid_cut", cuts.MID_STEP),
        ({"at_seq": 4, "run": True}, 422, "invalid_cut", turns.NOTHING_TO_ANSWER),
        ({"at_seq": 6, "run": True}, 422, "invalid_cut", turns.NOTHING_TO_ANSWER),
    ],
)
def test_it_refuses_a_branch_it_cannot_make(api, tab, body, status, code, message):
    before = copied(log_of(api, tab.id))
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", body)
    assert response.status_code == status
    assert error_of(response) == {"code": code, "message": message}
    nothing_changed(tab, before)


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"", "The request body is empty: send a JSON object."),
        (b"{", "The request body is not valid JSON: Expecting property name"),
        (b'{"at_seq": 3', "The request body is not valid JSON: Expecting ',' delimiter"),
        (b"[3]", "The request body must be a JSON object."),
        (b"3", "The request body must be a JSON object."),
        (b"\xff", "The request body is not UTF-8."),
    ],
)
def test_it_refuses_a_branch_body_that_is_not_a_json_object(api, tab, raw, message):
    before = copied(log_of(api, tab.id))
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", raw=raw)
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"
    assert error_of(response)["message"].startswith(message)
    nothing_changed(tab, before)


def test_it_refuses_a_cut_with_a_call_still_unanswered(api, alice):
    """A step whose call has no result (a crashed turn not yet recovered) is no cut."""
    tab = Tab.objects.create(owner=alice, title="t", model="offline/demo")
    turn = uuid.uuid4()
    call = {"call_id": "c1", "name": "shell", "arguments": {"command": "ls"}}
    log.append(
        tab.id,
        [
            Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "ls"}),
            Block(uuid.uuid4(), turn, 1, "assistant", "tool_call", call),
        ],
    )
    before = copied(log_of(api, tab.id))
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 2})
    assert response.status_code == 422
    assert error_of(response) == {"code": "invalid_cut", "message": cuts.UNANSWERED}
    nothing_changed(tab, before)


def test_it_refuses_to_branch_an_empty_tab(api, alice):
    tab = Tab.objects.create(owner=alice, title="empty", model="offline/demo")
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 0})
    assert response.status_code == 422
    assert error_of(response) == {"code": "invalid_cut", "message": cuts.EMPTY}
    nothing_changed(tab, [])


@pytest.mark.parametrize("at_seq", [5, 6])
def test_it_refuses_a_cut_inside_the_running_turn(api, tab, at_seq):
    before = copied(log_of(api, tab.id))
    running(tab, turn_of(tab, 5))
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": at_seq})
    assert response.status_code == 409
    assert error_of(response) == {"code": "turn_running", "message": cuts.RUNNING}
    nothing_changed(tab, before)


def test_another_users_tab_cannot_be_branched(alice, bob, tab):
    before = copied([log.as_json(c) for c in Chunk.objects.filter(tab=tab).order_by("seq")])
    api = ApiClient(token=ApiToken.issue(bob)[1])
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert response.status_code == 404
    assert error_of(response) == {
        "code": "not_found",
        "message": f"No tab {tab.id} (or it is not yours).",
    }
    nothing_changed(tab, before)
    assert api.post(f"/api/v1/tabs/{uuid.uuid4()}/branch", {"at_seq": 4}).status_code == 404


def test_a_read_only_token_cannot_branch(alice, tab):
    api = ApiClient(token=ApiToken.issue(alice, read_only=True)[1])
    before = copied(log_of(api, tab.id))
    response = api.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert response.status_code == 403
    assert error_of(response)["code"] == "read_only_token"
    nothing_changed(tab, before)


def test_a_session_needs_the_csrf_token_to_branch(alice, tab):
    session = ApiClient(user=alice, csrf=True)
    response = session.post(f"/api/v1/tabs/{tab.id}/branch", {"at_seq": 4})
    assert response.status_code == 403
    assert error_of(response)["code"] == "csrf_failed"
    assert Tab.objects.count() == 1


def test_branch_is_post_only(api, tab):
    """Not validated: the spec has no operation for a method it refuses."""
    response = api.client.get(f"/api/v1/tabs/{tab.id}/branch", headers=api.headers)
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert Tab.objects.count() == 1


# --- Continue ------------------------------------------------------------------------------


def cut_short(tab: Tab, kind: str = "output-limit") -> None:
    """A third turn on `tab` that stopped while writing (a limit, Stop, a restart)."""
    turn = uuid.uuid4()
    log.append(
        tab.id,
        [
            Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "write a story"}),
            Block(uuid.uuid4(), turn, 1, "assistant", "text", {"text": "Once upon a time"}),
            Block(uuid.uuid4(), turn, 1, "system", "system", {"kind": kind, "text": "cut"}),
        ],
    )


@pytest.mark.parametrize("kind", ["output-limit", "cancelled", "interrupted", "step-limit"])
def test_it_continues_a_turn_that_was_cut_short(api, tab, kind):
    """202 with the queued message, resume's account of what was cut and where; the
    workers are asked to run it."""
    cut_short(tab, kind)
    last_turn = list(Chunk.objects.filter(tab=tab, seq__gt=6).order_by("seq"))
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 202
    queued = QueuedMessage.objects.get()
    assert response.json() == {"id": queued.pk, "text": queued.text}
    assert queued.text == resume.message(last_turn)
    assert "Once upon a time" in queued.text
    assert (queued.tab_id, queued.rerun) == (tab.id, False)
    assert worker_channel_messages() == [{"type": "turn.start", "tab_id": str(tab.id)}]
    status = api.get(f"/api/v1/tabs/{tab.id}").json()["status"]
    assert status["queued"] == [queued.pk]


def test_continue_takes_an_empty_object(api, tab):
    cut_short(tab)
    assert api.post(f"/api/v1/tabs/{tab.id}/continue", {}).status_code == 202


def nothing_queued() -> None:
    assert not QueuedMessage.objects.exists()
    assert worker_channel_messages() == []


def test_a_turn_that_finished_has_nothing_to_continue(api, tab):
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 409
    assert error_of(response) == {"code": "cannot_continue", "message": resume.NOTHING}
    nothing_queued()


def test_an_empty_tab_has_nothing_to_continue(api, alice):
    tab = Tab.objects.create(owner=alice, title="empty", model="offline/demo")
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 409
    assert error_of(response) == {"code": "cannot_continue", "message": resume.EMPTY}
    nothing_queued()


def test_continue_while_a_turn_runs_is_a_conflict(api, tab):
    cut_short(tab)
    running(tab, uuid.uuid4())
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 409
    assert error_of(response) == {
        "code": "cannot_continue",
        "message": "A turn is running: wait for it to end, or stop it, first.",
    }
    nothing_queued()


def test_continue_while_a_message_waits_is_a_conflict(api, tab):
    cut_short(tab)
    waiting = QueuedMessage.objects.create(tab=tab, text="next")
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 409
    assert error_of(response)["message"] == "A message is already waiting to start the next turn."
    assert list(QueuedMessage.objects.all()) == [waiting]


@pytest.mark.parametrize(
    "raw, status, message",
    [
        (b'{"text": "go on"}', 422, "Unknown field(s): text (known: none)."),
        (b"{", 400, "The request body is not valid JSON: Expecting property name"),
        (b"[]", 400, "The request body must be a JSON object."),
    ],
)
def test_continue_refuses_a_body_it_does_not_take(api, tab, raw, status, message):
    cut_short(tab)
    response = api.post(f"/api/v1/tabs/{tab.id}/continue", raw=raw)
    assert response.status_code == status
    assert error_of(response)["message"].startswith(message)
    nothing_queued()


def test_another_users_tab_cannot_be_continued(bob, tab):
    cut_short(tab)
    api = ApiClient(token=ApiToken.issue(bob)[1])
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
    nothing_queued()


def test_a_read_only_token_cannot_continue(alice, tab):
    cut_short(tab)
    api = ApiClient(token=ApiToken.issue(alice, read_only=True)[1])
    response = api.post(f"/api/v1/tabs/{tab.id}/continue")
    assert response.status_code == 403
    assert error_of(response)["code"] == "read_only_token"
    nothing_queued()


def test_a_finishing_turn_is_idle_in_the_tab_list_as_in_the_tab(api, tab):
    """Its end is in the log (the moment between idle and the lease's release)."""
    RunningTurn.objects.create(
        tab=tab,
        turn_id=uuid.uuid4(),
        worker="w",
        heartbeat_at=timezone.now(),
        status=RunningTurn.Status.FINISHING,
    )
    listed = {t["id"]: t for t in api.get("/api/v1/tabs").json()["tabs"]}
    assert listed[str(tab.id)]["state"] == "idle"
    assert api.get(f"/api/v1/tabs/{tab.id}").json()["status"]["state"] == "idle"


@pytest.mark.parametrize("route", ["branch", "continue"])
def test_a_tab_deleted_while_the_request_runs_is_a_404(api, tab, route, monkeypatch):
    found = api_module._get_tab

    def found_then_deleted(request, tab_id):
        tab = found(request, tab_id)
        Tab.objects.filter(pk=tab_id).delete()
        return tab

    monkeypatch.setattr(api_module, "_get_tab", found_then_deleted)
    body = {"at_seq": 1} if route == "branch" else {}
    response = api.post(f"/api/v1/tabs/{tab.id}/{route}", body)
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"
