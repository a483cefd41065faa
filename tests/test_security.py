"""The web surface: the socket's origin check, the Content-Security-Policy, cookies over TLS."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client

from dispatch.asgi import router
from tests.engine import make_tab

SITE = "127.0.0.1:8000"


def _session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


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
    connected, _ = await communicator.connect()
    await communicator.disconnect()
    assert not connected
