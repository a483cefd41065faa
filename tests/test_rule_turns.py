"""Permission rules in turns: the runner allows, denies or asks as chat.rules decides,
logs each decision a rule made, and "always allow" adds a rule the next call uses."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from django.urls import reverse

from chat import turns
from chat.models import PermissionRule, Tab
from chat.providers.base import Finish, TextDelta, ToolCallEvent
from tests.engine import Watcher, chunks, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "notes.txt").write_text("hello from notes\n")
    return workspace


def call(call_id: str, name: str, **arguments) -> ToolCallEvent:
    return ToolCallEvent(call_id, name, arguments)


def waiting_for(call_id: str):
    return lambda m: (
        m["op"] == "status" and (m["status"].get("approval") or {}).get("call_id") == call_id
    )


async def with_rules(tab: Tab, tab_rules: list[dict], user_rules: list[tuple[str, str]]) -> None:
    tab.rules = tab_rules
    await tab.asave(update_fields=["rules"])
    for action, pattern in user_rules:
        await PermissionRule.objects.acreate(user_id=tab.owner_id, action=action, pattern=pattern)


def rule_chunks(rows) -> list[dict]:
    return [r.data for r in rows if r.type == "system" and r.data.get("kind") == "rule"]


def results(rows) -> dict[str, dict]:
    return {r.data["call_id"]: r.data for r in rows if r.type == "tool_result"}


async def test_rules_allow_deny_and_leave_the_rest_to_approval(script, workspace):
    """Approval on: an allow rule runs the shell call unasked, a deny rule answers the
    write with an error, and a call no rule matches waits for the user as before."""
    script(
        [
            call("s1", "shell", command="echo ran > ran.txt"),
            call("w1", "write_file", path="./secret/k.txt", content="k"),
            call("w2", "write_file", path="other.txt", content="o"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        await with_rules(
            tab,
            [{"action": "deny", "pattern": "write_file(secret/**)"}],
            [("allow", "shell(echo *)"), ("allow", "write_file(ran.txt)")],
        )
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(waiting_for("w2"))
            await database_sync_to_async(turns.approve)(tab.pk, "w2", True)
            await watcher.until_idle()
    asked = {
        m["status"]["approval"]["call_id"]
        for m in watcher.ops
        if m["op"] == "status" and m["status"].get("approval")
    }
    assert asked == {"w2"}
    rows = await chunks(tab.pk)
    assert rule_chunks(rows) == [
        {
            "kind": "rule",
            "text": "Allowed by rules `shell(echo *)` (your settings) and "
            "`write_file(ran.txt)` (your settings)",
            "call_id": "s1",
            "action": "allow",
            "pattern": "shell(echo *)",
            "source": "user",
        },
        {
            "kind": "rule",
            "text": "Denied by rule `write_file(secret/**)` (this tab)",
            "call_id": "w1",
            "action": "deny",
            "pattern": "write_file(secret/**)",
            "source": "tab",
        },
    ]
    done = results(rows)
    assert (workspace / "ran.txt").read_text() == "ran\n" and done["s1"]["is_error"] is False
    assert done["w1"]["is_error"] is True
    assert done["w1"]["result"] == "Denied by rule `write_file(secret/**)` (this tab)."
    assert not (workspace / "secret").exists()
    assert (workspace / "other.txt").read_text() == "o"


async def test_deny_and_ask_rules_apply_with_approval_off(script, workspace):
    """Approval off in Settings: a deny rule still refuses, an ask rule asks, and a
    command the parser cannot read asks when a deny rule might have matched it."""
    script(
        [
            call("rm", "shell", command="ls && rm notes.txt"),
            call("w", "write_file", path="a.txt", content="a"),
            call("sub", "shell", command="echo $(echo hi) > sub.txt"),
            call("ok", "shell", command="echo plain > plain.txt"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=False)
        await with_rules(
            tab, [{"action": "ask", "pattern": "write_file"}], [("deny", "shell(rm *)")]
        )
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(waiting_for("w"))
            await database_sync_to_async(turns.approve)(tab.pk, "w", False)
            await watcher.until(waiting_for("sub"))
            await database_sync_to_async(turns.approve)(tab.pk, "sub", True)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    audit = {c["call_id"]: (c["action"], c["text"]) for c in rule_chunks(rows)}
    assert audit == {
        "rm": ("deny", "Denied by rule `shell(rm *)` (your settings)"),
        "w": ("ask", "Asked by rule `write_file` (this tab)"),
        "sub": (
            "ask",
            "Asked: the command has a command substitution, which rule `shell(rm *)` "
            "(your settings) cannot check",
        ),
    }
    done = results(rows)
    assert (workspace / "notes.txt").exists() and done["rm"]["is_error"] is True
    assert done["w"]["result"] == "Denied by the user." and not (workspace / "a.txt").exists()
    assert (workspace / "sub.txt").read_text() == "hi\n"
    # No rule matched: approval is off, so it ran unasked and nothing was logged for it.
    assert (workspace / "plain.txt").exists() and "ok" not in audit


async def test_a_stored_rule_that_cannot_be_used_is_named_and_left_out(script, workspace):
    script(
        [call("r", "read_file", path="notes.txt"), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        await with_rules(
            tab,
            [{"action": "allow", "pattern": "shell("}, {"action": "deny", "pattern": "read_file"}],
            [],
        )
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "read")
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert [c["text"] for c in rule_chunks(rows)] == [
        "The rule allow `shell(` (this tab) is ignored: `shell(` opens a parenthesis it "
        "does not close.",
        "Denied by rule `read_file` (this tab)",
    ]
    assert results(rows)["r"]["is_error"] is True
    assert rows[-1].type == "text"


def _press(tab: Tab, field: str, call_id: str) -> int:
    client = Client()
    client.force_login(tab.owner)
    response = client.post(
        reverse("tab_approve", args=[tab.id]), {field: call_id}, HTTP_HX_REQUEST="true"
    )
    return response.status_code


async def test_always_allow_adds_the_rule_and_the_next_call_runs_unasked(script, workspace):
    """The card's "always allow … in this tab" approves the call and adds its rule to the
    tab; the same command asked again in the next step runs without a question."""
    script(
        [call("s1", "shell", command="echo one"), Finish(stop_reason="tool_use")],
        [call("s2", "shell", command="echo  one"), Finish(stop_reason="tool_use")],
        [call("s3", "shell", command="echo two"), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        tab = await Tab.objects.select_related("owner").aget(pk=tab.pk)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(waiting_for("s1"))
            assert await database_sync_to_async(_press)(tab, "always_tab", "s1") == 204
            await watcher.until(waiting_for("s3"))
            await database_sync_to_async(turns.approve)(tab.pk, "s3", False)
            await watcher.until_idle()
    await tab.arefresh_from_db()
    assert tab.rules == [{"action": "allow", "pattern": "shell(echo one)"}]
    rows = await chunks(tab.pk)
    done = results(rows)
    assert all(done[c]["result"].startswith("one\n") for c in ("s1", "s2"))
    assert not done["s1"]["is_error"] and not done["s2"]["is_error"]
    assert done["s3"]["result"] == "Denied by the user."
    assert [(c["call_id"], c["text"]) for c in rule_chunks(rows)] == [
        ("s1", "Rule added for this tab: allow `shell(echo one)`"),
        ("s2", "Allowed by rule `shell(echo one)` (this tab)"),
    ]
    assert rule_chunks(rows)[0]["added"] is True


async def test_path_rules_see_where_links_lead_in_the_tabs_working_directory(script, workspace):
    """Approval off, a deny rule on .git: a write and a shell redirection through a link
    to .git are denied (matched where the link leads, from the tab's working directory),
    a path that leads out is asked about, and a plain redirection runs unasked."""
    proj = workspace / "proj"
    (proj / ".git" / "hooks").mkdir(parents=True)
    (proj / "src").mkdir()
    (proj / "src" / "h").symlink_to("../.git/hooks")
    (proj / "up").symlink_to("../..")
    script(
        [
            call("w1", "write_file", path="src/h/pre-commit", content="evil"),
            call("s1", "shell", command="echo evil > src/h/post-commit"),
            call("w2", "write_file", path="up/x", content="x"),
            call("s2", "shell", command="echo fine > out.txt"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=False)
        tab.workdir = "proj"
        await tab.asave(update_fields=["workdir"])
        await with_rules(tab, [], [("deny", "write_file(.git/**)")])
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(waiting_for("w2"))
            await database_sync_to_async(turns.approve)(tab.pk, "w2", False)
            await watcher.until_idle()
    assert sorted(p.name for p in (proj / ".git" / "hooks").iterdir()) == []
    rows = await chunks(tab.pk)
    audit = {c["call_id"]: (c["action"], c["text"]) for c in rule_chunks(rows)}
    assert audit == {
        "w1": (
            "deny",
            "Denied by rule `write_file(.git/**)` (your settings) for src/h/pre-commit, "
            "a link to .git/hooks/pre-commit",
        ),
        "s1": (
            "deny",
            "Denied by rule `write_file(.git/**)` (your settings) for the redirection "
            "> src/h/post-commit, a link to .git/hooks/post-commit",
        ),
        "w2": (
            "ask",
            "Asked: the path up/x cannot be followed (up/x: resolves outside the workspace "
            "through a symlink; refused), which rule `write_file(.git/**)` (your settings) "
            "cannot check",
        ),
    }
    done = results(rows)
    assert done["w1"]["is_error"] and done["s1"]["is_error"] and done["w2"]["is_error"]
    assert done["w2"]["result"] == "Denied by the user."
    assert (proj / "out.txt").read_text() == "fine\n" and done["s2"]["is_error"] is False


async def test_a_command_closing_a_descriptor_runs_in_a_tab_without_rules(script, workspace):
    """`2>&-` closes stderr: it once made reading the command raise, which ended the turn
    with an internal error although the tab had no rules at all."""
    script(
        [call("s1", "shell", command="echo hi 2>&-"), Finish(stop_reason="tool_use")],
        [call("s2", "shell", command="echo there >&2 2>&-"), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=False)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    done = results(rows)
    assert done["s1"]["is_error"] is False and "hi" in done["s1"]["result"]
    assert done["s2"]["is_error"] is False
    assert rule_chunks(rows) == [] and rows[-1].type == "text"
    assert not [r for r in rows if r.type == "error"]


@pytest.mark.parametrize("approve_tools", [True, False])
async def test_a_shell_allow_rule_leaves_a_write_it_does_not_cover_to_the_tab(
    script, workspace, approve_tools
):
    """`allow shell(echo *)` is not `echo hi > main.py`: with no write_file rule allowing
    main.py no rule decides, so approval on asks and approval off runs it, as for a call
    without rules; the command without the write is allowed by the rule."""
    script(
        [
            call("s1", "shell", command="echo hi > main.py"),
            call("s2", "shell", command="echo plain"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=approve_tools)
        await with_rules(tab, [], [("allow", "shell(echo *)")])
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            if approve_tools:
                await watcher.until(waiting_for("s1"))
                await database_sync_to_async(turns.approve)(tab.pk, "s1", False)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    done = results(rows)
    assert [(c["call_id"], c["action"]) for c in rule_chunks(rows)] == [("s2", "allow")]
    assert done["s2"]["is_error"] is False
    if approve_tools:
        assert done["s1"]["result"] == "Denied by the user."
        assert not (workspace / "main.py").exists()
    else:
        assert (workspace / "main.py").read_text() == "hi\n" and done["s1"]["is_error"] is False


async def test_a_link_made_earlier_in_the_command_is_asked_about(script, workspace):
    """Approval off, a deny rule on .git: `ln -s` then a redirection through the link it
    makes waits for the user (the link does not exist yet when the rules follow the path,
    so they cannot allow it), and denying it leaves .git alone."""
    (workspace / ".git" / "hooks").mkdir(parents=True)
    (workspace / "src").mkdir()
    command = "ln -s ../.git/hooks src/h3; echo evil > src/h3/pre-commit"
    script(
        [call("s1", "shell", command=command), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=False)
        await with_rules(
            tab,
            [],
            [
                ("allow", "shell(ln *)"),
                ("allow", "shell(echo *)"),
                ("deny", "write_file(.git/**)"),
            ],
        )
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(waiting_for("s1"))
            await database_sync_to_async(turns.approve)(tab.pk, "s1", False)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert [(c["call_id"], c["action"], c["text"]) for c in rule_chunks(rows)] == [
        (
            "s1",
            "ask",
            "Asked: the target of the redirection > src/h3/pre-commit does not exist yet (an "
            "earlier command may make it a link), which rule `write_file(.git/**)` (your "
            "settings) cannot check",
        )
    ]
    assert results(rows)["s1"]["result"] == "Denied by the user."
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists()
