"""The socket's user, read once from the session cookie when it connects.

Channels' AuthMiddlewareStack would do the same, but its session middleware
also wraps `send` to save a modified session after each message: a check on
every frame a socket sends, for sockets that never change their session. This
reads the session and the user at connect and passes `send` through untouched.
While the socket is open, chat.revocation checks that session (and the user's
password and state) again, and closes the socket when it has ended.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from channels.auth import get_user
from django.conf import settings
from django.http import parse_cookie


class SessionAuthMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.session_store = import_module(settings.SESSION_ENGINE).SessionStore

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        # Every Cookie header, joined as Django joins them for a page request
        # (an HTTP/2 front end may split the cookies over several).
        cookie = "; ".join(
            value.decode("latin1") for name, value in scope.get("headers", []) if name == b"cookie"
        )
        cookies = parse_cookie(cookie)
        session = self.session_store(cookies.get(settings.SESSION_COOKIE_NAME))
        scope = dict(scope, cookies=cookies, session=session)
        # The same check as a page request: a session whose password hash no
        # longer matches (password changed, logged out elsewhere) is anonymous.
        scope["user"] = await get_user(scope)
        return await self.inner(scope, receive, send)
