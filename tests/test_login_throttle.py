"""Sign-in throttling: failures lock the account and the address, each on its own count;
the page says how long to wait; the cool-off ends it; `unlock_login` lifts it, from any process.

The clock is moved by moving the stored failures back in time: axes compares
each failure's time with now minus the cool-off, so a failure made N minutes
earlier is exactly what N minutes passing looks like to it, without patching
whichever module imported `now`.
"""

from __future__ import annotations

import asyncio
import http.client
import secrets
import subprocess
import sys
import urllib.parse
from datetime import timedelta
from io import StringIO

import pytest
from axes.models import AccessAttempt
from django.conf import settings as django_settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.core.management import CommandError, call_command
from django.db.models import F
from django.test import Client, RequestFactory
from django.urls import reverse

from chat import throttle
from harness.servers import ROOT, server_env
from tests.live import PASSWORD

pytestmark = pytest.mark.django_db

User = get_user_model()
HOME_ADDRESS = "203.0.113.10"
OTHER_ADDRESS = "198.51.100.20"
RIGHT = "correct horse battery"
LIMIT = django_settings.AXES_FAILURE_LIMIT
COOLOFF = django_settings.AXES_COOLOFF_TIME
# One HTTP request to a local live server.
HTTP_TIMEOUT = 15.0
# A manage.py command in a subprocess: Django start-up on two busy cores.
COMMAND_TIMEOUT = 60


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password=RIGHT, is_staff=True, is_superuser=True)


def sign_in(username: str, password: str, address: str = HOME_ADDRESS, path: str = ""):
    client = Client(REMOTE_ADDR=address)
    response = client.post(path or reverse("login"), {"username": username, "password": password})
    return response, client


def signed_in(client: Client) -> bool:
    return SESSION_KEY in client.session


def fail(times: int, username: str = "alice", address: str = HOME_ADDRESS) -> list[int]:
    return [sign_in(username, "wrong", address)[0].status_code for _ in range(times)]


def move_clock(by: timedelta) -> None:
    """`by` passes, as axes sees it: every failure happened that much earlier."""
    AccessAttempt.objects.update(attempt_time=F("attempt_time") - by)


def test_it_locks_the_account_after_the_limit_even_from_another_address(alice):
    """Under the limit a wrong password only says so; the failure that reaches it gets
    the 429 page with the wait; then even the right password from a new address is refused."""
    statuses = fail(LIMIT - 1)
    response, _ = sign_in("alice", "wrong")
    assert statuses == [200] * (LIMIT - 1)
    assert response.status_code == 429
    page = response.content.decode()
    assert "Too many failed sign-ins. Try again in 15 minutes." in page
    assert 14 * 60 < int(response["Retry-After"]) <= 15 * 60
    assert 'name="password"' in page, "the sign-in page itself, not a bare error"
    assert "correct username and password" not in page

    response, client = sign_in("alice", RIGHT, address=OTHER_ADDRESS)
    assert response.status_code == 429
    assert "Try again in 15 minutes." in response.content.decode()
    assert not signed_in(client)


def test_it_locks_the_address_after_the_limit_even_for_another_account(alice):
    """Guessing a different account each time still locks the address, for every account;
    the account itself stays open from elsewhere."""
    for i in range(LIMIT):
        sign_in(f"guess{i}", "wrong")
    response, client = sign_in("alice", RIGHT)
    assert response.status_code == 429
    assert "Too many failed sign-ins." in response.content.decode()
    assert not signed_in(client)

    response, client = sign_in("alice", RIGHT, address=OTHER_ADDRESS)
    assert response.status_code == 302 and signed_in(client)


def test_the_page_names_the_wait_that_is_left(alice):
    fail(LIMIT)
    move_clock(timedelta(minutes=1))
    response, _ = sign_in("alice", RIGHT)
    assert "Try again in 14 minutes." in response.content.decode()
    move_clock(COOLOFF - timedelta(minutes=1, seconds=30))
    response, _ = sign_in("alice", RIGHT)
    assert "Try again in 1 minute." in response.content.decode()


def test_a_try_while_locked_does_not_extend_the_lock(alice):
    """Refused tries are not counted: the owner retrying does not push the end back."""
    fail(LIMIT)
    before = list(AccessAttempt.objects.values_list("failures_since_start", "attempt_time"))
    assert before, "the failures were counted"
    move_clock(timedelta(minutes=5))
    assert fail(3) == [429] * 3
    assert sign_in("alice", RIGHT)[0].status_code == 429
    after = list(AccessAttempt.objects.values_list("failures_since_start", "attempt_time"))
    assert [(n, t - timedelta(minutes=5)) for n, t in before] == after


def test_the_lock_ends_after_the_cooloff(alice):
    fail(LIMIT)
    move_clock(COOLOFF - timedelta(minutes=1))
    assert sign_in("alice", RIGHT)[0].status_code == 429
    move_clock(timedelta(minutes=2))
    response, client = sign_in("alice", RIGHT)
    assert response.status_code == 302 and signed_in(client)
    # The slate is clean: the next wrong password is the first of a new count.
    assert fail(1) == [200]


def test_the_admin_sign_in_counts_and_is_locked_too(alice):
    """The admin's login form goes through the same counter and shows the same page."""
    admin_login = reverse("admin:login")
    for _ in range(LIMIT - 1):
        sign_in("alice", "wrong", path=admin_login)
    response, _ = sign_in("alice", "wrong")
    assert response.status_code == 429
    response, client = sign_in("alice", RIGHT, path=admin_login)
    assert response.status_code == 429
    assert "Too many failed sign-ins." in response.content.decode()
    assert not signed_in(client)


def unlock(*args: str) -> str:
    out = StringIO()
    call_command("unlock_login", *args, stdout=out)
    return out.getvalue()


def test_unlock_login_lists_the_locks_and_lifts_them_by_account_address_or_all(alice):
    fail(LIMIT, "alice", OTHER_ADDRESS)
    fail(LIMIT, "mallory", HOME_ADDRESS)
    assert unlock().splitlines() == [
        "locked: account alice for 15 more minute(s)",
        "locked: account mallory for 15 more minute(s)",
        # Soonest-ending first.
        f"locked: address {OTHER_ADDRESS} for 15 more minute(s)",
        f"locked: address {HOME_ADDRESS} for 15 more minute(s)",
    ]

    out = unlock("--user", "alice")
    assert out.splitlines()[0] == f"Forgot {LIMIT} failed sign-in(s) of alice."
    assert "account alice" not in out and f"address {OTHER_ADDRESS}" not in out
    response, client = sign_in("alice", RIGHT, address=OTHER_ADDRESS)
    assert response.status_code == 302 and signed_in(client)

    out = unlock("--ip", HOME_ADDRESS)
    assert out.splitlines() == [
        f"Forgot {LIMIT} failed sign-in(s) of {HOME_ADDRESS}.",
        "No sign-in is locked.",
    ]

    fail(LIMIT)
    assert unlock("--all").splitlines() == [
        f"Forgot {LIMIT} failed sign-in(s) of everyone.",
        "No sign-in is locked.",
    ]
    assert sign_in("alice", RIGHT)[0].status_code == 302


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ip", "not-an-address"], "--ip 'not-an-address' is not an IP address"),
        (["--all", "--user", "alice"], "--all already lifts every lock"),
    ],
)
def test_unlock_login_refuses_bad_options(args, message):
    with pytest.raises(CommandError, match=message):
        unlock(*args)


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        # No proxy trusted: the header is the client's own words and is ignored.
        (0, "192.0.2.1", "127.0.0.9"),
        # One proxy appends the address it saw; what the client wrote before it is ignored.
        (1, "192.0.2.1, 198.51.100.7", "198.51.100.7"),
        (1, "198.51.100.7", "198.51.100.7"),
        (2, "192.0.2.1, 198.51.100.7, 10.0.0.2", "198.51.100.7"),
        # Fewer entries than proxies: it did not come through them.
        (2, "198.51.100.7", "127.0.0.9"),
        (1, "", "127.0.0.9"),
        # Something that is not an address is not stored as one.
        (1, "unknown", "127.0.0.9"),
        (1, "2001:db8::7", "2001:db8::7"),
    ],
)
def test_the_client_address_behind_trusted_proxies(settings, proxies, forwarded, expected):
    settings.DISPATCH_TRUSTED_PROXIES = proxies
    request = RequestFactory().post(
        "/login/", REMOTE_ADDR="127.0.0.9", HTTP_X_FORWARDED_FOR=forwarded
    )
    assert throttle.client_ip(request) == expected


def test_behind_a_proxy_a_forged_header_does_not_escape_the_address_lock(settings, alice):
    settings.DISPATCH_TRUSTED_PROXIES = 1
    client = Client(REMOTE_ADDR="127.0.0.1")
    for i in range(LIMIT):
        client.post(
            reverse("login"),
            {"username": f"guess{i}", "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"192.0.2.{i}, {OTHER_ADDRESS}",
        )
    response = client.post(
        reverse("login"),
        {"username": "alice", "password": RIGHT},
        HTTP_X_FORWARDED_FOR=f"192.0.2.99, {OTHER_ADDRESS}",
    )
    assert response.status_code == 429
    # Another client behind the same proxy is not locked with it.
    response = client.post(
        reverse("login"),
        {"username": "alice", "password": RIGHT},
        HTTP_X_FORWARDED_FOR=HOME_ADDRESS,
    )
    assert response.status_code == 302


# --- Across processes ------------------------------------------------------------------


def http_sign_in(port: int, username: str, password: str) -> tuple[int, str]:
    """POST the sign-in form to a live server as a fresh browser: (status, body)."""
    csrf = secrets.token_hex(16)
    body = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": csrf}
    )
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT)
    try:
        conn.request(
            "POST",
            "/login/",
            body=body,
            headers={
                "Cookie": f"csrftoken={csrf}",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        response = conn.getresponse()
        return response.status, response.read().decode(errors="replace")
    finally:
        conn.close()


@pytest.mark.django_db(transaction=True)
async def test_a_lock_counted_by_the_server_is_seen_and_lifted_by_another_process(serve):  # noqa: F811
    """The served app (daphne, axes' async middleware) counts and locks; a separate
    `manage.py unlock_login` process lists that lock and lifts it; the server then
    lets the right password in."""
    # Hashed with the server's hasher: the test settings' fast MD5 is not one it accepts.
    hasher = PBKDF2PasswordHasher()
    hashed = hasher.encode(PASSWORD, hasher.salt())
    await User.objects.acreate(username="alice", password=hashed)
    server = await serve()

    statuses = [
        (await asyncio.to_thread(http_sign_in, server.port, "alice", "wrong"))[0]
        for _ in range(LIMIT)
    ]
    assert statuses == [200] * (LIMIT - 1) + [429]
    status, body = await asyncio.to_thread(http_sign_in, server.port, "alice", PASSWORD)
    assert status == 429 and "Try again in 15 minutes." in body

    env = server_env(serve.workspace)
    listed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "unlock_login"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert "locked: account alice for 15 more minute(s)" in listed.stdout, listed.stderr
    lifted = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "manage.py", "unlock_login", "--user", "alice", "--ip", "127.0.0.1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert lifted.returncode == 0, lifted.stderr
    assert "No sign-in is locked." in lifted.stdout

    status, _ = await asyncio.to_thread(http_sign_in, server.port, "alice", PASSWORD)
    assert status == 302
