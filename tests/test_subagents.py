"""Sub-agents (the `agent` tool, chat.turn.agents): child tabs made, followed and read, their
caps, approvals, Stop and usage, with scripted providers at the boundary (one per tab:
a parent and its children stream at the same time)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from chat import render, turns, worker
from chat.models import Chunk, Profile, QueuedMessage, RunningTurn, Tab, UsageRecord
from chat.providers import aget_provider
from chat.providers.base import (
    Finish,
    ProviderError,
    ReasoningDelta,
    ReasoningEnd,
    TextDelta,
    ToolCallEvent,
    Usage,
)
from chat.providers.replay import ScriptedProvider
from chat.turn import agents, lease, step
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


class Tabs:
    """Scripted providers by the first user message of a request: the parent's, and each
    child's prompt. A model id in `real` goes to the real provider factory."""

    def __init__(self) -> None:
        self.by_prompt: dict[str, ScriptedProvider] = {}
        self.real: set[str] = set()

    def script(self, prompt: str, *steps) -> ScriptedProvider:
        provider = ScriptedProvider(list(steps))
        self.by_prompt[prompt] = provider
        return provider

    async def provider_for(self, model: str):
        if model in self.real:
            return await aget_provider(model)
        return self

    async def stream(self, request):
        first = request.messages[0].parts[-1].text
        async for event in self.by_prompt[first].stream(request):
            yield event


@pytest.fixture
def tabs(monkeypatch, workspace):
    routed = Tabs()
    monkeypatch.setattr(step, "provider_for", routed.provider_for)
    return routed


def call(call_id: str, name: str, **arguments) -> ToolCallEvent:
    return ToolCallEvent(call_id, name, arguments)


def delegate(call_id: str, prompt: str, description: str = "Look around", **more):
    return call(call_id, "agent", description=description, prompt=prompt, **more)


def result_of(rows, call_id: str) -> Chunk:
    return next(c for c in rows if c.type == "tool_result" and c.data["call_id"] == call_id)


def tail(result: Chunk) -> dict:
    return json.loads(result.data["result"].rsplit("\n", 1)[-1])


async def run_parent(tab, text: str = "go"):
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        await watcher.until_idle()
    return watcher


async def child_pk(tab_pk, call_id: str) -> uuid.UUID:
    """The id of the child the tab's last call of that id made (chat.turn.agents.child_id)."""
    seq = (
        await Chunk.objects.filter(tab_id=tab_pk, type="tool_call", data__call_id=call_id)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .afirst()
    )
    return agents.child_id(tab_pk, call_id, seq)


async def child_of(tab, call_id: str) -> Tab:
    return await Tab.objects.aget(pk=await child_pk(tab.pk, call_id))


async def test_the_result_is_every_text_of_the_childs_last_step_and_a_json_tail(tabs):
    """The child is a tab of the parent's owner, id uuid5(parent, call@seq), its title the
    description, its message marked as the parent's; it runs two steps; the parent gets
    both text blocks of the last one (not only the last block), then {child_tab, status,
    usage}; the child has no `agent` tool (no nesting)."""
    parent_provider = tabs.script(
        "go",
        [delegate("c1", "count the files"), Finish(Usage(10, 5), "tool_use")],
        [TextDelta("The child said so."), Finish(Usage(30, 4))],
    )
    child_provider = tabs.script(
        "count the files",
        [TextDelta("Looking."), call("l1", "list_files"), Finish(Usage(7, 3), "tool_use")],
        [
            TextDelta("There are no files."),
            ReasoningDelta("double check"),
            ReasoningEnd(signature="sig"),
            TextDelta("Nothing else to say."),
            Finish(Usage(9, 2)),
        ],
    )
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_of(tab, "c1")
    assert child.parent_tab_id == tab.pk and child.parent_call_id == "c1"
    assert child.owner_id == tab.owner_id and child.title == "Look around"
    assert child.model == tab.model and child.system_prompt == tab.system_prompt
    first = (await chunks(child.pk))[0]
    assert first.data["origin"] == {"kind": "agent", "parent_tab": str(tab.pk), "call_id": "c1"}
    assert first.data["text"] == "count the files"
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/tool_call",
        "tool/tool_result",
        "assistant/text",
    ]
    result = result_of(rows, "c1")
    assert result.data["is_error"] is False
    assert result.data["child_tab"] == str(child.pk)
    text = result.data["result"]
    assert text.startswith("There are no files.\n\nNothing else to say.\n\n{")
    assert "Looking." not in text
    meta = tail(result)
    assert meta["child_tab"] == str(child.pk) and meta["status"] == "completed"
    assert meta["usage"]["input"] == 16 and meta["usage"]["output"] == 5
    # The parent's second request holds the result; the child was never offered `agent`.
    assert parent_provider.requests[1].messages[-1].parts[0].result == text
    assert "agent" not in {t.name for t in child_provider.requests[0].tools}
    assert "agent" in {t.name for t in parent_provider.requests[0].tools}


async def test_a_child_that_writes_no_text_says_so(tabs):
    """An empty final step is neither an error nor an empty result: it is said."""
    tabs.script(
        "go",
        [delegate("c1", "be quiet"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("be quiet", [Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is False
    assert result.data["result"].startswith(agents.NO_TEXT + "\n\n{")
    assert tail(result)["status"] == "completed"


async def test_a_child_that_fails_on_its_first_step_is_an_error_naming_it(tabs):
    tabs.script(
        "go",
        [delegate("c1", "fail please"), Finish(stop_reason="tool_use")],
        [TextDelta("It failed."), Finish()],
    )
    tabs.script("fail please", [ProviderError("Bad request: no such thing", status_code=400)])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_of(tab, "c1")
    assert kinds(await chunks(child.pk)) == ["user/text", "assistant/error"]
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    text = result.data["result"]
    assert text.startswith(f"Sub-agent “Look around” (tab {child.pk}) stopped on an error:")
    assert "Bad request: no such thing" in text
    assert tail(result)["status"] == "error"


async def test_a_child_whose_model_has_no_key_is_an_error_saying_which_key(tabs, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    model = "anthropic/claude-sonnet-4-5"
    tabs.real.add(model)
    await Profile.objects.acreate(name="keyless", model=model)
    tabs.script(
        "go",
        [delegate("c1", "do it", profile="keyless"), Finish(stop_reason="tool_use")],
        [TextDelta("No luck."), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_of(tab, "c1")
    assert child.model == model
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    assert "No API key for" in result.data["result"]
    assert "ANTHROPIC_API_KEY" in result.data["result"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"description": "x", "prompt": "do it", "profile": "nobody"},
            "Not run: No profile named “nobody”. Profiles: none yet.",
        ),
        (
            {"description": "x", "prompt": "   "},
            "invalid arguments for agent: argument 'prompt' must not be blank",
        ),
        (
            {"description": "x", "prompt": 42},
            "invalid arguments for agent: argument 'prompt' must be a string, not integer",
        ),
        (
            {"description": "x"},
            "invalid arguments for agent: missing required argument 'prompt'",
        ),
    ],
)
async def test_a_bad_call_is_answered_with_an_error_and_makes_no_child(tabs, arguments, message):
    tabs.script(
        "go",
        [ToolCallEvent("c1", "agent", arguments), Finish(stop_reason="tool_use")],
        [TextDelta("Sorry."), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    assert result.data["result"] == message
    assert not await Tab.objects.filter(parent_tab=tab.pk).aexists()


async def test_the_step_limit_ends_the_call_with_an_error_naming_the_child(tabs, settings):
    settings.DISPATCH_CHILD_MAX_STEPS = 1
    tabs.script(
        "go",
        [delegate("c1", "loop"), Finish(stop_reason="tool_use")],
        [TextDelta("It looped."), Finish()],
    )
    tabs.script("loop", [TextDelta("Step one."), call("l", "list_files"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_of(tab, "c1")
    child_rows = await chunks(child.pk)
    assert child_rows[-1].data["kind"] == "step-limit"
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    text = result.data["result"]
    assert text.startswith(
        f"Sub-agent “Look around” (tab {child.pk}) did not finish: "
        "it stopped at its step limit (1 steps)."
    )
    assert "Step one." in text
    assert tail(result)["status"] == "step-limit"


async def test_the_time_limit_stops_the_child_and_ends_the_call_with_an_error(tabs, settings):
    settings.DISPATCH_CHILD_TIMEOUT = 1
    tabs.script(
        "go",
        [delegate("c1", "hang"), Finish(stop_reason="tool_use")],
        [TextDelta("It hung."), Finish()],
    )
    tabs.script("hang", [TextDelta("Thinking about it"), asyncio.Event()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_of(tab, "c1")
    child_rows = await chunks(child.pk)
    assert child_rows[-1].data["kind"] == "cancelled"
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    assert result.data["result"].startswith(
        f"Sub-agent “Look around” (tab {child.pk}) ran out of time (1 s)."
    )
    assert tail(result)["status"] == "cancelled"


async def test_calls_past_the_concurrency_cap_are_refused_and_the_rest_run_together(tabs, settings):
    """Two children run at once (each waits until the other has started); a third call in
    the same step is refused without a child."""
    settings.DISPATCH_CHILD_CONCURRENCY = 2
    both = asyncio.Event()
    tabs.script(
        "go",
        [
            delegate("a", "first", "A"),
            delegate("b", "second", "B"),
            delegate("c", "third", "C"),
            Finish(stop_reason="tool_use"),
        ],
        [TextDelta("Done."), Finish()],
    )
    first = tabs.script("first", [both, TextDelta("one"), Finish()])
    second = tabs.script("second", [both, TextDelta("two"), Finish()])

    async def release_when_both_asked():
        while not (first.requests and second.requests):
            await asyncio.sleep(0.05)
        both.set()

    releaser = asyncio.create_task(release_when_both_asked())
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    await releaser
    rows = await chunks(tab.pk)
    assert result_of(rows, "a").data["result"].startswith("one\n\n")
    assert result_of(rows, "b").data["result"].startswith("two\n\n")
    refused = result_of(rows, "c")
    assert refused.data["is_error"] is True
    assert refused.data["result"].startswith("Not run: too many sub-agents at once")
    assert await Tab.objects.filter(parent_tab=tab.pk).acount() == 2


async def test_stop_on_the_parent_stops_its_children(tabs):
    tabs.script("go", [delegate("a", "first", "A"), delegate("b", "second", "B"), Finish()])
    tabs.script("first", [TextDelta("working"), asyncio.Event()])
    tabs.script("second", [TextDelta("working too"), asyncio.Event()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and [c["state"] for c in m["status"].get("children", [])] == ["running"] * 2
                )
            )
            await database_sync_to_async(turns.cancel)(tab.pk)
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert rows[-1].data["kind"] == "cancelled"
    for call_id in ("a", "b"):
        child = await child_of(tab, call_id)
        assert (await chunks(child.pk))[-1].data["kind"] == "cancelled"
        result = result_of(rows, call_id)
        assert result.data["is_error"] is True
        assert "was stopped with its parent" in result.data["result"]


async def test_a_childs_approval_shows_in_the_parent_and_is_answered_on_the_child(tabs):
    tabs.script(
        "go",
        [delegate("c1", "write it"), Finish(stop_reason="tool_use")],
        [TextDelta("Written."), Finish()],
    )
    tabs.script(
        "write it",
        [call("w", "write_file", path="x.txt", content="hi"), Finish(stop_reason="tool_use")],
        [TextDelta("Wrote x.txt."), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            asking = await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and any(c.get("approval") for c in m["status"].get("children", []))
                )
            )
            (entry,) = asking["status"]["children"]
            child_id = await child_pk(tab.pk, "c1")
            assert entry["tab"] == str(child_id) and entry["title"] == "Look around"
            assert entry["state"] == "waiting"
            assert entry["approval"] == {
                "call_id": "w",
                "name": "write_file",
                "arguments": {"path": "x.txt", "content": "hi"},
            }
            await database_sync_to_async(turns.approve)(child_id, "w", True)
            await watcher.until_idle()
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["result"].startswith("Wrote x.txt.\n\n")


async def test_a_child_deleted_while_the_parent_waits_is_an_error(tabs):
    tabs.script(
        "go",
        [delegate("c1", "hang"), Finish(stop_reason="tool_use")],
        [TextDelta("Gone."), Finish()],
    )
    tabs.script("hang", [TextDelta("working"), asyncio.Event()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and [c["state"] for c in m["status"].get("children", [])] == ["running"]
                )
            )
            await Tab.objects.filter(pk=await child_pk(tab.pk, "c1")).adelete()
            await watcher.until_idle()
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    assert "was deleted before it finished" in result.data["result"]
    assert tail(result)["status"] == "gone"


async def test_a_profile_that_allows_nesting_gives_its_children_the_agent_tool(tabs):
    await Profile.objects.acreate(name="nester", allow_nesting=True)
    tabs.script(
        "go",
        [delegate("c1", "nest", profile="nester"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    nested = tabs.script("nest", [TextDelta("fine"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    assert "agent" in {t.name for t in nested.requests[0].tools}
    child = await child_of(tab, "c1")
    assert child.profile_id is not None


async def test_ensure_finds_the_child_a_call_made(tabs):
    """A resumed call makes no second child and queues no second prompt."""
    tab = await make_tab()
    arguments = {"description": "d", "prompt": "p"}
    ensure = database_sync_to_async(agents.ensure)
    first, made = await ensure(tab.pk, "c1", arguments, call_seq=2)
    again, made_again = await ensure(tab.pk, "c1", arguments, call_seq=2)
    assert made and not made_again and first.pk == again.pk
    assert first.pk == uuid.uuid5(tab.pk, "c1@2")
    assert await first.queued.acount() == 1


async def test_the_parents_usage_includes_its_childrens(tabs):
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(Usage(10, 1), "tool_use")],
        [TextDelta("ok"), Finish(Usage(20, 2))],
    )
    tabs.script("work", [TextDelta("done"), Finish(Usage(100, 50))])
    async with running_worker():
        tab = await make_tab()
        watcher = await run_parent(tab)
    idle = watcher.ops[-1]["status"]
    assert idle["turn_end"]["turn"]["input"] == 130
    assert idle["turn_end"]["turn"]["output"] == 53
    assert idle["turn_end"]["tab"]["input"] == 130
    assert await UsageRecord.objects.filter(tab_id=tab.pk).acount() == 2


# --- a parent whose worker stops while its children run ---------------------------------


async def test_a_parent_recovered_while_its_child_runs_waits_for_that_child(tabs, monkeypatch):
    """The parent's worker is dead (its lease stale, another host's): recovery leaves the
    `agent` call open and resumes the turn, which finds the child it made (no second one),
    waits for it and answers the call with its text; the dead runner writes nothing."""
    monkeypatch.setattr(lease, "HEARTBEAT_SECONDS", 0.1)
    release = asyncio.Event()
    parent = tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("The child is done."), Finish()],
    )
    tabs.script("work", [TextDelta("started"), release, TextDelta(" and finished"), Finish()])
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and [c["state"] for c in m["status"].get("children", [])] == ["running"]
                )
            )
            dead = worker.RUNNING[tab.pk]
            await RunningTurn.objects.filter(tab_id=tab.pk).aupdate(
                worker="elsewhere:1:gone", heartbeat_at=timezone.now() - timedelta(minutes=5)
            )
            assert await database_sync_to_async(lease.recover_stale)() == [tab.pk]
            while not dead.lease_lost:
                await asyncio.sleep(0.05)
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
        "tool/tool_result",
        "assistant/text",
    ]
    assert rows[2].data["kind"] == "interrupted" and lease.RESUMING in rows[2].data["text"]
    result = result_of(rows, "c1")
    assert result.data["is_error"] is False
    assert result.data["result"].startswith("started and finished\n\n")
    assert result.turn_id != rows[1].turn_id == rows[2].turn_id
    assert parent.requests[1].messages[-1].parts[0].result == result.data["result"]
    assert not await QueuedMessage.objects.filter(tab_id=tab.pk).aexists()


async def test_a_parent_stopped_with_its_worker_resumes_and_reads_its_finished_child(
    tabs, settings
):
    """The worker shuts down (both turns interrupted): the parent's `agent` call stays open
    and a rerun waits; the next worker resumes the parent, which reads the child's ending
    from the child's log (interrupted: an error naming it) instead of making another."""
    settings.DISPATCH_SHUTDOWN_GRACE = 0
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("It was cut."), Finish()],
    )
    tabs.script("work", [TextDelta("started"), asyncio.Event()])
    tab = await make_tab()
    async with Watcher(tab.pk) as watcher:
        async with running_worker():
            await submit(tab, "go")
            await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and [c["state"] for c in m["status"].get("children", [])] == ["running"]
                )
            )
        rows = await chunks(tab.pk)
        assert kinds(rows) == ["user/text", "assistant/tool_call", "system/system"]
        assert lease.RESUMING.strip() in rows[-1].data["text"]
        assert await QueuedMessage.objects.filter(tab_id=tab.pk, rerun=True).aexists()
        child = await child_of(tab, "c1")
        assert (await chunks(child.pk))[-1].data["kind"] == "interrupted"
        async with running_worker():
            await watcher.until(
                lambda m: (
                    m["op"] == "seal"
                    and m["block"]["type"] == "text"
                    and m["block"]["role"] == "assistant"
                )
            )
            await watcher.until_idle()
    assert await Tab.objects.filter(parent_tab=tab.pk).acount() == 1
    result = result_of(await chunks(tab.pk), "c1")
    assert result.data["is_error"] is True
    assert "its server stopped in the middle of its turn" in result.data["result"]
    assert "started" in result.data["result"]


async def test_the_result_card_links_to_the_childs_tab(tabs):
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("work", [TextDelta("done"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_pk(tab.pk, "c1")

    def page() -> str:
        client = Client()
        client.force_login(tab.owner)
        return client.get(f"/t/{tab.pk}/").content.decode()

    html = await database_sync_to_async(page)()
    assert f'href="/t/{child}/">Open the sub-agent’s tab</a>' in html


async def test_the_status_frame_puts_a_childs_approval_in_the_bar_and_its_state_on_its_card():
    """The parent's status frame: the status line only counts its sub-agents; each one's
    state and step go to its call's card (keyed by the call), and each approval pending
    in the tree (a sub-agent's own sub-agent's too) is a row of the approval bar naming
    the sub-agent and the call, whose buttons post to that sub-agent's tab."""
    child, grand = uuid.uuid4(), uuid.uuid4()
    status = {
        "state": "running",
        "step": 1,
        "children": [
            {
                "tab": str(child),
                "title": "Survey <b>",
                "call_id": "c1",
                "state": "waiting",
                "step": 2,
                "approval": {
                    "call_id": "w",
                    "name": "write_file",
                    "arguments": {"path": "x.txt", "content": "hi"},
                },
                "children": [
                    {
                        "tab": str(grand),
                        "title": "Deep",
                        "call_id": "g1",
                        "state": "waiting",
                        "step": 1,
                        "approval": {
                            "call_id": "s",
                            "name": "shell",
                            "arguments": {"command": "ls"},
                        },
                    }
                ],
            }
        ],
    }
    html = render.fragment_status(status)
    assert '<span class="sep child-status">sub-agent asks approval</span>' in html
    assert '<div id="approval" class="approval" hx-swap-oob="true">' in html  # not hidden
    form = f'<form id="approve-form-{child}" class="child-approval" data-child="{child}"'
    assert form in html
    assert f'hx-post="/t/{child}/approve/"' in html
    assert f'Sub-agent <a href="/t/{child}/">Survey &lt;b&gt;</a>:</span>' in html
    assert '<span class="tool-name">write_file</span> <code>x.txt</code>' in html
    for answer in ("approve", "deny", "always_tab", "always_user"):
        assert f'form="approve-form-{child}" name="{answer}" value="w"' in html
    assert ">its tab</button>" in html
    assert f'hx-post="/t/{grand}/approve/"' in html
    assert 'Deep</a> <span class="muted">(under Survey &lt;b&gt;)</span>' in html
    assert f'form="approve-form-{grand}" name="approve" value="s"' in html
    card = f'innerHTML:[data-child-card="{render.approve_key("c1")}"]'
    assert card in html
    assert f'<a class="child-tab" href="/t/{child}/">Survey &lt;b&gt;</a>' in html
    assert '<span class="child-state state-waiting">waiting for approval</span>' in html
    assert '<span class="child-step">step 2</span>' in html

    running = {**status["children"][0], "state": "running", "approval": None, "children": []}
    html = render.fragment_status({**status, "children": [running, {**running, "tab": str(grand)}]})
    assert '<span class="sep child-status">2 sub-agents</span>' in html
    assert '<div id="approval" class="approval" hx-swap-oob="true" hidden>' in html
    assert "child-approval" not in html
    assert '<span class="child-state state-running">running</span>' in html
    idle = render.fragment_status({**status, "state": "idle"})
    for gone in ("sub-agent", "child-approval", "data-child-card"):
        assert gone not in idle


async def test_a_childs_approval_is_answered_from_the_parent_and_never_by_another_user(tabs):
    """The parent's approval bar posts to the child's approve endpoint: another user's
    post is a 404 and leaves the child waiting; the owner's approves it, the child's turn
    goes on and the parent gets its result."""
    tabs.script(
        "go",
        [delegate("c1", "write it"), Finish(stop_reason="tool_use")],
        [TextDelta("Written."), Finish()],
    )
    tabs.script(
        "write it",
        [call("w", "write_file", path="x.txt", content="hi"), Finish(stop_reason="tool_use")],
        [TextDelta("Wrote x.txt."), Finish()],
    )
    intruder = await database_sync_to_async(User.objects.create_user)("intruder")

    def post(user, url: str, **data) -> int:
        client = Client()
        client.force_login(user)
        return client.post(url, data, HTTP_HX_REQUEST="true").status_code

    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            asking = await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and any(c.get("approval") for c in m["status"].get("children", []))
                )
            )
            html = render.fragment_status(asking["status"])
            action = re.search(r'class="child-approval"[^>]* hx-post="([^"]+)"', html)[1]
            child = await child_pk(tab.pk, "c1")
            assert action == f"/t/{child}/approve/"
            assert await database_sync_to_async(post)(intruder, action, approve="w") == 404
            assert (await RunningTurn.objects.aget(tab_id=child)).status == "waiting"
            assert await database_sync_to_async(post)(tab.owner, action, approve="w") == 204
            gone = await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and not any(c.get("approval") for c in m["status"].get("children", []))
                )
            )
            assert "child-approval" not in render.fragment_status(gone["status"])
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert result_of(rows, "c1").data["result"].startswith("Wrote x.txt.\n\n")
    assert rows[-1].data["text"] == "Written."


async def test_a_grandchilds_approval_reaches_the_top_tab_and_is_answered_there(tabs):
    """With a profile that allows nesting, a sub-agent's own sub-agent's approval is in
    the top tab's status (under its parent's entry) and bar, and answering it there lets
    the whole tree finish."""
    await Profile.objects.acreate(name="nester", allow_nesting=True)
    tabs.script(
        "go",
        [delegate("c1", "nest", "Middle", profile="nester"), Finish(stop_reason="tool_use")],
        [TextDelta("Top done."), Finish()],
    )
    tabs.script(
        "nest",
        [delegate("g1", "deep", "Bottom"), Finish(stop_reason="tool_use")],
        [TextDelta("Middle done."), Finish()],
    )
    tabs.script(
        "deep",
        [call("w", "write_file", path="x.txt", content="hi"), Finish(stop_reason="tool_use")],
        [TextDelta("Bottom done."), Finish()],
    )

    def asks(message) -> bool:
        return message["op"] == "status" and any(
            grand.get("approval")
            for entry in message["status"].get("children", [])
            for grand in entry.get("children") or []
        )

    def post(user, url: str, **data) -> int:
        client = Client()
        client.force_login(user)
        return client.post(url, data, HTTP_HX_REQUEST="true").status_code

    async with running_worker():
        tab = await make_tab(approve_tools=True)
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            asking = await watcher.until(asks)
            middle = await child_pk(tab.pk, "c1")
            bottom = await child_pk(middle, "g1")
            html = render.fragment_status(asking["status"])
            assert 'Bottom</a> <span class="muted">(under Middle)</span>' in html
            action = f"/t/{bottom}/approve/"
            assert f'hx-post="{action}"' in html
            assert await database_sync_to_async(post)(tab.owner, action, approve="w") == 204
            await watcher.until_idle()
    rows = await chunks(tab.pk)
    assert result_of(rows, "c1").data["result"].startswith("Middle done.\n\n")
    assert rows[-1].data["text"] == "Top done."


async def test_a_child_followed_late_shows_its_approval_and_keeps_it_across_polls(
    tabs, monkeypatch
):
    """A parent that starts following a child already waiting for approval (re-attached
    after a crash) learns the approval from the child's runner; the database polls that
    follow (which know the state, not the question) keep it."""
    monkeypatch.setattr(agents, "POLL_SECONDS", 0.05)
    tabs.script(
        "write it",
        [call("w", "write_file", path="x.txt", content="hi"), Finish(stop_reason="tool_use")],
        [TextDelta("Wrote x.txt."), Finish()],
    )
    seen: list[dict] = []
    polls = asyncio.Event()

    async def on_status(live: dict) -> None:
        seen.append(dict(live))
        if len(seen) >= 8:
            polls.set()

    async with running_worker():
        parent = await make_tab(approve_tools=True)
        arguments = {"description": "Write", "prompt": "write it"}
        child, _ = await database_sync_to_async(agents.ensure)(
            parent.pk, "c1", arguments, call_seq=2
        )
        async with Watcher(child.pk) as watcher:
            await watcher.until(lambda m: m["op"] == "status" and m["status"].get("approval"))
        stop = asyncio.Event()
        following = asyncio.create_task(
            agents.wait(child.pk, "c1", on_status, timeout=60, cancelled=stop)
        )
        await polls.wait()
        stop.set()
        _, why = await following
        assert why == agents.STOPPED
        asked = [i for i, live in enumerate(seen) if live.get("approval")]
        assert asked, seen
        assert seen[asked[0]]["approval"]["call_id"] == "w"
        assert all(live.get("approval", "kept") for live in seen[asked[0] :]), seen
        await database_sync_to_async(turns.approve)(child.pk, "w", True)


async def test_a_childs_page_links_back_to_its_parent_and_the_sidebar_marks_it(tabs):
    tabs.script(
        "go",
        [delegate("c1", "work"), Finish(stop_reason="tool_use")],
        [TextDelta("ok"), Finish()],
    )
    tabs.script("work", [TextDelta("done"), Finish()])
    async with running_worker():
        tab = await make_tab()
        await run_parent(tab)
    child = await child_pk(tab.pk, "c1")

    def page() -> str:
        client = Client()
        client.force_login(tab.owner)
        return client.get(f"/t/{child}/").content.decode()

    html = await database_sync_to_async(page)()
    assert f'A sub-agent of <a href="/t/{tab.pk}/">go</a>' in html
    assert html.count('class="child-mark"') == 1
