"""External agents on the Settings page (chat.views.agents): superusers add, edit and
remove them, their variables encrypted and masked; other staff only see them; every bad
input a message on the form."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chat.acp import config as acp_config
from chat.acp.seam import AgentConfig
from chat.envcheck import acp_agents
from chat.forms import SECRET_MASK
from chat.models import AcpAgent, Tab

TOKEN = "sk-agent-s3cret-value"


def logged_in(**fields) -> Client:
    client = Client()
    client.force_login(User.objects.create_user(**fields))
    return client


@pytest.fixture
def root(db) -> Client:
    return logged_in(username="root", password="pw-root-12345", is_staff=True, is_superuser=True)


@pytest.fixture
def staff(db) -> Client:
    return logged_in(username="sam", password="pw-sam-12345", is_staff=True)


def add(client: Client, **fields: str):
    data = {"action": "agent", "provider": "", "enabled": "on", **fields}
    return client.post(reverse("settings_section", args=["models"]), data)


def test_a_superuser_adds_an_agent_whose_variables_are_encrypted_and_masked(root):
    command = "node '/opt/my agent/index.js' --acp"
    response = add(root, name="mine", command=command, env=f"AGENT_TOKEN={TOKEN}")
    assert response.status_code == 302
    assert response["Location"].endswith("#agents")
    row = AcpAgent.objects.get(name="mine")
    assert row.command == ["node", "/opt/my agent/index.js", "--acp"]
    assert row.get_env() == {"AGENT_TOKEN": TOKEN}
    assert TOKEN not in row.env_encrypted
    page = root.get(reverse("settings_section", args=["models"])).content.decode()
    assert "acp/mine" in page
    assert "node &#x27;/opt/my agent/index.js&#x27; --acp" in page
    assert f"AGENT_TOKEN={SECRET_MASK}" in page and TOKEN not in page


def test_editing_keeps_a_masked_variable_and_changes_the_rest(root):
    add(root, name="mine", command="mine-acp", env=f"AGENT_TOKEN={TOKEN}")
    row = AcpAgent.objects.get(name="mine")
    form = root.get(
        reverse("settings_section", args=["models"]) + f"?agent={row.pk}"
    ).content.decode()
    assert f"AGENT_TOKEN={SECRET_MASK}" in form and TOKEN not in form
    response = add(
        root,
        agent=str(row.pk),
        name="mine",
        command="mine-acp --verbose",
        env=f"AGENT_TOKEN={SECRET_MASK}\nMORE=1",
        provider="anthropic",
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.command == ["mine-acp", "--verbose"]
    assert row.get_env() == {"AGENT_TOKEN": TOKEN, "MORE": "1"}
    assert row.provider == "anthropic"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"name": "Mine", "command": "x"}, "name", "Use lowercase letters, digits, _ and -"),
        ({"name": "-x", "command": "x"}, "name", "Use lowercase letters, digits, _ and -"),
        ({"name": "mine", "command": "   "}, "command", "This field is required."),
        ({"name": "mine", "command": "x 'open"}, "command", "The command could not be read"),
        ({"name": "mine", "command": "x", "env": "1BAD=x"}, "env", "Line 1: write NAME=value"),
        ({"name": "mine", "command": "x", "env": f"T={SECRET_MASK}"}, "env", "type the value"),
        ({"name": "mine", "command": "x", "provider": "google"}, "provider", "not one of"),
    ],
)
def test_bad_input_is_a_message_at_its_field_and_saves_nothing(root, fields, field, message):
    response = add(root, **fields)
    assert response.status_code == 422
    errors = response.context["agent_form"].errors
    assert any(message in error for error in errors[field]), errors
    assert not AcpAgent.objects.exists()


def test_a_second_agent_of_the_same_name_is_refused(root):
    add(root, name="mine", command="x")
    response = add(root, name="mine", command="y")
    assert response.status_code == 422
    assert response.context["agent_form"].errors["name"] == [
        "There is already an agent named mine."
    ]
    assert AcpAgent.objects.get().command == ["x"]


def test_other_staff_see_agents_but_cannot_add_change_or_remove_them(root, staff):
    add(root, name="mine", command="mine-acp")
    row = AcpAgent.objects.get()
    page = staff.get(reverse("settings_section", args=["models"])).content.decode()
    assert "acp/mine" in page and "Only a superuser can add" in page
    assert "mine-acp" not in page  # the command line: an argument may hold a token
    assert "Add agent" not in page
    assert add(staff, name="theirs", command="x").status_code == 403
    assert staff.post(reverse("agent_delete", args=[row.pk])).status_code == 403
    assert list(AcpAgent.objects.values_list("name", flat=True)) == ["mine"]


def test_a_superuser_removes_an_agent(root):
    add(root, name="mine", command="mine-acp")
    row = AcpAgent.objects.get()
    response = root.post(reverse("agent_delete", args=[row.pk]))
    assert response.status_code == 302
    assert not AcpAgent.objects.exists()
    assert root.post(reverse("agent_delete", args=[row.pk])).status_code == 404
    assert root.get(reverse("settings_section", args=["models"]) + "?agent=abc").status_code == 404


def test_saved_agents_join_the_presets_and_the_variable_wins_by_name(root, monkeypatch, settings):
    """What a tab may use: the presets found, then the enabled agents saved here, then
    DISPATCH_ACP_AGENTS (the operator's), a later one replacing an earlier of its name."""
    monkeypatch.setenv("PATH", "/nonexistent")
    add(root, name="mine", command="mine-acp --x", env=f"AGENT_TOKEN={TOKEN}")
    add(root, name="theirs", command="theirs-acp", provider="openai")
    add(root, name="off", command="off-acp", enabled="")
    assert AcpAgent.objects.get(name="off").enabled is False
    settings.DISPATCH_ACP_AGENTS = acp_agents('{"theirs": {"command": ["/opt/theirs"]}}')
    agents = acp_config.agents()
    assert agents == {
        "mine": AgentConfig("mine", ("mine-acp", "--x"), (("AGENT_TOKEN", TOKEN),), ""),
        "theirs": AgentConfig("theirs", ("/opt/theirs",), (), ""),
    }
    page = root.get(reverse("settings_section", args=["models"])).content.decode()
    assert "DISPATCH_ACP_AGENTS, replacing the saved one" in page
    assert "/opt/theirs" in page


def test_an_agent_whose_variables_cannot_be_read_is_left_out(root, monkeypatch):
    """Saved under another SECRET_KEY, its variables cannot be decrypted: started without
    them it would fail without saying why."""
    add(root, name="mine", command="mine-acp", env=f"AGENT_TOKEN={TOKEN}")
    AcpAgent.objects.filter(name="mine").update(env_encrypted="not-a-token")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert acp_config.agents({}) == {}


def test_an_agent_tabs_page_offers_no_compaction_and_no_context_meter(root):
    """An external agent keeps its own context: the page of its tab has no "/compact"
    hint and (by the agent-tab class, for page and live answers alike) no "Summarise up to
    here" nor context meter; a native tab keeps them."""
    user = User.objects.get(username="root")
    agent = Tab.objects.create(owner=user, title="agent", model="acp/claude-code")
    native = Tab.objects.create(owner=user, title="native", model="offline/demo")
    page = root.get(reverse("tab", args=[agent.pk])).content.decode()
    assert re.search(r'<body[^>]*class="app agent-tab"', page)
    assert 'placeholder="Message the agent…"' in page and "/compact [focus]" not in page
    page = root.get(reverse("tab", args=[native.pk])).content.decode()
    assert re.search(r'<body[^>]*class="app"', page) and "/compact [focus]" in page
    css = (settings.BASE_DIR / "static" / "chat" / "app.css").read_text()
    assert ".agent-tab .act-compact, .agent-tab #context-meter { display: none" in css
