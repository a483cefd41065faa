"""Images in tool results (issue 28.7): what browsers show is accepted (a PNG whose
colour profile's checksum is wrong, as server-everything's tiny image), a refused block
leaves every other block of an MCP result standing and says exactly why it was left out,
several images of one result are each kept, and a large image is decoded within a
bounded memory budget (a PNG a strip of rows at a time)."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from channels.db import database_sync_to_async
from mcp import types
from PIL import Image

from chat import blobs, turns
from chat.models import Blob, McpServer
from chat.tools import base as tool_base
from chat.tools import mcp
from harness.servers import Proc, clean_env
from tests import attachment_files as files
from tests.anthropic_wire import MODEL, reply, settled, text, tool_use, use_anthropic
from tests.engine import Watcher, chunks, make_tab, running_worker

ROOT = Path(__file__).resolve().parent.parent
GALLERY = str(ROOT / "tests" / "mcp_servers" / "gallery.py")

# A colour profile whose checksum is wrong (the tiny image's iCCP chunk has one).
BAD_PROFILE = files.png_chunk(b"iCCP", b"p\0\0" + zlib.compress(b"not a profile"), crc=1)


@pytest.fixture(autouse=True)
def data_dir(tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR


# --- What browsers show is accepted; what they refuse, refused with its reason -----------


@pytest.mark.parametrize(
    "chunks_",
    [
        pytest.param({"before_pixels": BAD_PROFILE}, id="iCCP-before-the-pixels"),
        pytest.param({"before_pixels": files.png_chunk(b"tEXt", b"Comment\0hi", crc=7)}, id="tEXt"),
    ],
)
def test_an_ancillary_chunk_with_a_wrong_checksum_is_dropped_and_the_image_kept(chunks_):
    clean = blobs.normalise(files.png(40, 30), "clean.png")
    damaged = files.png(40, 30, **chunks_)
    with pytest.raises((SyntaxError, OSError)):  # Pillow alone refuses the file whole
        Image.open(io.BytesIO(damaged)).load()
    n = blobs.normalise(damaged, "tiny.png")
    assert (n.mime, n.width, n.height, n.data) == ("image/png", 40, 30, clean.data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            files.png(4, 4, pixels_crc=0),
            "x.png is a damaged PNG image (the checksum of its IDAT chunk is wrong).",
            id="pixels",
        ),
        pytest.param(
            files.png(4, 4, colour=3)[:33]
            + files.png_chunk(b"PLTE", bytes(768), crc=0)
            + files.png(4, 4, colour=3)[33 + 780 :],
            "x.png is a damaged PNG image (the checksum of its PLTE chunk is wrong).",
            id="palette",
        ),
        pytest.param(
            files.png(4, 4)[:16] + b"\0" * 17,
            "x.png is a damaged PNG image (the checksum of its IHDR chunk is wrong).",
            id="header-checksum",
        ),
        pytest.param(
            files.png(4, 4)[:20],
            "x.png is a damaged PNG image (its header chunk is missing or cut short).",
            id="header-cut",
        ),
        pytest.param(
            b"\xff\xd8\xff\xe0" + b"\0" * 40, "x.png is a damaged JPEG image (", id="jpeg-garbage"
        ),
        pytest.param(
            b"BM" + b"\0" * 60,
            "x.png is not a file that can be attached (accepted: PNG, JPEG, GIF, WebP and HEIC "
            "images, and PDFs).",
            id="bmp",
        ),
    ],
)
def test_a_refused_image_says_exactly_why(data, expected):
    with pytest.raises(blobs.AttachmentError) as refused:
        blobs.normalise(data, "x.png")
    assert str(refused.value).startswith(expected), str(refused.value)


# --- MCP results: each block kept, or named with why it was left out ---------------------


def _image_block(data: bytes | str) -> types.ImageContent:
    encoded = data if isinstance(data, str) else base64.b64encode(data).decode()
    return types.ImageContent(type="image", data=encoded, mime_type="image/png")


def test_an_mcp_result_keeps_its_images_in_order_and_names_what_it_leaves_out():
    good = files.png(2, 2)
    content = [
        types.TextContent(type="text", text="before"),
        _image_block("not base64!"),
        *[_image_block(good) for _ in range(tool_base.MAX_RESULT_IMAGES + 1)],
        types.TextContent(type="text", text="after"),
    ]
    out = mcp.outcome("shots", types.CallToolResult(content=content))
    assert not out.is_error
    assert [i.name for i in out.images] == [f"shots-{n}" for n in range(3, 13)]
    assert {i.data for i in out.images} == {good} and {i.path for i in out.images} == {""}
    assert out.result.splitlines() == [
        "before",
        "after",
        "[content block 2, an image, left out: its data is not valid base64]",
        "[content block 13, an image, left out: a result carries at most 10 images]",
    ]


def test_an_mcp_image_is_named_for_its_tool_and_typed_by_its_bytes():
    """A server that calls a JPEG image/png: the image is kept, as the JPEG it is."""
    block = _image_block(files.image("JPEG", (8, 8)))  # said to be image/png
    out = mcp.outcome("pixel", types.CallToolResult(content=[block]))
    assert [(i.name, out.result) for i in out.images] == [("pixel", "(an image)")]
    n = blobs.normalise(out.images[0].data, out.images[0].name)
    assert (n.name, n.mime) == ("pixel.jpg", "image/jpeg")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_a_refused_image_of_an_mcp_result_leaves_the_rest_standing(
    fake_server, monkeypatch, tmp_path, settings
):
    """tests/mcp_servers/gallery.py over streamable HTTP: text, a pixel whose
    profile's checksum is wrong (kept), a damaged one (left out, the result says why), a
    blue one (kept), text. The model gets the text, the note and both images."""
    use_anthropic(monkeypatch, fake_server)
    settings.DISPATCH_WORKSPACE = tmp_path / "workspace"
    web = Proc("mcp-web", [sys.executable, GALLERY, "http"], clean_env(), tmp_path / "web.log")
    web.start().listening()
    try:
        await McpServer.objects.acreate(
            name="web", transport="http", url=f"{web.url}/mcp", timeout=20.0
        )
        tab = await make_tab(MODEL)
        fake_server.add(
            reply(tool_use("c1", "mcp__web__gallery"), stop="tool_use"), reply(text("Seen."))
        )
        async with running_worker(), Watcher(tab.pk) as watcher:
            await database_sync_to_async(turns.submit)(tab, "Show me.")
            await watcher.until_idle()
        await settled(tab.pk)
    finally:
        web.stop()
        await mcp.close_all()
    result = next(c for c in await chunks(tab.pk) if c.type == "tool_result").data
    assert result["is_error"] is False
    assert result["result"].splitlines() == [
        "before",
        "after",
        "[left out: gallery-3 is a damaged PNG image (the checksum of its IDAT chunk is wrong).]",
    ]
    refs = result["attachments"]
    assert [(r["name"], r["width"], r["height"]) for r in refs] == [
        ("gallery-2.png", 1, 1),
        ("gallery-4.png", 1, 1),
    ]
    colours = [Image.open(io.BytesIO(blobs.read(r["sha256"]))).getpixel((0, 0)) for r in refs]
    assert colours == [(0, 255, 0), (0, 0, 255)]
    assert await Blob.objects.acount() == 2
    sent = fake_server.requests[1].json["messages"][-1]["content"][0]
    assert [block["type"] for block in sent["content"]] == ["text", "image", "image"]
    assert sent["content"][0]["text"] == result["result"]


# --- Large images: decoded within a bounded budget --------------------------------------


def _saved(im: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    im.save(out, "PNG", **options)
    return out.getvalue()


def _in_mode(mode: str) -> bytes:
    """A 4000x300 picture (stored at half its size: each strip is reduced by 2) in
    `mode`, saved with Pillow's adaptive row filters, so every strip's first row is
    read from the row before it."""
    rgba = Image.open(io.BytesIO(files.image("PNG", (4000, 300), mode="RGBA")))
    if mode == "P":
        return _saved(rgba.convert("RGB").convert("P"), transparency=3)
    if mode == "I;16":
        return _saved(rgba.convert("L").point(lambda v: v * 200, "I").convert("I;16"))
    return _saved(rgba.convert(mode))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P", "L", "LA", "I;16", "1"])
def test_a_png_read_in_strips_gives_the_same_bytes_as_read_whole(mode, monkeypatch):
    data = _in_mode(mode)
    whole = blobs.normalise(data, "wide.png")
    # 4000 x 36 pixels a strip (9 strips, the last 12 rows), the whole over the budget.
    monkeypatch.setattr(blobs, "STRIP_BYTES", 4000 * 4 * 37)
    monkeypatch.setattr(blobs, "DECODE_BUDGET", 1_000_000)
    strips = blobs.normalise(data, "wide.png")
    assert (strips.width, strips.height) == (whole.width, whole.height) == (1568, 117)
    assert strips.data == whole.data


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        pytest.param(
            files.png_header(7000, 7000, depth=16, colour=2), "PNG image", id="16-bit-colour"
        ),
        pytest.param(
            files.png_header(7000, 7000, depth=8, colour=2, interlace=1), "PNG image", id="adam7"
        ),
        pytest.param(files.image("WEBP", (3000, 3000)), "WebP image", id="webp"),
    ],
)
def test_an_image_that_cannot_be_read_within_the_budget_is_refused_unread(data, kind):
    width = Image.open(io.BytesIO(data)).width
    with pytest.raises(blobs.AttachmentError) as refused:
        blobs.normalise(data, "big")
    assert str(refused.value).startswith(
        f"big is {width}×{width} pixels, more than a {kind} may have to be read here ("
    )
    assert str(refused.value).endswith(" megapixels at most): attach a smaller copy.")


# What normalising a 49 MP PNG may add to a process's peak memory: its strips and the
# stored size (measured: about 35 MB; read whole, it would take 560 MB).
PNG_49MP_BUDGET_MB = 96

MEASURE = """
import django, sys
django.setup()
from chat import blobs
from tests import attachment_files as files

data = files.png(7000, 7000, colour=6)

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key))
    return int(line.split()[1]) // 1024

open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here
before = status("VmRSS")
n = blobs.normalise(data, "big.png")
print(n.width, n.height, status("VmHWM") - before)
"""


def test_a_49_megapixel_png_is_normalised_within_a_bounded_memory(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISPATCH_DATA_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", MEASURE], cwd=ROOT, env=env, capture_output=True, check=True
    )
    width, height, grew_mb = map(int, done.stdout.split())
    assert (width, height) == (1095, 1095)
    assert grew_mb < PNG_49MP_BUDGET_MB, f"normalising took {grew_mb} MB"


def test_a_png_whose_pixels_end_early_shows_what_it_has_read_whole_or_in_strips(monkeypatch):
    """300 rows declared, 100 stored (whole chunks, right checksums): Pillow shows the
    rows there are, as browsers do, and the strips give the same bytes."""
    short = files.png(4000, 100)
    data = short[:8] + files.png_chunk(b"IHDR", short[16:20] + (300).to_bytes(4) + short[24:29])
    data += short[33:]
    whole = blobs.normalise(data, "short.png")
    monkeypatch.setattr(blobs, "STRIP_BYTES", 4000 * 4 * 37)
    monkeypatch.setattr(blobs, "DECODE_BUDGET", 1_000_000)
    assert blobs.normalise(data, "short.png").data == whole.data
    rows = Image.open(io.BytesIO(whole.data)).convert("L")
    assert rows.getpixel((0, 0)) > 0 and rows.getpixel((0, whole.height - 1)) == 0
