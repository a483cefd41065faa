"""Attachments' bytes (chat.blobs; ARCHITECTURE.md, Attachments): normalisation (the real
type sniffed, the metadata gone, pixels and bytes bounded, the same bytes for the same
file), every refusal with its sentence, and storage (content-addressed, idempotent,
collected when unused)."""

from __future__ import annotations

import hashlib
import io
import zlib
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from chat import blobs
from chat.models import Attachment, Blob, Tab
from tests import attachment_files as files


@pytest.fixture(autouse=True)
def data_dir(tmp_path, settings):
    """Each test's own data directory: blob files outlive a test's rolled-back rows."""
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


def opened(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


# --- Normalisation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "name"),
    [
        (files.image("PNG"), "screenshot.png"),
        (files.photo((2000, 1500)), "IMG_0001.JPG"),
        (files.image("HEIF"), "IMG_0002.heic"),
        (files.image("WEBP"), "shot.webp"),
        (files.image("GIF"), "still.gif"),
        (files.pdf(["page one"]), "report.pdf"),
    ],
)
def test_the_same_file_always_gives_the_same_bytes(data, name):
    first, second = blobs.normalise(data, name), blobs.normalise(bytes(data), name)
    assert first.data == second.data
    assert first.sha256 == second.sha256 == hashlib.sha256(first.data).hexdigest()
    assert first.ref() == second.ref()


def test_a_stored_png_normalises_to_itself():
    once = blobs.normalise(files.image("PNG", (800, 600)), "a.png")
    assert blobs.normalise(once.data, "a.png").data == once.data


def test_a_photo_is_bounded_upright_and_without_metadata():
    """A 12 MP phone photo held sideways (EXIF orientation 6), with GPS, a camera model
    and a colour profile: stored upright, within the pixel and byte bounds, with none
    of its metadata."""
    raw = files.photo((4000, 3000), orientation=6)
    n = blobs.normalise(raw, "IMG_0003.jpg")
    assert (n.mime, n.name) == ("image/jpeg", "IMG_0003.jpg")
    assert n.height > n.width  # turned upright: 3000 wide, 4000 high
    assert max(n.width, n.height) <= blobs.MAX_EDGE
    assert n.width * n.height <= blobs.MAX_PIXELS
    assert len(n.data) <= blobs.MAX_IMAGE_BYTES < len(raw)
    im = opened(n.data)
    assert im.size == (n.width, n.height)
    assert not im.getexif()
    assert "icc_profile" not in im.info and "exif" not in im.info
    assert b"Secret Camera" not in n.data and b"Secret Camera" in raw


def test_a_sideways_photo_is_turned_not_squeezed():
    """Orientation 6 (the camera held upright, the sensor sideways): what was the left of
    the stored pixels is the top of the picture."""
    im = Image.new("RGB", (400, 200), (255, 0, 0))
    im.paste((0, 0, 255), (200, 0, 400, 200))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    im.save(out, "JPEG", exif=exif.tobytes(), quality=95)
    upright = opened(blobs.normalise(out.getvalue(), "side.jpg").data)
    assert upright.size == (200, 400)
    red, blue = upright.getpixel((100, 50)), upright.getpixel((100, 350))
    assert red[0] > 200 and red[2] < 60
    assert blue[2] > 200 and blue[0] < 60


def test_a_small_image_keeps_its_size_and_loses_its_text_chunks():
    raw = files.image("PNG", (640, 480), pnginfo=_pnginfo(Comment="from my laptop"))
    n = blobs.normalise(raw, "small.png")
    assert (n.width, n.height) == (640, 480)
    assert b"from my laptop" in raw and b"from my laptop" not in n.data


def _pnginfo(**text: str) -> PngInfo:
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    return info


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        ((1280, 720), (1280, 720)),  # within both bounds
        ((1568, 600), (1568, 600)),  # at the edge bound
        ((3136, 1200), (1568, 600)),  # edge-bound: halved
        ((2000, 2000), (1095, 1095)),  # pixel-bound: sqrt(1.2 MP)
        ((100, 10_000), (15, 1568)),  # a tall strip
        ((1, 1), (1, 1)),
    ],
)
def test_bounded(size, expected):
    assert blobs.bounded(*size) == expected


def test_an_image_too_heavy_after_scaling_is_scaled_down_until_it_fits(monkeypatch):
    monkeypatch.setattr(blobs, "MAX_IMAGE_BYTES", 30_000)
    n = blobs.normalise(files.photo((1200, 900)), "noisy.jpg")
    assert len(n.data) <= 30_000
    assert n.width < 1200 and opened(n.data).size == (n.width, n.height)


@pytest.mark.parametrize(
    ("data", "name", "stored"),
    [
        (files.image("GIF"), "still.gif", ("image/png", "still.png")),
        (files.image("HEIF"), "IMG_1.HEIC", ("image/jpeg", "IMG_1.jpg")),
        (files.image("WEBP"), "w.webp", ("image/jpeg", "w.jpg")),
        (files.image("WEBP", mode="RGBA"), "alpha.webp", ("image/png", "alpha.png")),
        (files.image("PNG", mode="RGBA"), "alpha.png", ("image/png", "alpha.png")),
        (files.image("JPEG"), "no extension", ("image/jpeg", "no extension.jpg")),
        (files.image("PNG"), "Screenshot 12.03", ("image/png", "Screenshot 12.03.png")),
        (files.image("JPEG"), "photo.JPEG", ("image/jpeg", "photo.JPEG")),
    ],
)
def test_what_each_format_is_stored_as(data, name, stored):
    n = blobs.normalise(data, name)
    assert (n.mime, n.name) == stored
    assert opened(n.data).format == {"image/png": "PNG", "image/jpeg": "JPEG"}[n.mime]


def test_a_png_with_unused_transparency_is_stored_without_it():
    n = blobs.normalise(files.image("PNG", mode="RGBA", size=(64, 64)), "opaque.png")
    # The drawing's half-transparent rectangle uses it:
    assert opened(n.data).mode == "RGBA"
    opaque = Image.new("RGBA", (64, 64), (1, 2, 3, 255))
    out = io.BytesIO()
    opaque.save(out, "PNG")
    assert opened(blobs.normalise(out.getvalue(), "o.png").data).mode == "RGB"


def test_a_pdf_is_kept_as_it_came_with_its_text_and_page_count():
    raw = files.pdf(["Error: disk full", "Traceback (most recent call last)"])
    n = blobs.normalise(raw, "error.pdf")
    assert n.data == raw
    assert (n.mime, n.pages, n.width, n.height) == ("application/pdf", 2, None, None)
    assert n.text == "Error: disk full\n\nTraceback (most recent call last)"
    assert n.ref() == {
        "sha256": n.sha256,
        "name": "error.pdf",
        "mime": "application/pdf",
        "size": len(raw),
        "pages": 2,
    }


# --- Refusals ----------------------------------------------------------------------------

REFUSED = [
    pytest.param(b"", "empty.png", "empty.png is empty (0 bytes).", id="zero-byte"),
    pytest.param(
        files.image(),
        "photo.jpg",
        "photo.jpg is a PNG image, not what its name says",
        id="png-as-jpg",
    ),
    pytest.param(
        files.pdf(["x"]), "cat.png", "cat.png is a PDF, not what its name says", id="pdf-as-png"
    ),
    pytest.param(
        files.image(),
        "notes.txt",
        "notes.txt is a PNG image, not what its name says",
        id="png-as-txt",
    ),
    pytest.param(
        files.image(),
        "report.pdf",
        "report.pdf is a PNG image, not what its name says",
        id="png-as-pdf",
    ),
    pytest.param(
        b"<?xml version='1.0'?>\n<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>",
        "logo.svg",
        "logo.svg is an SVG image, which can carry scripts and is not accepted",
        id="svg",
    ),
    pytest.param(
        b"\xef\xbb\xbf  <!-- made by hand -->\n<svg onload='alert(1)'/>",
        "logo.png",
        "logo.png is an SVG image",
        id="svg-named-png",
    ),
    pytest.param(
        files.png_header(100_000, 100_000),
        "bomb.png",
        "bomb.png has more pixels than an image may have (50 megapixels at most).",
        id="bomb-past-pillow",
    ),
    pytest.param(
        files.png_header(8000, 8000),
        "big.png",
        "big.png is 8000×8000 pixels; the most an image may have is 50 megapixels.",
        id="bomb-past-ours",
    ),
    pytest.param(
        files.png(1, 1_000_000),
        "thread.png",
        "thread.png is 1×1000000 pixels; an image may be at most 65,535 pixels on a side.",
        id="one-pixel-wide",
    ),
    pytest.param(
        files.image()[:3000], "cut.png", "cut.png is a damaged image (", id="truncated-image"
    ),
    pytest.param(
        b"%PDF-1.7\n1 0 obj garbage",
        "broken.pdf",
        "broken.pdf is not a readable PDF (",
        id="corrupt-pdf",
    ),
    pytest.param(
        files.encrypted_pdf(), "locked.pdf", "locked.pdf is password-protected", id="encrypted-pdf"
    ),
    pytest.param(files.animated("GIF"), "dance.gif", "dance.gif is animated", id="animated-gif"),
    pytest.param(
        files.animated("WEBP"), "dance.webp", "dance.webp is animated", id="animated-webp"
    ),
    pytest.param(files.animated("PNG"), "dance.png", "dance.png is animated", id="apng"),
    pytest.param(
        b"MZ\x90\x00 this is a program",
        "tool.png",
        "tool.png is not a file that can be attached (accepted: PNG, JPEG, GIF, WebP and HEIC "
        "images, and PDFs).",
        id="not-an-image",
    ),
    pytest.param(
        files.image(), "../../x.png", "The file name '../../x.png' is a path", id="dotdot"
    ),
    pytest.param(files.image(), "a/b.png", "The file name 'a/b.png' is a path", id="slash"),
    pytest.param(files.image(), "C:\\x.png", "is a path", id="backslash"),
    pytest.param(files.image(), "..", "The file name '..' is a path", id="dotdot-alone"),
    pytest.param(files.image(), "a\nb.png", "holds control characters", id="newline"),
    pytest.param(files.image(), "  ", "A file has no name.", id="blank-name"),
]


@pytest.mark.parametrize(("data", "name", "message"), REFUSED)
def test_a_bad_file_is_refused_saying_why(data, name, message):
    with pytest.raises(blobs.AttachmentError) as refused:
        blobs.normalise(data, name)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_file_past_the_upload_cap_is_refused_unread(monkeypatch):
    monkeypatch.setattr(blobs, "_image", _never)
    with pytest.raises(
        blobs.AttachmentError, match=r"is 20.0 MB; the most a file may be is 20.0 MB"
    ):
        blobs.normalise(b"\x89PNG" + bytes(blobs.MAX_UPLOAD_BYTES), "huge.png")


def _never(*args):
    raise AssertionError("decoded a file past the cap")


def test_a_pdf_past_the_page_cap_is_refused(monkeypatch):
    monkeypatch.setattr(blobs, "MAX_PDF_PAGES", 2)
    with pytest.raises(
        blobs.AttachmentError, match="long.pdf has 3 pages; the most a PDF may have is 2."
    ):
        blobs.normalise(files.pdf(["a", "b", "c"]), "long.pdf")


def drawn_pdf(pages: int, content: bytes) -> bytes:
    """A PDF of `pages` pages that all draw one Flate-compressed content stream."""
    stream = zlib.compress(content, 9)
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    drawn = b"<< /Length %d /Filter /FlateDecode >>\nstream\n%s\nendstream" % (
        len(stream),
        stream,
    )
    kids_id = pages + 3
    page = (
        b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents 2 0 R "
        b"/Resources << /Font << /F1 1 0 R >> >> >>" % kids_id
    )
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(pages))
    objects = [font, drawn, *[page] * pages]
    objects += [b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages)]
    objects += [b"<< /Type /Catalog /Pages %d 0 R >>" % kids_id]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % offset for offset in offsets))
    out.write(
        b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, len(objects), xref)
    )
    return out.getvalue()


# Text drawn again and again: what pypdf's text extraction is slowest at.
TEXT_OPS = b"BT /F1 12 Tf 72 720 Td (hello) Tj ET\n"


@pytest.mark.parametrize(
    ("pages", "content_bytes"),
    [
        pytest.param(1, 3 * 1024 * 1024, id="one-page-of-3-MB"),
        pytest.param(5, 512 * 1024, id="five-pages-sharing-512-KB"),
    ],
)
def test_a_pdf_whose_pages_draw_too_much_is_refused_before_its_text_is_read(pages, content_bytes):
    raw = drawn_pdf(pages, TEXT_OPS * (content_bytes // len(TEXT_OPS)))
    assert len(raw) < 20_000
    with pytest.raises(
        blobs.AttachmentError,
        match="bomb.pdf: this PDF is too complex to read: its pages hold more than 2.0 MB "
        "of drawing instructions.",
    ):
        blobs.normalise(raw, "bomb.pdf")


def test_a_pdf_the_reader_cannot_finish_within_its_cpu_time_is_refused(monkeypatch):
    # 1.5 MB of text operators (within the byte bound) take pypdf seconds.
    monkeypatch.setattr(blobs, "PDF_SECONDS", 1)
    raw = drawn_pdf(1, TEXT_OPS * (1536 * 1024 // len(TEXT_OPS)))
    with pytest.raises(
        blobs.AttachmentError,
        match="slow.pdf: this PDF is too complex to read: reading it took more than 1 seconds.",
    ):
        blobs.normalise(raw, "slow.pdf")


def test_a_pdf_text_is_cut_at_its_cap_and_the_rest_is_not_read(monkeypatch):
    monkeypatch.setattr(blobs, "MAX_PDF_TEXT_CHARS", 8)
    n = blobs.normalise(files.pdf(["Error: disk full", "Traceback"]), "error.pdf")
    assert (n.pages, n.text) == (2, "Error: d")


def test_a_long_name_is_cut_keeping_its_extension():
    n = blobs.normalise(files.image(), "x" * 300 + ".png")
    assert len(n.name) == blobs.MAX_NAME_CHARS and n.name.endswith("….png")


# --- Storage -----------------------------------------------------------------------------


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="pw")


def test_store_writes_the_bytes_once_under_their_hash(alice, settings):
    n = blobs.normalise(files.image(), "a.png")
    first = blobs.store(n)
    second = blobs.store(n)
    assert first.pk == second.pk == n.sha256
    assert Blob.objects.count() == 1
    path = settings.DATA_DIR / "blobs" / n.sha256[:2] / n.sha256[2:4] / n.sha256
    assert path.read_bytes() == n.data
    assert [p.name for p in path.parent.iterdir()] == [n.sha256]  # no temporary left
    assert (first.mime, first.size, first.width, first.height) == (
        "image/png",
        len(n.data),
        1280,
        720,
    )


def test_store_writes_the_file_again_when_it_went_missing(alice):
    n = blobs.normalise(files.image(), "a.png")
    blobs.store(n)
    blobs.path_of(n.sha256).unlink()
    blobs.store(n)
    assert blobs.read(n.sha256) == n.data


def test_a_pdf_keeps_its_text_beside_it(alice):
    n = blobs.normalise(files.pdf(["hello"]), "a.pdf")
    blobs.store(n)
    assert blobs.text(n.sha256) == "hello"
    assert blobs.READER.data(n.sha256) == n.data


def test_collect_deletes_what_no_tab_uses(alice):
    tab = Tab.objects.create(owner=alice)
    kept, pending, dropped = (
        blobs.normalise(files.image(size=(10 + i, 10)), f"{i}.png") for i in range(3)
    )
    blobs.attach(tab.pk, blobs.store(kept), "kept.png", sent=True)
    blobs.attach(tab.pk, blobs.store(pending), "pending.png", sent=False)
    old = blobs.attach(tab.pk, blobs.store(dropped), "dropped.png", sent=False)
    Attachment.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - blobs.PENDING_TTL - timedelta(minutes=1)
    )
    blobs.thumbnail(Blob.objects.get(pk=dropped.sha256))
    assert blobs.garbage() == blobs.Garbage(0, 0)
    assert blobs.collect() == blobs.Garbage(1, len(dropped.data))
    assert set(Blob.objects.values_list("pk", flat=True)) == {kept.sha256, pending.sha256}
    assert blobs.read(dropped.sha256) is None
    assert list(blobs.path_of(dropped.sha256).parent.iterdir()) == []
    assert blobs.read(kept.sha256) == kept.data

    tab.delete()
    assert blobs.garbage() == blobs.Garbage(2, len(kept.data) + len(pending.data))
    blobs.collect()
    assert not Blob.objects.exists()


def test_a_blob_two_tabs_use_stays_until_both_are_gone(alice):
    one, two = Tab.objects.create(owner=alice), Tab.objects.create(owner=alice)
    n = blobs.normalise(files.image(), "a.png")
    blob = blobs.store(n)
    blobs.attach(one.pk, blob, "a.png", sent=True)
    blobs.copy_refs(one.pk, two.pk)
    one.delete()
    blobs.collect()
    assert blobs.read(n.sha256) == n.data
    two.delete()
    blobs.collect()
    assert blobs.read(n.sha256) is None


def test_a_thumbnail_is_small_deterministic_and_kept(alice):
    n = blobs.normalise(files.image(size=(1280, 720)), "a.png")
    blob = blobs.store(n)
    path = blobs.thumbnail(blob)
    data = path.read_bytes()
    assert opened(data).size == (320, 180)
    path.unlink()
    assert blobs.thumbnail(blob).read_bytes() == data
    pdf = blobs.store(blobs.normalise(files.pdf(["x"]), "a.pdf"))
    assert blobs.thumbnail(pdf) is None


def test_place_copies_a_file_into_the_workspace_once(alice, tmp_path):
    n = blobs.normalise(files.image(), "shot.png")
    blobs.store(n)
    blobs.place(tmp_path, n.ref())
    target = tmp_path / "uploads" / n.sha256[:12] / "shot.png"
    assert target.read_bytes() == n.data


def test_place_never_writes_through_a_link_out_of_the_workspace(alice, tmp_path):
    n = blobs.normalise(files.image(), "shot.png")
    blobs.store(n)
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = tmp_path / "ws"
    (workspace / "uploads").mkdir(parents=True)
    (workspace / "uploads" / n.sha256[:12]).symlink_to(outside)
    blobs.place(workspace, n.ref())
    assert list(outside.iterdir()) == []


def test_place_makes_nothing_through_a_linked_uploads_folder(alice, tmp_path):
    n = blobs.normalise(files.image(), "shot.png")
    blobs.store(n)
    outside = tmp_path / "outside"
    outside.mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "uploads").symlink_to(outside)
    blobs.place(workspace, n.ref())
    assert list(outside.iterdir()) == []
    assert (workspace / "uploads").is_symlink()
