"""A sub-agent never has more authority than its parent (issue 28 §1): a profile the model
picks for a child narrows its tools and rules, never widens them. Its allow rules hold
only where a person chose the profile for the tab; a call the parent's tab would ask
about is asked about (or refused under a deny wake, down the whole tree); the audit
names the rule that decided and where it came from. Scripted providers per prompt and
the real tools (the shell in its sandbox), as in test_subagents."""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.utils import timezone

from chat import log, rules, turns
from chat.models import PermissionRule, Profile, Tab, Wake
from chat.preferences import new_tab
from chat.providers.base import Finish, TextDelta
from chat.stream import Block
from chat.tools import wake
from chat.tools.base import ToolError
from chat.tools.workdir import user_workspace
from chat.turn import agents, lease
from tests import test_subagents as base
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.test_rule_turns import rule_chunks
from tests.test_subagents import call, child_of, child_pk, delegate, result_of, run_parent
from tests.test_subagents_attacks import children_running, kill_parent_worker

tabs = base.tabs
workspace = base.workspace

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

DENY_WAKE = {
    "kind": "wake",
    "wake_id": 1,
    "scheduled_for": "2026-01-01T00:00:00Z",
    "approval": "deny",
}
UNATTENDED = "Not approved: unattended wake turn."
# What the model's child tries, each leaving a file behind if it runs.
CALLS = {
    "shell": {"command": "touch by-shell"},
    "write_file": {"path": "by-write", "content": "x"},
}


def written(workspace, owner, name: str = "by-*") -> list[str]:
    """The files of that name anywhere under the workspace root, as paths from the
    owner's own workspace (every tab here is the owner's)."""
    own = user_workspace(owner.pk)
    return sorted(os.path.relpath(path, own) for path in workspace.rglob(name))


async def staff_profile(name: str = "staff", **fields) -> Profile:
    """A profile that allows the shell and writing files without asking."""
    profile = await Profile.objects.acreate(name=name, **fields)
    for pattern in ("shell", "write_file"):
        await PermissionRule.objects.acreate(profile=profile, action="allow", pattern=pattern)
    return profile


def child_asks(message) -> bool:
    return message["op"] == "status" and any(
        c.get("approval") for c in message["status"].get("children", [])
    )


def asks_or_idle(message) -> bool:
    """Anyone in the tree asks for approval, or the turn ended."""
    return message["op"] == "status" and (
        message["status"]["state"] == "idle"
        or bool(message["status"].get("approval"))
        or child_asks(message)
    )


@pytest.mark.parametrize("tool", sorted(CALLS))
async def test_a_model_chosen_profiles_allow_rule_asks_where_the_parent_would(
    tabs, workspace, tool
):
    """Approval on, no rules: the child the model started with the `staff` profile asks
    (in the parent's approval bar) instead of running; denied, nothing ran, and no rule
    chunk claims an allow."""
    await staff_profile()
    tabs.script(
        "go",
        [delegate("c1", "do it", profile="staff"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script(
        "do it",
        [call("t1", tool, **CALLS[tool]), Finish(stop_reason="tool_use")],
        [TextDelta("refused"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            asking = await watcher.until(child_asks)
            (entry,) = asking["status"]["children"]
            assert entry["approval"]["name"] == tool
            await database_sync_to_async(turns.approve)(await child_pk(tab.pk, "c1"), "t1", False)
            await watcher.until_idle()
    kid = await child_of(tab, "c1")
    rows = await chunks(kid.pk)
    assert result_of(rows, "t1").data["result"] == "Denied by the user."
    assert rule_chunks(rows) == []
    assert written(workspace, tab.owner) == []
    # The profile's allow rules are not the child's; its tools and prompt are.
    assert kid.rules == [] and kid.profile_id is not None


async def test_under_a_deny_wake_the_whole_tree_is_refused_and_nothing_runs(tabs, workspace):
    """A deny wake starts the parent; the model starts a child with a profile that allows
    the shell and writing and may nest, and that child a grandchild with it too: every
    call of both is refused at once, nothing is asked and nothing is written."""
    await staff_profile(allow_nesting=True)
    tabs.script(
        "go",
        [delegate("c1", "middle", profile="staff"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    steps = [call(f"m-{tool}", tool, **args) for tool, args in CALLS.items()]
    tabs.script(
        "middle",
        [*steps, delegate("g1", "bottom", profile="staff"), Finish(stop_reason="tool_use")],
        [TextDelta("middle refused"), Finish()],
    )
    tabs.script(
        "bottom",
        [*(call(f"b-{t}", t, **a) for t, a in CALLS.items()), Finish(stop_reason="tool_use")],
        [TextDelta("bottom refused"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go", origin=DENY_WAKE)
            await watcher.until_idle()
    assert not any(child_asks(m) for m in watcher.ops)
    middle = await child_of(tab, "c1")
    bottom = await child_of(middle, "g1")
    for kid, prefix in ((middle, "m"), (bottom, "b")):
        rows = await chunks(kid.pk)
        assert rows[0].data["origin"]["approval"] == "deny"
        for tool in CALLS:
            assert result_of(rows, f"{prefix}-{tool}").data["result"] == UNATTENDED
        assert rule_chunks(rows) == []
    assert result_of(await chunks(middle.pk), "g1").data["result"].startswith("bottom refused")
    assert written(workspace, tab.owner) == []


async def test_a_profile_a_person_chose_keeps_its_allow_rules_and_the_audit_says_whose(
    tabs, workspace
):
    """A tab made with the `staff` profile (the New tab form, the API, `manage.py send`)
    writes without asking, by its own rule; its child (no profile) may do what it may, by
    the parent's rule, and the audit says so; a child the model gives the `careful`
    profile is asked by that profile's ask rule, named as the profile's."""
    staff = await staff_profile()
    careful = await Profile.objects.acreate(name="careful")
    await PermissionRule.objects.acreate(profile=careful, action="ask", pattern="write_file")
    await PermissionRule.objects.acreate(profile=careful, action="allow", pattern="shell")
    write = {"path": "by-write", "content": "x"}
    tabs.script(
        "go",
        [
            call("p1", "write_file", **write),
            delegate("c1", "copy me"),
            delegate("c2", "careful me", profile="careful"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("ok"), Finish()],
    )
    tabs.script(
        "copy me",
        [call("w1", "write_file", path="by-child", content="y"), Finish(stop_reason="tool_use")],
        [TextDelta("wrote"), Finish()],
    )
    tabs.script(
        "careful me",
        [call("w2", "write_file", path="by-careful", content="z"), Finish(stop_reason="tool_use")],
        [TextDelta("asked"), Finish()],
    )
    owner = (await make_tab(approve_tools=True)).owner
    tab = await database_sync_to_async(new_tab)(owner, "scripted/test", profile=staff)
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, "go")
        await watcher.until(child_asks)
        await database_sync_to_async(turns.approve)(await child_pk(tab.pk, "c2"), "w2", False)
        await watcher.until_idle()
    assert [r["text"] for r in rule_chunks(await chunks(tab.pk))] == [
        "Allowed by rule `write_file` (this tab)"
    ]
    copy, wary = await child_of(tab, "c1"), await child_of(tab, "c2")
    assert [r["text"] for r in rule_chunks(await chunks(copy.pk))] == [
        "Allowed by rule `write_file` (the parent tab)"
    ]
    assert [(r["text"], r["source"]) for r in rule_chunks(await chunks(wary.pk))] == [
        ("Asked by rule `write_file` (this tab's profile)", "profile")
    ]
    assert written(workspace, owner) == ["by-child", "by-write"]
    # The careful child keeps its profile's ask rule and the parent's allow rules, never
    # its profile's own allow.
    assert wary.rules == [
        {"action": "ask", "pattern": "write_file", "source": "profile"},
        {"action": "allow", "pattern": "shell", "source": "parent"},
        {"action": "allow", "pattern": "write_file", "source": "parent"},
    ]


async def test_a_child_works_in_its_parents_folder_and_cannot_leave_it(tabs, workspace):
    """The parent is confined to `proj`; its model-chosen child (a profile that allows
    writing) works there too: a write outside it is refused, nothing lands outside."""
    staff = await staff_profile()
    tabs.script(
        "go",
        [delegate("c1", "escape", profile="staff"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script(
        "escape",
        [
            call("w1", "write_file", path="../outside.txt", content="x"),
            call("w2", "write_file", path="inside.txt", content="x"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("done"), Finish()],
    )
    owner = (await make_tab(approve_tools=False)).owner
    tab = await database_sync_to_async(new_tab)(
        owner, "scripted/test", profile=staff, workdir="proj"
    )
    async with running_worker():
        await run_parent(tab)
    kid = await child_of(tab, "c1")
    assert kid.workdir == "proj"
    rows = await chunks(kid.pk)
    assert result_of(rows, "w1").data["is_error"] is True
    assert written(workspace, owner, "*side.txt") == ["proj/inside.txt"]


async def test_a_deny_wake_turn_resumed_after_its_worker_died_stays_unattended(
    tabs, workspace, monkeypatch
):
    """The parent's worker dies while its child runs; the resumed turn (a rerun, no
    message) answers the call and goes on: its own calls are still refused, and a child
    it starts then is unattended too."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.1)
    release = asyncio.Event()
    tabs.script(
        "go",
        [delegate("c1", "slow"), Finish(stop_reason="tool_use")],
        [
            call("p-write_file", "write_file", **CALLS["write_file"]),
            delegate("c2", "later"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("slow", [TextDelta("started"), release, TextDelta(" done"), Finish()])
    tabs.script(
        "later",
        [call("l-shell", "shell", **CALLS["shell"]), Finish(stop_reason="tool_use")],
        [TextDelta("later refused"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go", origin=DENY_WAKE)
            await watcher.until(children_running)
            await kill_parent_worker(tab)
            await watcher.until(children_running)  # the resumed turn re-attached
            release.set()
            ended = await watcher.until(asks_or_idle)
    assert ended["status"]["state"] == "idle", ended["status"]
    rows = await chunks(tab.pk)
    assert result_of(rows, "p-write_file").data["result"] == UNATTENDED
    later = await child_of(tab, "c2")
    later_rows = await chunks(later.pk)
    assert later_rows[0].data["origin"]["approval"] == "deny"
    assert result_of(later_rows, "l-shell").data["result"] == UNATTENDED
    assert written(workspace, tab.owner) == []


@database_sync_to_async
def wake_from(kind: str, target: str):
    """schedule_wake's effect in a tab with the `staff` profile: a person's tab, a
    sub-agent's (the model chose the profile), a branch of that sub-agent, or such a
    branch once the sub-agent is deleted (nothing links it to a parent any more)."""
    owner = get_user_model().objects.create_user("owner")
    staff = Profile.objects.get(name="staff")
    # A sub-agent's parent with no profile and no rules: its child inherits none.
    tab = new_tab(owner, "scripted/test", profile=staff if kind == "person" else None)
    if kind != "person":
        made = {"description": "look", "prompt": "look", "profile": "staff"}
        tab, _ = agents.ensure(tab.pk, "c1", made, call_seq=1)
    if kind in ("branch", "orphan"):
        log.append(tab.pk, [Block(uuid.uuid4(), uuid.uuid4(), 0, "user", "text", {"text": "x"})])
        child, tab = tab, turns.branch(tab, 1).tab
        if kind == "orphan":
            child.delete()
            tab.refresh_from_db()
    args = {"name": "again", "prompt": "go on", "interval_seconds": 3600, "target": target}
    try:
        wake._create(args, tab.pk, timezone.now())
    except ToolError as exc:
        return str(exc)
    made = Wake.objects.get()
    return (made.profile and made.profile.name, made.tab_id == tab.pk)


@pytest.mark.parametrize(
    ("kind", "target", "expected"),
    [
        ("person", "new_tab", ("staff", False)),
        ("child", "this_tab", (None, True)),
        ("child", "new_tab", "A sub-agent's tab"),
        ("branch", "new_tab", "A sub-agent's tab"),
        ("orphan", "new_tab", "A sub-agent's tab"),
    ],
)
async def test_a_sub_agent_cannot_pass_its_profile_on_through_a_wake(kind, target, expected):
    """A wake into new tabs makes them with the scheduling tab's profile: from a person's
    tab that is their choice; from a sub-agent (or a branch of one, even once the
    sub-agent is gone) the model's, so it is refused (its new tabs would get the
    profile's allow rules); its own tab it may wake."""
    await staff_profile()
    made = await wake_from(kind, target)
    if isinstance(expected, str):
        assert made.startswith(expected)
    else:
        assert made == expected


# The parent tab's rules, the model-chosen profile's, and calls to decide with both.
PARENT_RULES = [
    [],
    [("allow", "shell(git *)")],
    [("deny", "write_file(secret/**)"), ("allow", "write_file")],
    [("ask", "shell(rm *)"), ("allow", "shell")],
]
PROFILE_RULES = [
    [("allow", "shell"), ("allow", "write_file"), ("allow", "mcp__*")],
    [("deny", "read_file"), ("allow", "shell(git *)")],
    [("ask", "shell(git push *)"), ("allow", "write_file(secret/**)")],
]
DECIDED = [
    ("shell", {"command": "git status"}),
    ("shell", {"command": "git push origin main"}),
    ("shell", {"command": "rm -rf build"}),
    ("shell", {"command": "echo hi > secret/k"}),
    ("write_file", {"path": "secret/k", "content": "x"}),
    ("write_file", {"path": "a.txt", "content": "x"}),
    ("read_file", {"path": "a.txt"}),
    ("mcp__srv__tool", {}),
]
STRICTNESS = {rules.ALLOW: 0, rules.ASK: 1, rules.DENY: 2}


def strictness(stored: list[dict], name: str, arguments: dict, approve: bool) -> int:
    """How strictly a tab with these rules treats the call: a rule's action, else the
    approval setting's (every call here needs approval)."""
    parsed, problems = rules.parse_all(stored, source=rules.TAB)
    assert problems == []
    decision = rules.decide(parsed, name, arguments)
    action = decision.action if decision else (rules.ASK if approve else rules.ALLOW)
    return STRICTNESS[action]


@database_sync_to_async
def child_rules_for(parent_rules, profile_rules) -> tuple[list[dict], list[dict]]:
    Profile.objects.filter(name="picked").delete()
    profile = Profile.objects.create(name="picked")
    for action, pattern in profile_rules:
        PermissionRule.objects.create(profile=profile, action=action, pattern=pattern)
    parent = Tab(rules=[{"action": a, "pattern": p} for a, p in parent_rules])
    return parent.rules, agents.inherited_rules(parent, profile)


async def test_a_child_decides_every_call_at_least_as_strictly_as_its_parent():
    """For every parent's rules, model-chosen profile's rules, call and approval setting,
    the child's decision is the parent's or stricter (deny > ask > allow)."""
    for parent_rules, profile_rules in itertools.product(PARENT_RULES, PROFILE_RULES):
        parent, child = await child_rules_for(parent_rules, profile_rules)
        for (name, arguments), approve in itertools.product(DECIDED, (True, False)):
            case = (parent_rules, profile_rules, name, arguments, approve)
            assert strictness(child, name, arguments, approve) >= strictness(
                parent, name, arguments, approve
            ), case
