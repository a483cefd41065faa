"""A tab made from a profile, in a turn: its tools run in its working directory, and a
profile whose model is no longer served makes the turn say so (not crash or hang)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from chat.models import Profile, Setting
from chat.preferences import new_tab
from chat.providers.base import Finish, TextDelta, ToolCallEvent
from chat.providers.replay import ScriptedProvider
from chat.turn import step
from tests.engine import Watcher, chunks, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "site").mkdir()
    (workspace / "site" / "index.html").write_text("<h1>hi</h1>")
    (workspace / "secret.txt").write_text("not for this tab")
    return workspace


@database_sync_to_async
def tab_from(profile: dict, workdir: str = ""):
    owner, _ = get_user_model().objects.get_or_create(username="owner")
    return new_tab(owner, profile=Profile.objects.create(**profile), workdir=workdir)


async def run_one(tab, text: str) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        await watcher.until_idle()


async def test_the_tools_run_in_the_tabs_working_directory(monkeypatch, workspace):
    provider = ScriptedProvider(
        [
            [ToolCallEvent("c1", "list_files", {"path": "."}), Finish(stop_reason="tool_use")],
            [TextDelta("Done."), Finish()],
        ]
    )

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    tab = await tab_from(
        {"name": "site", "model": "scripted/test", "tools": ["list_files"]}, "site"
    )
    async with running_worker():
        await run_one(tab, "What is here?")
    result = next(c for c in await chunks(tab.pk) if c.type == "tool_result")
    assert "index.html" in result.data["result"] and "secret.txt" not in result.data["result"]
    assert [t.name for t in provider.requests[0].tools] == ["list_files"]


async def test_a_profile_whose_model_is_gone_makes_the_turn_say_so(workspace):
    tab = await tab_from({"name": "old", "model": "retired/model-1"})
    async with running_worker():
        await run_one(tab, "hello?")
    error = next(c for c in await chunks(tab.pk) if c.type == "error")
    assert error.data["message"] == (
        "unknown model provider 'retired' in 'retired/model-1' "
        "(known: anthropic, deepseek, offline, openai)"
    )


async def test_a_call_of_a_tool_the_profile_leaves_out_is_not_run(monkeypatch, workspace):
    """The allow-list holds for calls, not only for the list sent: a model that calls a
    tool it was not offered (approval off, so nobody would be asked) gets an error."""
    provider = ScriptedProvider(
        [
            [
                ToolCallEvent("c1", "write_file", {"path": "pwn.txt", "content": "x"}),
                ToolCallEvent("c2", "read_file", {"path": "secret.txt"}),
                Finish(stop_reason="tool_use"),
            ],
            [TextDelta("Done."), Finish()],
        ]
    )

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    await database_sync_to_async(Setting.objects.update_or_create)(
        key="approve_tools", defaults={"value": False}
    )
    tab = await tab_from({"name": "ro", "model": "scripted/test", "tools": ["read_file"]})
    async with running_worker():
        await run_one(tab, "Write something")
    assert not (workspace / "pwn.txt").exists()
    results = {c.data["call_id"]: c.data for c in await chunks(tab.pk) if c.type == "tool_result"}
    assert results["c1"]["is_error"] and "not one of this tab's tools" in results["c1"]["result"]
    assert results["c2"]["result"].startswith("not for this tab")
