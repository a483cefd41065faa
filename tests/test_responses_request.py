"""The Responses API's requests, rebuilt from the neutral messages, and which API the
`openai` provider speaks (OPENAI_API_STYLE, the Settings endpoint, the base URL)."""

from __future__ import annotations

import json
import logging

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chat.envcheck import EXIT_CONFIGURATION, api_style_problem
from chat.models import ProviderEndpoint
from chat.providers import get_provider
from chat.providers.base import (
    DocumentPart,
    ImagePart,
    Message,
    Request,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolResultPart,
    ToolSpec,
)
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import PROVIDERS, ProviderConfigError, api_style, model_info
from chat.providers.responses import ResponsesProvider, build_params
from tests.test_startup import check_in_process, one_line

GPT5 = model_info("openai/gpt-5")
SYSTEM = "You are a careful assistant."
ITEM = '{"id":"rs_1","type":"reasoning","encrypted_content":"gAAA","summary":[]}'
PNG = b"\x89PNG fake bytes"
SHA = "a" * 64
PDF_SHA = "b" * 64
WEATHER = ToolSpec(
    "weather",
    "The weather in a city.",
    {"type": "object", "required": ["location"], "properties": {"location": {"type": "string"}}},
)


class Blobs:
    def data(self, sha256: str) -> bytes | None:
        return PNG if sha256 == SHA else None

    def text(self, sha256: str) -> str | None:
        return "Page one." if sha256 == PDF_SHA else None


IMAGE = ImagePart(SHA, "map.png", "image/png", 10, 10, "uploads/aaaaaaaaaaaa/map.png")
PDF = DocumentPart(
    PDF_SHA, "notes.pdf", "application/pdf", 100, 1, "uploads/bbbbbbbbbbbb/notes.pdf"
)


def conversation() -> tuple[Message, ...]:
    return (
        Message("user", (IMAGE, PDF, TextPart("Weather in Paris and Oslo?"))),
        Message(
            "assistant",
            (
                ThinkingPart("Two cities.", reasoning_item=ITEM),
                # Another provider's thinking: nothing the API could take.
                ThinkingPart("Anthropic's.", signature="c2ln"),
                TextPart("Checking."),
                ToolCallPart("c1", "weather", {"location": "Paris", "unit": "c"}),
                ToolCallPart("c2", "weather", {"unit": "c", "location": "Oslo"}),
            ),
        ),
        Message(
            "user",
            (
                ToolResultPart("c1", "weather", "sunny", images=(IMAGE,)),
                ToolResultPart("c2", "weather", "no such city", is_error=True),
                TextPart("Also, hurry."),
            ),
        ),
        Message("assistant", (TextPart("Paris is sunny."),)),
        Message("user", (TextPart("Thanks"),)),
    )


def request(messages: tuple[Message, ...] | None = None, **kw) -> Request:
    messages = conversation() if messages is None else messages
    return Request(SYSTEM, (WEATHER,), messages, blobs=Blobs(), cache_key="tab-7", **kw)


def test_the_request_holds_the_log_as_items_in_order():
    params = build_params(request(), GPT5)
    image = {
        "type": "input_image",
        "image_url": "data:image/png;base64,iVBORyBmYWtlIGJ5dGVz",
        "detail": "auto",
    }
    assert params["input"] == [
        {
            "role": "user",
            "content": [
                image,
                # GPT-5 is not listed as reading PDFs: the text says where it is, and its text.
                {
                    "type": "input_text",
                    "text": (
                        "[document notes.pdf, 1 page, saved in the workspace at "
                        "uploads/bbbbbbbbbbbb/notes.pdf; its text, extracted with pypdf, "
                        "follows]\nPage one."
                    ),
                },
                {"type": "input_text", "text": "Weather in Paris and Oslo?"},
            ],
        },
        json.loads(ITEM),
        {"role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments": '{"location": "Paris", "unit": "c"}',
        },
        {
            "type": "function_call",
            "call_id": "c2",
            "name": "weather",
            "arguments": '{"location": "Oslo", "unit": "c"}',
        },
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": "sunny"}, image],
        },
        {"type": "function_call_output", "call_id": "c2", "output": "Error: no such city"},
        {"role": "user", "content": "Also, hurry."},
        {"role": "assistant", "content": "Paris is sunny."},
        {"role": "user", "content": "Thanks"},
    ]
    assert params["instructions"] == SYSTEM
    assert params["store"] is False
    assert params["include"] == ["reasoning.encrypted_content"]
    assert params["reasoning"] == {"summary": "auto"}
    assert params["prompt_cache_key"] == "tab-7"
    assert "max_output_tokens" not in params
    assert params["tools"] == [
        {
            "type": "function",
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
                "type": "object",
            },
            "strict": False,
        }
    ]


def test_a_reasoning_item_goes_back_with_its_keys_in_the_order_they_came():
    item = '{"type":"reasoning","summary":[],"id":"rs_9","encrypted_content":"x"}'
    messages = (
        Message("user", (TextPart("hi"),)),
        Message("assistant", (ThinkingPart("", reasoning_item=item), TextPart("Hello."))),
        Message("user", (TextPart("again"),)),
    )
    sent = json.dumps(build_params(request(messages), GPT5)["input"], separators=(",", ":"))
    assert item in sent


def test_a_reasoning_item_that_nothing_follows_is_left_out():
    """A turn stopped right after its reasoning: the API wants an item after each
    reasoning item, so that one is not sent (the message's other items are)."""
    messages = (
        Message("user", (TextPart("hi"),)),
        Message("assistant", (ThinkingPart("", reasoning_item=ITEM),)),
        Message("user", (TextPart("again"),)),
        Message(
            "assistant",
            (
                ThinkingPart("", reasoning_item=ITEM),
                TextPart("Hello."),
                ThinkingPart("", reasoning_item=ITEM),
            ),
        ),
        Message("user", (TextPart("and?"),)),
    )
    items = build_params(request(messages), GPT5)["input"]
    assert [i.get("type") or i["role"] for i in items] == [
        "user",
        "user",
        "reasoning",
        "assistant",
        "user",
    ]


def test_a_model_without_reasoning_gets_no_reasoning_parameters():
    params = build_params(request(), model_info("openai/gpt-4.1"))
    assert "include" not in params and "reasoning" not in params
    assert params["store"] is False
    # A model the registry does not list is a reasoning one by its name.
    assert "reasoning" in build_params(request(), model_info("openai/gpt-5.9-turbo"))


def test_a_lower_output_limit_is_sent_as_max_output_tokens():
    assert build_params(request(max_tokens=2000), GPT5)["max_output_tokens"] == 2000


def test_a_stored_item_that_is_not_a_reasoning_item_is_left_out(caplog):
    messages = (
        Message("user", (TextPart("hi"),)),
        Message("assistant", (ThinkingPart("", reasoning_item="{cut"), TextPart("Hello."))),
        Message("user", (TextPart("again"),)),
    )
    with caplog.at_level(logging.WARNING, logger="chat.providers.responses"):
        items = build_params(request(messages), GPT5)["input"]
    assert [i.get("role") for i in items] == ["user", "assistant", "user"]
    assert "a stored reasoning item is not one" in caplog.text


def test_a_request_with_nothing_to_send_is_refused():
    with pytest.raises(ValueError, match="nothing to send"):
        build_params(request(()), GPT5)


def test_its_request_prefix_is_byte_stable_as_the_conversation_grows():
    """The input items of a shorter conversation are the first bytes of a longer one's,
    written as the SDK writes them; instructions, tools and the cache key never move."""
    full = conversation()
    whole = build_params(request(full), GPT5)
    after = json.dumps(whole["input"], ensure_ascii=False, separators=(",", ":"))
    for n in range(1, len(full)):
        shorter = build_params(request(full[:n]), GPT5)
        before = json.dumps(shorter["input"], ensure_ascii=False, separators=(",", ":"))
        assert after.startswith(before[:-1])
        for key in ("instructions", "tools", "prompt_cache_key", "include", "reasoning"):
            assert shorter[key] == whole[key]


# --- Which API --------------------------------------------------------------------------


@pytest.fixture
def no_style(monkeypatch):
    monkeypatch.delenv("OPENAI_API_STYLE", raising=False)


@pytest.mark.parametrize(
    ("env", "base_url", "stored", "expected"),
    [
        (None, None, "", "responses"),  # the SDK's default: OpenAI's own
        (None, "https://api.openai.com/v1", "", "responses"),
        (None, "https://eu.api.openai.com/v1/", "", "responses"),
        (None, "http://localhost:11434/v1", "", "chat"),  # any other server
        (None, "https://openrouter.ai/api/v1", "", "chat"),
        (None, "http://localhost:8000/v1", "responses", "responses"),  # Settings says
        (None, "https://api.openai.com/v1", "chat", "chat"),
        ("chat", "https://api.openai.com/v1", "responses", "chat"),  # the variable wins
        (" Responses ", "http://localhost:8000/v1", "chat", "responses"),
    ],
)
def test_the_api_style_is_chosen_by_variable_then_endpoint_then_url(
    monkeypatch, env, base_url, stored, expected
):
    if env is None:
        monkeypatch.delenv("OPENAI_API_STYLE", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_STYLE", env)
    assert api_style("openai", base_url, stored) == expected


def test_deepseek_speaks_chat_completions_unless_its_endpoint_says_otherwise(no_style):
    assert api_style("deepseek", "https://api.deepseek.com", "") == "chat"
    assert api_style("deepseek", "https://api.deepseek.com", "responses") == "responses"


def test_a_bad_api_style_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("OPENAI_API_STYLE", "completions")
    with pytest.raises(ProviderConfigError, match="OPENAI_API_STYLE='completions' is not one of"):
        api_style("openai", None)
    assert api_style_problem("chat") is None and api_style_problem("RESPONSES") is None
    assert "unset it to choose by the base URL" in (api_style_problem("x") or "")


def test_the_factory_gives_each_style_its_adapter(db, monkeypatch, no_style):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert isinstance(get_provider("openai/gpt-5"), ResponsesProvider)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert isinstance(get_provider("openai/gpt-5"), OpenAIProvider)
    monkeypatch.setenv("OPENAI_API_STYLE", "responses")
    provider = get_provider("openai/gpt-5")
    assert isinstance(provider, ResponsesProvider)
    assert provider.base_url == "http://127.0.0.1:9/v1"


def test_serve_stops_on_a_bad_api_style(settings, monkeypatch, capsys, tmp_path):
    done = check_in_process(settings, monkeypatch, capsys, tmp_path, OPENAI_API_STYLE="openai")
    line = one_line(done, EXIT_CONFIGURATION)
    assert line.startswith(
        "Configuration error: OPENAI_API_STYLE='openai' is not one of responses, chat"
    ), line


# --- Per endpoint, on Settings ----------------------------------------------------------


@pytest.fixture
def root(db, monkeypatch) -> Client:
    for spec in PROVIDERS.values():
        for name in (spec.key_env, spec.url_env, spec.style_env):
            if name:
                monkeypatch.delenv(name, raising=False)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root-12345"))
    return client


def save_endpoint(client: Client, url: str, style: str):
    data = {
        "action": "endpoint",
        "provider": "openai",
        "base_url": url,
        "key": "sk-endpoint-0123456789",
        "api_style": style,
    }
    return client.post(reverse("settings"), data)


def test_an_endpoint_saved_with_an_api_uses_it(root):
    save_endpoint(root, "http://127.0.0.1:9/v1", "responses")
    row = ProviderEndpoint.objects.get(provider="openai")
    assert row.api_style == "responses"
    assert isinstance(get_provider("openai/gpt-5"), ResponsesProvider)
    page = root.get(reverse("settings")).content.decode()
    assert ">Responses API</span>" in page
    assert 'name="api_style"' in page
    # Saved again as automatic: that server gets Chat Completions.
    save_endpoint(root, "http://127.0.0.1:9/v1", "")
    assert ProviderEndpoint.objects.get(provider="openai").api_style == ""
    assert isinstance(get_provider("openai/gpt-5"), OpenAIProvider)


def test_an_endpoint_refuses_an_api_it_does_not_know(root):
    response = save_endpoint(root, "http://127.0.0.1:9/v1", "soap")
    assert response.status_code == 422
    assert "Select a valid choice" in response.content.decode()
    assert not ProviderEndpoint.objects.exists()


def test_the_endpoints_api_applies_only_to_its_own_url(root, monkeypatch):
    """OPENAI_BASE_URL in the environment wins over the Settings endpoint, and so the
    endpoint's API choice does not follow the key elsewhere."""
    save_endpoint(root, "https://api.openai.com/v1", "chat")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert isinstance(get_provider("openai/gpt-5"), OpenAIProvider)
    monkeypatch.setenv("OPENAI_BASE_URL", "https://api.openai.com/v1")
    assert isinstance(get_provider("openai/gpt-5"), ResponsesProvider)
