"""Every answer under /api/ is JSON, also where no API view runs: unknown routes, a tab
id that is not a UUID, methods a route does not take, a server error. Pages elsewhere
keep Django's HTML."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from chat import api
from chat.models import ApiToken

pytestmark = pytest.mark.django_db

TAB = "6f1c1a52-6c0a-4f4e-9d38-2f7f7f2b9a11"


@pytest.fixture
def client(db) -> Client:
    user = get_user_model().objects.create_user("alice", password="correct horse battery")
    token = ApiToken.issue(user, name="laptop")[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)


@pytest.mark.parametrize(
    ("method", "path", "status", "code", "message"),
    [
        ("get", "/api/v1/tabs/not-a-uuid", 404, "not_found", "'not-a-uuid' is not a tab id"),
        ("get", "/api/v1/tabs/123/chunks", 404, "not_found", "'123' is not a tab id"),
        ("post", "/api/v1/tabs/x/messages", 404, "not_found", "'x' is not a tab id"),
        ("get", "/api/v1/nothing", 404, "not_found", "No API route '/api/v1/nothing'"),
        ("get", "/api/v1/", 404, "not_found", "No API route '/api/v1/'"),
        ("get", "/api/v2/tabs", 404, "not_found", "No API route '/api/v2/tabs'"),
        ("get", f"/api/v1/tabs/{TAB}/", 404, "not_found", "No API route"),
        ("get", f"/api/v1/tabs/{TAB}/nope", 404, "not_found", "No API route"),
        ("get", f"/api/v1/tabs/{TAB}", 404, "not_found", f"No tab {TAB}"),
        ("delete", "/api/v1/tabs", 405, "method_not_allowed", "DELETE is not allowed here"),
        ("get", "/api/v1/tabs/import", 405, "method_not_allowed", "GET is not allowed here"),
        ("put", f"/api/v1/tabs/{TAB}/stop", 405, "method_not_allowed", "PUT is not allowed"),
    ],
)
def test_it_answers_json_for_bad_paths_and_methods(client, method, path, status, code, message):
    response = getattr(client, method)(path)
    assert response.status_code == status
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["error"]["code"] == code
    assert body["error"]["message"].startswith(message)


def test_it_answers_json_for_a_server_error(client, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api.search, "search", fail)
    response = client.get("/api/v1/search?q=x")
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "server_error"


def test_pages_keep_html_errors(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
