"""Permission rules in pages: the user's rules page, a tab's rules in its menu, and
"always allow" on the approval card."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from chat import bus, log
from chat import render as chat_render
from chat.models import PermissionRule, Tab
from chat.stream import Block, Kind, Role
from chat.tools.workdir import user_workspace
from tests.ui_helpers import tidy_tags

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def alice(db):
    # Not staff: rules are every user's own, unlike Settings.
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def tab(alice):
    return Tab.objects.create(owner=alice, model="offline/demo")


def with_call(tab: Tab, call_id: str, name: str, **arguments) -> None:
    data = {"call_id": call_id, "name": name, "arguments": arguments}
    log.append(tab.id, [Block(uuid.uuid4(), uuid.uuid4(), 1, Role.ASSISTANT, Kind.TOOL_CALL, data)])


def control_channel(tab: Tab) -> str:
    channel = async_to_sync(get_channel_layer().new_channel)()
    async_to_sync(get_channel_layer().group_add)(bus.control_group(tab.id), channel)
    return channel


def received(channel: str) -> dict:
    return async_to_sync(get_channel_layer().receive)(channel)


# --- the user's rules page ---------------------------------------------------------------


def test_a_user_adds_lists_and_removes_their_rules(alice, bob):
    PermissionRule.objects.create(user=bob, action="allow", pattern="shell(bob only)")
    client = client_for(alice)
    response = client.post(
        reverse("permission_rules"), {"action": "deny", "pattern": " shell(rm  *) "}
    )
    assert response.status_code == 302
    rule = PermissionRule.objects.get(user=alice)
    assert (rule.action, rule.pattern) == ("deny", "shell(rm  *)")
    page = client.get(reverse("permission_rules")).content.decode()
    assert "shell(rm  *)" in page and "Added the rule deny `shell(rm  *)`." in page
    assert "bob only" not in page
    assert client.post(reverse("rule_delete", args=[rule.pk])).status_code == 302
    assert not PermissionRule.objects.filter(user=alice).exists()


@pytest.mark.parametrize(
    ("action", "pattern", "message"),
    [
        ("allow", "shell(git status", "`shell(git status` opens a parenthesis it does not close."),
        ("allow", "shell(a && b)", "holds 2 commands"),
        ("allow", "", "A rule needs a pattern"),
        ("sometimes", "read_file", "A rule&#x27;s action is allow, ask or deny"),
        ("allow", "write_file(../x)", "climbs out with .."),
    ],
)
def test_a_bad_rule_is_refused_with_its_reason(alice, action, pattern, message):
    response = client_for(alice).post(
        reverse("permission_rules"), {"action": action, "pattern": pattern}
    )
    assert response.status_code == 422
    page = response.content.decode()
    assert message in page
    assert f'value="{escape(pattern)}"' in page
    assert not PermissionRule.objects.exists()


def test_another_users_rule_cannot_be_removed(alice, bob):
    theirs = PermissionRule.objects.create(user=bob, action="deny", pattern="shell(rm *)")
    response = client_for(alice).post(reverse("rule_delete", args=[theirs.pk]))
    assert response.status_code == 404
    assert "There is no such rule of yours" in response.content.decode()
    assert PermissionRule.objects.filter(pk=theirs.pk).exists()


def test_the_rules_page_needs_a_sign_in():
    assert Client().get(reverse("permission_rules")).status_code == 302
    assert Client().post(reverse("permission_rules"), {"action": "allow", "pattern": "x"})
    assert not PermissionRule.objects.exists()


# --- a tab's own rules ---------------------------------------------------------------------


def test_the_tab_menu_lists_its_rules_and_removes_one(alice, tab):
    tab.rules = [
        {"action": "allow", "pattern": "shell(git status)"},
        {"action": "deny", "pattern": "write_file(secret/**)"},
    ]
    tab.save(update_fields=["rules"])
    client = client_for(alice)
    page = client.get(reverse("tab", args=[tab.id])).content.decode()
    assert "Permission rules (2)" in page and "write_file(secret/**)" in page
    url = reverse("tab_rule_delete", args=[tab.id])
    assert client.post(url, {"action": "allow", "pattern": "shell(git status)"}).status_code == 302
    tab.refresh_from_db()
    assert tab.rules == [{"action": "deny", "pattern": "write_file(secret/**)"}]
    response = client.post(url, {"action": "allow", "pattern": "shell(git status)"}, follow=True)
    assert "This tab has no rule allow `shell(git status)`" in response.content.decode()


def test_another_users_tab_rules_are_untouchable(bob, tab):
    tab.rules = [{"action": "deny", "pattern": "shell"}]
    tab.save(update_fields=["rules"])
    url = reverse("tab_rule_delete", args=[tab.id])
    assert client_for(bob).post(url, {"action": "deny", "pattern": "shell"}).status_code == 404
    tab.refresh_from_db()
    assert tab.rules == [{"action": "deny", "pattern": "shell"}]


# --- "always allow" on the approval card ------------------------------------------------------


def approve(client, tab, field, call_id):
    return client.post(
        reverse("tab_approve", args=[tab.id]), {field: call_id}, HTTP_HX_REQUEST="true"
    )


def test_always_allow_in_this_tab_adds_the_calls_rule_and_approves(alice, tab):
    with_call(tab, "c1", "shell", command="git  status")
    channel = control_channel(tab)
    assert approve(client_for(alice), tab, "always_tab", "c1").status_code == 204
    tab.refresh_from_db()
    assert tab.rules == [{"action": "allow", "pattern": "shell(git status)"}]
    assert received(channel) == {
        "type": "turn.approve",
        "tab_id": str(tab.id),
        "call_id": "c1",
        "approved": True,
        "rule": {
            "text": "Rule added for this tab: allow `shell(git status)`",
            "rule": {
                "action": "allow",
                "pattern": "shell(git status)",
                "source": "tab",
                "added": True,
            },
        },
    }


def test_always_allow_in_all_my_tabs_adds_a_rule_of_the_user(alice, tab):
    with_call(tab, "w", "write_file", path="./src/app/a.py", content="x")
    channel = control_channel(tab)
    assert approve(client_for(alice), tab, "always_user", "w").status_code == 204
    rule = PermissionRule.objects.get()
    assert (rule.user, rule.action, rule.pattern) == (alice, "allow", "write_file(src/app/**)")
    assert received(channel)["rule"]["text"] == (
        "Rule added for all your tabs: allow `write_file(src/app/**)`"
    )
    tab.refresh_from_db()
    assert tab.rules == []


def test_always_allow_adds_nothing_when_an_ask_rule_would_still_win(alice, tab):
    PermissionRule.objects.create(user=alice, action="ask", pattern="shell(git push *)")
    with_call(tab, "p", "shell", command="git push")
    channel = control_channel(tab)
    assert approve(client_for(alice), tab, "always_tab", "p").status_code == 204
    tab.refresh_from_db()
    assert tab.rules == [] and PermissionRule.objects.count() == 1
    message = received(channel)
    assert message["approved"] is True
    assert message["rule"]["text"] == (
        "Approved once; no rule added: Asked by rule `shell(git push *)` (your settings) "
        "would still decide first"
    )
    assert "added" not in message["rule"]["rule"]


def test_always_allow_on_a_command_closing_a_descriptor_adds_its_rule(alice, tab):
    # `2>&-` once made reading the command raise: the button answered with a 500.
    with_call(tab, "c1", "shell", command="echo hi 2>&-")
    channel = control_channel(tab)
    assert approve(client_for(alice), tab, "always_tab", "c1").status_code == 204
    tab.refresh_from_db()
    assert tab.rules == [{"action": "allow", "pattern": "shell(echo hi)"}]
    assert received(channel)["rule"]["text"] == "Rule added for this tab: allow `shell(echo hi)`"


def test_always_allow_adds_nothing_when_an_ask_rule_matches_where_a_link_leads(
    alice, tab, tmp_path, settings
):
    """The approve view decides as the runner does, links followed from the tab's
    working directory: `src/h` leads to `.git/hooks`, which an ask rule covers, so the
    folder rule the card offers would never decide and is not added."""
    settings.DISPATCH_WORKSPACE = tmp_path
    proj = user_workspace(alice.pk) / "proj"
    (proj / ".git" / "hooks").mkdir(parents=True)
    (proj / "src").mkdir()
    (proj / "src" / "h").symlink_to("../.git/hooks")
    tab.workdir = "proj"
    tab.save(update_fields=["workdir"])
    PermissionRule.objects.create(user=alice, action="ask", pattern="write_file(.git/**)")
    with_call(tab, "w", "write_file", path="src/h/pre-commit", content="x")
    channel = control_channel(tab)
    assert approve(client_for(alice), tab, "always_tab", "w").status_code == 204
    tab.refresh_from_db()
    assert tab.rules == [] and PermissionRule.objects.count() == 1
    message = received(channel)
    assert message["approved"] is True
    assert message["rule"]["text"] == (
        "Approved once; no rule added: Asked by rule `write_file(.git/**)` (your settings) "
        "for src/h/pre-commit, a link to .git/hooks/pre-commit would still decide first"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (("shell", {"command": "git status && rm -rf /"}), "This call has no rule to always allow"),
        (("shell", {"command": "rm *"}), "This call has no rule to always allow"),
        (("shell", {"command": "echo hi > src/main.py"}), "a redirection to a file or a path"),
        (("write_file", {"path": "../x"}), "This call has no rule to always allow"),
        (None, "There is no call 'c9' in this tab."),
    ],
)
def test_always_allow_refuses_a_call_without_a_safe_rule(alice, tab, call, message):
    if call is not None:
        with_call(tab, "c9", call[0], **call[1])
    response = approve(client_for(alice), tab, "always_user", "c9")
    assert response.status_code == 400
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert message in response.content.decode()
    tab.refresh_from_db()
    assert tab.rules == [] and not PermissionRule.objects.exists()


def test_always_allow_on_another_users_tab_is_a_404(bob, tab):
    with_call(tab, "c1", "shell", command="git status")
    assert approve(client_for(bob), tab, "always_user", "c1").status_code == 404
    assert not PermissionRule.objects.exists()


@pytest.mark.parametrize(
    ("arguments", "rule"),
    [
        ({"command": "git status"}, "shell(git status)"),
        ({"command": "git status; rm -rf /"}, None),
    ],
)
def test_the_approval_card_offers_the_calls_rule(arguments, rule):
    status = {
        "state": "waiting",
        "approval": {"call_id": "c1", "name": "shell", "arguments": arguments},
    }
    s = chat_render.status_context(status)
    html = tidy_tags(render_to_string("chat/tab.html#approval", {"s": s}))
    if rule is None:
        assert "Always allow" not in html and 'name="approve" value="c1"' in html
        return
    assert f"Always allow <code>{rule}</code> in" in html
    assert 'name="always_tab" value="c1"' in html and 'name="always_user" value="c1"' in html
