"""Files for the attachment tests and bench, made here (no fixtures on disk): images in
every accepted format, a photo with camera metadata, animations, a decompression bomb's
header, PDFs with text."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pillow_heif
import pypdf
from PIL import Image, ImageCms, ImageDraw

pillow_heif.register_heif_opener()


def image(
    fmt: str = "PNG", size: tuple[int, int] = (1280, 720), mode: str = "RGB", **save
) -> bytes:
    """A picture with some structure (a gradient and shapes), so encoders have work."""
    im = Image.new(mode, size, (30, 60, 90, 255)[: len(mode)] if mode != "L" else 80)
    draw = ImageDraw.Draw(im)
    w, h = size
    for i in range(0, w, max(1, w // 16)):
        draw.line(
            [(i, 0), (w - i, h)],
            fill=(200, i % 255, 40, 255)[: len(mode)] if mode != "L" else 200,
            width=3,
        )
    draw.rectangle(
        [w // 4, h // 4, w // 2, h // 2],
        fill=(250, 250, 250, 128)[: len(mode)] if mode != "L" else 250,
    )
    out = io.BytesIO()
    im.save(out, fmt, **save)
    return out.getvalue()


def photo(
    size: tuple[int, int] = (4000, 3000), *, orientation: int = 1, quality: int = 92
) -> bytes:
    """A camera-like JPEG: noise (so it weighs what a photo does), EXIF with a GPS
    position, a camera model and an orientation tag, and an ICC profile."""
    rng = random.Random(7)
    small = Image.frombytes(
        "RGB",
        (size[0] // 8, size[1] // 8),
        bytes(rng.randrange(256) for _ in range(size[0] // 8 * size[1] // 8 * 3)),
    )
    im = small.resize(size, Image.Resampling.BILINEAR)
    noise = Image.effect_noise(size, 40).convert("RGB")
    im = Image.blend(im, noise, 0.3)
    exif = Image.Exif()
    exif[0x0110] = "Secret Camera 9000"  # Model
    exif[0x0112] = orientation
    exif.get_ifd(0x8825).update({1: "N", 2: (52.0, 31.0, 12.0), 3: "E", 4: (13.0, 24.0, 1.0)})
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    out = io.BytesIO()
    im.save(out, "JPEG", quality=quality, exif=exif.tobytes(), icc_profile=icc)
    return out.getvalue()


def animated(fmt: str = "GIF") -> bytes:
    frames = [Image.new("RGB", (32, 32), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    return out.getvalue()


def png_chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    """One PNG chunk; `crc` instead of its checksum makes it damaged."""
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png_header(
    width: int, height: int, *, depth: int = 1, colour: int = 0, interlace: int = 0
) -> bytes:
    """A PNG that declares `width` x `height` pixels in a few bytes: a bomb's header
    (1-bit grey unless told, one tiny IDAT), which Pillow reads without decoding."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\0"))
        + png_chunk(b"IEND", b"")
    )


def png(
    width: int,
    height: int,
    *,
    colour: int = 2,
    depth: int = 8,
    before_pixels: bytes = b"",
    after_pixels: bytes = b"",
    pixels_crc: int | None = None,
) -> bytes:
    """A PNG made by hand (colour type `colour`, `depth` bits): each row a ramp, stored
    unfiltered and compressed as it is made, so a 49 MP file costs its compressed size
    to make, not its pixels; `before_pixels` and `after_pixels` are chunks around the
    pixels, and `pixels_crc` their checksum (a damaged file)."""
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    row_bytes = -(-width * channels * depth // 8)
    row = b"\0" + bytes(i * 7 % 256 for i in range(row_bytes))
    deflate = zlib.compressobj()
    pixels = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0)
    palette = png_chunk(b"PLTE", bytes(range(256)) * 3) if colour == 3 else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + palette
        + before_pixels
        + png_chunk(b"IDAT", pixels, pixels_crc)
        + after_pixels
        + png_chunk(b"IEND", b"")
    )


def pdf(pages: list[str]) -> bytes:
    """A PDF whose pages show the given lines of text (Helvetica)."""
    objects: list[bytes] = []

    def add(body: bytes) -> int:
        objects.append(body)
        return len(objects)

    font = add(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    kids = []
    page_ids = []
    for text in pages:
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode()
        stream = b"BT /F1 12 Tf 72 720 Td (" + escaped + b") Tj ET"
        content = add(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
        page_ids.append((content, len(objects) + 1))
        kids.append(add(b"PAGE"))  # placeholder, filled below
    pages_id = add(b"PAGES")
    for (content, page), _ in zip(page_ids, kids, strict=True):
        objects[page - 1] = (
            b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 612 792] /Contents %d 0 R "
            b"/Resources << /Font << /F1 %d 0 R >> >> >>" % (pages_id, content, font)
        )
    objects[pages_id - 1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
        b" ".join(b"%d 0 R" % k for k in kids),
        len(kids),
    )
    catalog = add(b"<< /Type /Catalog /Pages %d 0 R >>" % pages_id)
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % i + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(
        b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n"
        % (len(objects) + 1, catalog, xref)
    )
    return out.getvalue()


def encrypted_pdf() -> bytes:
    writer = pypdf.PdfWriter(clone_from=io.BytesIO(pdf(["secret"])))
    writer.encrypt("password")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
