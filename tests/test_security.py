"""The web surface: the socket's origin check, the Content-Security-Policy, cookies over TLS."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat import consumers, log, render
from chat.models import Chunk
from chat.preferences import new_tab
from dispatch.asgi import router
from harness.login import cookie_header, session_for
from tests.engine import make_tab
from tests.test_socket import refused
from tests.ui_helpers import block, parse, seed_every_type

ROOT = Path(__file__).resolve().parent.parent

SITE = "127.0.0.1:8000"


def _session_cookie(user) -> bytes:
    return cookie_header(session_for(user)).encode()


async def _handshake(origin: str | None, *, host: str = SITE, scheme: str = "ws", extra=()) -> bool:
    """Whether the real stack (origin check, session, auth, routing) accepts the owner's socket."""
    tab = await make_tab()
    owner = await database_sync_to_async(lambda: tab.owner)()
    cookie = await database_sync_to_async(_session_cookie)(owner)
    headers = [(b"host", host.encode()), (b"cookie", cookie), *extra]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    communicator = WebsocketCommunicator(router, f"/ws/tabs/{tab.pk}/", headers=headers)
    communicator.scope["scheme"] = scheme
    connected, _ = await communicator.connect()
    await communicator.disconnect()
    return connected


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("origin", "host", "accepted"),
    [
        ("http://127.0.0.1:8000", SITE, True),
        # The same host on another port is another site (another app, a dev server).
        ("http://127.0.0.1:9000", SITE, False),
        ("http://localhost:9000", "localhost:8000", False),
        # The same host and port over another scheme is another origin too.
        ("https://127.0.0.1:8000", SITE, False),
        # Default ports are the same origin whether written or not.
        ("http://localhost", "localhost:80", True),
        ("http://localhost:80", "localhost", True),
        ("HTTP://LOCALHOST:8000", "localhost:8000", True),
        # A host outside ALLOWED_HOSTS is refused even when the origin matches it.
        ("http://evil.example:8000", "evil.example:8000", False),
        ("http://evil.example", SITE, False),
        ("null", SITE, False),
        ("not a url", SITE, False),
        (None, SITE, False),
    ],
)
async def test_a_socket_is_accepted_only_from_the_sites_own_origin(origin, host, accepted):
    assert await _handshake(origin, host=host) is accepted


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_socket_over_tls_wants_an_https_origin():
    """wss is the https page's socket: the http origin of the same host and port is not it."""
    assert await _handshake("https://localhost", host="localhost", scheme="wss")
    assert not await _handshake("http://localhost:443", host="localhost", scheme="wss")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_behind_a_tls_proxy_the_forwarded_scheme_counts(settings):
    """The proxy speaks plain ws to daphne; its X-Forwarded-Proto says what the page used."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proto = (b"x-forwarded-proto", b"https")
    assert await _handshake("https://localhost", host="localhost", extra=[proto])
    assert not await _handshake("http://localhost", host="localhost", extra=[proto])
    # Without the setting the header is anyone's to send, and is ignored.
    settings.SECURE_PROXY_SSL_HEADER = None
    assert not await _handshake("https://localhost", host="localhost", extra=[proto])


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_csrf_trusted_origins_may_open_a_socket(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://chat.example.com", "https://*.corp.example"]
    assert await _handshake("https://chat.example.com")
    assert await _handshake("https://chat.example.com:443")
    assert await _handshake("https://a.corp.example")
    assert not await _handshake("https://chat.example.com:8443")
    assert not await _handshake("http://chat.example.com")
    assert not await _handshake("https://corp.example.evil")


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_user_without_a_session_is_still_refused_from_the_right_origin():
    """The origin check is in front of auth, not instead of it."""
    await database_sync_to_async(get_user_model().objects.create)(username="someone")
    tab = await make_tab()
    communicator = WebsocketCommunicator(
        router,
        f"/ws/tabs/{tab.pk}/",
        headers=[(b"host", SITE.encode()), (b"origin", f"http://{SITE}".encode())],
    )
    assert await refused(communicator) == consumers.CLOSE_SIGNED_OUT


# --- Content-Security-Policy ---------------------------------------------------------------


@pytest.fixture
def owner(db):
    return get_user_model().objects.create_user(
        "owner", password="correct horse battery", is_staff=True, is_superuser=True
    )


def _logged_in_pages(owner) -> list[str]:
    """A URL of every kind of page: a chat with every chunk type and a table, settings, admin."""
    tab = new_tab(owner, "offline/demo")
    seed_every_type(tab.id)
    log.append(tab.id, [block("text", {"text": "| a | b |\n|:-:|--:|\n| 1 | 2 |\n"})])
    chunk = Chunk.objects.filter(tab=tab).first()
    return [
        reverse("tab", args=[tab.id]),
        reverse("tab_delete", args=[tab.id]),
        reverse("settings"),
        reverse("api_tokens"),
        reverse("admin:index"),
        reverse("admin:chat_chunk_changelist"),
        reverse("admin:chat_chunk_change", args=[chunk.pk]),
    ]


def _directives(header: str) -> dict[str, list[str]]:
    return {name: values for name, *values in (part.split() for part in header.split(";"))}


class _Tags(HTMLParser):
    """Every start tag with its attributes, and whether each <script> has a body (lenient:
    the admin's markup is Django's, with self-closing tags)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline_scripts = 0
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.inline_scripts += 1


def _assert_no_inline_code(html: str, url: str) -> None:
    """Nothing the policy would block: inline scripts, handlers, style attributes, hx-on."""
    parser = _Tags()
    parser.feed(html)
    assert not parser.inline_scripts, f"{url}: inline script"
    for tag, attrs in parser.tags:
        if tag == "script":
            assert attrs.get("src"), f"{url}: inline script"
        for name in attrs:
            assert not name.startswith("on"), f"{url}: <{tag} {name}=...>"
            assert name != "style", f"{url}: <{tag} style=...>"
            assert not name.startswith(("hx-on", "data-hx-on")), f"{url}: <{tag} {name}>"


def test_every_page_carries_a_strict_policy_and_needs_nothing_it_forbids(owner):
    client = Client()
    anonymous = [reverse("login")]
    client.force_login(owner)
    for url in [*_logged_in_pages(owner), *anonymous]:
        if url in anonymous:
            client.logout()
        response = client.get(url)
        assert response.status_code == 200, url
        policy = _directives(response.headers["Content-Security-Policy"])
        assert policy["script-src"] == ["'self'"], url
        assert policy["connect-src"] == ["'self'"], url
        assert policy["frame-ancestors"] == ["'none'"], url
        assert policy["object-src"] == ["'none'"], url
        assert "'unsafe-inline'" not in " ".join(sum(policy.values(), [])), url
        _assert_no_inline_code(response.content.decode(), url)


@pytest.mark.django_db
def test_the_first_run_and_empty_home_pages_need_nothing_the_policy_forbids():
    client = Client()
    response = client.get(reverse("setup"))
    assert response.status_code == 200
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    _assert_no_inline_code(response.content.decode(), "setup")
    user = get_user_model().objects.create_user("someone", password="correct horse battery")
    client.force_login(user)
    response = client.get(reverse("home"))
    assert response.status_code == 200
    _assert_no_inline_code(response.content.decode(), "home")


def test_the_admins_inline_style_carries_the_policys_nonce(owner):
    client = Client()
    client.force_login(owner)
    tab = new_tab(owner, "offline/demo")
    log.append(tab.id, [block("text", {"text": "hi"})])
    chunk = Chunk.objects.get(tab=tab)
    response = client.get(reverse("admin:chat_chunk_change", args=[chunk.pk]))
    [nonce] = [
        v
        for v in _directives(response.headers["Content-Security-Policy"])["style-src"]
        if v.startswith("'nonce-")
    ]
    parser = _Tags()
    parser.feed(response.content.decode())
    styles = [attrs for tag, attrs in parser.tags if tag == "style"]
    assert styles and all(f"'nonce-{attrs.get('nonce')}'" == nonce for attrs in styles)


def test_a_markdown_tables_alignment_is_a_class_not_a_style_attribute(owner):
    html = str(render.markdown("| a | b |\n|:-:|--:|\n| 1 | 2 |\n"))
    cells = parse(html).find_all(lambda n: n.tag in ("th", "td"))
    assert [c.get("class") for c in cells] == ["align-center", "align-right"] * 2
    assert all(c.get("style") is None for c in cells)


# --- Cookies over TLS -------------------------------------------------------------------------


def _settings_in_a_fresh_process(tmp_path, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(DJANGO_SETTINGS_MODULE="dispatch.settings", DISPATCH_DATA_DIR=str(tmp_path), **env)
    code = (
        "from django.conf import settings as s; "
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER)"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    # The last line: `shell` may first say what it imported.
    return done.stdout.strip().splitlines()[-1].split(maxsplit=2)


def test_behind_a_tls_proxy_cookies_are_secure_and_the_forwarded_scheme_is_trusted(tmp_path):
    assert _settings_in_a_fresh_process(tmp_path, DISPATCH_BEHIND_TLS_PROXY="1") == [
        "True",
        "True",
        "('HTTP_X_FORWARDED_PROTO', 'https')",
    ]
    # Plain http (the default): a Secure cookie would never come back, and the
    # header is anyone's to send.
    assert _settings_in_a_fresh_process(tmp_path) == ["False", "False", "None"]


def test_a_bad_tls_proxy_value_stops_the_server_naming_it(tmp_path):
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(
        DJANGO_SETTINGS_MODULE="dispatch.settings",
        DISPATCH_DATA_DIR=str(tmp_path),
        DISPATCH_BEHIND_TLS_PROXY="maybe",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "DISPATCH_BEHIND_TLS_PROXY='maybe' is not a boolean" in done.stderr
