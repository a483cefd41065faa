"""Settings in sections (chat.views.settings), a key's test and save, the default model a
saved key leaves alone, the model picker's entries and the refusal of a model without a
key (chat.forms), the admin's name. Keys are tested against fake provider servers."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat import preferences
from chat.forms import SETTINGS_SECTIONS, TabModelForm, model_picker
from chat.models import ApiKey, Setting, Tab, set_setting
from chat.providers import check
from harness.fakeprovider import Reply

User = get_user_model()
ENV = ("ANTHROPIC", "OPENAI", "DEEPSEEK")


@pytest.fixture(autouse=True)
def no_provider_env(monkeypatch, settings):
    """Keys and URLs only from what each test sets; the default model automatic."""
    for name in ENV:
        for suffix in ("_API_KEY", "_BASE_URL"):
            monkeypatch.delenv(name + suffix, raising=False)
    settings.DISPATCH_MODEL = ""


@pytest.fixture
def root(db):
    user = User.objects.create_superuser("root", password="pw-for-tests-only")
    client = Client()
    client.force_login(user)
    return client


def html(response) -> str:
    return response.content.decode()


def url(section: str) -> str:
    return (
        reverse("settings")
        if section == "connections"
        else reverse("settings_section", args=[section])
    )


# --- Sections -------------------------------------------------------------------------------

SECTION_MARKS = [
    ("connections", 'id="provider-anthropic"'),
    ("models", 'name="default_model"'),
    ("tools", 'id="mcp"'),
    ("rules", 'href="/account/rules/"'),
    ("profiles", 'id="profiles"'),
    ("appearance", 'name="expand_thinking"'),
    ("advanced", 'name="dom_window"'),
]


@pytest.mark.parametrize(("section", "mark"), SECTION_MARKS)
def test_each_section_has_its_page_and_the_nav_marks_it(root, section, mark):
    page = html(root.get(url(section)))
    assert mark in page
    assert f'<a href="{url(section)}" aria-current="page">' in page
    # Every section links to every other.
    for other, _ in SECTION_MARKS:
        assert f'href="{url(other)}"' in page


@pytest.mark.parametrize(
    ("section", "absent"),
    [
        ("connections", 'name="page_size"'),
        ("models", 'id="provider-anthropic"'),
        ("appearance", 'name="approve_tools"'),
        ("advanced", 'name="default_model"'),
    ],
)
def test_a_section_shows_only_its_own_forms(root, section, absent):
    assert absent not in html(root.get(url(section)))


def test_an_unknown_section_is_a_404_and_settings_stay_staff_only(root, db):
    assert root.get("/settings/nowhere/").status_code == 404
    plain = User.objects.create_user("plain")
    client = Client()
    client.force_login(plain)
    assert client.get(url("models")).status_code == 403


@pytest.mark.parametrize(
    ("section", "data", "stored"),
    [
        ("appearance", {"expand_thinking": "on"}, {"expand_thinking": True}),
        ("tools", {}, {"approve_tools": False}),
        (
            "advanced",
            {"page_size": "50", "dom_window": "300"},
            {"page_size": 50, "dom_window": 300},
        ),
        (
            "models",
            {"default_model": "offline/demo", "fallback_model": "", "system_prompt": "Terse."},
            {"default_model": "offline/demo", "fallback_model": "", "system_prompt": "Terse."},
        ),
    ],
)
def test_saving_a_section_writes_its_fields_only(root, section, data, stored):
    """An unticked box elsewhere is not read as "off": other sections keep their values."""
    if section != "tools":
        set_setting("approve_tools", True)
    response = root.post(url(section), {"action": "settings", "section": section, **data})
    assert response.status_code == 302 and response["Location"] == url(section)
    rows = dict(Setting.objects.values_list("key", "value"))
    assert {k: rows[k] for k in stored} == stored
    assert set(rows) - {"approve_tools"} <= set(SETTINGS_SECTIONS[section])
    if section != "tools":
        assert rows["approve_tools"] is True


def test_a_section_without_preferences_refuses_a_settings_post(root):
    response = root.post(url("connections"), {"action": "settings", "section": "connections"})
    assert response.status_code == 400
    assert b"The Connections section has no preferences." in response.content
    assert root.post(url("models"), {"action": "settings", "section": "x"}).status_code == 400


def test_an_error_is_shown_in_its_own_section(root):
    response = root.post(
        url("advanced"),
        {"action": "settings", "section": "advanced", "page_size": "200", "dom_window": "100"},
    )
    assert response.status_code == 422
    page = html(response)
    assert "must hold at least one page (200 chunks)" in page
    assert f'<a href="{url("advanced")}" aria-current="page">' in page


# --- A key's test and save -----------------------------------------------------------------


TEST_CASES = [
    # reply (None: the fake server's model list), the badge, words of the message
    (None, "ok", "The key works at"),
    (
        Reply.error(401, "authentication_error", "invalid x-api-key"),
        "rejected",
        "rejected the key: invalid x-api-key",
    ),
    (Reply(body={"data": []}, delay=3.0), "timeout", "did not answer within 0.3 seconds"),
]


@pytest.mark.parametrize(("reply", "outcome", "words"), TEST_CASES)
def test_the_test_button_reports_each_outcome_and_saves_nothing(
    root, monkeypatch, fake_server, reply, outcome, words
):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    monkeypatch.setattr(check, "KEY_TEST_TIMEOUT", 0.3)
    if reply is not None:
        fake_server.add_models(reply)
    response = root.post(
        url("connections"), {"action": "test_key", "provider": "anthropic", "key": "sk-typed-0001"}
    )
    assert response.status_code == 200
    page = html(response)
    assert f'class="key-test {outcome}" id="key-test-anthropic"' in page
    assert words in page
    # The typed key stays in its field; nothing is stored.
    assert 'value="sk-typed-0001"' in page
    assert not ApiKey.objects.exists() and not Setting.objects.exists()
    assert len(fake_server.requests) == 1


def test_an_unreachable_endpoint_is_said(root, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    response = root.post(
        url("connections"), {"action": "test_key", "provider": "openai", "key": "sk-typed-0001"}
    )
    assert 'class="key-test unreachable"' in html(response)
    assert "http://127.0.0.1:9/v1 cannot be reached" in html(response)


def test_test_without_a_typed_key_tests_the_key_in_use(root, monkeypatch, fake_server):
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.openai_url)
    page = html(root.post(url("connections"), {"action": "test_key", "provider": "openai"}))
    assert "There is no key to test: paste one first." in page
    assert fake_server.requests == []
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-env-1234")
    page = html(root.post(url("connections"), {"action": "test_key", "provider": "openai"}))
    assert 'class="key-test ok"' in page
    assert fake_server.last.headers["authorization"] == "Bearer sk-from-the-env-1234"


def test_test_refuses_an_unknown_provider_and_a_malformed_key(root):
    assert root.post(url("connections"), {"action": "test_key", "provider": "x"}).status_code == 400
    response = root.post(
        url("connections"), {"action": "test_key", "provider": "anthropic", "key": "sk a b c d e"}
    )
    assert response.status_code == 422 and "no spaces or line breaks" in html(response)


def test_a_saved_key_is_tested_and_a_failing_one_kept_with_the_reason(
    root, monkeypatch, fake_server
):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    fake_server.add_models(Reply.error(401, "authentication_error", "invalid x-api-key"))
    response = root.post(
        url("connections"),
        {"action": "key", "provider": "anthropic", "key": "sk-bad-00001"},
        follow=True,
    )
    page = html(response)
    assert "Saved the anthropic key (…0001)" in page
    assert (
        f"The test failed: {fake_server.url} rejected the key: invalid x-api-key The key is "
        "saved anyway." in page
    )
    assert ApiKey.objects.get().get_key() == "sk-bad-00001"


def test_saving_a_key_changes_no_default_model(root, monkeypatch, fake_server, alice_wake):
    """The automatic default (offline, with no key) is written down when the key would move
    it: new tabs and wakes keep it, and Connections offers the change as a button."""
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake_server.url)
    assert preferences.load().new_tab_model == "offline/demo"
    response = root.post(
        url("connections"),
        {"action": "key", "provider": "anthropic", "key": "sk-good-0001"},
        follow=True,
    )
    page = html(response)
    assert "New tabs and wakes still use offline/demo: saving a key changes no default." in page
    assert Setting.objects.get(key="default_model").value == "offline/demo"
    assert preferences.load().new_tab_model == "offline/demo"
    assert preferences.new_tab(alice_wake).model == "offline/demo"
    assert "Use anthropic/claude-sonnet-4-5 for new tabs and wakes" in page

    root.post(url("connections"), {"action": "use_model", "model": "anthropic/claude-sonnet-4-5"})
    assert preferences.load().new_tab_model == "anthropic/claude-sonnet-4-5"
    # A second key leaves a chosen default alone and says nothing about it.
    monkeypatch.setenv("OPENAI_BASE_URL", fake_server.openai_url)
    page = html(
        root.post(
            url("connections"),
            {"action": "key", "provider": "openai", "key": "sk-good-0002"},
            follow=True,
        )
    )
    assert "still use" not in page
    assert preferences.load().new_tab_model == "anthropic/claude-sonnet-4-5"


@pytest.fixture
def alice_wake(db):
    return User.objects.create_user("alice")


def test_use_model_refuses_a_model_without_a_key(root):
    page = html(
        root.post(
            url("connections"), {"action": "use_model", "model": "openai/gpt-4.1"}, follow=True
        )
    )
    assert "openai/gpt-4.1 cannot run: OpenAI-compatible has no API key." in page
    assert not Setting.objects.filter(key="default_model").exists()


# --- The model picker ----------------------------------------------------------------------


def test_the_picker_lists_models_that_can_run_first(db, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-1234567")
    picker = model_picker("anthropic/claude-sonnet-4-5")
    assert [e.provider for e in picker["ready"]] == ["openai"] * len(picker["ready"][:-1]) + [
        "offline"
    ]
    assert [(label, provider) for label, provider, _ in picker["waiting"]] == [
        ("Anthropic", "anthropic"),
        ("DeepSeek", "deepseek"),
    ]
    assert all(e.needs_key == "Anthropic" for e in picker["waiting"][0][2])
    assert picker["current_label"] == "Claude Sonnet 4.5"


def test_a_tabs_unlisted_model_stays_in_the_picker(db):
    picker = model_picker("openai/gpt-9")
    assert picker["current"] == "openai/gpt-9"
    assert picker["ready"][-1].id == "openai/gpt-9"


@pytest.mark.parametrize(
    ("current", "posted", "error"),
    [
        (
            "offline/demo",
            "anthropic/claude-sonnet-4-5",
            "anthropic/claude-sonnet-4-5 cannot run: Anthropic has no API key. Add one in "
            "Settings → Connections (or set ANTHROPIC_API_KEY), then choose it again.",
        ),
        ("offline/demo", "evil/model", "“evil/model” is not a model this server offers."),
        ("anthropic/claude-sonnet-4-5", "anthropic/claude-sonnet-4-5", None),
        ("anthropic/claude-sonnet-4-5", "offline/demo", None),
    ],
)
def test_a_model_without_a_key_is_refused_with_the_fix(db, current, posted, error):
    form = TabModelForm({"model": posted}, current=current)
    assert form.is_valid() == (error is None)
    if error:
        assert form.errors["model"] == [error]


def test_the_tab_page_refuses_a_posted_model_without_a_key(root):
    tab = Tab.objects.create(owner=User.objects.get(username="root"), model="offline/demo")
    response = root.post(
        reverse("tab_model", args=[tab.id]), {"model": "openai/gpt-4.1"}, follow=True
    )
    assert "openai/gpt-4.1 cannot run: OpenAI-compatible has no API key." in html(response)
    tab.refresh_from_db()
    assert tab.model == "offline/demo"


def test_the_tab_page_has_the_picker_with_add_a_key_links(root):
    tab = Tab.objects.create(owner=User.objects.get(username="root"), model="offline/demo")
    page = html(root.get(reverse("tab", args=[tab.id])))
    assert 'class="model-picker"' in page
    assert '<a href="/settings/#provider-anthropic">add a key</a>' in page
    assert 'value="offline/demo" class="picker-opt" aria-current="true"' in page
    assert 'name="model" value="anthropic/' not in page  # no submit button for them


# --- Tokens and the admin ---------------------------------------------------------------------


def test_a_new_token_has_a_copy_button(root):
    page = html(root.post(reverse("api_tokens"), {"name": "laptop"}))
    assert 'data-copy-from="new-token"' in page and 'id="new-token"' in page


def test_the_admin_is_dispatch_admin_and_settings_link_it(root):
    page = html(root.get("/admin/"))
    assert "<title>Stored rows | Dispatch admin</title>" in page
    assert ">Dispatch admin<" in page
    assert '<a href="/admin/">Dispatch admin</a>' in html(root.get(url("advanced")))


def test_a_key_saved_in_the_admin_changes_no_default_model(root):
    response = root.post(
        reverse("admin:chat_apikey_add"),
        {"provider": "openai", "key": "sk-admin-key-0000000001"},
        follow=True,
    )
    assert ApiKey.objects.get().get_key() == "sk-admin-key-0000000001"
    assert "New tabs and wakes still use offline/demo" in html(response)
    assert preferences.load().new_tab_model == "offline/demo"
