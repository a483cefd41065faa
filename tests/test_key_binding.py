"""A stored API key is bound to the endpoint it was saved for, and only superusers change
endpoints: nobody who cannot see a key can have it sent to a host of their choosing."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.urls import reverse

from chat.models import ApiKey, ProviderEndpoint
from chat.providers import check, get_provider
from chat.providers.registry import PROVIDERS, KeyBoundElsewhere, endpoint_now, key_endpoint
from harness.fakeprovider import Reply, recorded
from tests.engine import Watcher, chunks, kinds, make_tab, running_worker, submit

KEY = "sk-bound-key-0123456789"
TEXT_REPLY = "recorded-streams/openai-compatible__azure-text.chunks.txt"
REFUSED = "Only superusers can add, change or remove provider endpoints"


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    for spec in PROVIDERS.values():
        for name in (spec.key_env, spec.url_env):
            if name:
                monkeypatch.delenv(name, raising=False)


def login(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def staff(db) -> Client:
    """Staff, not a superuser, holding every Django permission on endpoints (the admin's
    own check would otherwise refuse them before the endpoint admin's)."""
    user = User.objects.create_user("sam", password="pw-sam-12345", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__endswith="providerendpoint"))
    return login(user)


@pytest.fixture
def root(db) -> Client:
    return login(User.objects.create_superuser("root", password="pw-root-12345"))


def save_endpoint(client: Client, url: str, key: str = "", provider: str = "openai"):
    data = {"action": "endpoint", "provider": provider, "base_url": url, "key": key}
    return client.post(reverse("settings"), data)


def save_key(client: Client, key: str, provider: str = "openai"):
    return client.post(reverse("settings"), {"action": "key", "provider": provider, "key": key})


# --- The binding ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "binding"),
    [
        ("HTTPS://API.Example.COM:443/v1/", "https://api.example.com/v1"),
        ("http://127.0.0.1:80", "http://127.0.0.1"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1"),
        ("https://user:pw@api.example.com/v1#frag", "https://api.example.com/v1"),
        # One host serves many accounts by path or query: both count.
        ("https://gw.example.com/v1/ACCOUNT/openai", "https://gw.example.com/v1/ACCOUNT/openai"),
        ("https://gw.example.com/v1?tenant=a", "https://gw.example.com/v1?tenant=a"),
        ("http://[::1]:8080/", "http://[::1]:8080"),
        ("", ""),
    ],
)
def test_a_binding_is_the_url_with_only_its_spelling_normalised(url, binding):
    assert key_endpoint(url) == binding


def test_the_default_urls_are_the_sdks_own():
    """A key saved with no endpoint set is bound to where the SDK then sends it."""
    import anthropic
    import openai

    sdk = {
        "anthropic": anthropic.Anthropic(api_key="x").base_url,
        "openai": openai.OpenAI(api_key="x").base_url,
    }
    for name, url in sdk.items():
        assert key_endpoint(PROVIDERS[name].default_url) == key_endpoint(str(url))


@pytest.mark.django_db
@pytest.mark.parametrize("moved_by", ["settings", "environment"])
def test_a_stored_key_is_never_sent_to_another_endpoint(monkeypatch, moved_by):
    """Wherever the new URL comes from, a stored key saved for another endpoint is refused
    before any request, naming both endpoints; an operator's key from the environment
    follows the URL."""
    row = ApiKey(provider="openai")
    row.set_key(KEY, endpoint=endpoint_now("openai"))
    row.save()
    assert row.endpoint == "https://api.openai.com/v1"
    evil = "https://evil.example/v1"
    if moved_by == "settings":
        ProviderEndpoint.objects.create(provider="openai", base_url=evil)
    else:
        monkeypatch.setenv("OPENAI_BASE_URL", evil)
    with pytest.raises(KeyBoundElsewhere) as raised:
        get_provider("openai/gpt-4.1")
    assert raised.value.message.startswith(
        "The stored OpenAI-compatible key was saved for https://api.openai.com/v1 and must "
        "be entered again for https://evil.example/v1"
    )
    assert not raised.value.retryable
    monkeypatch.setenv("OPENAI_API_KEY", "sk-operators-own")
    assert get_provider("openai/gpt-4.1").api_key == "sk-operators-own"


# --- Who may change endpoints -------------------------------------------------------------


def test_staff_who_are_not_superusers_cannot_change_endpoints_on_settings(staff, root):
    """No form, no Remove button; a post is a 403 that says why, and nothing changes."""
    ProviderEndpoint.objects.create(provider="openai", base_url="https://api.example.com/v1")
    page = staff.get(reverse("settings")).content.decode()
    assert 'name="action" value="endpoint"' not in page
    assert reverse("endpoint_delete", args=["openai"]) not in page
    assert "Only a superuser can add, change or remove provider endpoints" in page
    refused = save_endpoint(staff, "https://evil.example/v1")
    assert refused.status_code == 403 and REFUSED in refused.content.decode()
    assert save_endpoint(staff, "https://evil.example/v1", provider="deepseek").status_code == 403
    assert staff.post(reverse("endpoint_delete", args=["openai"])).status_code == 403
    assert list(ProviderEndpoint.objects.values_list("provider", "base_url")) == [
        ("openai", "https://api.example.com/v1")
    ]
    assert 'name="action" value="endpoint"' in root.get(reverse("settings")).content.decode()
    assert save_endpoint(root, "https://other.example/v1").status_code == 302
    assert ProviderEndpoint.objects.get().base_url == "https://other.example/v1"


def test_staff_who_are_not_superusers_cannot_change_endpoints_in_the_admin(staff, root):
    """Even with the model's permissions: they see the endpoints and change none."""
    row = ProviderEndpoint.objects.create(provider="openai", base_url="https://api.example.com/v1")
    change = reverse("admin:chat_providerendpoint_change", args=[row.pk])
    evil = {"provider": "openai", "base_url": "https://evil.example/v1"}
    assert staff.get(reverse("admin:chat_providerendpoint_changelist")).status_code == 200
    assert 'name="base_url"' not in staff.get(change).content.decode()
    assert staff.post(change, evil).status_code == 403
    added = {"provider": "deepseek", "base_url": "https://evil.example/v1"}
    assert staff.post(reverse("admin:chat_providerendpoint_add"), added).status_code == 403
    delete = reverse("admin:chat_providerendpoint_delete", args=[row.pk])
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    row.refresh_from_db()
    assert (ProviderEndpoint.objects.count(), row.base_url) == (1, "https://api.example.com/v1")
    assert root.post(change, evil).status_code == 302
    row.refresh_from_db()
    assert row.base_url == "https://evil.example/v1"


# --- Saving keys --------------------------------------------------------------------------


def test_a_key_cannot_be_stored_before_its_provider_has_an_endpoint(root, monkeypatch):
    """DeepSeek has no default URL: a key saved then would be bound to nothing."""
    # A saved key is tested at its endpoint: not DeepSeek's real one from a test.
    monkeypatch.setattr(check, "check_key", lambda *a, **k: check.KeyCheck(check.Outcome.OK, ""))
    response = save_key(root, KEY, provider="deepseek")
    assert response.status_code == 422
    assert "DeepSeek has no endpoint yet" in response.content.decode()
    assert not ApiKey.objects.exists()
    assert save_endpoint(root, "https://api.deepseek.com", KEY, provider="deepseek").status_code
    assert ApiKey.objects.get().endpoint == "https://api.deepseek.com"


def test_a_key_saved_in_the_admin_is_bound_and_stays_with_its_provider(root):
    """Bound like one saved on Settings; moving it to another provider's row would send it
    to that provider's endpoint, so the provider is fixed once saved."""
    ProviderEndpoint.objects.create(provider="openai", base_url="https://api.example.com/v1/")
    added = root.post(reverse("admin:chat_apikey_add"), {"provider": "openai", "key": KEY})
    assert added.status_code == 302
    row = ApiKey.objects.get()
    assert row.endpoint == "https://api.example.com/v1"
    change = reverse("admin:chat_apikey_change", args=[row.pk])
    assert 'name="provider"' not in root.get(change).content.decode()
    assert root.post(change, {"provider": "anthropic", "key": ""}).status_code == 302
    row.refresh_from_db()
    assert (row.provider, row.endpoint) == ("openai", "https://api.example.com/v1")


def test_a_bad_key_with_an_endpoint_saves_neither(root):
    response = save_endpoint(root, "https://api.example.com/v1", "sk-has a space-123")
    assert response.status_code == 422
    assert "no spaces or line breaks" in response.content.decode()
    assert not ProviderEndpoint.objects.exists() and not ApiKey.objects.exists()


# --- End to end: a superuser moves the endpoint --------------------------------------------


async def run_one(tab) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, "hi")
        await watcher.until_idle()


@pytest.mark.django_db(transaction=True)
async def test_a_moved_endpoint_gets_the_key_only_once_it_is_entered_again(
    fake_server_factory, settings, tmp_path
):
    """Key saved for server A; a superuser points the endpoint at server B without the key:
    the turn ends on one error chunk saying so, B never sees the key, no retry is spent,
    and Settings asks for the key again. Entered again with the endpoint: B gets it."""
    settings.DISPATCH_WORKSPACE = tmp_path
    old, new = fake_server_factory(), fake_server_factory()
    root = await database_sync_to_async(User.objects.create_superuser)("root", password="pw-12345")
    client = await database_sync_to_async(login)(root)
    post = database_sync_to_async(save_endpoint)
    assert (await post(client, old.openai_url)).status_code == 302
    assert (await database_sync_to_async(save_key)(client, KEY)).status_code == 302
    response = await post(client, new.openai_url)
    assert response.status_code == 302
    async with running_worker():
        tab = await make_tab("openai/gpt-4.1")
        await run_one(tab)
    # The key went nowhere but to its own endpoint, once, when it was saved (its test).
    assert new.requests == []
    assert [(r.method, r.path) for r in old.requests] == [("GET", "/v1/models")]
    rows = await chunks(tab.pk)
    assert kinds(rows)[-1] == "assistant/error"
    data = rows[-1].data
    assert data["summary"] == "The stored OpenAI-compatible key was saved for another endpoint"
    assert (
        f"saved for {old.openai_url} and must be entered again for {new.openai_url}"
        in data["message"]
    )
    assert "attempts" not in data
    page = (await database_sync_to_async(client.get)(reverse("settings"))).content.decode()
    assert (
        f"The stored openai key (…6789) was saved for {old.openai_url}: it is not sent to "
        f"{new.openai_url} until it is entered again." in page
    )
    assert f"bound to {old.openai_url}, re-enter it for the new endpoint {new.openai_url}" in page

    assert (await post(client, new.openai_url, KEY)).status_code == 302
    new.add(Reply(events=recorded(TEXT_REPLY)))
    async with running_worker():
        await run_one(tab)
    assert kinds(await chunks(tab.pk))[-1] == "assistant/text"
    assert new.last.headers["authorization"] == f"Bearer {KEY}"
    assert [(r.method, r.path) for r in old.requests] == [("GET", "/v1/models")]


# --- The migration ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_migration_binds_each_stored_key_to_the_endpoint_then_in_effect():
    """A stored endpoint, else the SDK's default: the keys keep working after the upgrade,
    and only there."""
    executor = MigrationExecutor(connection)
    executor.migrate([("chat", "0015_mcp_confinement")])
    before = executor.loader.project_state([("chat", "0015_mcp_confinement")]).apps
    sealed = ApiKey()
    sealed.set_key(KEY, endpoint="")
    for provider in ("anthropic", "openai"):
        before.get_model("chat", "ApiKey").objects.create(
            provider=provider, encrypted=sealed.encrypted, last4=sealed.last4
        )
    stored = "http://127.0.0.1:8080/v1/"
    before.get_model("chat", "ProviderEndpoint").objects.create(provider="openai", base_url=stored)

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    bound = dict(ApiKey.objects.values_list("provider", "endpoint"))
    assert bound == {"anthropic": "https://api.anthropic.com", "openai": "http://127.0.0.1:8080/v1"}
    assert get_provider("openai/gpt-4.1").api_key == KEY
    assert get_provider("anthropic/claude-sonnet-4-5").api_key == KEY
    ProviderEndpoint.objects.update(base_url="https://evil.example/v1")
    with pytest.raises(KeyBoundElsewhere):
        get_provider("openai/gpt-4.1")
