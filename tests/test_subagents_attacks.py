"""Sub-agents under attack: what a child may do (never more than its parent), calls that
repeat an id, a child stopped before it starts, a tree of children (its depth, its
usage), a parent recovered twice or deleted, an empty last step, limits that hold across
re-attaching. Scripted providers at the boundary, as in test_subagents."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import log, turns, worker
from chat.history import History
from chat.models import Chunk, PermissionRule, Profile, QueuedMessage, RunningTurn, Tab
from chat.preferences import new_tab
from chat.providers.base import Finish, TextDelta, Usage
from chat.stream import Block
from chat.tools import shell
from chat.turn import agents, lease
from tests import test_subagents as base
from tests.engine import Watcher, chunks, kinds, make_tab, running_worker, submit
from tests.test_subagents import call, child_of, child_pk, delegate, result_of, run_parent, tail

# The scripted providers and the workspace of test_subagents.
tabs = base.tabs
workspace = base.workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def children_running(message) -> bool:
    return message["op"] == "status" and [
        c["state"] for c in message["status"].get("children", [])
    ] == ["running"]


async def kill_parent_worker(tab) -> None:
    """Make the tab's runner look dead (a stale lease of another host), recover it, and
    wait for the old runner to notice it lost the lease."""
    dead = worker.RUNNING[tab.pk]
    recovered = []
    while not recovered:  # again if the runner's heartbeat came in between
        await RunningTurn.objects.filter(tab_id=tab.pk).aupdate(
            worker="elsewhere:1:gone", heartbeat_at=timezone.now() - timedelta(minutes=5)
        )
        recovered = await database_sync_to_async(lease.recover_stale)()
    assert recovered == [tab.pk]
    while not dead.lease_lost:
        await asyncio.sleep(0.05)


async def valid_history(tab_id) -> History:
    """The tab's log as the next request reads it: every call answered once."""
    history = History.build(await database_sync_to_async(log.context_tail)(tab_id))
    assert history.open_calls() == []
    return history


# --- 1. a parent recovered twice ------------------------------------------------------


async def test_a_parent_recovered_twice_still_answers_its_agent_call(tabs, monkeypatch):
    """The resumed turn's re-attached call is in the turn before it: the second recovery
    too leaves it open, says the turn goes on and queues the rerun, which answers it with
    the child's text before the parent's next words (no user message needed)."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.1)
    release = asyncio.Event()
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("The child is done."), Finish()],
    )
    tabs.script("work", [TextDelta("started"), release, TextDelta(" and finished"), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(children_running)
            await kill_parent_worker(tab)
            await watcher.until(children_running)  # the resumed turn re-attached
            while worker.RUNNING.get(tab.pk) is None or worker.RUNNING[tab.pk].lease_lost:
                await asyncio.sleep(0.05)
            await kill_parent_worker(tab)
            release.set()
            await watcher.until(
                lambda m: (
                    m["op"] == "seal"
                    and m["block"]["type"] == "text"
                    and m["block"]["role"] == "assistant"
                )
            )
            await watcher.until_idle()
    assert await Tab.objects.filter(parent_tab=tab.pk).acount() == 1
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "system/system",
        "system/system",
        "tool/tool_result",
        "assistant/text",
    ]
    assert all(lease.RESUMING in row.data["text"] for row in rows[2:4])
    result = result_of(rows, "c1")
    assert result.data["is_error"] is False
    assert result.data["result"].startswith("started and finished\n\n")
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()
    await valid_history(tab.pk)


# --- 2. a profile never widens what a child may do ---------------------------------------


async def test_a_childs_profile_cannot_give_it_a_tool_its_parent_lacks(tabs):
    """The parent tab may read files only; the `power` profile allows every tool: the
    child gets the parent's tools, not the shell."""
    readonly = await Profile.objects.acreate(name="readonly", tools=["read_file", "agent"])
    await Profile.objects.acreate(name="power", tools=[])
    parent = tabs.script(
        "go",
        [delegate("c1", "run shell", profile="power"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    child = tabs.script("run shell", [TextDelta("done"), Finish()])
    owner = (await make_tab()).owner
    tab = await database_sync_to_async(new_tab)(owner, "scripted/test", profile=readonly)
    async with running_worker():
        await run_parent(tab)
    assert {t.name for t in parent.requests[0].tools} == {"read_file", "agent"}
    assert {t.name for t in child.requests[0].tools} == {"read_file"}
    kid = await child_of(tab, "c1")
    assert kid.tool_allow == ["agent", "read_file"]


async def test_a_profile_sharing_no_tool_with_the_parent_is_refused(tabs):
    readonly = await Profile.objects.acreate(name="readonly", tools=["read_file", "agent"])
    await Profile.objects.acreate(name="shelly", tools=["shell"])
    tabs.script(
        "go",
        [delegate("c1", "run shell", profile="shelly"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    owner = (await make_tab()).owner
    tab = await database_sync_to_async(new_tab)(owner, "scripted/test", profile=readonly)
    async with running_worker():
        await run_parent(tab)
    result = result_of(await chunks(tab.pk), "c1").data
    assert result["is_error"] is True
    assert result["result"] == "Not run: profile “shelly” allows none of this tab's tools"
    assert not await Tab.objects.filter(parent_tab=tab.pk).aexists()


async def test_a_parents_deny_rule_holds_for_a_child_with_another_profile(tabs, workspace):
    """The parent's profile denies write_file; a child asked for with the `power` profile
    (no rules) is denied it too, the audit naming the rule."""
    careful = await Profile.objects.acreate(name="careful", tools=[])
    await PermissionRule.objects.acreate(profile=careful, action="deny", pattern="write_file")
    await PermissionRule.objects.acreate(profile=careful, action="ask", pattern="shell")
    await Profile.objects.acreate(name="power", tools=[])
    tabs.script(
        "go",
        [delegate("c1", "write via child", profile="power"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script(
        "write via child",
        [
            call("w1", "write_file", path="escaped.txt", content="pwn"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("wrote"), Finish()],
    )
    owner = (await make_tab()).owner
    tab = await database_sync_to_async(new_tab)(owner, "scripted/test", profile=careful)
    async with running_worker():
        await run_parent(tab)
    kid = await child_of(tab, "c1")
    assert kid.rules == [
        {"action": "deny", "pattern": "write_file", "source": "parent"},
        {"action": "ask", "pattern": "shell", "source": "parent"},
    ]
    written = result_of(await chunks(kid.pk), "w1").data
    assert written["is_error"] is True
    assert written["result"] == "Denied by rule `write_file` (the parent tab)."
    assert not (workspace / "escaped.txt").exists()


# --- 3, 4. call ids that repeat ----------------------------------------------------------


async def test_a_call_id_repeated_in_a_later_step_makes_its_own_child(tabs):
    """The OpenAI adapter names id-less calls `call_{index}`: each step's first call is
    `call_0`. The second step's `agent` call runs its own task, not the first's again."""
    tabs.script(
        "go",
        [delegate("call_0", "first task", "A"), Finish(stop_reason="tool_use")],
        [delegate("call_0", "second task", "B"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("first task", [TextDelta("FIRST RESULT"), Finish()])
    second = tabs.script("second task", [TextDelta("SECOND RESULT"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    rows = await chunks(tab.pk)
    results = [c.data["result"] for c in rows if c.type == "tool_result"]
    assert second.requests
    assert results[0].startswith("FIRST RESULT") and results[1].startswith("SECOND RESULT")
    titles = await database_sync_to_async(
        lambda: sorted(Tab.objects.filter(parent_tab=tab.pk).values_list("title", flat=True))
    )()
    assert titles == ["A", "B"]
    assert tail(result_of(rows[4:], "call_0"))["child_tab"] == str(await child_pk(tab.pk, "call_0"))


async def test_the_same_call_id_twice_in_one_step_refuses_the_second(tabs):
    """Two `agent` calls of one step with one id: the first runs, the second is refused
    ("duplicate call id") after the first's result, so each result answers its own call;
    one child, no task left behind, the log a valid history."""
    parent = tabs.script(
        "go",
        [
            delegate("call_0", "first task", "A"),
            delegate("call_0", "second task", "B"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("first task", [TextDelta("FIRST RESULT"), Finish()])
    second = tabs.script("second task", [TextDelta("SECOND RESULT"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "assistant/tool_call",
        "tool/tool_result",
        "tool/tool_result",
        "assistant/text",
    ]
    first, refused = rows[3].data, rows[4].data
    assert first["is_error"] is False and first["result"].startswith("FIRST RESULT")
    assert refused["is_error"] is True
    assert refused["result"].startswith("Not run: duplicate call id 'call_0' in this step")
    assert not second.requests
    assert await Tab.objects.filter(parent_tab=tab.pk).acount() == 1
    await valid_history(tab.pk)
    sent = parent.requests[1].messages[-1].parts
    assert [(p.call_id, p.result[:12]) for p in sent] == [
        (parent.requests[1].messages[-2].parts[0].call_id, "FIRST RESULT"),
        (parent.requests[1].messages[-2].parts[1].call_id, "Not run: dup"),
    ]


async def test_other_calls_that_repeat_an_id_in_one_step_each_run_with_their_own_arguments(
    tabs, workspace
):
    """Some servers repeat call ids: two write_file calls of one id each write their own
    file (not the second's twice), their results in the order of the calls."""
    tabs.script(
        "go",
        [
            call("w", "write_file", path="one.txt", content="1"),
            call("w", "write_file", path="two.txt", content="2"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("ok"), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    assert (workspace / "one.txt").read_text() == "1"
    assert (workspace / "two.txt").read_text() == "2"
    rows = await chunks(tab.pk)
    results = [c.data for c in rows if c.type == "tool_result"]
    assert [r["is_error"] for r in results] == [False, False]
    assert "one.txt" in results[0]["result"] and "two.txt" in results[1]["result"]
    await valid_history(tab.pk)


# --- 5. a child stopped before it starts ------------------------------------------------


async def test_a_child_stopped_before_a_worker_took_its_prompt_never_runs(tabs):
    """A cap stops a child whose prompt no worker took yet: the prompt goes into its log
    as a turn that ends cancelled (saying why), so the parent reads `cancelled`, and no
    worker finds anything left to run."""
    ran = tabs.script("late task", [TextDelta("I ran anyway"), Finish()])
    tab = await make_tab()
    child, _ = await database_sync_to_async(agents.ensure)(
        tab.pk, "c1", {"description": "d", "prompt": "late task"}, call_seq=2
    )
    outcome, why = await agents.stop(
        child.pk, "c1", "ran out of time (1 s)", "its parent's time limit for it (1 s) ran out"
    )
    assert outcome.done and outcome.status == "cancelled" and why == "ran out of time (1 s)"
    assert not await QueuedMessage.objects.filter(tab_id=child.pk).aexists()
    rows = await chunks(child.pk)
    assert kinds(rows) == ["user/text", "system/system"]
    assert rows[0].data["text"] == "late task" and rows[0].data["origin"]["call_id"] == "c1"
    assert rows[1].data == {
        "kind": "cancelled",
        "text": "Stopped before it started: its parent's time limit for it (1 s) ran out.",
    }
    assert await database_sync_to_async(lease.acquire)(child.pk, "w:1:x") is None
    assert not ran.requests
    result = agents.result(child.pk, child.title, outcome, why=why)
    assert result.is_error and "ran out of time (1 s)" in result.text


async def test_the_users_stop_on_a_child_no_worker_took_yet_stops_it(tabs):
    """The child's own Stop button while its prompt waits for a worker: it is stopped
    before it starts (its log says by whom) and its parent reads `cancelled`; a Stop on a
    tab with nothing running or waiting still does nothing."""
    tabs.script("late task", [TextDelta("I ran anyway"), Finish()])
    tab = await make_tab()
    child, _ = await database_sync_to_async(agents.ensure)(
        tab.pk, "c1", {"description": "d", "prompt": "late task"}, call_seq=2
    )
    assert await database_sync_to_async(turns.cancel)(child.pk)
    outcome = await database_sync_to_async(agents.read)(child.pk, "c1")
    assert outcome.done and outcome.status == "cancelled"
    assert not await QueuedMessage.objects.filter(tab_id=child.pk).aexists()
    rows = await chunks(child.pk)
    assert kinds(rows) == ["user/text", "system/system"]
    assert rows[1].data == {"kind": "cancelled", "text": "Stopped by the user before it started."}
    assert not await database_sync_to_async(turns.cancel)(child.pk)
    assert not await database_sync_to_async(turns.cancel)(tab.pk)
    async with running_worker():
        await asyncio.sleep(0.3)  # a worker now finds nothing of it to run
    assert kinds(await chunks(child.pk)) == ["user/text", "system/system"]


# --- 6, 7. trees of children ----------------------------------------------------------


def nesting_script(tabs, levels: int) -> None:
    """`go` delegates to level1, which delegates to level2, ...; each level's two steps
    use 10^level input tokens each."""
    prompts = ["go", *(f"level{n}" for n in range(1, levels + 1))]
    for n, prompt in enumerate(prompts):
        used = Usage(10**n, 10**n)
        if n < levels:
            tabs.script(
                prompt,
                [delegate("c1", prompts[n + 1], f"L{n + 1}"), Finish(used, "tool_use")],
                [TextDelta(f"{prompt} done"), Finish(used)],
            )
        else:
            tabs.script(prompt, [TextDelta(f"{prompt} done"), Finish(used)])


async def nester_tab() -> Tab:
    nester = await Profile.objects.acreate(name="nester", allow_nesting=True)
    owner = (await make_tab()).owner
    return await database_sync_to_async(new_tab)(owner, "scripted/test", profile=nester)


async def test_usage_rolls_up_the_whole_tree_of_children(tabs):
    """A profile allows nesting, three levels deep (the default limit): the top turn's
    cost, the tab's and each result's usage include every level below, not one."""
    nesting_script(tabs, 3)
    tab = await nester_tab()
    async with running_worker():
        watcher = await run_parent(tab)
    ended = watcher.ops[-1]["status"]["turn_end"]
    assert ended["turn"]["input"] == ended["tab"]["input"] == 2 + 20 + 200 + 1000
    assert tail(result_of(await chunks(tab.pk), "c1"))["usage"]["input"] == 20 + 200 + 1000
    middle = await child_of(tab, "c1")
    assert tail(result_of(await chunks(middle.pk), "c1"))["usage"]["input"] == 200 + 1000


async def test_nesting_stops_at_the_depth_limit(tabs, settings):
    settings.DISPATCH_CHILD_MAX_DEPTH = 2
    nesting_script(tabs, 3)
    tab = await nester_tab()
    async with running_worker():
        await run_parent(tab)
    second = await child_of(await child_of(tab, "c1"), "c1")
    refused = result_of(await chunks(second.pk), "c1").data
    assert refused["is_error"] is True
    assert refused["result"] == (
        "Not run: sub-agents nest at most 2 deep (the limit DISPATCH_CHILD_MAX_DEPTH), "
        "and this tab is already 2 deep"
    )
    assert not await Tab.objects.filter(parent_tab=second.pk).aexists()
    assert result_of(await chunks(tab.pk), "c1").data["is_error"] is False


# --- 8. an unattended parent's child ----------------------------------------------------


async def test_a_deny_wake_turns_child_is_answered_not_approved_too(tabs, settings):
    """A wake whose approval policy is deny starts the parent: its child's call that needs
    approval is refused at once ("unattended"), as the parent's own would be, instead of
    waiting for a human until the time limit."""
    settings.DISPATCH_CHILD_TIMEOUT = 20
    tabs.script(
        "go",
        [delegate("c1", "write it"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script(
        "write it",
        [call("w", "write_file", path="x.txt", content="hi"), Finish(stop_reason="tool_use")],
        [TextDelta("Could not write."), Finish()],
    )
    origin = {"kind": "wake", "wake_id": 1, "scheduled_for": "2026-01-01T00:00:00Z"}
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go", origin={**origin, "approval": "deny"})
            await watcher.until_idle()
    assert not any(
        c.get("approval")
        for m in watcher.ops
        if m["op"] == "status"
        for c in m["status"].get("children", [])
    )
    kid = await child_of(tab, "c1")
    rows = await chunks(kid.pk)
    assert rows[0].data["origin"]["approval"] == "deny"
    assert result_of(rows, "w").data["result"] == "Not approved: unattended wake turn."
    result = result_of(await chunks(tab.pk), "c1").data
    assert result["is_error"] is False and result["result"].startswith("Could not write.")


# --- 9. a deleted parent -------------------------------------------------------------------


async def test_deleting_the_parent_stops_its_running_children(tabs, monkeypatch):
    """The parent's runner finds its tab gone: its children do not run on unwatched (no
    time limit holds them any more); each says why in its own log."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.1)
    tabs.script(
        "go",
        [delegate("c1", "hang"), Finish(stop_reason="tool_use")],
        [TextDelta("x"), Finish()],
    )
    tabs.script("hang", [TextDelta("working"), asyncio.Event()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(children_running)
            kid = await child_pk(tab.pk, "c1")
            async with Watcher(kid) as child_watcher:
                await Tab.objects.filter(pk=tab.pk).adelete()
                await child_watcher.until_idle()
    assert not await RunningTurn.objects.filter(tab_id=kid).aexists()
    rows = await chunks(kid)
    assert rows[-1].data == {"kind": "cancelled", "text": "Stopped: its parent was deleted."}


# --- 10. what the result says -----------------------------------------------------------


async def test_an_empty_last_step_returns_no_text_not_the_preamble_before(tabs):
    """The child's last step says nothing: the result says so (NO_TEXT), not the text it
    wrote before its calls in the step before."""
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script(
        "work",
        [TextDelta("Let me look first."), call("l", "list_files"), Finish(stop_reason="tool_use")],
        [Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    result = result_of(await chunks(tab.pk), "c1").data
    assert result["is_error"] is False
    assert result["result"].startswith(agents.NO_TEXT + "\n\n{")


async def test_a_long_result_is_capped_as_a_shell_commands_output(tabs):
    """100 KB of child text: the parent gets its start and end with the shell's note of
    what was dropped, and the JSON tail whole; the card knows how much was cut."""
    long = "".join(f"line {n:05d} é\n" for n in range(8000))
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("work", [TextDelta(long), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    result = result_of(await chunks(tab.pk), "c1")
    text = result.data["result"]
    body, json_tail = text.rsplit("\n\n", 1)
    dropped = len(long.strip().encode()) - shell.OUTPUT_CAP
    assert body == (
        long.strip().encode()[: shell.OUTPUT_HEAD].decode(errors="ignore")
        + shell.DROP_MARKER.format(dropped=result.data["truncated_bytes"])
        + long.strip().encode()[-shell.OUTPUT_TAIL :].decode(errors="ignore")
    )
    assert result.data["truncated"] is True
    assert dropped <= result.data["truncated_bytes"] <= dropped + 4
    assert tail(result)["status"] == "completed"


# --- the time limit ---------------------------------------------------------------------


async def test_the_time_limit_runs_from_the_call_across_a_recovery(tabs, monkeypatch, settings):
    """A parent resumed after a crash gives its child only what is left of the limit,
    counted from when the call was made: here none, so the child is stopped at once,
    and its own log says it was its parent's time limit."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.1)
    settings.DISPATCH_CHILD_TIMEOUT = 1000
    tabs.script(
        "go",
        [delegate("c1", "hang"), Finish(stop_reason="tool_use")],
        [TextDelta("It timed out."), Finish()],
    )
    tabs.script("hang", [TextDelta("working"), asyncio.Event()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(children_running)
            await Chunk.objects.filter(tab_id=tab.pk, type="tool_call").aupdate(
                created_at=timezone.now() - timedelta(seconds=1001)
            )
            await kill_parent_worker(tab)
            await watcher.until(lambda m: m["op"] == "seal" and m["block"]["role"] == "assistant")
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "system/system",
        "tool/tool_result",
        "assistant/text",
    ]
    result = result_of(rows, "c1").data
    assert result["is_error"] is True
    assert "ran out of time (1000 s)" in result["result"].split("\n")[0]
    rows = await chunks(await child_pk(tab.pk, "c1"))
    assert rows[-1].data == {
        "kind": "cancelled",
        "text": "Stopped: its parent's time limit for it (1000 s) ran out.",
    }


async def test_a_child_stopped_with_its_parent_says_so_in_its_own_log(tabs):
    tabs.script(
        "go",
        [delegate("c1", "hang"), Finish(stop_reason="tool_use")],
        [TextDelta("x"), Finish()],
    )
    tabs.script("hang", [TextDelta("working"), asyncio.Event()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(children_running)
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    rows = await chunks(await child_pk(tab.pk, "c1"))
    assert rows[-1].data == {"kind": "cancelled", "text": "Stopped: its parent was stopped."}


async def test_a_log_that_is_no_history_does_not_stop_the_recovery_of_a_parent(tabs):
    """Looking for the open agent calls reads the log as a history: a log that does not
    read as one (a call without a name) still gets its turn closed, with no rerun."""

    def setup():
        tab = new_tab(Tab.objects.get(pk=tab_pk).owner, "scripted/test")
        turn = uuid.uuid4()
        log.append(
            tab.pk,
            [
                Block(uuid.uuid4(), turn, 0, "user", "text", {"text": "go"}),
                Block(
                    uuid.uuid4(), turn, 1, "assistant", "tool_call", {"call_id": "c1", "name": ""}
                ),
            ],
        )
        Tab.objects.create(owner=tab.owner, parent_tab=tab, parent_call_id="c1")
        RunningTurn.objects.create(
            tab=tab, turn_id=turn, worker="elsewhere:1:gone", heartbeat_at=timezone.now()
        )
        return tab

    tab_pk = (await make_tab()).pk
    tab = await database_sync_to_async(setup)()
    assert await database_sync_to_async(lease.recover_stale)(everything=True) == [tab.pk]
    rows = await chunks(tab.pk)
    assert rows[-1].data["kind"] == "interrupted" and lease.RESUMING not in rows[-1].data["text"]
    assert not await RunningTurn.objects.filter(tab_id=tab.pk).aexists()
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()
