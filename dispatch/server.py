"""daphne's server with request bodies bounded as they arrive (`manage.py serve`).

daphne (through Twisted) stores a whole request body, in memory or a temporary file,
before the application sees the request, so dispatch.bodylimit's middleware alone would
refuse a 200 MB body only once it is stored. Here the same Budget runs on the bytes as
Twisted receives them: a body declared past its route's cap is refused once the headers
are in; a request whose body may be larger than a signed-out one may send stops being
read (TCP back-pressure) until its session or token is checked; a chunked body is
counted and cut at its cap. A refused request gets its answer at once, the rest of its
body is read and dropped for LINGER_SECONDS at most (so the client reads the answer
rather than a reset), and the connection is closed; the application never sees it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import unquote, urlsplit

import daphne.server  # first: it installs the asyncio reactor Twisted must use
from daphne.http_protocol import HTTPFactory, WebRequest
from twisted.internet import defer, reactor
from twisted.python.failure import Failure

from dispatch.bodylimit import Budget, Refusal, credential_refusal, not_signed_in

logger = logging.getLogger(__name__)

# How long a refused request's remaining body is read and dropped before the connection
# is closed: enough for a client to see the answer and stop sending; bounded so a client
# that never stops costs nothing after it.
LINGER_SECONDS = 2.0
STATUS_TEXTS = {401: b"Unauthorized", 413: b"Content Too Large", 429: b"Too Many Requests"}


class LimitedRequest(WebRequest):
    """daphne's request, its body kept within dispatch.bodylimit's Budget."""

    _budget: Budget | None = None
    _refused = False
    _checking = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Twisted parses a form body (multipart, urlencoded) into request.args, which
        # daphne never reads, before the application or any check sees it: a body of
        # empty parts would cost many times its size in memory and hold the event loop
        # for seconds.
        # Django parses what it needs, within its own limits.
        self._parsePOSTFormSubmission = False

    def gotLength(self, length: int | None) -> None:
        super().gotLength(length)
        path = unquote(urlsplit(self.channel._path.decode("latin1")).path)
        headers = [
            (name.lower(), value)
            for name, values in self.requestHeaders.getAllRawHeaders()
            for value in values
        ]
        self._budget = budget = Budget(path, headers)
        if refusal := budget.declared_refusal():
            self._refuse(refusal)
        elif budget.needs_sign_in():
            if budget.credentials:
                self._check(path, headers)
            elif refusal := budget.signed_in(not_signed_in(path)):
                self._refuse(refusal)  # nothing to check, and it says it is too large

    def _check(self, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        """Stop reading until the session or token is known to be valid (or not)."""
        self._checking = True
        self.transport.pauseProducing()
        peer = self.getClientAddress()
        scope: dict[str, Any] = {
            "type": "http",
            "method": self.channel._command.decode("latin1"),
            "path": path,
            "query_string": b"",
            "headers": headers,
            "client": (getattr(peer, "host", ""), getattr(peer, "port", 0)),
            "server": None,
        }
        future = asyncio.ensure_future(credential_refusal(scope))
        defer.Deferred.fromFuture(future).addBoth(self._checked)

    def _checked(self, result: Any) -> None:
        if not self._checking:
            return  # the whole body came first: the application checks it itself
        self._checking = False
        if self._refused or self._disconnected or self._budget is None:
            return
        if isinstance(result, Failure):
            # A database that cannot say: read on, and the application checks again.
            logger.warning("could not check a request's credentials: %s", result.value)
            self.transport.resumeProducing()
            return
        if refusal := self._budget.signed_in(result):
            self._refuse(refusal)
        else:
            self.transport.resumeProducing()

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        if self._budget is not None and (refusal := self._budget.count(len(data))):
            self._refuse(refusal)
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        if self._refused:
            return  # answered already; the application never sees it
        if self._checking:
            # The whole (small) body came before the check: the application checks it.
            self._checking = False
            self.transport.resumeProducing()
        super().requestReceived(command, path, version)

    def _refuse(self, refusal: Refusal) -> None:
        """Answer now, drop the rest of the body for a while, then close."""
        self._refused = True
        # Twisted would send "100 Continue" after this, inviting the body.
        self.requestHeaders.removeHeader(b"expect")
        status, headers, body = refusal.response(self._budget.path if self._budget else "")
        head = b"HTTP/1.1 %d %s\r\n" % (status, STATUS_TEXTS.get(status, b"Error"))
        head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        self.transport.write(head + b"\r\n" + body)
        self.transport.resumeProducing()
        # Twisted's interfaces declare their methods without `self`, and mypy, without the
        # zope plugin, takes the first parameter (the delay) for it.
        reactor.callLater(LINGER_SECONDS, self.transport.loseConnection)  # type: ignore[arg-type]


class LimitedHTTPFactory(HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = LimitedRequest
        return protocol


class Server(daphne.server.Server):
    """daphne's Server, its HTTP requests LimitedRequest. daphne makes its factory in
    run() with no hook for the request class: the factory it assigns is swapped here."""

    @property
    def http_factory(self) -> HTTPFactory:
        return self.__dict__["http_factory"]

    @http_factory.setter
    def http_factory(self, factory: HTTPFactory) -> None:
        self.__dict__["http_factory"] = LimitedHTTPFactory(self)
