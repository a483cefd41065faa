"""A whole turn through the Responses API: the fake server answers `/v1/responses` by
what each request holds, through the real SDK and the turn engine."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from chat import log, transfer, usage
from chat.history import History
from chat.models import Tab, UsageRecord
from chat.providers.base import Request
from chat.providers.registry import model_info
from chat.providers.responses import build_params
from chat.render.usage import usage_line
from chat.usage import Totals
from harness.fakeprovider import (
    FIXTURES,
    FakeProviderServer,
    Recorded,
    Reply,
    ResponsesStream,
    recorded,
)
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit
from tests.test_golden import UPDATE, import_golden, next_request, stable
from tests.test_responses import STEP1, STEP2, done_item

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


def answer(request: Recorded) -> Reply:
    """The model: two parallel calls when nothing has been called yet, then the answer
    once every call has its output."""
    items = request.json["input"]
    called = {i["call_id"] for i in items if i.get("type") == "function_call"}
    answered = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    if not called:
        return Reply(events=recorded(STEP1))
    if called == answered:
        return Reply(events=recorded(STEP2))
    return Reply.error(400, "invalid_request_error", f"calls without output: {called - answered}")


@pytest.fixture
def responses_server(monkeypatch):
    server = FakeProviderServer(respond=answer).start()
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.setenv("OPENAI_API_STYLE", "responses")
    yield server
    server.stop()


async def run_one(tab, text: str) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, text)
        await watcher.until_idle()


def wire(value) -> bytes:
    """JSON as the SDK writes a request body."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


async def test_reasoning_and_parallel_calls_survive_into_the_next_step(responses_server, workspace):
    async with running_worker():
        tab = await make_tab("openai/gpt-5")
        await run_one(tab, "Weather in Paris and Oslo?")
    rows = await chunks(tab.pk)
    assert kinds(rows) == [
        "user/text",
        "assistant/thinking",
        "assistant/tool_call",
        "assistant/tool_call",
        "tool/tool_result",
        "tool/tool_result",
        "assistant/thinking",
        "assistant/text",
    ]
    assert rows[1].data["reasoning_item"] == done_item(STEP1, 0)
    assert rows[1].data["text"].endswith("in parallel.\n\nCelsius for both.")
    assert [r.data["call_id"] for r in rows[2:6]] == ["call_01Paris", "call_02Oslo"] * 2
    assert rows[6].data == {"text": "", "reasoning_item": done_item(STEP2, 0)}
    assert rows[7].data["text"] == "Paris: 18 °C and sunny. Oslo: no such city, says the tool."

    first, second = responses_server.requests
    assert first.path == second.path == "/v1/responses"
    # The reasoning item goes back byte for byte, as .done had it.
    assert done_item(STEP1, 0).encode() in second.body
    # The first request's input is the start of the second's, to the byte.
    before = wire(first.json["input"])
    assert before in first.body, "the body is written as `wire` writes it"
    # Everything up to the end of the first's input (all but its closing bracket) is
    # the same bytes at the same place in the second: model, instructions, input.
    end = first.body.index(before) + len(before) - 1
    assert second.body[:end] == first.body[:end]
    new = second.json["input"][len(first.json["input"]) :]
    assert [(i.get("type"), i.get("call_id")) for i in new] == [
        ("reasoning", None),
        ("function_call", "call_01Paris"),
        ("function_call", "call_02Oslo"),
        ("function_call_output", "call_01Paris"),
        ("function_call_output", "call_02Oslo"),
    ]
    for body in (first.json, second.json):
        assert body["store"] is False
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["prompt_cache_key"] == str(tab.pk)
        assert body["instructions"] == first.json["instructions"]


async def test_usage_and_cost_are_recorded_per_step(responses_server, workspace):
    async with running_worker():
        tab = await make_tab("openai/gpt-5")
        await run_one(tab, "Weather in Paris and Oslo?")
    records = await database_sync_to_async(list)(UsageRecord.objects.order_by("step"))
    assert [(r.step, r.input_tokens, r.cache_read_tokens, r.output_tokens) for r in records] == [
        (1, 1320, 0, 262),
        (2, 210, 1280, 58),
    ]
    totals = await database_sync_to_async(usage.tab_totals)(tab.pk)
    assert totals.unknown == ()
    # GPT-5: $1.25 per million input tokens, $0.125 cached, $10 output (reasoning included).
    expected = (
        Decimal(1320 + 210) * Decimal("1.25") + 1280 * Decimal("0.125") + (262 + 58) * 10
    ) / 10**6
    assert totals.usd == expected
    # Reasoning is part of the output, and the usage line says how much of it.
    assert (totals.tokens.output, totals.tokens.reasoning) == (320, 216)
    assert "output 320 (216 reasoning)" in usage_line(totals)["detail"]
    assert Totals.from_dict(totals.as_dict()).tokens == totals.tokens


async def test_the_output_limit_gives_its_notice(responses_server, workspace):
    responses_server.add(Reply(events=recorded("responses/incomplete-max-output.jsonl")))
    async with running_worker():
        tab = await make_tab("openai/gpt-5")
        await run_one(tab, "Explain everything.")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/thinking", "assistant/text", "system/system"]
    assert rows[-1].data["kind"] == "output-limit"


async def test_a_failed_response_is_an_error_card_with_its_message(responses_server, workspace):
    """invalid_prompt is not retried: one request, one error chunk saying why."""
    failed = {
        "type": "response.failed",
        "response": {"error": {"code": "invalid_prompt", "message": "This prompt was flagged."}},
    }
    responses_server.add(Reply(events=[failed]))
    async with running_worker():
        tab = await make_tab("openai/gpt-5")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows) == ["user/text", "assistant/error"]
    assert "This prompt was flagged." in rows[-1].data["message"]
    assert "(invalid_prompt)" in rows[-1].data["message"]
    assert len(responses_server.requests) == 1


async def test_a_server_error_event_is_retried(responses_server, workspace, monkeypatch):
    monkeypatch.setattr("chat.retry.RETRY_DELAYS", (0.01, 0.01, 0.01))
    responses_server.add(Reply(events=recorded("responses/failed.jsonl")))
    stream = ResponsesStream(model="gpt-5").text("Back again.").events()
    responses_server.add(Reply(events=stream))
    async with running_worker():
        tab = await make_tab("openai/gpt-5")
        await run_one(tab, "hi")
    rows = await chunks(tab.pk)
    assert kinds(rows)[-1] == "assistant/text" and rows[-1].data["text"] == "Back again."
    assert len(responses_server.requests) == 2


# --- The recorded tab's next request -------------------------------------------------

GOLDEN_REQUEST = FIXTURES / "responses" / "request.golden.json"


async def test_the_next_request_of_the_recorded_tab_is_unchanged(
    fake_server, monkeypatch, settings, tmp_path
):
    """The golden tab (tests/test_golden.py) continued on GPT-5 through the Responses
    API: Anthropic's signed and redacted thinking is not sent (no reasoning item), every
    call and result is, in log order. Rewritten with GOLDEN_UPDATE=1, as test_golden."""
    workspace = await database_sync_to_async(owner_workspace)(settings, tmp_path)
    owner = await get_user_model().objects.aget(username="owner")
    tab = await database_sync_to_async(import_golden)(owner)
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.openai_url)
    monkeypatch.setenv("OPENAI_API_STYLE", "responses")
    fake_server.add(Reply(events=ResponsesStream().text("Nothing more.").events()))
    await Tab.objects.filter(pk=tab.pk).aupdate(model="openai/gpt-5")
    await tab.arefresh_from_db()
    body = (await next_request(fake_server, tab)).decode()
    body = stable(body.replace(str(workspace), "<workspace>").replace(str(tmp_path), "<tmp>"))
    if UPDATE:
        GOLDEN_REQUEST.write_text(body, encoding="utf-8")
    assert body == GOLDEN_REQUEST.read_text(encoding="utf-8")
    sent = json.loads(body)
    assert not any(i.get("type") == "reasoning" for i in sent["input"])
    assert sent["prompt_cache_key"] == "<uuid-1>"


async def test_an_exported_tab_imports_with_its_reasoning_items_and_the_same_request(
    responses_server, workspace
):
    """The reasoning items travel through an export and an import unchanged: the imported
    tab's next request is the original's, byte for byte."""
    async with running_worker():
        tab = await make_tab("openai/gpt-5")
        await run_one(tab, "Weather in Paris and Oslo?")

    def both() -> tuple[bytes, bytes]:
        copy = transfer.import_jsonl(
            tab.owner, io.BytesIO("".join(transfer.export_jsonl(tab)).encode())
        )
        model = model_info("openai/gpt-5")
        built = [
            wire(build_params(Request("", (), History.build(log.tail(t.pk)).messages()), model))
            for t in (tab, copy)
        ]
        return built[0], built[1]

    original, imported = await database_sync_to_async(both)()
    assert original == imported
    assert done_item(STEP1, 0).encode() in imported
