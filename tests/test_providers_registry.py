"""Model ids, the model table, credentials and the public entry points."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat.models import ApiKey, ProviderEndpoint
from chat.providers import (
    OFFLINE_MODEL,
    ModelInfo,
    ProviderConfigError,
    adefault_model,
    aget_provider,
    default_model,
    get_provider,
    list_models,
    model_info,
)
from chat.providers.anthropic import AnthropicProvider
from chat.providers.base import Finish, Message, ProviderError, Request, TextPart
from chat.providers.offline import OfflineProvider
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import INTERLEAVED_THINKING_BETA, PROVIDERS, endpoint_now, has_key
from harness.fakeprovider import Reply, collect, recorded

ROOT = Path(__file__).resolve().parent.parent
# A bare interpreter start and three imports: well under this.
SUBPROCESS_TIMEOUT = 30

ENV_VARS = [var for spec in PROVIDERS.values() for var in (spec.key_env, spec.url_env) if var]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, settings):
    """No provider configuration leaks in from the machine running the tests."""
    for var in ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    settings.DISPATCH_MODEL = ""


def store(provider: str, key: str | None = None, url: str | None = None) -> None:
    """As Settings saves them: the key bound to where requests go once the URL is stored."""
    if url is not None:
        ProviderEndpoint.objects.create(provider=provider, base_url=url)
    if key is not None:
        row = ApiKey(provider=provider)
        row.set_key(key, endpoint=endpoint_now(provider))
        row.save()


def test_importing_the_package_loads_neither_django_nor_an_sdk():
    """chat.history imports chat.providers.base; that must keep the pure modules pure."""
    code = (
        "import sys, chat.history, chat.stream, chat.providers; "
        "print(sorted(m for m in ('django', 'anthropic', 'openai') if m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=True,
    )
    assert done.stdout.strip() == "[]"


# --- Model ids ----------------------------------------------------------------------


def test_it_gives_the_offline_model_without_any_key():
    """offline/demo needs no key and no database."""
    provider = get_provider(OFFLINE_MODEL)
    assert isinstance(provider, OfflineProvider)
    assert provider.model.id == OFFLINE_MODEL


@pytest.mark.parametrize("model_id", ["claude-sonnet-4-5", "", "anthropic/", "/claude", None])
def test_it_rejects_a_malformed_model_id(model_id):
    """An id that is not provider/model is a ValueError that shows the expected form."""
    with pytest.raises(ValueError, match="provider/model|names no model|unknown model provider"):
        get_provider(model_id)


def test_it_rejects_an_unknown_provider_naming_the_known_ones():
    """An unknown provider is a ValueError listing the providers there are."""
    with pytest.raises(ValueError) as raised:
        get_provider("mistral/large")
    assert "'mistral'" in str(raised.value)
    for name in PROVIDERS:
        assert name in str(raised.value)


def test_it_rejects_an_offline_model_other_than_the_demo():
    """The offline provider has only offline/demo."""
    with pytest.raises(ValueError, match="offline/demo"):
        get_provider("offline/other")


def test_a_model_it_does_not_list_gets_its_providers_defaults():
    """A new model of a known provider works without a table entry, with safe defaults."""
    info = model_info("anthropic/claude-next-7")
    assert (info.known, info.thinking, info.betas, info.name) == (
        False,
        "none",
        (),
        "claude-next-7",
    )
    assert model_info("anthropic/claude-sonnet-4-5").known


def test_the_table_configures_thinking_per_model():
    """Manual-thinking models carry a budget and the interleaved beta; newer ones are adaptive."""
    sonnet = model_info("anthropic/claude-sonnet-4-5")
    assert (sonnet.thinking, sonnet.thinking_budget, sonnet.betas) == (
        "manual",
        8000,
        (INTERLEAVED_THINKING_BETA,),
    )
    assert model_info("anthropic/claude-opus-4-1").thinking == "manual"
    assert model_info("anthropic/claude-sonnet-5").thinking == "adaptive"
    assert model_info("deepseek/deepseek-reasoner").send_reasoning
    assert not model_info("deepseek/deepseek-chat").send_reasoning


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"thinking": "sometimes"}, "thinking must be one of"),
        ({"thinking": "manual", "thinking_budget": 512}, "budget must be >= 1024"),
        ({"thinking": "manual", "thinking_budget": 9000, "max_output": 8000}, "below max_output"),
        ({"id": "no-slash"}, "provider/model"),
    ],
)
def test_it_refuses_a_bad_model_entry(kwargs, message):
    """A table entry that the API would refuse fails when it is written, not when used."""
    with pytest.raises(ValueError, match=message):
        ModelInfo(**{"id": "anthropic/x", **kwargs})


# --- Credentials --------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model_id", "var"),
    [
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("openai/gpt-4.1", "OPENAI_API_KEY"),
        ("deepseek/deepseek-chat", "DEEPSEEK_API_KEY"),
    ],
)
def test_a_missing_key_names_the_variable_to_set(model_id, var):
    """No key anywhere: a ProviderConfigError (also a ValueError, not retryable) naming it."""
    with pytest.raises(ProviderConfigError) as raised:
        get_provider(model_id)
    assert var in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert isinstance(raised.value, ProviderError)
    assert not raised.value.retryable


@pytest.mark.django_db
def test_deepseek_without_an_endpoint_names_the_variable_to_set(monkeypatch):
    """DeepSeek rides the OpenAI SDK, whose default URL is OpenAI's: its URL must be set."""
    monkeypatch.setenv("DEEPSEEK_API_KEY", "sk-test")
    with pytest.raises(ProviderConfigError, match="DEEPSEEK_BASE_URL"):
        get_provider("deepseek/deepseek-chat")


def test_it_takes_key_and_endpoint_from_the_environment(monkeypatch):
    """Both in the environment: no database needed."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1/anthropic")
    provider = get_provider("anthropic/claude-sonnet-4-5")
    assert isinstance(provider, AnthropicProvider)
    assert (provider.api_key, provider.base_url) == ("sk-env", "http://127.0.0.1:1/anthropic")


def test_the_idle_timeout_is_sixty_seconds_unless_the_endpoint_says_otherwise(monkeypatch):
    """Each provider's <PROVIDER>_STREAM_IDLE_TIMEOUT overrides the default; the HTTP read
    timeout (the backstop behind the runner's watchdog) never cuts a stream earlier."""
    for provider in ("ANTHROPIC", "OPENAI"):
        monkeypatch.setenv(f"{provider}_API_KEY", "sk-env")
        monkeypatch.setenv(f"{provider}_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("OPENAI_STREAM_IDLE_TIMEOUT", "300")
    assert get_provider("anthropic/claude-sonnet-4-5").idle_timeout == 60.0
    slow = get_provider("openai/gpt-4.1")
    assert slow.idle_timeout == 300.0
    assert slow.timeout.read == 300.0
    assert get_provider(OFFLINE_MODEL).idle_timeout == 60.0


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "100000"])
def test_a_bad_idle_timeout_names_the_variable_to_fix(monkeypatch, value):
    monkeypatch.setenv("ANTHROPIC_STREAM_IDLE_TIMEOUT", value)
    with pytest.raises(ProviderConfigError) as raised:
        get_provider("anthropic/claude-sonnet-4-5")
    assert raised.value.message == (
        f"ANTHROPIC_STREAM_IDLE_TIMEOUT={value!r} is not a number of seconds between 0 and "
        "600: fix it or unset it (default 60)."
    )


@pytest.mark.django_db
def test_it_takes_key_and_endpoint_from_the_database():
    """No environment: the stored (encrypted) key and the stored endpoint."""
    store("openai", key="sk-db", url="http://127.0.0.1:1/v1")
    provider = get_provider("openai/gpt-4.1-mini")
    assert isinstance(provider, OpenAIProvider)
    assert (provider.api_key, provider.base_url) == ("sk-db", "http://127.0.0.1:1/v1")
    assert provider.model.name == "gpt-4.1-mini"


@pytest.mark.django_db
def test_the_environment_wins_over_the_database(monkeypatch):
    """A key in both places: the environment's; an endpoint only stored: the stored one."""
    store("anthropic", key="sk-db", url="http://127.0.0.1:1/stored")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    provider = get_provider("anthropic/claude-opus-4-1")
    assert (provider.api_key, provider.base_url) == ("sk-env", "http://127.0.0.1:1/stored")


def test_an_endpoint_that_is_not_an_http_url_names_the_variable_to_fix(monkeypatch):
    """A base URL without http(s):// is a configuration error, not a retryable failure."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "localhost:8080/v1")
    with pytest.raises(ProviderConfigError, match="OPENAI_BASE_URL"):
        get_provider("openai/gpt-4.1")


@pytest.mark.django_db
def test_no_endpoint_anywhere_leaves_the_sdk_default():
    """Without a base URL the adapter passes none: the SDK's own default applies."""
    store("anthropic", key="sk-db")
    assert get_provider("anthropic/claude-sonnet-4-5").base_url is None


@pytest.mark.django_db
def test_a_stored_key_that_cannot_be_decrypted_is_a_clear_error():
    """A key saved under another SECRET_KEY says so and how to fix it."""
    ApiKey.objects.create(provider="anthropic", encrypted="not-a-fernet-token", last4="abcd")
    with pytest.raises(ProviderConfigError, match="cannot be decrypted.*ANTHROPIC_API_KEY"):
        get_provider("anthropic/claude-sonnet-4-5")


# --- Defaults and the picker ----------------------------------------------------------


@pytest.mark.django_db
def test_the_default_model_is_offline_without_any_key():
    """Nothing configured: the offline demo."""
    assert default_model() == OFFLINE_MODEL


@pytest.mark.django_db
def test_the_default_model_follows_the_first_provider_with_a_key(monkeypatch):
    """A stored OpenAI key picks OpenAI's default; an Anthropic key takes precedence."""
    store("openai", key="sk-db")
    assert default_model() == PROVIDERS["openai"].default_model
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    assert default_model() == PROVIDERS["anthropic"].default_model


@pytest.mark.django_db
def test_dispatch_model_wins_over_everything(monkeypatch, settings):
    """settings.DISPATCH_MODEL is the default whatever keys exist."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    settings.DISPATCH_MODEL = "openai/gpt-4.1"
    assert default_model() == "openai/gpt-4.1"


@pytest.mark.django_db
def test_list_models_marks_which_models_have_a_key(monkeypatch, settings):
    """Every known model is listed, available when its provider has a key; an unlisted
    DISPATCH_MODEL is added."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
    settings.DISPATCH_MODEL = "anthropic/claude-next-7"
    models = {m.id: m for m in list_models()}
    assert models["anthropic/claude-sonnet-4-5"].available
    assert not models["openai/gpt-4.1"].available
    assert not models["deepseek/deepseek-chat"].available
    assert models[OFFLINE_MODEL].available
    assert models["anthropic/claude-next-7"].available
    assert not models["anthropic/claude-next-7"].known


@pytest.mark.django_db
def test_list_models_reads_every_providers_key_and_endpoint_at_once(
    django_assert_num_queries,
):
    """Two statements for every provider (a page lists them all): a stored key with its
    endpoint, a stored key bound elsewhere, one that cannot be decrypted, none."""
    store("openai", key="sk-db", url="http://127.0.0.1:1/v1")
    store("deepseek", key="sk-deep")
    ProviderEndpoint.objects.create(provider="deepseek", base_url="http://127.0.0.1:2/moved")
    ApiKey.objects.create(provider="anthropic", encrypted="not-a-fernet-token", last4="abcd")
    with django_assert_num_queries(2):
        models = {m.id: m for m in list_models()}
    assert models["openai/gpt-4.1"].available
    assert not models["deepseek/deepseek-chat"].available, "a key bound elsewhere"
    assert not models["anthropic/claude-sonnet-4-5"].available, "a key that cannot be read"
    assert models[OFFLINE_MODEL].available
    assert {m.provider: m.available for m in models.values()} == {
        name: has_key(name) for name in PROVIDERS
    }


@pytest.mark.django_db(transaction=True)
async def test_the_async_entry_points_read_the_database():
    """From async code, aget_provider and adefault_model do their reads in a thread."""
    from asgiref.sync import sync_to_async

    await sync_to_async(store)("anthropic", key="sk-db")
    provider = await aget_provider("anthropic/claude-sonnet-4-5")
    assert provider.api_key == "sk-db"
    assert await adefault_model() == PROVIDERS["anthropic"].default_model


@pytest.mark.django_db(transaction=True)
async def test_the_sync_entry_points_also_work_from_async_code():
    """get_provider called inside an event loop still reads the stored key (on a thread),
    and a key that cannot be decrypted still gives the clear error."""
    from asgiref.sync import sync_to_async

    await sync_to_async(store)("openai", key="sk-db", url="http://127.0.0.1:1/v1")
    provider = get_provider("openai/gpt-4.1")
    assert (provider.api_key, provider.base_url) == ("sk-db", "http://127.0.0.1:1/v1")
    assert default_model() == PROVIDERS["openai"].default_model
    await sync_to_async(ApiKey.objects.create)(
        provider="anthropic", encrypted="not-a-fernet-token", last4="abcd"
    )
    with pytest.raises(ProviderConfigError, match="cannot be decrypted"):
        get_provider("anthropic/claude-sonnet-4-5")


# --- End to end -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "prefix", "script"),
    [
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC", "anthropic__anthropic-text.chunks.txt"),
        ("openai/gpt-4.1", "OPENAI", "openai-compatible__azure-text.chunks.txt"),
        ("deepseek/deepseek-reasoner", "DEEPSEEK", "deepseek__deepseek-reasoning.chunks.txt"),
    ],
)
async def test_a_configured_provider_streams_from_its_endpoint(
    fake_server, monkeypatch, model_id, prefix, script
):
    """get_provider wires key and base URL from the environment into a working adapter."""
    url = fake_server.url if prefix == "ANTHROPIC" else fake_server.openai_url
    monkeypatch.setenv(f"{prefix}_API_KEY", "sk-e2e")
    monkeypatch.setenv(f"{prefix}_BASE_URL", url)
    fake_server.add(Reply(events=recorded(f"recorded-streams/{script}")))
    request = Request("", (), (Message("user", (TextPart("hi"),)),))
    events = await collect(get_provider(model_id).stream(request))
    assert isinstance(events[-1], Finish)
    assert fake_server.last.headers["authorization"] == "Bearer sk-e2e"
    assert fake_server.last.json["model"] == model_id.partition("/")[2]
