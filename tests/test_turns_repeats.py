"""The doom-loop guard: the same tool call (name and arguments) three times in a row in
one turn stops and asks the user, as an ask rule would; and `calls.gate`, the pure
decision of whether a call runs, is refused or waits."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from chat import rules, turns
from chat.providers.base import Finish, TextDelta, ToolCallEvent, ToolResultPart
from chat.turn import calls
from chat.turn.calls import Gate, Repeats, gate
from tests.engine import Watcher, chunks, make_tab, owner_workspace, running_worker, submit


def decision(action: str) -> rules.Decision:
    return rules.Decision(action, (rules.parse(action, "read_file"),))


ALLOW, ASK, DENY = (decision(a) for a in (rules.ALLOW, rules.ASK, rules.DENY))

# (rule decision, tool, approve_tools, auto_approve, unattended, repeated) -> gate
GATES = [
    # No rule: the approval setting decides for tools that need it.
    (None, "read_file", False, False, False, False, Gate.RUN),
    (None, "read_file", True, False, False, False, Gate.RUN),  # needs no approval
    (None, "shell", False, False, False, False, Gate.RUN),
    (None, "shell", True, False, False, False, Gate.ASK),
    (None, "shell", True, True, False, False, Gate.RUN),  # auto-approved message
    (None, "shell", True, False, True, False, Gate.UNATTENDED),
    # Rules win over the setting, either way.
    (ALLOW, "shell", True, False, False, False, Gate.RUN),
    (ASK, "shell", False, False, False, False, Gate.ASK),
    (ASK, "shell", False, True, False, False, Gate.ASK),  # auto-approval never skips a rule
    (ASK, "shell", False, False, True, False, Gate.UNATTENDED),
    (DENY, "shell", False, False, False, False, Gate.DENY),
    (DENY, "shell", False, False, True, True, Gate.DENY),
    # A tool that always asks, unless the message was sent auto-approved.
    (None, "schedule_wake", False, False, False, False, Gate.ASK),
    (ALLOW, "schedule_wake", False, False, False, False, Gate.ASK),
    (None, "schedule_wake", False, True, False, False, Gate.RUN),
    # The same call again asks whatever the setting and an allow rule say.
    (None, "read_file", False, False, False, True, Gate.ASK),
    (ALLOW, "shell", False, False, False, True, Gate.ASK),
    (None, "read_file", False, False, True, True, Gate.UNATTENDED),
    (None, "read_file", False, True, False, True, Gate.RUN),
]


@pytest.mark.parametrize(
    ("decided", "tool", "approve_tools", "auto_approve", "unattended", "repeated", "expected"),
    GATES,
)
def test_the_gate_of_a_call(
    decided, tool, approve_tools, auto_approve, unattended, repeated, expected
):
    """Whether a call runs, is refused or waits is a function of its inputs alone."""
    got = gate(
        decided,
        tool,
        approve_tools=approve_tools,
        auto_approve=auto_approve,
        unattended=unattended,
        repeated=repeated,
    )
    assert got == expected


def test_repeats_count_the_same_call_in_a_row_only():
    """Three of the same call in a row trip the guard, and each one after; another call
    or other arguments between start the count again. Key order does not matter."""
    seen = Repeats()
    marks = [
        seen.see("read_file", {"path": "a", "x": 1}),
        seen.see("read_file", {"x": 1, "path": "a"}),
        seen.see("read_file", {"path": "a", "x": 1}),
        seen.see("read_file", {"path": "a", "x": 1}),
        seen.see("read_file", {"path": "b", "x": 1}),
        seen.see("list_files", {"path": "b", "x": 1}),
        seen.see("list_files", {"path": "b", "x": 1}),
    ]
    assert marks == [False, False, True, True, False, False, False]


def read(call_id: str, path: str = "notes.txt") -> list:
    return [ToolCallEvent(call_id, "read_file", {"path": path}), Finish(stop_reason="tool_use")]


def waiting_for(call_id: str):
    return lambda m: (
        m["op"] == "status" and (m["status"].get("approval") or {}).get("call_id") == call_id
    )


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "notes.txt").write_text("hello from notes\n")
    return workspace


async def _three_reads(script, approved: bool) -> tuple[list, list, object]:
    provider = script(read("r1"), read("r2"), read("r3"), [TextDelta("done"), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "read it")
            asked = await watcher.until(waiting_for("r3"))
            await database_sync_to_async(turns.approve)(tab.pk, "r3", approved)
            await watcher.until_idle()
    return await chunks(tab.pk), watcher.ops, (asked, provider)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_third_same_call_waits_and_runs_once_approved(script, workspace):
    """Approval off, read_file needs none: the first two reads run unasked, the third
    identical one waits for the user with a notice saying why; approved, it runs."""
    rows, ops, (asked, _) = await _three_reads(script, approved=True)
    assert asked["status"]["approval"]["repeated"] is True
    asking = [m for m in ops if m["op"] == "status" and (m["status"].get("approval") or {})]
    assert {m["status"]["approval"]["call_id"] for m in asking} == {"r3"}
    notices = [r.data for r in rows if r.type == "system" and r.data["kind"] == "repeated-call"]
    assert len(notices) == 1 and notices[0]["call_id"] == "r3"
    assert "same read_file call 3 times in a row" in notices[0]["text"]
    results = {r.data["call_id"]: r.data for r in rows if r.type == "tool_result"}
    assert all(results[c]["result"] == "hello from notes\n" for c in ("r1", "r2", "r3"))
    assert rows[-1].data["text"] == "done"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_denied_repeat_is_refused_with_a_result_the_model_sees(script, workspace):
    """Denied, the repeated call is answered with an error saying why, and the next
    request carries that answer to the model."""
    rows, _, (_, provider) = await _three_reads(script, approved=False)
    result = next(r.data for r in rows if r.type == "tool_result" and r.data["call_id"] == "r3")
    assert result["is_error"] and result["result"] == calls.REPEAT_DENIED
    sent = [
        part
        for message in provider.requests[-1].messages
        for part in message.parts
        if isinstance(part, ToolResultPart) and part.call_id == "r3"
    ]
    assert [(p.result, p.is_error) for p in sent] == [(calls.REPEAT_DENIED, True)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_calls_that_differ_never_ask(script, workspace):
    """Reads of other files in between, or with other arguments, are not a loop."""
    (workspace / "other.txt").write_text("other\n")
    script(
        read("r1"),
        read("r2"),
        read("r3", "other.txt"),
        read("r4"),
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "read them")
            await watcher.until_idle()
    assert not [m for m in watcher.ops if m["op"] == "status" and m["status"].get("approval")]
    rows = await chunks(tab.pk)
    assert sum(r.type == "tool_result" and not r.data["is_error"] for r in rows) == 4
