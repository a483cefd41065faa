"""The ACP driver (chat.turn.acp): full turns through the worker, with an in-memory agent
session at the one boundary (chat.acp.seam.AgentSession) that plays ACP updates, as the
SDK's own models, and permission requests. The real agents are part B's and the lead's
tests (issue 30)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from acp.schema import (
    PermissionOption,
    PromptResponse,
    SessionNotification,
    TextContentBlock,
    ToolCallUpdate,
)
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import turns
from chat.acp import config as acp_config
from chat.acp.seam import AgentConfig, AgentError
from chat.models import RunningTurn, Setting, Tab, UsageRecord
from chat.turn import acp, lease
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

AGENT = AgentConfig("fake", ("fake-acp",), provider="anthropic")


def upd(shape: dict[str, Any]) -> object:
    return SessionNotification.model_validate({"sessionId": "s-1", "update": shape}).update


def say(text: str, kind: str = "agent_message_chunk") -> object:
    return upd({"sessionUpdate": kind, "content": {"type": "text", "text": text}})


@dataclass
class Ask:
    """The agent asks permission for a call."""

    call_id: str
    raw_input: dict[str, Any]
    options: list[PermissionOption]


CLAUDE = [
    PermissionOption(option_id="allow_always", name="Always Allow", kind="allow_always"),
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
]
CODEX = [
    PermissionOption(option_id="approved", name="Yes", kind="allow_once"),
    PermissionOption(option_id="abort", name="No", kind="reject_once"),
]
HANG = "hang"


class FakeAgent:
    """An AgentSession double: each prompt plays the next script (updates, Ask, HANG, an
    AgentError, a PromptResponse or a callable of the agent making one)."""

    def __init__(
        self,
        *scripts: list[Any],
        restored: bool = False,
        images: bool = False,
        cancel_hangs: bool = False,
        close_takes: float = 0.0,
    ):
        self.cancel_hangs = cancel_hangs
        self.close_takes = close_takes
        self.session_id = "s-1"
        self.supports_load = True
        self.restored = restored
        self.images = images
        self.scripts = list(scripts)
        self.prompts: list[list[Any]] = []
        self.answers: list[str | None] = []
        self.cancelled = asyncio.Event()
        self.closed = False

    async def prompt(self, blocks: list[object], handler: Any) -> PromptResponse:
        self.prompts.append(blocks)
        for step in self.scripts.pop(0):
            if isinstance(step, Ask):
                tool_call = ToolCallUpdate.model_validate(
                    {"toolCallId": step.call_id, "kind": "execute", "rawInput": step.raw_input}
                )
                self.answers.append(await handler.permission(tool_call, step.options))
            elif step == HANG:
                await asyncio.Event().wait()
            elif isinstance(step, asyncio.Event):
                await step.wait()
            elif isinstance(step, AgentError):
                raise step
            elif isinstance(step, PromptResponse):
                return step
            elif callable(step):
                return step(self)
            else:
                await handler.update(step)
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self) -> None:
        self.cancelled.set()
        if self.cancel_hangs:
            await asyncio.Event().wait()

    def stderr_tail(self) -> str:
        return ""

    async def close(self) -> None:
        await asyncio.sleep(self.close_takes)
        self.closed = True


@dataclass
class Started:
    config: AgentConfig
    workspace: Path
    home: Path
    resume: str | None


@pytest.fixture
def agent(monkeypatch, tmp_path, settings) -> Callable[[FakeAgent], list[Started]]:
    """Serve `FakeAgent`s as the configured agent `fake`; returns the starts made."""
    owner_workspace(settings, tmp_path / "ws")
    monkeypatch.setattr(acp_config, "agents", lambda: {"fake": AGENT})
    starts: list[Started] = []
    agents: list[FakeAgent] = []

    async def start(config, *, workspace, cwd, home, resume):
        starts.append(Started(config, workspace, home, resume))
        return agents.pop(0)

    monkeypatch.setattr(acp, "start_agent", start)

    def install(*fakes: FakeAgent) -> list[Started]:
        agents.extend(fakes)
        return starts

    return install


async def run(tab: Tab, text: str) -> Watcher:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        await watcher.until_idle()
    return watcher


async def agent_tab(*, approve_tools: bool = False, rules: list[Any] | None = None) -> Tab:
    tab = await make_tab("acp/fake", approve_tools=approve_tools)
    if rules:
        await Tab.objects.filter(pk=tab.pk).aupdate(rules=rules)
    return tab


def bash(call_id: str, command: str, **fields: Any) -> list[object]:
    """Claude Code's two tool_calls of one Bash call: empty input, then the command."""
    meta = {"claudeCode": {"toolName": "Bash"}}
    first = {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "Terminal"}
    return [
        upd({**first, "kind": "execute", "status": "pending", "rawInput": {}, "_meta": meta}),
        upd(
            {
                **first,
                "title": f"`{command}`",
                "kind": "execute",
                "status": "pending",
                "rawInput": {"command": command},
                "_meta": meta,
                **fields,
            }
        ),
    ]


def output(call_id: str, text: str, status: str = "in_progress") -> object:
    return upd(
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": call_id,
            "status": status,
            "content": [{"type": "content", "content": {"type": "text", "text": text}}],
        }
    )


def plan(*statuses: str) -> object:
    entries = [
        {"content": f"step {n}", "status": s, "priority": "high"} for n, s in enumerate(statuses)
    ]
    return upd({"sessionUpdate": "plan", "entries": entries})


USAGE = PromptResponse.model_validate(
    {
        "stopReason": "end_turn",
        "usage": {"totalTokens": 30, "inputTokens": 20, "outputTokens": 10},
    }
)


async def test_an_agent_turn_streams_into_the_log_like_a_native_one(agent):
    fake = FakeAgent(
        [
            say("Let me look.", "agent_thought_chunk"),
            plan("in_progress", "pending"),
            *bash("toolu_1", "ls"),
            output("toolu_1", "a.txt\n"),
            output("toolu_1", "a.txt\nb.txt\n", "completed"),
            plan("completed", "in_progress"),
            say("Two "),
            say("files."),
            USAGE,
        ],
        [say("Again."), PromptResponse(stop_reason="end_turn")],
    )
    starts = agent(fake)
    async with running_worker():
        tab = await agent_tab()
        await run(tab, "what is here?")
        await run(tab, "and now?")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/plan",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/plan",
        "assistant/text",
        "user/text",
        "assistant/text",
    ]
    call = rows[3].data
    assert call == {
        "call_id": "toolu_1",
        "name": "shell",
        "arguments": {"command": "ls"},
        "title": "`ls`",
    }
    result = rows[4].data
    assert result["result"] == "a.txt\nb.txt\n" and result["shell_output"] == "a.txt\n"
    assert [e["status"] for e in rows[5].data["entries"]] == ["completed", "in_progress"]
    assert rows[6].data["text"] == "Two files."
    # The prompts carried the messages; one agent served both turns, started once.
    assert fake.prompts == [
        [TextContentBlock(type="text", text="what is here?")],
        [TextContentBlock(type="text", text="and now?")],
    ]
    assert len(starts) == 1 and starts[0].resume is None
    assert starts[0].home.parts[-4:] == ("fake", "users", str(tab.owner_id), "home")
    saved = await Tab.objects.aget(pk=tab.pk)
    assert saved.acp_session == {"agent": "fake", "session_id": "s-1"}
    usage = [
        (u.model, u.input_tokens, u.output_tokens)
        async for u in UsageRecord.objects.filter(tab_id=tab.pk)
    ]
    assert usage == [("acp/fake", 20, 10)]


async def test_a_restart_resumes_the_tabs_session_or_says_the_agent_starts_fresh(agent):
    restored = FakeAgent([say("Back.")], restored=True)
    fresh = FakeAgent([say("Who are you?")], restored=False)
    starts = agent(restored, fresh)
    async with running_worker():
        tab = await agent_tab()
        await Tab.objects.filter(pk=tab.pk).aupdate(
            acp_session={"agent": "fake", "session_id": "old"}
        )
        await run(tab, "go on")
        assert [s.resume for s in starts] == ["old"]
        await acp.close_all()  # the worker restarted: its agents are gone
        assert restored.closed
        await run(tab, "and?")
    rows = await chunks(tab.pk)
    assert [s.resume for s in starts] == ["old", "s-1"]
    notices = [r.data["text"] for r in rows if r.type == "system"]
    assert notices == [acp.FRESH]


async def _answer(watcher: Watcher, tab: Tab, call_id: str, approved: bool) -> dict[str, Any]:
    message = await watcher.until(
        lambda m: (
            m["op"] == "status" and (m["status"].get("approval") or {}).get("call_id") == call_id
        )
    )
    await database_sync_to_async(turns.approve)(tab.pk, call_id, approved)
    return message["status"]["approval"]


async def test_permissions_wait_for_dispatchs_approval_and_map_to_the_agents_options(agent):
    fake = FakeAgent(
        [
            *bash("t1", "touch a")[:1],
            Ask("t1", {"command": "touch a"}, CLAUDE),
            Ask("t2", {"command": "touch b"}, CLAUDE),
            say("Done."),
        ]
    )
    agent(fake)
    async with running_worker():
        tab = await agent_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "touch two")
            asked = await _answer(watcher, tab, "t1", True)
            await _answer(watcher, tab, "t2", False)
            await watcher.until_idle()
    assert asked == {"call_id": "t1", "name": "shell", "arguments": {"command": "touch a"}}
    assert fake.answers == ["allow", "reject"]
    rows = await chunks(tab.pk)
    # Each call is on the page (its card, where the approval buttons go) before it is asked.
    calls = [r.data["call_id"] for r in rows if r.type == "tool_call"]
    assert calls == ["t1", "t2"]
    assert "Denied by the user." in [r.data.get("text") for r in rows if r.type == "system"]


async def test_the_tabs_rules_decide_first_and_are_logged(agent):
    fake = FakeAgent(
        [
            Ask("d", {"command": "rm -rf x"}, CLAUDE),
            Ask("a", {"command": "git status"}, CLAUDE),
            say("ok"),
        ]
    )
    agent(fake)
    rules = [
        {"action": "deny", "pattern": "shell(rm *)"},
        {"action": "allow", "pattern": "shell(git status)"},
    ]
    async with running_worker():
        tab = await agent_tab(approve_tools=True, rules=rules)
        await run(tab, "clean up")
    assert fake.answers == ["reject", "allow"]
    rows = await chunks(tab.pk)
    audit = [(r.data["call_id"], r.data["action"]) for r in rows if r.data.get("kind") == "rule"]
    assert audit == [("d", "deny"), ("a", "allow")]


async def test_codexs_reject_ends_its_turn_cancelled_and_the_log_says_why(agent):
    def ends(fake: FakeAgent) -> PromptResponse:
        stop = "cancelled" if fake.answers[-1] == "abort" else "end_turn"
        return PromptResponse(stop_reason=stop)

    fake = FakeAgent([Ask("call_1", {"command": ["bash", "-lc", "rm a"]}, CODEX), ends])
    agent(fake)
    async with running_worker():
        tab = await agent_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "remove a")
            await _answer(watcher, tab, "call_1", False)
            await watcher.until_idle()
    assert fake.answers == ["abort"]
    rows = await chunks(tab.pk)
    assert rows[-1].data == {"kind": "cancelled", "text": acp.CODEX_CANCELLED}
    # The call the agent never ran is answered, as a native turn's would be.
    (result,) = [r for r in rows if r.type == "tool_result"]
    assert result.data["call_id"] == "call_1" and result.data["is_error"] is True


async def test_an_unattended_wake_refuses_without_asking(agent):
    fake = FakeAgent([Ask("w", {"command": "make"}, CLAUDE), say("ok")])
    agent(fake)
    async with running_worker():
        tab = await agent_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            origin = {"kind": "wake", "wake_id": 1, "approval": "deny"}
            await submit(tab, "nightly", origin=origin)
            await watcher.until_idle()
    assert fake.answers == ["reject"]


async def test_stop_cancels_the_agent_and_ends_the_turn_within_a_second(agent):
    fake = FakeAgent([*bash("t", "sleep 100"), output("t", "zz"), HANG])
    agent(fake)
    async with running_worker():
        tab = await agent_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "sleep")
            await watcher.until(lambda m: m["op"] == "open")
            stopped_at = time.monotonic()
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
            took = time.monotonic() - stopped_at
    assert fake.cancelled.is_set() and took < 1.5
    rows = await chunks(tab.pk)
    assert kinds(rows)[-3:] == ["assistant/tool_call", "tool/tool_result", "system/system"]
    assert rows[-2].data["shell_output"] == "zz" and rows[-2].data["interrupted"] is True
    assert rows[-1].data["kind"] == "cancelled"


async def test_the_agent_dying_is_an_error_chunk_and_the_next_turn_starts_it_again(agent):
    dying = FakeAgent([say("Working"), AgentError("The agent exited with status 1: boom")])
    second = FakeAgent([say("Fresh.")], restored=True)
    starts = agent(dying, second)
    async with running_worker():
        tab = await agent_tab()
        await run(tab, "go")
        await run(tab, "again")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/text",
        "assistant/error",
        "user/text",
        "assistant/text",
    ]
    assert rows[2].data["message"] == "The agent exited with status 1: boom"
    assert dying.closed and len(starts) == 2 and starts[1].resume == "s-1"


async def test_an_agent_no_longer_configured_is_an_error_chunk(agent, monkeypatch):
    agent()
    monkeypatch.setattr(acp_config, "agents", lambda: {})
    async with running_worker():
        tab = await agent_tab()
        await run(tab, "hello")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    assert rows[1].data["message"] == "No agent named 'fake' is configured (configured: none)."


async def test_a_compaction_asked_of_an_agent_tab_says_there_is_none(agent):
    agent(FakeAgent([say("hi")]))
    async with running_worker():
        tab = await agent_tab()
        await run(tab, "hello")
        async with Watcher(tab.pk) as watcher:
            await database_sync_to_async(turns.compact)(tab)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert [r.data.get("text") for r in rows] == ["hello", "hi", acp.NO_COMPACTION]


async def test_the_picker_and_the_api_know_configured_agents_only(agent, client):
    from django.contrib.auth import get_user_model

    from chat.forms import known_models, validate_model_id

    agent()
    assert "acp/fake" in {m.id for m in await database_sync_to_async(known_models)()}
    assert validate_model_id("acp/fake") == "acp/fake"
    user = await database_sync_to_async(get_user_model().objects.create_user)("api", password="pw")
    await database_sync_to_async(client.force_login)(user)
    await Setting.objects.aget_or_create(key="approve_tools", defaults={"value": True})
    made = await database_sync_to_async(client.post)(
        "/api/v1/tabs", {"model": "acp/fake"}, content_type="application/json"
    )
    assert made.status_code == 201 and made.json()["model"] == "acp/fake"
    refused = await database_sync_to_async(client.post)(
        "/api/v1/tabs", {"model": "acp/nope"}, content_type="application/json"
    )
    assert refused.status_code == 422
    assert (
        "No agent “nope” is configured. Configured: acp/fake." in refused.json()["error"]["message"]
    )


async def test_a_mid_turn_message_goes_to_the_agent_at_its_next_prompt(agent):
    release = asyncio.Event()
    fake = FakeAgent([say("Working."), release, say("Done.")], [say("Noted.")])
    agent(fake)
    async with running_worker():
        tab = await agent_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "first")
            await watcher.until(lambda m: m["op"] == "open")
            await submit(tab, "also this")
            release.set()
            await watcher.until(
                lambda m: m["op"] == "seal" and m["block"]["data"].get("text") == "Noted."
            )
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert [(r.role, r.data["text"]) for r in rows] == [
        ("user", "first"),
        ("assistant", "Working.Done."),
        ("user", "also this"),
        ("assistant", "Noted."),
    ]
    assert [[b.text for b in blocks] for blocks in fake.prompts] == [["first"], ["also this"]]


async def test_startup_takes_a_configured_agent_as_the_default_model_never_as_a_fallback(
    agent, settings
):
    from chat import startup

    agent()
    settings.DISPATCH_MODEL, settings.DISPATCH_FALLBACK_MODEL = "acp/fake", ""
    assert startup._model_problems() == []
    settings.DISPATCH_MODEL, settings.DISPATCH_FALLBACK_MODEL = "acp/nope", "acp/fake"
    assert startup._model_problems() == [
        "DISPATCH_MODEL='acp/nope': no agent 'nope' is configured (DISPATCH_ACP_AGENTS, "
        "Settings, or a preset found on PATH).",
        "DISPATCH_FALLBACK_MODEL='acp/fake': an external agent cannot be a fallback.",
    ]


async def test_an_agent_that_does_not_confirm_the_cancel_is_closed_and_the_turn_ends(agent):
    stuck = FakeAgent([say("busy"), HANG], cancel_hangs=True)
    after = FakeAgent([say("fresh")], restored=True)
    starts = agent(stuck, after)
    async with running_worker():
        tab = await agent_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "loop")
            await watcher.until(lambda m: m["op"] == "open")
            stopped_at = time.monotonic()
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
            took = time.monotonic() - stopped_at
        await run(tab, "again")
    assert stuck.cancelled.is_set() and took < 2.0
    assert stuck.closed and len(starts) == 2
    rows = await chunks(tab.pk)
    assert [r.data.get("kind") for r in rows if r.type == "system"] == ["cancelled"]


async def test_an_idle_session_is_closed_and_a_busy_one_kept(agent):
    pool = acp.Sessions()
    idle, busy = FakeAgent(), FakeAgent()
    a, b = uuid.uuid4(), uuid.uuid4()
    pool.keep(a, "fake", idle)
    pool.keep(b, "fake", busy)
    pool.release(a)
    now = asyncio.get_running_loop().time()
    await pool.close_idle(now + acp.ACP_IDLE_SECONDS - 1)
    assert not idle.closed
    await pool.close_idle(now + acp.ACP_IDLE_SECONDS + 1)
    assert idle.closed and not busy.closed
    assert pool.take(a, "fake") is None and pool.take(b, "other") is None
    assert pool.take(b, "fake") is busy
    await pool.close_all()
    assert busy.closed


def _lease_lost(tab_id: uuid.UUID) -> list[uuid.UUID]:
    """The turn's worker taken for dead and its turn recovered (tests/test_lease_fence)."""
    RunningTurn.objects.filter(tab_id=tab_id).update(
        worker="elsewhere:1:gone", heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    return lease.recover_stale()


async def test_a_prompt_abandoned_by_its_turn_is_cancelled(agent, monkeypatch):
    """The turn's lease lost mid-prompt (its next write fails): the agent is told to stop,
    as at a Stop, not left running a turn nobody logs."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 3600)
    later = asyncio.Event()
    fake = FakeAgent([say("one"), later, *bash("t", "sleep 100"), HANG])
    agent(fake)
    async with running_worker():
        tab = await agent_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "open")
        assert await database_sync_to_async(_lease_lost)(tab.pk) == [tab.pk]
        later.set()
        await asyncio.wait_for(fake.cancelled.wait(), 5.0)


async def test_closing_all_sessions_finishes_an_idle_close_under_way(agent):
    """A worker stopping cancels the sweep, never the close it was awaiting: that close
    is finished (the agent's sandbox not left running)."""
    pool = acp.Sessions()
    slow = FakeAgent(close_takes=0.3)
    pool.keep(uuid.uuid4(), "fake", slow)
    pool.release(next(iter(pool.entries)))
    later = asyncio.get_running_loop().time() + acp.ACP_IDLE_SECONDS + 1
    if pool.sweeper is not None:
        pool.sweeper.cancel()
    pool.sweeper = asyncio.create_task(pool.close_idle(later))
    await asyncio.sleep(0.05)
    await pool.close_all()
    assert slow.closed


async def test_a_regenerated_branch_starts_a_fresh_agent_on_the_question_again(agent):
    first = FakeAgent([say("One answer.")])
    second = FakeAgent([say("Another answer.")])
    starts = agent(first, second)
    async with running_worker():
        tab = await agent_tab()
        await run(tab, "a question")
        rows = await chunks(tab.pk)
        branched = await database_sync_to_async(turns.regenerate)(tab, rows[-1].seq)
        child = branched.tab.pk
        async with asyncio.timeout(10):  # the branch's own turn: answered, its lease released
            while not (
                any(r.role == "assistant" for r in await chunks(child))
                and not await RunningTurn.objects.filter(tab_id=child).aexists()
            ):
                await asyncio.sleep(0.02)
    assert [s.resume for s in starts] == [None, None]
    assert [[b.text for b in blocks] for blocks in second.prompts] == [["a question"]]
    answers = [r.data.get("text") for r in await chunks(branched.tab.pk) if r.role == "assistant"]
    assert answers == ["Another answer."]


async def test_settings_changed_during_an_agent_turn_are_said_at_its_end(agent):
    release = asyncio.Event()
    agent(FakeAgent([say("Working."), release, say("Done.")]))
    async with running_worker():
        tab = await agent_tab(approve_tools=False)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(lambda m: m["op"] == "open")
            await Setting.objects.aupdate_or_create(key="approve_tools", defaults={"value": True})
            release.set()
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert kinds(rows)[-1] == "system/system"
    assert rows[-1].data == {"kind": "config-reload", "text": "Settings changed: tool approval on."}
