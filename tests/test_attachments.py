"""Attachments end to end (issue 17; ARCHITECTURE.md, Attachments): the composer's upload
endpoint, the message form, owner-checked blob serving, the request shapes each provider
gets (against the fake servers, through the official SDKs), the fallback for a model that
cannot take a file, a tool's image, `manage.py send --attach`, the API's multipart send, and
the blobs going with their tabs (delete, wipe_history)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import uuid
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client
from PIL import Image

from chat import blobs, history, log, transfer, turns
from chat.models import ApiToken, Attachment, Blob, Chunk, QueuedMessage, Tab
from chat.providers import anthropic as wire
from chat.providers.anthropic import AnthropicProvider
from chat.providers.base import (
    DocumentPart,
    ImagePart,
    Message,
    Request,
    TextPart,
    ToolResultPart,
)
from chat.providers.common import MAX_DOCUMENT_TEXT_CHARS, Files
from chat.providers.openai import OpenAIProvider
from chat.providers.registry import model_info
from chat.stream import Block
from chat.tools.workdir import user_workspace
from harness.fakeprovider import Reply, collect, openai_text
from tests import attachment_files as files
from tests.anthropic_wire import MODEL, reply, settled, text, tool_use, use_anthropic
from tests.api_helpers import validate
from tests.engine import Watcher, chunks, make_tab, owner_workspace, running_worker


@pytest.fixture(autouse=True)
def data_dir(tmp_path, settings):
    """Each test's own data directory: blob files outlive a test's rolled-back rows."""
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


PDF_PAGES = ["Error: disk full on /var", "Traceback (most recent call last)"]


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def bob(db):
    return get_user_model().objects.create_user("bob", password="pw")


def client_for(user, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def upload(name: str, data: bytes, content_type: str = "application/octet-stream"):
    return SimpleUploadedFile(name, data, content_type=content_type)


def stored_files(settings) -> list[Path]:
    root = Path(settings.DATA_DIR) / "blobs"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def attach_url(tab: Tab) -> str:
    return f"/t/{tab.pk}/attachments/"


# --- The upload endpoint ------------------------------------------------------------------


def test_an_upload_answers_one_tray_item_per_file(alice):
    tab = Tab.objects.create(owner=alice)
    png, pdf = files.image(), files.pdf(PDF_PAGES)
    response = client_for(alice).post(
        attach_url(tab), {"file": [upload("shot.png", png), upload("report.pdf", pdf)]}
    )
    assert response.status_code == 200
    html = response.content.decode()
    values = re.findall(r'name="attachment" value="([^"]+)"', html)
    shas = [v.split(":")[0] for v in values]
    assert [v.split(":", 1)[1] for v in values] == ["shot.png", "report.pdf"]
    assert f"/blob/{shas[0]}/thumb/" in html
    assert set(Blob.objects.values_list("pk", flat=True)) == set(shas)
    rows = Attachment.objects.filter(tab=tab)
    assert sorted(rows.values_list("name", "sent")) == [("report.pdf", False), ("shot.png", False)]
    assert "base64" not in html and len(html) < 4000


BAD_UPLOADS = [
    pytest.param("empty.png", b"", "empty.png is empty (0 bytes).", id="zero-byte"),
    pytest.param("photo.jpg", files.image(), "photo.jpg is a PNG image", id="name-mismatch"),
    pytest.param("bomb.png", files.png_header(100_000, 100_000), "more pixels", id="bomb"),
    pytest.param("broken.pdf", b"%PDF-1.4\nnonsense", "not a readable PDF", id="corrupt-pdf"),
    pytest.param("logo.svg", b"<svg onload='alert(1)'/>", "is an SVG image", id="svg"),
]


@pytest.mark.parametrize(("name", "data", "message"), BAD_UPLOADS)
def test_a_bad_upload_is_refused_in_one_line_and_nothing_is_stored(
    alice, settings, name, data, message
):
    tab = Tab.objects.create(owner=alice)
    good = upload("fine.png", files.image())
    response = client_for(alice).post(attach_url(tab), {"file": [good, upload(name, data)]})
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    assert message in body and "\n" not in body
    # The good file sent with it is not kept either: all or nothing.
    assert not Blob.objects.exists() and not Attachment.objects.exists()
    assert stored_files(settings) == []


def test_too_many_files_are_refused(alice):
    tab = Tab.objects.create(owner=alice)
    many = [upload(f"{i}.png", files.image(size=(8, 8))) for i in range(blobs.MAX_FILES + 1)]
    response = client_for(alice).post(attach_url(tab), {"file": many})
    assert response.status_code == 400
    assert response.content.decode() == (
        f"{blobs.MAX_FILES + 1} files at once; the most one message may carry is {blobs.MAX_FILES}."
    )
    assert not Blob.objects.exists()


def test_a_file_over_the_size_cap_is_refused_unread(alice, monkeypatch):
    monkeypatch.setattr(blobs, "MAX_UPLOAD_BYTES", 1000)
    monkeypatch.setattr(blobs, "normalise", _never)
    tab = Tab.objects.create(owner=alice)
    response = client_for(alice).post(attach_url(tab), {"file": upload("big.png", files.image())})
    assert response.status_code == 400
    assert "big.png is" in response.content.decode()
    assert "the most a file may be is 1 KB" in response.content.decode()
    assert not Blob.objects.exists()


def _never(*args):
    raise AssertionError("read a file past the cap")


def test_a_request_declaring_too_much_is_refused_unread(alice):
    tab = Tab.objects.create(owner=alice)
    response = client_for(alice).post(
        attach_url(tab),
        {"file": upload("a.png", files.image())},
        CONTENT_LENGTH=str(blobs.MAX_REQUEST_BYTES + 1),
    )
    assert response.status_code == 400
    assert response.content.decode().startswith("Too much at once")
    assert not Blob.objects.exists()


def test_no_file_is_refused(alice):
    tab = Tab.objects.create(owner=alice)
    response = client_for(alice).post(attach_url(tab), {})
    assert (response.status_code, response.content) == (400, b"Choose a file to attach.")


def test_a_path_as_a_file_name_keeps_only_the_name(alice):
    """Django's upload parser keeps only a file name's last part; the stored name is
    never a path (and chat.blobs refuses one outright: test_blobs)."""
    tab = Tab.objects.create(owner=alice)
    response = client_for(alice).post(
        attach_url(tab), {"file": upload("../../etc/shot.png", files.image())}
    )
    assert response.status_code == 200
    assert Attachment.objects.get().name == "shot.png"


def test_an_upload_to_another_users_tab_is_refused(alice, bob, settings):
    tab = Tab.objects.create(owner=alice)
    response = client_for(bob).post(attach_url(tab), {"file": upload("a.png", files.image())})
    assert response.status_code == 404
    assert not Blob.objects.exists() and stored_files(settings) == []


def test_an_upload_needs_the_csrf_token(alice):
    tab = Tab.objects.create(owner=alice)
    client = client_for(alice, csrf=True)
    response = client.post(attach_url(tab), {"file": upload("a.png", files.image())})
    assert response.status_code == 403
    assert not Blob.objects.exists()


# --- Sending ------------------------------------------------------------------------------


def uploaded(tab: Tab, data: bytes, name: str) -> str:
    """The composer's value for a file uploaded to `tab`."""
    return blobs.add_uploads(tab.pk, [blobs.normalise(data, name)])[0]


def test_a_message_carries_references_to_its_files(alice):
    tab = Tab.objects.create(owner=alice)
    value = uploaded(tab, files.image(), "shot.png")
    response = client_for(alice).post(
        f"/t/{tab.pk}/send/",
        {"text": "what is this?", "attachment": [value]},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    queued = QueuedMessage.objects.get()
    blob = Blob.objects.get()
    assert queued.attachments == [
        {
            "sha256": blob.sha256,
            "name": "shot.png",
            "mime": "image/png",
            "size": blob.size,
            "width": 1280,
            "height": 720,
        }
    ]
    assert Attachment.objects.get().sent


def test_a_message_of_files_only_is_sent_and_names_the_tab(alice):
    tab = Tab.objects.create(owner=alice)
    value = uploaded(tab, files.pdf(PDF_PAGES), "report.pdf")
    response = client_for(alice).post(f"/t/{tab.pk}/send/", {"text": "", "attachment": [value]})
    assert response.status_code == 302
    assert QueuedMessage.objects.get().attachments[0]["pages"] == 2
    tab.refresh_from_db()
    assert tab.title == "report.pdf"


def test_a_message_with_neither_text_nor_files_is_refused(alice):
    tab = Tab.objects.create(owner=alice)
    response = client_for(alice).post(f"/t/{tab.pk}/send/", {"text": " "}, HTTP_HX_REQUEST="true")
    assert response.status_code == 422
    assert "The message is empty." in response.content.decode()


def test_another_users_file_cannot_be_sent(alice, bob):
    """bob knows the hash of alice's upload: his message is refused, and nothing of it is
    queued; alice's blob stays hers only."""
    alices = Tab.objects.create(owner=alice)
    value = uploaded(alices, files.image(), "secret.png")
    bobs = Tab.objects.create(owner=bob)
    response = client_for(bob).post(
        f"/t/{bobs.pk}/send/", {"text": "look", "attachment": [value]}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 422
    assert "no longer stored (or is not yours)" in response.content.decode()
    assert not QueuedMessage.objects.exists()
    assert not Attachment.objects.filter(tab=bobs).exists()


@pytest.mark.parametrize(
    "value",
    ["nothex:x.png", "a" * 64, "../../etc/passwd"],
)
def test_a_made_up_attachment_value_is_refused(alice, value):
    tab = Tab.objects.create(owner=alice)
    with pytest.raises(blobs.AttachmentError):
        turns.submit(tab, "hi", attachments=[value])
    assert not QueuedMessage.objects.exists()


def test_more_files_than_a_message_may_carry_are_refused(alice):
    tab = Tab.objects.create(owner=alice)
    values = [uploaded(tab, files.image(size=(8 + i, 8)), f"{i}.png") for i in range(11)]
    with pytest.raises(blobs.AttachmentError, match="11 files attached; the most one message"):
        turns.submit(tab, "hi", attachments=values)
    assert not QueuedMessage.objects.exists()


def test_a_changed_name_keeps_the_stored_types_extension(alice):
    tab = Tab.objects.create(owner=alice)
    sha = uploaded(tab, files.image(), "a.png").split(":")[0]
    queued = turns.submit(tab, "hi", attachments=[f"{sha}:evil.html"])
    assert queued.attachments[0]["name"] == "evil.html.png"


# --- Serving ------------------------------------------------------------------------------


def test_an_image_is_served_inline_to_its_owner_only(alice, bob):
    tab = Tab.objects.create(owner=alice)
    sha = uploaded(tab, files.image(), "shot.png").split(":")[0]
    response = client_for(alice).get(f"/blob/{sha}/")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"] == 'inline; filename="shot.png"'
    assert "sandbox" in response["Content-Security-Policy"]
    assert response.content == blobs.read(sha)
    assert client_for(bob).get(f"/blob/{sha}/").status_code == 404
    assert client_for(bob).get(f"/blob/{sha}/thumb/").status_code == 404
    assert Client().get(f"/blob/{sha}/").status_code == 302  # to the sign-in page


def test_a_thumbnail_is_small(alice):
    tab = Tab.objects.create(owner=alice)
    sha = uploaded(tab, files.image(size=(1280, 720)), "shot.png").split(":")[0]
    response = client_for(alice).get(f"/blob/{sha}/thumb/")
    assert response.status_code == 200 and response["Content-Type"] == "image/png"
    assert Image.open(io.BytesIO(response.content)).size == (320, 180)
    assert len(response.content) < len(blobs.read(sha))


def test_a_pdf_is_a_download_under_its_name(alice):
    tab = Tab.objects.create(owner=alice)
    sha = uploaded(tab, files.pdf(PDF_PAGES), "rapport d'été.pdf").split(":")[0]
    response = client_for(alice).get(f"/blob/{sha}/")
    assert response["Content-Type"] == "application/pdf"
    assert response["Content-Disposition"].startswith("attachment;")
    assert "filename*=utf-8''rapport%20d%27%C3%A9t%C3%A9.pdf" in response["Content-Disposition"]
    assert client_for(alice).get(f"/blob/{sha}/thumb/").status_code == 404


def test_an_svg_is_never_served_inline(alice, settings):
    """None is ever stored (normalise refuses it), but a blob row saying SVG (an edited
    database, a later format) still goes out as a download, never as a page."""
    tab = Tab.objects.create(owner=alice)
    svg = b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>"
    sha = hashlib.sha256(svg).hexdigest()
    blob = Blob.objects.create(sha256=sha, mime="image/svg+xml", size=len(svg), width=1, height=1)
    blobs._write(blobs.path_of(sha), svg)
    blobs.attach(tab.pk, blob, "logo.svg", sent=True)
    response = client_for(alice).get(f"/blob/{sha}/")
    assert response["Content-Disposition"].startswith("attachment;")
    assert response["X-Content-Type-Options"] == "nosniff"
    assert client_for(alice).get(f"/blob/{sha}/thumb/").status_code == 404


def test_a_branch_keeps_its_files_when_its_parent_is_deleted(alice):
    tab = Tab.objects.create(owner=alice, model="offline/demo")
    value = uploaded(tab, files.image(), "shot.png")
    sha = value.split(":")[0]
    queued = turns.submit(tab, "look", attachments=[value])
    block = Block(
        uuid.uuid4(), None, 0, "user", "text", {"text": "look", "attachments": queued.attachments}
    )
    log.append(tab.pk, [block])
    QueuedMessage.objects.all().delete()
    child = turns.branch(tab, 1).tab
    client_for(alice).post(f"/t/{tab.pk}/delete/")
    assert not Tab.objects.filter(pk=tab.pk).exists()
    assert client_for(alice).get(f"/blob/{sha}/").status_code == 200
    client_for(alice).post(f"/t/{child.pk}/delete/")
    assert blobs.read(sha) is None and not Blob.objects.exists()


def test_deleting_a_tab_removes_the_files_no_other_tab_uses(alice, settings):
    tab, other = Tab.objects.create(owner=alice), Tab.objects.create(owner=alice)
    own = uploaded(tab, files.image(size=(50, 50)), "own.png").split(":")[0]
    shared = uploaded(tab, files.image(size=(60, 60)), "shared.png").split(":")[0]
    uploaded(other, files.image(size=(60, 60)), "shared.png")
    client_for(alice).post(f"/t/{tab.pk}/delete/")
    assert blobs.read(own) is None and blobs.read(shared) is not None
    assert [p.name for p in stored_files(settings)] == [shared]


def test_wipe_history_counts_the_files_then_removes_them(alice, settings):
    tab = Tab.objects.create(owner=alice)
    values = [uploaded(tab, files.image(size=(40 + i, 40)), f"{i}.png") for i in range(3)]
    total = sum(Blob.objects.values_list("size", flat=True))
    out = io.StringIO()
    call_command("wipe_history", "--dry-run", stdout=out)
    assert (
        f"attachment files: 3, {total} B" in out.getvalue()
        or "attachment files: 3," in out.getvalue()
    )
    assert len(stored_files(settings)) == 3
    out = io.StringIO()
    call_command("wipe_history", "--yes", stdout=out)
    assert "attachment files: 3" in out.getvalue()
    assert not Blob.objects.exists() and stored_files(settings) == []
    assert all(blobs.read(v.split(":")[0]) is None for v in values)


# --- Request shapes (the official SDKs against the fake servers) ----------------------------


def stored(data: bytes, name: str) -> dict:
    n = blobs.normalise(data, name)
    blobs.store(n)
    return n.ref()


def user_chunk(*refs: dict, text: str = "What went wrong?") -> Block:
    return Block(
        uuid.uuid4(), None, 0, "user", "text", {"text": text, "attachments": list(refs)}, seq=1
    )


def request_of(*chunks: Block) -> Request:
    return Request("", (), history.build(chunks), blobs=blobs.READER)


async def sent(server, provider, request: Request) -> dict:
    await collect(provider.stream(request))
    return server.last.json


def anthropic(server, model: str = MODEL) -> AnthropicProvider:
    return AnthropicProvider(model_info(model), api_key="k", base_url=server.url)


def openai(server, model: str = "openai/gpt-4.1") -> OpenAIProvider:
    return OpenAIProvider(model_info(model), api_key="k", base_url=server.openai_url)


def b64(ref: dict) -> str:
    return base64.b64encode(blobs.read(ref["sha256"])).decode()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_anthropic_gets_image_and_document_blocks_before_the_text(fake_server):
    png = await database_sync_to_async(stored)(files.image(), "shot.png")
    pdf = await database_sync_to_async(stored)(files.pdf(PDF_PAGES), "report.pdf")
    fake_server.add(reply(text("A full disk.")))
    body = await sent(fake_server, anthropic(fake_server), request_of(user_chunk(png, pdf)))
    content = body["messages"][0]["content"]
    assert content[0] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": b64(png)},
    }
    assert content[1] == {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": b64(pdf)},
        "title": "report.pdf",
    }
    assert content[2]["text"] == "What went wrong?"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_openai_gets_image_url_parts_and_a_pdfs_text(fake_server):
    png = await database_sync_to_async(stored)(files.image(), "shot.png")
    pdf = await database_sync_to_async(stored)(files.pdf(PDF_PAGES), "report.pdf")
    fake_server.add(Reply(events=openai_text(["A full disk."])))
    body = await sent(fake_server, openai(fake_server), request_of(user_chunk(png, pdf)))
    content = body["messages"][0]["content"]
    assert content[0] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{b64(png)}"},
    }
    # GPT-4.1 is listed without PDF support: the PDF's text instead, and where it is.
    path = f"uploads/{pdf['sha256'][:12]}/report.pdf"
    assert content[1] == {
        "type": "text",
        "text": f"[document report.pdf, 2 pages, saved in the workspace at {path}; its text, "
        f"extracted with pypdf, follows]\n{PDF_PAGES[0]}\n\n{PDF_PAGES[1]}",
    }
    assert content[2] == {"type": "text", "text": "What went wrong?"}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_model_that_cannot_see_gets_a_line_of_text_instead(fake_server):
    """DeepSeek Chat reads text only: the image is a line saying what and where it is,
    and the message stays plain text (no parts a text-only server would refuse)."""
    png = await database_sync_to_async(stored)(files.image(), "screenshot.png")
    fake_server.add(Reply(events=openai_text(["I cannot see it."])))
    provider = openai(fake_server, "deepseek/deepseek-chat")
    body = await sent(fake_server, provider, request_of(user_chunk(png)))
    path = f"uploads/{png['sha256'][:12]}/screenshot.png"
    assert body["messages"][0]["content"] == (
        f"[image screenshot.png, 1280×720, saved in the workspace at {path}]\n\nWhat went wrong?"
    )
    assert "base64" not in json.dumps(body)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_tools_image_goes_with_its_result(fake_server):
    png = await database_sync_to_async(stored)(files.image(), "chart.png")
    ref = {**png, "path": "out/chart.png"}
    chunks_ = [
        Block(None, None, 0, "user", "text", {"text": "Draw it."}, seq=1),
        Block(
            None,
            "t",
            1,
            "assistant",
            "tool_call",
            {"call_id": "c1", "name": "read_file", "arguments": {"path": "out/chart.png"}},
            seq=2,
        ),
        Block(
            None,
            "t",
            1,
            "tool",
            "tool_result",
            {
                "call_id": "c1",
                "name": "read_file",
                "result": "out/chart.png: an image",
                "is_error": False,
                "attachments": [ref],
            },
            seq=3,
        ),
    ]
    fake_server.add(reply(text("A chart.")))
    body = await sent(fake_server, anthropic(fake_server), request_of(*chunks_))
    result = body["messages"][2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["content"][0] == {"type": "text", "text": "out/chart.png: an image"}
    assert result["content"][1]["source"]["data"] == b64(png)

    fake_server.add(Reply(events=openai_text(["A chart."])))
    body = await sent(fake_server, openai(fake_server), request_of(*chunks_))
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["user", "assistant", "tool", "user"]
    assert body["messages"][2]["content"] == "out/chart.png: an image"
    assert body["messages"][3]["content"][0]["image_url"]["url"].endswith(b64(png))

    fake_server.add(Reply(events=openai_text(["?"])))
    body = await sent(
        fake_server, openai(fake_server, "deepseek/deepseek-chat"), request_of(*chunks_)
    )
    assert body["messages"][3]["content"] == (
        "[image chart.png, 1280×720, saved in the workspace at out/chart.png]"
    )


def test_the_same_request_twice_is_the_same_bytes(alice):
    """Re-sent in every step, or stored again: the image block is byte for byte the same."""
    raw = files.photo((1600, 1200))
    first = wire.build_params(request_of(user_chunk(stored(raw, "photo.jpg"))), model_info(MODEL))
    again = wire.build_params(request_of(user_chunk(stored(raw, "photo.jpg"))), model_info(MODEL))
    assert json.dumps(first) == json.dumps(again)


def test_what_each_model_takes():
    assert (model_info(MODEL).images, model_info(MODEL).pdf) == (True, True)
    assert (
        model_info("anthropic/claude-new-7").images,
        model_info("anthropic/claude-new-7").pdf,
    ) == (True, True)
    assert (model_info("openai/gpt-4.1").images, model_info("openai/gpt-4.1").pdf) == (True, False)
    assert model_info("openai/gpt-5-unknown").images
    assert not model_info("deepseek/deepseek-chat").images
    assert not model_info("offline/demo").images


IMAGE = ImagePart("a" * 64, "shot.png", "image/png", 640, 480, "uploads/aaaaaaaaaaaa/shot.png")
DOC = DocumentPart("b" * 64, "r.pdf", "application/pdf", 1000, 1, "uploads/bbbbbbbbbbbb/r.pdf")


class Reader:
    def __init__(self, data: dict[str, bytes], text: dict[str, str]) -> None:
        self._data, self._text = data, text

    def data(self, sha256):
        return self._data.get(sha256)

    def text(self, sha256):
        return self._text.get(sha256)


@pytest.mark.parametrize(
    ("model", "part", "reader", "expected"),
    [
        (
            MODEL,
            IMAGE,
            Reader({}, {}),
            "[image shot.png, 640×480: no longer stored, so it cannot be shown]",
        ),
        (
            MODEL,
            DOC,
            Reader({}, {}),
            "[document r.pdf, 1 page: no longer stored, so it cannot be shown]",
        ),
        (
            "offline/demo",
            IMAGE,
            Reader({"a" * 64: b"x"}, {}),
            "[image shot.png, 640×480, saved in the workspace at uploads/aaaaaaaaaaaa/shot.png]",
        ),
        (
            "offline/demo",
            DOC,
            Reader({}, {"b" * 64: "  "}),
            "[document r.pdf, 1 page, saved in the workspace at uploads/bbbbbbbbbbbb/r.pdf; it has "
            "no text layer (a scan?): read it with the tools]",
        ),
        (
            "offline/demo",
            DOC,
            Reader({}, {}),
            "[document r.pdf, 1 page, saved in the workspace at uploads/bbbbbbbbbbbb/r.pdf]",
        ),
    ],
)
def test_what_a_model_gets_instead_of_a_file(model, part, reader, expected):
    files_ = Files(model_info(model), reader)
    assert files_.encoded(part) is None
    assert files_.instead(part) == expected


def test_a_long_pdf_text_is_cut_and_says_so():
    long = "x" * (MAX_DOCUMENT_TEXT_CHARS + 5)
    out = Files(model_info("offline/demo"), Reader({}, {"b" * 64: long})).instead(DOC)
    assert out.startswith(
        f"[document r.pdf, 1 page, saved in the workspace at uploads/bbbbbbbbbbbb/r.pdf; the "
        f"first {MAX_DOCUMENT_TEXT_CHARS:,} of its {len(long):,} characters"
    )
    assert out.endswith("]\n" + "x" * MAX_DOCUMENT_TEXT_CHARS)


def test_history_turns_references_into_parts_and_skips_what_is_not_one():
    good = {
        "sha256": "c" * 64,
        "name": "a.png",
        "mime": "image/png",
        "size": 5,
        "width": 2,
        "height": 3,
    }
    junk = [
        {"sha256": "../x", "mime": "image/png"},
        "text",
        {"sha256": "d" * 64, "mime": "text/html"},
    ]
    messages = history.build([user_chunk(good, *junk, text="")])
    assert messages == [
        Message(
            "user", (ImagePart("c" * 64, "a.png", "image/png", 2, 3, f"uploads/{'c' * 12}/a.png"),)
        )
    ]
    with_text = history.build([user_chunk(good, text="hi")])
    assert with_text[0].parts[1] == TextPart("hi")
    tool = ToolResultPart("c1", "read_file", "r", False, ())
    assert tool.images == ()


# --- A real turn: the runner, the official SDK, the fake server ------------------------------


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path / "workspace")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_turn_sends_the_image_and_puts_it_in_the_workspace(
    fake_server, monkeypatch, workspace
):
    """The message's image goes to the model as an image block; the user chunk holds a
    reference, never the bytes; the file is in the workspace for the tools. A tool reading
    a PNG of the workspace gets it stored the same way and shown with its result."""
    use_anthropic(monkeypatch, fake_server)
    (workspace / "chart.png").write_bytes(files.image("PNG", (300, 200)))
    tab = await make_tab(MODEL)
    value = await database_sync_to_async(uploaded)(tab, files.image(), "shot.png")
    fake_server.add(
        reply(tool_use("c1", "read_file", path="chart.png"), stop="tool_use"),
        reply(text("Both seen.")),
    )
    async with running_worker(), Watcher(tab.pk) as watcher:
        await database_sync_to_async(turns.submit)(tab, "Compare.", attachments=[value])
        await watcher.until_idle()
    await settled(tab.pk)
    rows = await chunks(tab.pk)
    user = rows[0].data
    sha = value.split(":")[0]
    assert user["attachments"][0]["sha256"] == sha and "data" not in user["attachments"][0]
    first = fake_server.requests[0].json["messages"][0]["content"]
    assert (
        first[0]["type"] == "image"
        and first[0]["source"]["data"] == base64.b64encode(blobs.read(sha)).decode()
    )
    assert (workspace / "uploads" / sha[:12] / "shot.png").read_bytes() == blobs.read(sha)
    result = next(c for c in rows if c.type == "tool_result")
    ref = result.data["attachments"][0]
    assert (ref["path"], ref["mime"], ref["width"], ref["height"]) == (
        "chart.png",
        "image/png",
        300,
        200,
    )
    second = fake_server.requests[1].json["messages"]
    block = second[-1]["content"][0]
    assert block["type"] == "tool_result"
    assert (
        block["content"][1]["source"]["data"]
        == base64.b64encode(blobs.read(ref["sha256"])).decode()
    )
    assert await Attachment.objects.filter(tab=tab, blob_id=ref["sha256"], sent=True).aexists()
    # Both requests carry the message's image with the same bytes (the cached prefix).
    assert second[0] == fake_server.requests[0].json["messages"][0] | {
        "content": second[0]["content"]
    }
    assert second[0]["content"][0] == first[0]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_tools_image_that_is_refused_is_an_error_result(
    fake_server, monkeypatch, workspace
):
    use_anthropic(monkeypatch, fake_server)
    (workspace / "anim.gif").write_bytes(files.animated("GIF"))
    tab = await make_tab(MODEL)
    fake_server.add(
        reply(tool_use("c1", "read_file", path="anim.gif"), stop="tool_use"),
        reply(text("Sorry.")),
    )
    async with running_worker(), Watcher(tab.pk) as watcher:
        await database_sync_to_async(turns.submit)(tab, "Look at anim.gif")
        await watcher.until_idle()
    await settled(tab.pk)
    result = next(c for c in await chunks(tab.pk) if c.type == "tool_result")
    assert result.data["is_error"] and "anim.gif is animated" in result.data["result"]
    assert "attachments" not in result.data
    assert not await Blob.objects.aexists()


# --- manage.py send --attach, the API -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_send_attach_sends_the_files(alice, workspace, tmp_path):
    root = get_user_model().objects.create_superuser("root", password="pw")
    shot = tmp_path / "shot.png"
    shot.write_bytes(files.image())
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "send", "--new", "--model", "offline/demo", "--attach", str(shot), stdout=out, stderr=err
    )
    user = Chunk.objects.filter(role="user").get()
    ref = user.data["attachments"][0]
    assert (user.data["text"], ref["name"], ref["mime"]) == ("", "shot.png", "image/png")
    assert (user_workspace(root.pk) / "uploads" / ref["sha256"][:12] / "shot.png").exists()
    assert Tab.objects.get().title == "shot.png"


@pytest.mark.django_db(transaction=True)
def test_send_attach_refuses_a_bad_file_before_making_a_tab(alice, tmp_path):
    get_user_model().objects.create_superuser("root", password="pw")
    svg = tmp_path / "logo.svg"
    svg.write_bytes(b"<svg/>")
    with pytest.raises(CommandError, match="logo.svg is an SVG image"):
        call_command("send", "--new", "--attach", str(svg), "look")
    with pytest.raises(CommandError, match="cannot read .*missing.png"):
        call_command("send", "--new", "--attach", str(tmp_path / "missing.png"), "look")
    assert not Tab.objects.exists() and not Blob.objects.exists()


def test_the_api_sends_a_multipart_message(alice):
    tab = Tab.objects.create(owner=alice)
    _, token = ApiToken.issue(alice)
    client = Client()
    auth = {"Authorization": f"Bearer {token}"}
    response = client.post(
        f"/api/v1/tabs/{tab.pk}/messages",
        {"text": "see", "file": [upload("shot.png", files.image())]},
        headers=auth,
    )
    validate(response.wsgi_request, response)
    assert response.status_code == 202
    assert QueuedMessage.objects.get().attachments[0]["name"] == "shot.png"

    bad = client.post(
        f"/api/v1/tabs/{tab.pk}/messages",
        {"text": "see", "file": [upload("a.png", files.image()), upload("x.svg", b"<svg/>")]},
        headers=auth,
    )
    validate(bad.wsgi_request, bad)
    assert bad.status_code == 422
    assert bad.json()["error"]["code"] == "invalid_file"
    assert "x.svg is an SVG image" in bad.json()["error"]["message"]
    assert Blob.objects.count() == 1 and QueuedMessage.objects.count() == 1


# --- Export and import ------------------------------------------------------------------------


def _with_a_file(owner) -> tuple[Tab, str]:
    tab = Tab.objects.create(owner=owner, model="offline/demo", title="shots")
    value = uploaded(tab, files.image(), "shot.png")
    queued = turns.submit(tab, "look", attachments=[value])
    data = {"text": "look", "attachments": queued.attachments}
    log.append(tab.pk, [Block(uuid.uuid4(), uuid.uuid4(), 0, "user", "text", data)])
    QueuedMessage.objects.all().delete()
    return tab, value.split(":")[0]


def test_an_export_imported_again_by_its_owner_keeps_its_files(alice):
    tab, sha = _with_a_file(alice)
    exported = "".join(transfer.export_jsonl(tab)).encode()
    assert b"base64" not in exported
    copy = transfer.import_jsonl(alice, io.BytesIO(exported))
    assert Chunk.objects.get(tab=copy).data["attachments"][0]["sha256"] == sha
    tab.delete()
    blobs.collect()
    assert client_for(alice).get(f"/blob/{sha}/").status_code == 200


def test_a_hash_in_an_imported_file_gives_no_access_to_the_blob(alice, bob):
    tab, sha = _with_a_file(alice)
    exported = "".join(transfer.export_jsonl(tab)).encode()
    copy = transfer.import_jsonl(bob, io.BytesIO(exported))
    assert not Attachment.objects.filter(tab=copy).exists()
    assert client_for(bob).get(f"/blob/{sha}/").status_code == 404


def _exported_with_refs(tab: Tab, refs: list[dict]) -> bytes:
    """`tab`'s export with its message's file references replaced by `refs`."""
    head, line = "".join(transfer.export_jsonl(tab)).splitlines()
    chunk = json.loads(line)
    chunk["data"]["attachments"] = refs
    return f"{head}\n{json.dumps(chunk)}\n".encode()


def test_an_imported_reference_to_a_blob_the_importer_lacks_names_the_file_only(alice, bob):
    tab, sha = _with_a_file(alice)
    alices = Chunk.objects.get(tab=tab).data["attachments"][0]
    made_up = {**alices, "sha256": "e" * 64, "name": "other.png"}
    odd = {**alices, "sha256": ["not", "a", "hash"], "name": "odd.png"}
    exported = _exported_with_refs(tab, [alices, made_up, odd])
    copy = transfer.import_jsonl(bob, io.BytesIO(exported))
    data = Chunk.objects.get(tab=copy).data
    assert [ref.get("sha256") for ref in data["attachments"]] == [None, None, None]
    assert [ref["name"] for ref in data["attachments"]] == ["shot.png", "other.png", "odd.png"]
    assert data["text"] == (
        "[image shot.png: not available (the tab was imported without it), so it cannot be "
        "shown]\n[image other.png: not available (the tab was imported without it), so it "
        "cannot be shown]\n[image odd.png: not available (the tab was imported without it), "
        "so it cannot be shown]\n\nlook"
    )
    messages = history.build(Chunk.objects.filter(tab=copy).order_by("seq"))
    assert not [p for m in messages for p in m.parts if isinstance(p, ImagePart)]
    # Alice's own import of the same file keeps her file and drops only the others.
    mine = Chunk.objects.get(tab=transfer.import_jsonl(alice, io.BytesIO(exported))).data
    assert [ref.get("sha256") for ref in mine["attachments"]] == [sha, None, None]
    assert mine["text"].startswith("[image other.png: not available")
