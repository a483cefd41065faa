"""Attachments on the page (issue 17; ARCHITECTURE.md, Attachments): a user message's files
under its text (thumbnails that open the image, chips that download the rest), the composer
tray's markup (chat/_attachment.html), and the Markdown export's list of names. A page
carries references to blobs, never their bytes; an SVG is never shown; a name is text."""

from __future__ import annotations

import base64
import uuid

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.template.loader import render_to_string
from django.test import Client

from chat import blobs, log, render, transfer
from chat.models import Tab
from tests import attachment_files as files
from tests.ui_helpers import block, parse, top

pytestmark = pytest.mark.django_db

PNG = {
    "sha256": "a" * 64,
    "name": "screenshot.png",
    "mime": "image/png",
    "size": 48_213,
    "width": 1280,
    "height": 720,
}
PDF = {"sha256": "b" * 64, "name": "report.pdf", "mime": "application/pdf", "size": 2_400_000}
SVG = {
    "sha256": "c" * 64,
    "name": "logo.svg",
    "mime": "image/svg+xml",
    "size": 900,
    "width": 64,
    "height": 64,
}
HOSTILE_NAME = '"><img src=x onerror=alert(1)><script>alert(2)</script>.png'


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def client_alice(alice):
    client = Client()
    client.force_login(alice)
    return client


def user_message(text: str, attachments: list[dict]) -> object:
    return block(
        "text", {"text": text, "attachments": attachments}, role="user", turn_id=uuid.uuid4()
    )


def tab_page(client: Client, owner, *messages) -> object:
    """The tab page after these user messages, parsed; the chunks' elements in order."""
    tab = Tab.objects.create(owner=owner, model="offline/demo")
    log.append(tab.id, list(messages))
    response = client.get(f"/t/{tab.id}/")
    assert response.status_code == 200
    html = response.content.decode()
    tree = parse(html)
    return html, [n for n in tree.iter() if "chunk" in n.classes]


def test_a_messages_images_are_thumbnails_that_open_the_image_and_files_are_downloads(
    alice, client_alice
):
    _, [chunk] = tab_page(client_alice, alice, user_message("What is wrong here?", [PNG, PDF]))
    body = [n for n in chunk.children if n.tag != "template"]
    assert [n.tag for n in body[:2]] == ["div", "div"]
    assert body[0].classes == {"md"} and "What is wrong here?" in body[0].text
    atts = body[1]
    assert atts.classes == {"atts"}
    image, download = atts.children
    assert image.attrs == {
        "class": "att-img",
        "href": f"/blob/{'a' * 64}/",
        "target": "_blank",
        "rel": "noopener",
        "title": "screenshot.png · 47.1\xa0KB",
    }
    # 1280 x 720 shown 160 px wide: the box is known before the thumbnail loads.
    [img] = image.children
    assert img.attrs == {
        "src": f"/blob/{'a' * 64}/thumb/",
        "alt": "screenshot.png",
        "width": "160",
        "height": "90",
        "loading": "lazy",
    }
    assert download.get("href") == f"/blob/{'b' * 64}/"
    assert download.get("download") == "report.pdf"
    assert not download.find_all(lambda n: n.tag == "img")
    assert [n.text for n in download.children if n.tag == "span"] == ["report.pdf", "2.3\xa0MB"]


def test_a_message_of_files_alone_shows_them_and_offers_nothing_to_copy(alice, client_alice):
    _, [chunk] = tab_page(client_alice, alice, user_message("", [PDF]))
    md, atts = [n for n in chunk.children if n.tag == "div"][:2]
    assert md.text == "" and atts.classes == {"atts"}
    assert not chunk.find_all(lambda n: n.get("data-copy"))


def test_an_svg_is_never_shown_as_an_image_only_offered_as_a_download(alice, client_alice):
    html, [chunk] = tab_page(client_alice, alice, user_message("logo", [SVG]))
    assert not chunk.find_all(lambda n: n.tag == "img")
    [chip] = chunk.find_all(lambda n: "att-file" in n.classes)
    assert chip.get("download") == "logo.svg" and chip.get("target") is None
    assert f"/blob/{'c' * 64}/thumb/" not in html


def test_a_file_name_is_text_wherever_it_shows(alice, client_alice):
    png = {**PNG, "name": HOSTILE_NAME}
    pdf = {**PDF, "name": HOSTILE_NAME}
    _, [chunk] = tab_page(client_alice, alice, user_message("", [png, pdf]))
    [img] = chunk.find_all(lambda n: n.tag == "img")
    assert img.get("alt") == HOSTILE_NAME
    assert set(img.attrs) == {"src", "alt", "width", "height", "loading"}
    assert not chunk.find_all(lambda n: n.tag == "script")
    [chip] = chunk.find_all(lambda n: "att-file" in n.classes)
    assert chip.get("download") == HOSTILE_NAME
    assert chip.children[1].text == HOSTILE_NAME


def uploaded(client: Client, tab: Tab, name: str, data: bytes) -> str:
    """The tray's `attachment` value for a file uploaded through the composer's endpoint."""
    response = client.post(f"/t/{tab.id}/attachments/", {"file": SimpleUploadedFile(name, data)})
    assert response.status_code == 200, response.content
    [field] = parse(response.content.decode()).find_all(lambda n: n.get("name") == "attachment")
    return field.get("value")


def test_a_page_carries_references_never_bytes(alice, client_alice):
    """The same message with a tiny image and with a photo of megabytes: the pages
    differ by the few characters of the reference (type, pixel size, byte size)."""
    sent = {"tiny.png": files.image(size=(8, 8)), "photo.jpg": files.photo()}
    tabs = {name: Tab.objects.create(owner=alice, model="offline/demo") for name in sent}
    stored, pages = {}, {}
    for name, tab in tabs.items():
        [ref] = blobs.refs(alice.pk, [uploaded(client_alice, tab, name, sent[name])])
        log.append(tab.id, [user_message("look", [ref])])
        stored[name] = blobs.read(ref["sha256"])
    for name, tab in tabs.items():
        html = client_alice.get(f"/t/{tab.id}/").content.decode()
        assert base64.b64encode(stored[name])[100:200].decode() not in html
        assert ";base64," not in html
        for other in tabs.values():
            html = html.replace(str(other.id), "")
        pages[name] = len(html)
    assert len(stored["photo.jpg"]) > 100 * len(stored["tiny.png"])
    assert abs(pages["photo.jpg"] - pages["tiny.png"]) < 100


def test_fifty_image_messages_make_a_page_of_links(alice, client_alice):
    def message(n: int) -> object:
        return user_message("look", [{**PNG, "sha256": f"{n:064x}"}])

    one, _ = tab_page(client_alice, alice, message(1))
    html, chunks = tab_page(client_alice, alice, *(message(n) for n in range(1, 51)))
    assert len(chunks) == 50
    # One message's markup, thumbnail, link and actions included.
    assert (len(html) - len(one)) / 49 < 2000


@pytest.mark.parametrize(
    "entry",
    [
        {**PNG, "sha256": "../../etc/passwd"},
        {**PNG, "sha256": "A" * 64},
        {**PNG, "sha256": None},
        "screenshot.png",
        None,
    ],
)
def test_an_entry_without_a_blob_address_is_left_out(entry):
    item = render.present(user_message("hi", [entry, PDF]))
    assert [a.name for a in item.attachments] == ["report.pdf"]


def test_sizes_that_are_not_positive_integers_show_no_thumbnail_box():
    odd = {**PNG, "width": True, "height": -3, "size": "big"}
    [attachment] = render.present(user_message("hi", [odd])).attachments
    assert not attachment.image and attachment.size == 0


def test_only_a_users_message_carries_files():
    item = render.present(block("text", {"text": "x", "attachments": [PNG]}))
    assert item.attachments == []


def test_a_message_sealed_live_shows_its_files_as_the_page_does():
    message = user_message("hi", [PNG, PDF])
    [wrapper] = top(render.fragment_seal(message))
    [chunk] = wrapper.children
    assert [n.classes for n in chunk.children if n.tag == "div"] == [{"md"}, {"atts"}]


def tray(a: dict) -> object:
    [el] = parse(render_to_string("chat/_attachment.html", {"a": a}).strip()).children
    return el


def test_the_tray_shows_an_images_thumbnail_and_carries_the_file_for_the_message_form():
    el = tray(PNG)
    assert el.classes == {"att"}
    [img] = el.find_all(lambda n: n.tag == "img")
    assert img.get("src") == f"/blob/{'a' * 64}/thumb/"
    [field] = el.find_all(lambda n: n.tag == "input")
    assert field.attrs == {
        "type": "hidden",
        "name": "attachment",
        "value": f"{'a' * 64}:screenshot.png",
    }
    assert el.find_all(lambda n: "att-remove" in n.classes)


@pytest.mark.parametrize("a", [PDF, SVG], ids=["pdf", "svg"])
def test_the_tray_shows_other_files_with_an_icon(a):
    el = tray(a)
    assert not el.find_all(lambda n: n.tag == "img")
    assert el.find_all(lambda n: "file-icon" in n.classes)


def test_the_tray_escapes_a_name():
    el = tray({**PNG, "name": HOSTILE_NAME})
    assert not el.find_all(lambda n: n.tag == "script")
    assert [n.tag for n in el.iter()].count("img") == 1
    [name] = el.find_all(lambda n: "att-name" in n.classes)
    assert name.text == HOSTILE_NAME
    [field] = el.find_all(lambda n: n.tag == "input")
    assert field.get("value") == f"{'a' * 64}:{HOSTILE_NAME}"


def test_the_markdown_export_lists_a_messages_files_by_name():
    with_text = transfer.markdown_chunk(user_message("Why?", [PNG, {**PDF, "name": "a`b.pdf"}]))
    assert with_text == "Why?\n\n- Attached: `screenshot.png`\n- Attached: ``a`b.pdf``\n\n"
    alone = transfer.markdown_chunk(user_message("", [PDF]))
    assert alone == "- Attached: `report.pdf`\n\n"
    assert transfer.markdown_chunk(user_message("Plain", [])) == "Plain\n\n"


def test_a_queued_message_of_files_alone_says_so():
    [item] = parse(render.fragment_queued(1, "")).find_all(lambda n: n.tag == "li")
    assert item.children[0].text == "Files only"


# --- A tool result's images (read_file's, an MCP tool's) ------------------------------------


def tool_result(attachments: list[dict], turn_id: uuid.UUID) -> object:
    data = {"call_id": "c1", "name": "mcp__web__shot", "result": "(2 images)", "is_error": False}
    return block("tool_result", {**data, "attachments": attachments}, role="tool", turn_id=turn_id)


def test_a_tool_results_images_are_thumbnails_in_its_card_that_open_the_image(alice, client_alice):
    turn = uuid.uuid4()
    call = block("tool_call", {"call_id": "c1", "name": "mcp__web__shot", "arguments": {}})
    call.turn_id = turn
    second = {**PNG, "sha256": "d" * 64, "name": HOSTILE_NAME, "width": 300, "height": 600}
    html, chunks_ = tab_page(client_alice, alice, call, tool_result([PNG, second], turn))
    card, result = chunks_
    assert result in card.find_all(lambda n: True)  # in its call's card, not on its own
    [atts] = [n for n in result.children if n.tag == "div" and "atts" in n.classes]
    links = atts.children
    assert [(a.get("href"), a.get("target"), a.get("class")) for a in links] == [
        (f"/blob/{'a' * 64}/", "_blank", "att-img"),
        (f"/blob/{'d' * 64}/", "_blank", "att-img"),
    ]
    assert [(i.get("src"), i.get("width"), i.get("height")) for a in links for i in a.children] == [
        (f"/blob/{'a' * 64}/thumb/", "160", "90"),
        (f"/blob/{'d' * 64}/thumb/", "80", "160"),
    ]
    assert "<script>alert(2)" not in html


def test_a_tool_result_sealed_live_shows_its_images_as_the_page_does():
    [wrapper] = top(render.fragment_seal(tool_result([PNG], uuid.uuid4())))
    [chunk] = wrapper.children
    [link] = [a for a in chunk.iter() if "att-img" in a.classes]
    assert link.get("href") == f"/blob/{'a' * 64}/"
    assert [i.get("src") for i in link.children] == [f"/blob/{'a' * 64}/thumb/"]
