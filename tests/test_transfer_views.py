"""Export and import through the pages (tab menu, import page) and the JSON API."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from chat import log, transfer
from chat.models import ApiToken, Chunk, Tab
from tests.api_helpers import ApiClient
from tests.test_transfer import export_bytes, make_tab, request_json, rich_log

pytestmark = pytest.mark.django_db

User = get_user_model()
HUNDRED_MB = 100 * 1024 * 1024


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


@pytest.fixture
def web(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def token_for(user, *, read_only: bool = False) -> str:
    row, plain = ApiToken.issue(user, name="t", read_only=read_only)
    return plain


def streamed(response) -> bytes:
    """The body of a streamed response, read as daphne reads it: asynchronously."""
    assert response.is_async  # a sync iterator would be read whole under ASGI

    async def collect() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(collect)()


def counts() -> tuple[int, int]:
    return Tab.objects.count(), Chunk.objects.count()


# --- Pages -----------------------------------------------------------------------------


def test_the_tab_menu_offers_both_exports_and_the_sidebar_the_import(web, alice):
    tab = make_tab(alice, rich_log())
    page = web.get(reverse("tab", args=[tab.id])).content.decode()
    url = reverse("tab_export", args=[tab.id])
    assert f'href="{url}?format=jsonl"' in page and ">Export (JSONL)</a>" in page
    assert f'href="{url}?format=markdown"' in page and ">Export (Markdown)</a>" in page
    assert f'href="{reverse("tab_import")}"' in page


def test_jsonl_export_page_is_a_streamed_download(web, alice):
    tab = make_tab(alice, rich_log(), title="Files & more")
    response = web.get(reverse("tab_export", args=[tab.id]), {"format": "jsonl"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson; charset=utf-8"
    disposition = response["Content-Disposition"]
    assert disposition.startswith('attachment; filename="files-more-')
    assert disposition.endswith('.jsonl"')
    body = streamed(response)
    assert body.count(b"\n") == 1 + len(rich_log())
    assert json.loads(body.split(b"\n")[0])["title"] == "Files & more"


def test_markdown_export_page(web, alice):
    tab = make_tab(alice, rich_log())
    response = web.get(reverse("tab_export", args=[tab.id]), {"format": "markdown"})
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"].endswith('.md"')
    assert streamed(response).startswith(b"# Files\n")


def test_export_page_of_an_unknown_format_is_refused(web, alice):
    tab = make_tab(alice, [])
    response = web.get(reverse("tab_export", args=[tab.id]), {"format": "pdf"})
    assert response.status_code == 400
    assert response.content == b"Unknown export format 'pdf': use jsonl or markdown."


def test_another_users_tab_cannot_be_exported(web, bob):
    tab = make_tab(bob, rich_log())
    assert web.get(reverse("tab_export", args=[tab.id])).status_code == 404


def upload(data: bytes, name: str = "tab.jsonl") -> dict[str, Any]:
    return {"file": SimpleUploadedFile(name, data, content_type="application/x-ndjson")}


def test_import_page_makes_a_new_tab_and_opens_it(web, alice):
    original = make_tab(alice, rich_log())
    assert b'enctype="multipart/form-data"' in web.get(reverse("tab_import")).content
    response = web.post(reverse("tab_import"), upload(export_bytes(original)), follow=True)
    copy = Tab.objects.exclude(pk=original.pk).get()
    assert response.redirect_chain == [(reverse("tab", args=[copy.id]), 302)]
    assert copy.owner == alice
    assert "Imported tab.jsonl as a new tab." in response.content.decode()
    assert request_json(copy) == request_json(original)


def test_import_page_shows_a_bad_files_line_and_problem(web, alice):
    lines = export_bytes(make_tab(alice, rich_log())).split(b"\n")
    lines[4] = b"{oops"
    before = counts()
    response = web.post(reverse("tab_import"), upload(b"\n".join(lines)))
    assert response.status_code == 400
    assert (
        '<p class="error" id="import-error" role="alert">Not imported: line 5: not valid JSON: '
        in response.content.decode()
    )
    assert counts() == before


def test_import_page_without_a_file_says_what_to_send(web):
    response = web.post(reverse("tab_import"), {})
    assert response.status_code == 400
    assert "Choose a .jsonl file exported from Dispatch." in response.content.decode()


def test_import_page_refuses_a_100_mb_upload_without_reading_it(web):
    """Content-Length says 100 MB and the body is a few bytes: reading it would fail."""
    before = counts()
    response = web.post(
        reverse("tab_import"),
        upload(b"{}"),
        CONTENT_LENGTH=str(HUNDRED_MB),
    )
    assert response.status_code == 413
    assert (
        "Not imported: the file is larger than the import limit of 64 MB."
        in response.content.decode()
    )
    assert counts() == before


def test_import_page_refuses_a_file_past_the_limit_that_did_not_say_so(web, alice, monkeypatch):
    data = export_bytes(make_tab(alice, rich_log()))
    monkeypatch.setattr(transfer, "IMPORT_MAX_BYTES", len(data) - 1)
    before = counts()
    response = web.post(reverse("tab_import"), upload(data))
    assert response.status_code == 413
    assert "larger than the import limit" in response.content.decode()
    assert counts() == before


def test_import_page_checks_csrf(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    data = export_bytes(make_tab(alice, []))
    before = counts()
    assert client.post(reverse("tab_import"), upload(data)).status_code == 403
    assert counts() == before


def test_import_page_needs_a_signed_in_user():
    response = Client().post(reverse("tab_import"), upload(b"{}"))
    assert response.status_code == 302 and "/login/" in response["Location"]


# --- API -------------------------------------------------------------------------------


def test_api_export_and_import_round_trip(alice):
    original = make_tab(alice, rich_log())
    api = ApiClient(token=token_for(alice))
    response = api.get(f"/api/v1/tabs/{original.id}/export", {"format": "jsonl"})
    assert response.status_code == 200
    data = streamed(response)
    response = api.post("/api/v1/tabs/import", raw=data, content_type="application/x-ndjson")
    assert response.status_code == 201
    copy = Tab.objects.get(pk=response.json()["id"])
    assert copy.owner == alice and copy.pk != original.pk
    assert response.json()["total"] == len(rich_log())
    assert request_json(copy) == request_json(original)


def test_api_markdown_export(alice):
    tab = make_tab(alice, rich_log())
    response = ApiClient(token=token_for(alice)).get(
        f"/api/v1/tabs/{tab.id}/export", {"format": "markdown"}
    )
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert b"<details><summary>Thinking</summary>" in streamed(response)


def test_api_export_of_an_unknown_format_or_another_users_tab(alice, bob):
    api = ApiClient(token=token_for(alice))
    mine, theirs = make_tab(alice, []), make_tab(bob, [])
    response = api.get(f"/api/v1/tabs/{mine.id}/export", {"format": "pdf"})
    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "invalid_parameter",
        "message": "?format= must be jsonl or markdown, not 'pdf'.",
    }
    assert api.get(f"/api/v1/tabs/{theirs.id}/export").status_code == 404


def test_api_import_of_a_bad_file_is_422_with_the_line(alice):
    lines = export_bytes(make_tab(alice, rich_log())).split(b"\n")
    lines[2] = lines[2].replace(b'"seq":2', b'"seq":5')
    before = counts()
    response = ApiClient(token=token_for(alice)).post(
        "/api/v1/tabs/import", raw=b"\n".join(lines), content_type="application/x-ndjson"
    )
    assert response.status_code == 422
    assert response.json()["error"] == {
        "code": "invalid_import",
        "message": "Not imported: line 3: seq 5 where 2 was expected: seqs must run 1, 2, 3, "
        "… with no gap or repeat.",
    }
    assert counts() == before


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "Not imported: line 1: the file is empty"),
        (b"\xff\xfe{}", "Not imported: line 1: not UTF-8 text (byte 0xff at column 1)."),
    ],
)
def test_api_import_of_an_empty_or_non_utf8_body(alice, body, message):
    response = ApiClient(token=token_for(alice)).post(
        "/api/v1/tabs/import", raw=body, content_type="application/x-ndjson"
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith(message)


def test_api_import_refuses_100_mb_by_content_length_without_reading(alice):
    before = counts()
    response = ApiClient(token=token_for(alice)).post(
        "/api/v1/tabs/import",
        raw=b"{}",
        content_type="application/x-ndjson",
        CONTENT_LENGTH=str(HUNDRED_MB),
    )
    assert response.status_code == 413
    assert response.json()["error"] == {
        "code": "import_too_large",
        "message": "Not imported: the file is larger than the import limit of 64 MB.",
    }
    assert counts() == before


def test_api_import_refuses_a_body_past_the_limit_that_did_not_say_so(alice, monkeypatch):
    data = export_bytes(make_tab(alice, rich_log()))
    monkeypatch.setattr(transfer, "IMPORT_MAX_BYTES", len(data) // 2)
    response = ApiClient(token=token_for(alice)).post(
        "/api/v1/tabs/import", raw=data, content_type="application/x-ndjson"
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "import_too_large"


def test_api_import_refuses_a_form_body(alice):
    response = ApiClient(token=token_for(alice)).post(
        "/api/v1/tabs/import", raw=b"a=b", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unsupported_body"


def test_api_import_is_a_write_a_read_only_token_cannot_do(alice):
    data = export_bytes(make_tab(alice, []))
    before = counts()
    response = ApiClient(token=token_for(alice, read_only=True)).post(
        "/api/v1/tabs/import", raw=data, content_type="application/x-ndjson"
    )
    assert response.status_code == 403
    assert counts() == before


def test_api_import_with_a_session_needs_the_csrf_token(alice):
    data = export_bytes(make_tab(alice, []))
    response = ApiClient(user=alice, csrf=True).post(
        "/api/v1/tabs/import", raw=data, content_type="application/x-ndjson"
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "csrf_failed"


def test_api_imported_tab_pages_like_any_other(alice):
    original = make_tab(alice, rich_log())
    api = ApiClient(token=token_for(alice))
    response = api.post(
        "/api/v1/tabs/import", raw=export_bytes(original), content_type="application/x-ndjson"
    )
    copy_id = response.json()["id"]
    assert log.count(copy_id) == len(rich_log())
    chunks = api.get(f"/api/v1/tabs/{copy_id}/chunks").json()["chunks"]
    assert [c["seq"] for c in chunks] == list(range(1, len(rich_log()) + 1))
