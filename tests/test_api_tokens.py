"""Personal API tokens: created once and revoked on the Settings page, by
`manage.py create_api_token`, seen (never added) in the admin; kept by wipe_history."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from chat.models import ApiToken, Tab
from tests.api_helpers import ApiClient
from tests.ui_helpers import parse

pytestmark = pytest.mark.django_db

User = get_user_model()


@pytest.fixture
def alice(db):
    return User.objects.create_user(
        "alice", password="correct horse battery", is_staff=True, is_superuser=True
    )


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery", is_staff=True)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def create_token(client: Client, **data) -> str:
    response = client.post(reverse("settings"), {"action": "token", **data})
    assert response.status_code == 200
    shown = parse(response.content.decode()).by_id("new-token")
    assert shown is not None
    return shown.text.strip()


# --- Settings page ---------------------------------------------------------------------------


def test_it_creates_a_token_and_shows_it_once(alice):
    client = logged_in(alice)
    token = create_token(client, name="laptop")
    row = ApiToken.objects.get()
    assert (row.user, row.name, row.read_only) == (alice, "laptop", False)
    assert row.token_hash == ApiToken.hash(token)
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 200
    again = client.get(reverse("settings")).content.decode()
    assert token not in again
    assert row.prefix in again and "last used" in again


def test_it_creates_a_read_only_token(alice):
    token = create_token(logged_in(alice), name="", read_only="on")
    assert ApiToken.objects.get().read_only is True
    tab = Tab.objects.create(owner=alice)
    api = ApiClient(token=token)
    assert api.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "hi"}).status_code == 403


def test_it_refuses_a_token_name_too_long(alice):
    response = logged_in(alice).post(reverse("settings"), {"action": "token", "name": "x" * 101})
    assert response.status_code == 422
    assert "A token&#x27;s name has at most 100 characters." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_it_lists_only_the_users_own_tokens(alice, bob):
    ApiToken.issue(alice, name="alice's laptop")
    ApiToken.issue(bob, name="bob's laptop")
    page = logged_in(alice).get(reverse("settings")).content.decode()
    assert "alice&#x27;s laptop" in page
    assert "bob&#x27;s laptop" not in page


def test_it_revokes_a_token(alice):
    row, token = ApiToken.issue(alice)
    response = logged_in(alice).post(reverse("api_token_revoke", args=[row.pk]))
    assert response.status_code == 302
    assert not ApiToken.objects.exists()
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 401


def test_it_never_revokes_another_users_token(alice, bob):
    row, _ = ApiToken.issue(bob)
    response = logged_in(alice).post(reverse("api_token_revoke", args=[row.pk]))
    assert response.status_code == 404
    assert ApiToken.objects.filter(pk=row.pk).exists()


def test_revoking_needs_a_post(alice):
    row, _ = ApiToken.issue(alice)
    assert logged_in(alice).get(reverse("api_token_revoke", args=[row.pk])).status_code == 405
    assert ApiToken.objects.exists()


# --- create_api_token --------------------------------------------------------------------------


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("create_api_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_command_prints_a_working_token_once(alice):
    out, err = run("alice", "--name", "ci")
    token = out.strip()
    row = ApiToken.objects.get()
    assert (row.name, row.read_only, row.token_hash) == ("ci", False, ApiToken.hash(token))
    assert token not in err and row.prefix in err and "read-write" in err
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 200


def test_the_command_creates_a_read_only_token(alice):
    out, err = run("alice", "--read-only")
    assert ApiToken.objects.get().read_only is True
    assert "read-only" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["nobody"], "There is no user 'nobody'; nothing was created."),
        (["alice", "--name", "x" * 101], "--name has at most 100 characters."),
    ],
)
def test_the_command_refuses_what_it_cannot_do(alice, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not ApiToken.objects.exists()


def test_the_command_refuses_a_deactivated_user(alice):
    User.objects.filter(pk=alice.pk).update(is_active=False)
    with pytest.raises(CommandError, match="deactivated"):
        run("alice")
    assert not ApiToken.objects.exists()


# --- Admin, wipe ---------------------------------------------------------------------------------


def test_the_admin_shows_tokens_but_cannot_add_one(alice):
    row, token = ApiToken.issue(alice, name="laptop")
    client = logged_in(alice)
    listing = client.get(reverse("admin:chat_apitoken_changelist")).content.decode()
    assert row.prefix in listing and token not in listing
    assert client.get(reverse("admin:chat_apitoken_add")).status_code == 403
    change = client.get(reverse("admin:chat_apitoken_change", args=[row.pk])).content.decode()
    assert 'name="token_hash"' not in change  # shown, never editable


def test_wipe_history_keeps_tokens(alice):
    _, token = ApiToken.issue(alice)
    Tab.objects.create(owner=alice)
    call_command("wipe_history", "--yes", stdout=StringIO())
    assert not Tab.objects.exists()
    assert ApiClient(token=token).get("/api/v1/tabs").json()["tabs"] == []
