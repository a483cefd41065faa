"""Test support for the JSON API: a client whose every response is checked against
openapi.yaml, so the spec cannot drift from the code.

Use it in any API test:

    from tests.api_helpers import ApiClient

    def test_it_lists_tabs(db):
        api = ApiClient(token=plain_token)       # or ApiClient(user=user) for a session
        response = api.get("/api/v1/tabs")       # validated before it is returned
        assert response.status_code == 200

`api.post(path, {"text": "hi"})` sends JSON; `api.post(path, raw=b"...")` sends bytes
as they are (for malformed bodies). A response the spec does not describe (an
undeclared status, a missing field, an extra one) fails the test with
openapi-core's reason. Requests are *not* validated: bad-input tests send what the
spec forbids on purpose.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.test import Client
from openapi_core import OpenAPI
from openapi_core.contrib.django import DjangoOpenAPIRequest, DjangoOpenAPIResponse

SPEC_PATH = Path(__file__).resolve().parent.parent / "openapi.yaml"


@cache
def spec() -> OpenAPI:
    return OpenAPI.from_file_path(str(SPEC_PATH))


class _Request(DjangoOpenAPIRequest):
    """openapi-core's Django request, without the body: the API reads the body as a
    stream, after which Django refuses `request.body`, and validating a response
    does not need it."""

    @property
    def body(self) -> bytes:
        return b""


class _Response(DjangoOpenAPIResponse):
    """Streamed responses (SSE, exports) are validated by status and headers only:
    reading the stream here would consume (or, for events, never end) it."""

    @property
    def data(self) -> bytes:
        if getattr(self.response, "streaming", False):
            # Not empty: openapi-core refuses a response without data outright.
            return b"(streamed)"
        return super().data


def validate(request: HttpRequest, response: HttpResponse) -> None:
    """Raise openapi-core's error when `response` is not what openapi.yaml says."""
    spec().validate_response(_Request(request), _Response(response))


class ApiClient:
    """Django's test client, authenticated by a token or a session, validating every
    response against openapi.yaml."""

    def __init__(
        self,
        *,
        token: str | None = None,
        user: Any = None,
        csrf: bool = False,
        address: str = "127.0.0.1",
    ) -> None:
        # csrf=True checks CSRF as for a browser (session tests); `address` is the
        # client's, which token throttling counts by.
        self.client = Client(enforce_csrf_checks=csrf, REMOTE_ADDR=address)
        self.headers: dict[str, str] = {}
        if token is not None:
            self.headers["Authorization"] = f"Bearer {token}"
        if user is not None:
            self.client.force_login(user)

    def _checked(self, response: HttpResponse) -> HttpResponse:
        validate(response.wsgi_request, response)
        return response

    def get(self, path: str, params: dict[str, Any] | None = None, **headers: str) -> HttpResponse:
        return self._checked(
            self.client.get(path, params or {}, headers={**self.headers, **headers})
        )

    def post(
        self,
        path: str,
        data: Any = None,
        *,
        raw: bytes | None = None,
        content_type: str = "application/json",
        **headers: str,
    ) -> HttpResponse:
        body = raw if raw is not None else (b"" if data is None else json.dumps(data).encode())
        return self._checked(
            self.client.post(
                path, body, content_type=content_type, headers={**self.headers, **headers}
            )
        )

    def request(self, method: str, path: str, **headers: str) -> HttpResponse:
        return self._checked(self.client.generic(method, path, headers={**self.headers, **headers}))
