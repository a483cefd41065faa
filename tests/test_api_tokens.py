"""Personal API tokens: created once and revoked by each user on their own API tokens
page (linked from Settings) or by `manage.py create_api_token`, seen (never added) in
the admin; kept by wipe_history."""

from __future__ import annotations

from io import StringIO

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from chat.models import ApiToken, Tab
from harness.login import session_for_new_user
from tests.api_helpers import ApiClient
from tests.live import open_page
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


@pytest.fixture
def carol(db):
    """A team member: not staff, so no Settings page, but her own tokens all the same."""
    return User.objects.create_user("carol", password="a third horse battery")


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def create_token(client: Client, **data) -> str:
    response = client.post(reverse("api_tokens"), data)
    assert response.status_code == 200
    shown = parse(response.content.decode()).by_id("new-token")
    assert shown is not None
    return shown.text.strip()


def token_error(response) -> str:
    shown = parse(response.content.decode()).by_id("token-error")
    assert shown is not None
    return shown.text.strip()


# --- The API tokens page -------------------------------------------------------------------------


def test_it_creates_a_token_and_shows_it_once(alice):
    client = logged_in(alice)
    token = create_token(client, name="laptop")
    row = ApiToken.objects.get()
    assert (row.user, row.name, row.read_only) == (alice, "laptop", False)
    assert row.token_hash == ApiToken.hash(token)
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 200
    again = client.get(reverse("api_tokens")).content.decode()
    assert token not in again
    assert row.prefix in again and "last used" in again


def test_it_creates_a_read_only_token(alice):
    token = create_token(logged_in(alice), name="reader", read_only="on")
    assert ApiToken.objects.get().read_only is True
    tab = Tab.objects.create(owner=alice)
    api = ApiClient(token=token)
    assert api.post(f"/api/v1/tabs/{tab.id}/messages", {"text": "hi"}).status_code == 403


def test_a_non_staff_user_manages_their_own_tokens(carol):
    client = logged_in(carol)
    assert client.get(reverse("settings")).status_code == 403
    home = parse(client.get(reverse("home"), follow=True).content.decode())
    links = [a.get("href") for a in home.find_all(lambda n: n.tag == "a")]
    assert reverse("api_tokens") in links  # the sidebar links the page for everyone

    token = create_token(client, name="carol's script")
    row = ApiToken.objects.get()
    assert (row.user, row.name) == (carol, "carol's script")
    Tab.objects.create(owner=carol, title="carol's tab")
    tabs = ApiClient(token=token).get("/api/v1/tabs").json()["tabs"]
    assert [t["title"] for t in tabs] == ["carol's tab"]
    listed = client.get(reverse("api_tokens")).content.decode()
    assert "carol&#x27;s script" in listed and row.prefix in listed and "never used" not in listed

    response = client.post(reverse("api_token_revoke", args=[row.pk]), follow=True)
    assert response.redirect_chain == [(reverse("api_tokens"), 302)]
    assert f"Revoked the API token {row.prefix}…." in response.content.decode()
    assert "No API tokens." in response.content.decode()
    assert not ApiToken.objects.exists()
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 401


@pytest.mark.parametrize("name", ["", "   "])
def test_it_refuses_a_token_without_a_name(alice, name):
    response = logged_in(alice).post(reverse("api_tokens"), {"name": name})
    assert response.status_code == 422
    assert token_error(response) == (
        "Give the token a name, so you can tell it apart when you revoke it."
    )
    assert not ApiToken.objects.exists()


def test_it_refuses_a_token_name_too_long(alice):
    response = logged_in(alice).post(reverse("api_tokens"), {"name": "x" * 101})
    assert response.status_code == 422
    assert token_error(response) == "A token's name has at most 100 characters."
    assert parse(response.content.decode()).by_id("token-name").get("value") == "x" * 101
    assert not ApiToken.objects.exists()


def test_it_lists_only_the_users_own_tokens(alice, carol):
    ApiToken.issue(alice, name="alice's laptop")
    ApiToken.issue(carol, name="carol's laptop")
    page = logged_in(carol).get(reverse("api_tokens")).content.decode()
    assert "carol&#x27;s laptop" in page
    assert "alice&#x27;s laptop" not in page


def test_it_revokes_a_token(alice):
    row, token = ApiToken.issue(alice)
    response = logged_in(alice).post(reverse("api_token_revoke", args=[row.pk]))
    assert response.status_code == 302
    assert not ApiToken.objects.exists()
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 401


@pytest.mark.parametrize("revoker", ["carol", "bob"])
def test_it_never_revokes_another_users_token(alice, bob, carol, revoker):
    """Not even staff may: another user's token is a 404, like one that never existed."""
    row, token = ApiToken.issue(alice)
    response = logged_in({"carol": carol, "bob": bob}[revoker]).post(
        reverse("api_token_revoke", args=[row.pk])
    )
    assert response.status_code == 404
    assert token_error(response) == (
        "There is no such API token of yours; it may already have been revoked."
    )
    assert row.prefix not in response.content.decode()
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 200


def test_revoking_a_missing_token_says_so(carol):
    row, _ = ApiToken.issue(carol)
    client = logged_in(carol)
    assert client.post(reverse("api_token_revoke", args=[row.pk])).status_code == 302
    again = client.post(reverse("api_token_revoke", args=[row.pk]))
    assert again.status_code == 404
    assert token_error(again) == (
        "There is no such API token of yours; it may already have been revoked."
    )


def test_revoking_needs_a_post(alice):
    row, _ = ApiToken.issue(alice)
    assert logged_in(alice).get(reverse("api_token_revoke", args=[row.pk])).status_code == 405
    assert ApiToken.objects.exists()


def test_the_page_needs_login(carol):
    row, _ = ApiToken.issue(carol)
    anonymous = Client()
    for response in (
        anonymous.get(reverse("api_tokens")),
        anonymous.post(reverse("api_tokens"), {"name": "sneaky"}),
        anonymous.post(reverse("api_token_revoke", args=[row.pk])),
    ):
        assert response.status_code == 302
        assert response.url.startswith(reverse("login"))
    assert list(ApiToken.objects.values_list("pk", flat=True)) == [row.pk]


def test_creating_and_revoking_need_the_csrf_token(carol):
    row, _ = ApiToken.issue(carol, name="old")
    client = Client(enforce_csrf_checks=True)
    client.force_login(carol)
    assert client.post(reverse("api_tokens"), {"name": "forged"}).status_code == 403
    assert client.post(reverse("api_token_revoke", args=[row.pk])).status_code == 403
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["old"]

    # Each form carries the token its post needs.
    page = parse(client.get(reverse("api_tokens")).content.decode())
    forms = {f.get("action"): f for f in page.find_all(lambda n: n.tag == "form")}
    revoke_url = reverse("api_token_revoke", args=[row.pk])
    csrf = {
        url: forms[url].find_all(lambda n: n.get("name") == "csrfmiddlewaretoken")[0].get("value")
        for url in (reverse("api_tokens"), revoke_url)
    }
    token = create_token(client, name="real", csrfmiddlewaretoken=csrf[reverse("api_tokens")])
    assert ApiClient(token=token).get("/api/v1/tabs").status_code == 200
    revoked = client.post(revoke_url, {"csrfmiddlewaretoken": csrf[revoke_url]})
    assert revoked.status_code == 302
    assert list(ApiToken.objects.values_list("name", flat=True)) == ["real"]


def test_settings_links_the_page_instead_of_its_own_token_form(alice):
    page = parse(
        logged_in(alice).get(reverse("settings_section", args=["advanced"])).content.decode()
    )
    section = page.by_id("api-tokens")
    assert section is not None
    links = [a.get("href") for a in section.find_all(lambda n: n.tag == "a")]
    assert links == [reverse("api_tokens")]
    assert not section.find_all(lambda n: n.tag == "form")


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


# --- In Chromium -------------------------------------------------------------------------------


@pytest.mark.browser
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.django_db(transaction=True)
async def test_a_non_staff_user_manages_tokens_in_chromium(browser, serve):
    """From the sidebar link to a working token and back to none: the error for a missing
    name, the token shown once, and a Revoke that asks first (refused, then confirmed)."""
    server = await serve()
    session = await sync_to_async(session_for_new_user)("dana")
    live = await open_page(browser, server, "/", session=session)
    page = live.page
    await page.click("a.foot-link:text('API tokens')")
    await page.wait_for_url(f"{server.url}{reverse('api_tokens')}")

    await page.click("button:text('Create token')")
    assert await page.text_content("#token-error") == (
        "Give the token a name, so you can tell it apart when you revoke it."
    )
    await page.fill("#token-name", "editor")
    await page.check("input[name=read_only]")
    await page.click("button:text('Create token')")
    token = (await page.text_content("#new-token")).strip()
    await page.set_viewport_size({"width": 375, "height": 700})
    assert await page.evaluate("document.documentElement.scrollWidth") <= 375
    await page.set_viewport_size({"width": 1100, "height": 800})
    api = ApiClient(token=token)
    assert (await sync_to_async(api.get)("/api/v1/tabs")).status_code == 200

    await page.goto(f"{server.url}{reverse('api_tokens')}")
    assert await page.query_selector("#new-token") is None
    listed = await page.text_content("#token-list")
    assert "editor" in listed and "read-only" in listed and token not in listed

    # The in-page confirmation: Escape cancels and nothing happens; its button revokes.
    await page.click("button:text('Revoke')")
    row = await sync_to_async(ApiToken.objects.get)()
    dialog = page.locator("dialog#confirm-dialog[open]")
    assert await dialog.locator("#confirm-text").text_content() == (
        f"Revoke the token {row.prefix}…? Anything using it stops working."
    )
    await page.keyboard.press("Escape")
    await page.wait_for_selector("dialog#confirm-dialog:not([open])", state="attached")
    assert await sync_to_async(ApiToken.objects.count)() == 1
    await page.click("button:text('Revoke')")
    await dialog.locator("button:text('Revoke the token')").click()
    await page.wait_for_selector(".messages")
    assert "Revoked the API token" in await page.text_content(".messages")
    assert await page.text_content("#api-tokens p.muted:not(.small)") == "No API tokens."
    assert (await sync_to_async(api.get)("/api/v1/tabs")).status_code == 401
    live.assert_clean()
