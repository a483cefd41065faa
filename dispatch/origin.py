"""The WebSocket origin check: only pages of this very site may open a socket.

A browser sends cookies with a WebSocket handshake whatever page opens it, so
a socket must check who asks (cross-site WebSocket hijacking). Channels'
`AllowedHostsOriginValidator` compares the Origin's host with ALLOWED_HOSTS
only: a page on another port of the same host (another app, a dev server) was
let in. This check is the one Django's CSRF middleware makes for a form post:
the Origin must be the site's own origin — scheme, host and port of the
request itself, its host in ALLOWED_HOSTS — or one of CSRF_TRUSTED_ORIGINS.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import SplitResult, urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 80, "https": 443}


def _normal(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) origin, the port made explicit; None if it is not one."""
    try:
        parts: SplitResult = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def _header(headers: dict[bytes, bytes], name: str) -> str | None:
    value = headers.get(name.encode())
    return value.decode("latin1") if value is not None else None


def _scheme(scope: dict[str, Any], headers: dict[bytes, bytes]) -> str:
    """The http scheme the page was served with: as Django's `request.is_secure()` sees it."""
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, secure_value = proxy
        # "HTTP_X_FORWARDED_PROTO" -> "x-forwarded-proto", as WSGI spells headers.
        value = _header(headers, name.removeprefix("HTTP_").lower().replace("_", "-"))
        if value is not None:
            return "https" if value.split(",", 1)[0].strip() == secure_value else "http"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def _host(headers: dict[bytes, bytes]) -> str | None:
    if getattr(settings, "USE_X_FORWARDED_HOST", False):
        forwarded = _header(headers, "x-forwarded-host")
        if forwarded:
            return forwarded.split(",", 1)[0].strip()
    return _header(headers, "host")


def origin_allowed(scope: dict[str, Any]) -> bool:
    headers = dict(scope.get("headers") or [])
    origin_header = _header(headers, "origin")
    origin = _normal(origin_header) if origin_header else None
    if origin is None:
        # Browsers always send one on a WebSocket; "null" (a sandboxed or file
        # page) and garbage are nobody this site trusts.
        return False
    scheme = _scheme(scope, headers)
    host = _host(headers)
    if host:
        domain, _port = split_domain_port(host)
        own = domain and validate_host(domain, settings.ALLOWED_HOSTS)
        if own and _normal(f"{scheme}://{host}") == origin:
            return True
    return any(_trusted(entry, origin) for entry in settings.CSRF_TRUSTED_ORIGINS)


def _trusted(entry: str, origin: tuple[str, str, int]) -> bool:
    scheme, _, netloc = entry.partition("://")
    if not netloc.startswith("*"):
        return _normal(entry) == origin
    # "https://*.example.com": any subdomain, on the same scheme and port (as Django's CSRF).
    host, _, port = netloc[1:].partition(":")
    try:
        port_number = int(port) if port else DEFAULT_PORTS.get(scheme)
    except ValueError:
        return False
    return (origin[0], origin[2]) == (scheme, port_number) and is_same_domain(
        origin[1], host.lower()
    )


class SameOriginValidator:
    """ASGI middleware for WebSocket scopes: refuses the handshake of a foreign page."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            headers = dict(scope.get("headers") or [])
            logger.warning(
                "refused a WebSocket from origin %r (host %r)",
                _header(headers, "origin"),
                _header(headers, "host"),
            )
            return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)
