"""Profiles, AGENTS.md and a tab's working directory (issue 18): what a new tab gets
(preferences.new_tab, the one place tabs are made), the forms that check a profile
(Settings and the admin), and every way to make a tab from one: the page, the API and
`manage.py send`."""

from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.urls import reverse

from chat import preferences
from chat.forms import ProfileForm
from chat.models import ApiToken, McpServer, PermissionRule, Profile, Tab
from chat.preferences import AGENTS_MAX_CHARS, DEFAULT_SYSTEM_PROMPT, new_tab
from chat.tools.workdir import BadWorkdir, user_workspace
from tests.api_helpers import ApiClient

User = get_user_model()


@pytest.fixture
def workspace(tmp_path, settings, owner):
    """The owner's workspace, where their tabs' AGENTS.md and working directories are."""
    settings.DISPATCH_WORKSPACE = tmp_path / "ws"
    return user_workspace(owner.pk)


@pytest.fixture
def owner(db):
    return User.objects.create_user("owner", password="pw-owner-123", is_staff=True)


@pytest.fixture
def reviewer(db) -> Profile:
    profile = Profile.objects.create(
        name="reviewer",
        description="reads, never writes",
        system_prompt="You review code.",
        model="offline/demo",
        tools=["list_files", "read_file"],
    )
    PermissionRule.objects.create(profile=profile, action="allow", pattern="read_file")
    PermissionRule.objects.create(profile=profile, action="deny", pattern="shell(rm *)")
    return profile


# --- new_tab -------------------------------------------------------------------------


def test_a_tab_made_from_a_profile_gets_a_copy_of_it(owner, reviewer, workspace):
    tab = new_tab(owner, profile=reviewer)
    assert (tab.system_prompt, tab.model, tab.tool_allow) == (
        "You review code.",
        "offline/demo",
        ["list_files", "read_file"],
    )
    assert tab.rules == [
        {"action": "allow", "pattern": "read_file"},
        {"action": "deny", "pattern": "shell(rm *)"},
    ]
    assert tab.profile == reviewer and tab.tools is None
    # Editing the profile changes no tab made from it.
    reviewer.system_prompt = "Something else."
    reviewer.save()
    reviewer.rules.all().delete()
    tab.refresh_from_db()
    assert tab.system_prompt == "You review code." and len(tab.rules) == 2


def test_a_tab_without_a_profile_gets_the_settings_and_every_tool(owner, workspace):
    tab = new_tab(owner, "offline/demo")
    assert (tab.system_prompt, tab.tool_allow, tab.rules, tab.profile, tab.workdir) == (
        DEFAULT_SYSTEM_PROMPT,
        [],
        [],
        None,
        "",
    )


def test_an_explicit_model_and_prompt_win_over_the_profiles(owner, reviewer, workspace):
    tab = new_tab(owner, "anthropic/claude-sonnet-4-5", profile=reviewer, system_prompt="Mine.")
    assert (tab.model, tab.system_prompt) == ("anthropic/claude-sonnet-4-5", "Mine.")


def test_agents_md_joins_the_system_prompt_under_a_header(owner, workspace):
    (workspace / "AGENTS.md").write_text("Run `make test` before you say done.\n")
    tab = new_tab(owner, "offline/demo")
    assert tab.system_prompt == (
        f"{DEFAULT_SYSTEM_PROMPT}\n\n# Instructions from AGENTS.md in the workspace\n\n"
        "Run `make test` before you say done."
    )


def test_the_working_directorys_agents_md_wins_and_a_long_one_is_cut_with_a_note(owner, workspace):
    (workspace / "AGENTS.md").write_text("the workspace's")
    (workspace / "site").mkdir()
    (workspace / "site" / "AGENTS.md").write_text("x" * (AGENTS_MAX_CHARS + 500))
    tab = new_tab(owner, "offline/demo", workdir="site")
    assert "# Instructions from site/AGENTS.md in the workspace" in tab.system_prompt
    assert "the workspace's" not in tab.system_prompt
    assert tab.system_prompt.count("x") == AGENTS_MAX_CHARS
    assert tab.system_prompt.endswith(
        f"[site/AGENTS.md is {AGENTS_MAX_CHARS + 500:,} bytes: only its first "
        f"{AGENTS_MAX_CHARS:,} characters are included here.]"
    )
    # A working directory without one gets the workspace's.
    other = new_tab(owner, "offline/demo", workdir="other")
    assert other.system_prompt.endswith("AGENTS.md in the workspace\n\nthe workspace's")


def test_a_binary_agents_md_is_left_out_with_a_notice_in_the_prompt_view(owner, workspace, client):
    """NUL bytes make AGENTS.md a binary file: it is not included, the prompt (shown in
    the tab's system-prompt view) says so instead, and the tab is made. PostgreSQL
    refuses NUL in text: kept, it failed the making of every tab."""
    (workspace / "AGENTS.md").write_bytes(b"Be nice.\x00\x01\xff\xfe binary \x00 stuff")
    tab = new_tab(owner, "offline/demo")
    notice = "[AGENTS.md in the workspace is not included: it holds NUL bytes, as binary files do.]"
    assert tab.system_prompt == f"{DEFAULT_SYSTEM_PROMPT}\n\n{notice}"
    tab.refresh_from_db()
    assert tab.system_prompt.endswith(notice)
    client.force_login(owner)
    page = client.get(reverse("tab", args=[tab.id])).content.decode()
    assert notice in page


def test_control_characters_are_taken_out_of_agents_md(owner, workspace):
    """Escape sequences, CR, a bell: taken out; line feeds and tabs kept."""
    (workspace / "AGENTS.md").write_bytes(
        b"\x1b[31mRed\x1b[0m rules:\r\n\t- one\x07\x0c\n\t- two\x7f\xc2\x9b"
    )
    tab = new_tab(owner, "offline/demo")
    assert tab.system_prompt.endswith(
        "# Instructions from AGENTS.md in the workspace\n\n[31mRed[0m rules:\n\t- one\n\t- two"
    )


def test_an_agents_md_that_is_a_link_is_not_read(owner, workspace, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the data dir's secret")
    (workspace / "AGENTS.md").symlink_to(secret)
    assert new_tab(owner, "offline/demo").system_prompt == DEFAULT_SYSTEM_PROMPT


def test_a_working_directory_is_made_and_one_outside_the_workspace_refused(
    owner, workspace, tmp_path
):
    tab = new_tab(owner, "offline/demo", workdir="projects/site/")
    assert tab.workdir == "projects/site" and (workspace / "projects" / "site").is_dir()
    (workspace / "out").symlink_to(tmp_path)
    for bad, why in (("../x", "leaves the workspace"), ("/tmp", "not relative"), ("out", "link")):
        with pytest.raises(BadWorkdir, match=why):
            new_tab(owner, "offline/demo", workdir=bad)
    assert Tab.objects.count() == 1
    assert not (tmp_path / "x").exists()


def test_profile_named_says_which_profiles_there_are(reviewer):
    with pytest.raises(ValueError, match="No profile named “nope”. Profiles: reviewer."):
        preferences.profile_named("nope")


# --- the form (Settings and the admin) ------------------------------------------------


def form(**fields) -> ProfileForm:
    data = {"name": "p", "description": "", "system_prompt": "", "model": "", "tools": ""}
    data["rules_text"] = ""
    return ProfileForm({**data, **fields})


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"model": "nowhere/model-9"}, "model", "Unknown provider “nowhere”"),
        ({"model": "gpt"}, "model", "is not a model id"),
        ({"tools": "read_file\nrm_rf"}, "tools", "No such tool: rm_rf. The tools are:"),
        ({"tools": "mcp__github__*"}, "tools", "No such tool: mcp__github__*."),
        ({"rules_text": "allow shell(ls)\npermit read_file"}, "rules_text", "Line 2"),
        ({"rules_text": "deny"}, "rules_text", "A rule needs a pattern"),
        ({"rules_text": "allow shell(ls"}, "rules_text", "opens a parenthesis it does not close"),
        ({"name": ""}, "name", "required"),
    ],
)
def test_a_profile_naming_an_unknown_model_or_tool_or_a_bad_rule_is_refused(
    db, fields, field, message
):
    f = form(**fields)
    assert not f.is_valid()
    assert message in " ".join(f.errors[field])
    assert not Profile.objects.exists()


def test_a_good_profile_is_saved_with_its_rules(db):
    McpServer.objects.create(name="github", transport="http", url="http://127.0.0.1:1/mcp")
    f = form(
        name="dev",
        model="offline/demo",
        tools="read_file\n  shell \n\nmcp__github__*",
        rules_text="allow shell(git status)\ndeny write_file(secrets/**)",
    )
    assert f.is_valid(), f.errors
    profile = f.save()
    assert profile.tools == ["read_file", "shell", "mcp__github__*"]
    assert [(r.action, r.pattern) for r in profile.rules.all()] == [
        ("allow", "shell(git status)"),
        ("deny", "write_file(secrets/**)"),
    ]
    again = ProfileForm(instance=profile)
    assert again.initial["rules_text"] == "allow shell(git status)\ndeny write_file(secrets/**)"


# --- the pages -----------------------------------------------------------------------


def test_profiles_are_staff_only(client, db):
    client.force_login(User.objects.create_user("pat", password="pw-pat-12345"))
    assert client.get(reverse("profile_new")).status_code == 403
    response = client.post(reverse("profile_new"), {"name": "sneaky"})
    assert response.status_code == 403 and not Profile.objects.exists()


def test_staff_add_edit_and_delete_a_profile_from_settings(client, owner, workspace):
    client.force_login(owner)
    response = client.post(
        reverse("profile_new"),
        {"name": "writer", "model": "offline/demo", "tools": "write_file", "rules_text": ""},
    )
    assert response.status_code == 302
    profile = Profile.objects.get(name="writer")
    page = client.get(reverse("settings_section", args=["profiles"])).content.decode()
    assert 'id="profiles"' in page and reverse("profile_edit", args=[profile.id]) in page
    refused = client.post(
        reverse("profile_edit", args=[profile.id]),
        {"name": "writer", "model": "offline/demo", "tools": "delete_everything"},
    )
    assert refused.status_code == 422
    assert "No such tool: delete_everything." in refused.content.decode()
    client.post(reverse("profile_delete", args=[profile.id]))
    assert not Profile.objects.exists()


def test_the_new_tab_form_makes_a_tab_from_a_profile_in_a_working_directory(
    client, owner, reviewer, workspace
):
    client.force_login(owner)
    form_page = client.get(reverse("tab_new")).content.decode()
    assert "reviewer" in form_page and 'name="workdir"' in form_page
    response = client.post(reverse("tab_new"), {"profile": reviewer.id, "workdir": "review"})
    tab = Tab.objects.get()
    assert response.url == reverse("tab", args=[tab.id])
    assert (tab.profile, tab.workdir, tab.model) == (reviewer, "review", "offline/demo")
    refused = client.post(reverse("tab_new"), {"workdir": "../elsewhere"})
    assert refused.status_code == 422
    assert "leaves the workspace" in refused.content.decode()
    assert Tab.objects.count() == 1
    # The sidebar's button posts nothing: a plain new tab.
    client.post(reverse("tab_new"))
    assert Tab.objects.filter(profile=None, workdir="").count() == 1


# --- the API and the command ------------------------------------------------------------


def test_the_api_makes_a_tab_from_a_profile(owner, reviewer, workspace):
    api = ApiClient(token=ApiToken.issue(owner, name="t")[1])
    made = api.post("/api/v1/tabs", {"profile": "reviewer", "workdir": "r"})
    assert made.status_code == 201
    body = made.json()
    assert (body["profile"], body["workdir"], body["model"]) == ("reviewer", "r", "offline/demo")
    assert body["system_prompt"] == "You review code."
    unknown = api.post("/api/v1/tabs", {"profile": "nope"})
    assert unknown.status_code == 422
    assert unknown.json()["error"]["code"] == "unknown_profile"
    assert "No profile named “nope”" in unknown.json()["error"]["message"]
    outside = api.post("/api/v1/tabs", {"workdir": "../x"})
    assert outside.status_code == 422 and outside.json()["error"]["code"] == "invalid_workdir"
    assert Tab.objects.count() == 1


def test_send_refuses_an_unknown_profile_and_a_workdir_out_of_the_workspace(
    owner, reviewer, workspace, transactional_db
):
    owner.is_superuser = True
    owner.save()
    for args, message in (
        (["--profile", "nope"], "No profile named “nope”. Profiles: reviewer."),
        (["--workdir", "../x"], "leaves the workspace"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("send", "--new", *args, "hi", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="--profile is for a new tab: use it with --new"):
        call_command("send", "--tab", "x", "--profile", "reviewer", "hi")
    assert not Tab.objects.exists()


def test_send_makes_a_tab_from_a_profile(owner, reviewer, workspace, transactional_db):
    owner.is_superuser = True
    owner.save()
    out = io.StringIO()
    call_command(
        "send",
        "--new",
        "--profile",
        "reviewer",
        "--json",
        "hello",
        stdout=out,
        stderr=io.StringIO(),
    )
    tab = Tab.objects.get()
    assert (tab.profile, tab.model, tab.tool_allow) == (reviewer, "offline/demo", reviewer.tools)
    assert [e["name"] for e in tab.tools] == ["list_files", "read_file"]
    assert any(json.loads(line).get("op") == "seal" for line in out.getvalue().splitlines())
