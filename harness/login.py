"""Logging a client in: one session per user, sent as the session cookie.

The session is made by Django's own `force_login` in this process, so it is valid for
every process on the same database and SECRET_KEY (a live server, the bench server).
The same key serves every kind of client:

    session = session_for(user)
    client.cookies[settings.SESSION_COOKIE_NAME] = session      # Django's test client
    websockets.connect(url, additional_headers={"Cookie": cookie_header(session)})
    await context.add_cookies([browser_cookie(session, server.url)])   # Playwright
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client


def session_for(user: Any) -> str:
    """The key of a new session logged in as `user`."""
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def session_for_new_user(username: str) -> str:
    """A new user named `username` (no usable password), and a session for it."""
    return session_for(get_user_model().objects.create_user(username))


def cookie_header(session: str) -> str:
    """The `Cookie` header value of a request (HTTP or WebSocket) in that session."""
    return f"{settings.SESSION_COOKIE_NAME}={session}"


def browser_cookie(session: str, url: str) -> dict[str, str]:
    """The cookie as Playwright's `BrowserContext.add_cookies` takes it, for `url`'s site."""
    return {"name": settings.SESSION_COOKIE_NAME, "value": session, "url": url}
