"""Attachments' bytes (ARCHITECTURE.md, Attachments): what a file becomes (`normalise`), where it is
kept (`store`), who may read it, and when it goes (`collect`).

A file is normalised once, when it arrives: its real type is sniffed (Pillow, the PDF
header; never the name), an image is decoded, turned upright, converted to sRGB, bounded
in pixels and bytes and re-encoded without its metadata, with fixed settings, so the same
file always gives the same bytes. Every later request carries exactly those bytes, and the
image stays inside the provider's cached prefix. A PDF is kept as it came, once pypdf has
read every page (its text, for models that cannot read PDFs, is kept beside it).

Bytes live once per SHA-256 under the data directory (`blobs/ab/cd/<sha256>`), written to a
temporary name and renamed, so a reader never sees half a file. A `Blob` row describes them;
`Attachment` rows say which tabs use them (uploaded to the composer, sent in a message, read
by a tool). A blob no row uses is garbage, and so is a composer upload never sent within
PENDING_TTL.

`normalise` is pure (bytes in, bytes out); the rest reads and writes the database and the
data directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import unicodedata
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pillow_heif
from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from PIL import Image, ImageCms, ImageFile, ImageOps, UnidentifiedImageError

from chat.models import Attachment, Blob
from chat.providers.base import upload_path
from chat.tools.files import make_private

logger = logging.getLogger(__name__)

pillow_heif.register_heif_opener()

# Run as a script, never imported: this process never parses a PDF, and importing pypdf
# would add to every Django process's start.
PDFTEXT_SCRIPT = Path(__file__).with_name("pdftext.py")

# The most files one message carries: a handful of screenshots, not an album (each is
# sent again in every later request of the tab).
MAX_FILES = 10
# The most one file may be as it arrives: a phone photo is 3-12 MB, a long PDF a few.
# Past it the upload is refused before it is decoded.
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
# The most a request of files may declare: MAX_FILES of MAX_UPLOAD_BYTES, and room for
# the multipart framing. Past it, refused before it is read.
MAX_REQUEST_BYTES = MAX_FILES * MAX_UPLOAD_BYTES + 64 * 1024
# The long edge of a stored image: what Anthropic scales every image down to anyway.
MAX_EDGE = 1568
# The most pixels of a stored image: Anthropic's ~1,600-token bound (1092x1092, 1456x816 at
# 16:9). A larger image is scaled down by the API, so its extra bytes buy nothing.
MAX_PIXELS = 1_200_000
# The most bytes of a stored image (Anthropic refuses larger ones); an image still larger
# after scaling is scaled down in steps of DOWNSCALE_STEP until it fits.
MAX_IMAGE_BYTES = 5 * 1024 * 1024
DOWNSCALE_STEP = 0.8
# The most pixels a file may declare before it is decoded: a 48 MP phone photo fits, a
# decompression bomb (a small file of 100,000 x 100,000 pixels) does not. (Decoding has a
# memory budget of its own: DECODE_BUDGET.)
MAX_SOURCE_PIXELS = 50_000_000
# The longest side a file may declare: decoders keep something per row (a 1 x 16,000,000
# PNG, 113 KB and within the pixel cap, cost Pillow 0.9 GB), and JPEG's own limit is this.
MAX_SOURCE_SIDE = 65_535
# The most memory the pixels of one image may take while it is normalised: decoded, in
# the mode they are worked on, and what the decoder keeps beside them. A 12 MP HEIC phone
# photo fits (about 100 MB); a larger image is read at a fraction of its size (a JPEG,
# by its decoder's scaling; a PNG, a strip of rows at a time) or refused, so a request
# never holds a 49 MP image whole (about 200 MB, and as much again for each copy).
DECODE_BUDGET = 128 * 1024 * 1024
# What a decoder keeps per pixel beside Pillow's image while it decodes (measured:
# pillow-heif's RGB buffer; Pillow's WebP decoder, its canvases and a copy).
DECODER_BYTES_PER_PIXEL = {"HEIF": 4, "WEBP": 12}
# What Pillow's image takes per pixel, by mode (every other mode takes 4).
MODE_BYTES_PER_PIXEL = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2}
# A PNG over the budget is decoded a strip of about this many bytes of pixels at a time.
STRIP_BYTES = 4 * 1024 * 1024
# Pillow's raw modes of a PNG's rows that its image gives back byte for byte (not those
# of 16-bit colour, which it keeps as 8 bits): the rows a strip can carry over.
STRIP_RAWMODES = frozenset(
    {"1", "L", "L;2", "L;4", "P", "P;1", "P;2", "P;4", "LA", "RGB", "RGBA", "I;16B"}
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG output: fixed settings, so re-encoding is deterministic.
JPEG_QUALITY = 85
# PNG output: zlib's default level; fixed for the same reason.
PNG_COMPRESS_LEVEL = 6
# A PDF: Anthropic reads at most 100 pages, and its request (which holds the rest of the
# conversation too) at most 32 MB, of which a PDF's base64 takes 4/3 of its size.
MAX_PDF_PAGES = 100
MAX_DOCUMENT_BYTES = 10 * 1024 * 1024
# What reading a PDF's text may cost (chat/pdftext.py): pypdf takes about 10 µs a byte of
# a page's drawing instructions, and a 100-page report holds about 1 MB of them. A page
# drawing a shared stream counts it again, since pypdf parses it again.
MAX_PDF_CONTENT_BYTES = 2 * 1024 * 1024
# The text kept: ten times what a request sends (chat.providers.common), so the request
# can still say how long the text was; a PDF that says more is cut here.
MAX_PDF_TEXT_CHARS = 1_000_000
# The CPU time the reader may take (and twice that in wall time): a file past the byte
# bound's reach (fonts, forms) is refused as too complex then.
PDF_SECONDS = 10
# What the page shows next to a message: twice the thumbnail's CSS size, for sharp
# screens (chat.render.THUMB_EDGE_PX is 160).
THUMB_EDGE = 320
# A file name is a label: longer ones are cut, keeping the extension.
MAX_NAME_CHARS = 120
# A composer upload not sent within this long was abandoned (the tab was left, the file
# removed from the tray); its row goes, and its blob with it if nothing else uses it.
PENDING_TTL = timedelta(days=1)

PNG = "image/png"
JPEG = "image/jpeg"
PDF = "application/pdf"
# Pillow's formats that are accepted as images, and what each is stored as: a lossless
# source stays lossless, a photo stays a JPEG; a WebP by whether it has transparency.
IMAGE_FORMATS = {"PNG": PNG, "GIF": PNG, "JPEG": JPEG, "MPO": JPEG, "HEIF": JPEG, "WEBP": None}
# The decoders tried (an MPO, a camera's JPEG with extra views, comes from JPEG's).
DECODERS = ("PNG", "GIF", "JPEG", "WEBP", "HEIF")
# Formats whose extra frames are an animation (an MPO's or a HEIC's are other views of
# the photo: the first is the photo).
ANIMATED_FORMATS = frozenset({"PNG", "GIF", "WEBP"})
ACCEPTED = "PNG, JPEG, GIF, WebP and HEIC images, and PDFs"
_JPEG_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".jfif")
# What a file of each source format may be called, and what it is called in each.
EXTENSIONS = {
    "PNG": (".png",),
    "GIF": (".gif",),
    "JPEG": _JPEG_EXTENSIONS,
    "MPO": (*_JPEG_EXTENSIONS, ".mpo"),
    "HEIF": (".heic", ".heif"),
    "WEBP": (".webp",),
    "PDF": (".pdf",),
}
KIND_NAMES = {
    "PNG": "PNG image",
    "GIF": "GIF image",
    "JPEG": "JPEG image",
    "MPO": "JPEG image",
    "HEIF": "HEIC image",
    "WEBP": "WebP image",
    "PDF": "PDF",
}
STORED_EXTENSIONS = {PNG: (".png",), JPEG: _JPEG_EXTENSIONS, PDF: (".pdf",)}
# Names of other kinds of file: a file called one of these whose content is an image or a
# PDF is refused, since its name and its content disagree. (Any other suffix is part of
# the name: "Screenshot 12.03", and the stored type's extension is added.)
OTHER_EXTENSIONS = frozenset(
    (".svg", ".svgz", ".html", ".htm", ".xhtml", ".xml", ".js", ".mjs", ".sh", ".bat")
    + (".txt", ".md", ".csv", ".json", ".exe", ".dll", ".zip", ".gz", ".tgz", ".tar", ".7z")
    + (".rar", ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".rtf")
    + (".mp3", ".wav", ".mp4", ".mov", ".avi", ".mkv")
    + (".bmp", ".tif", ".tiff", ".ico", ".psd", ".avif", ".jxl")
)
SVG_START = re.compile(
    rb"^(\xef\xbb\xbf)?\s*(<\?xml[^>]*>\s*)?(<!--.*?-->\s*)*(<!DOCTYPE svg|<svg)", re.S
)


class AttachmentError(ValueError):
    """A file that is refused; the message is one sentence for the user."""


@dataclass(frozen=True)
class Normalised:
    """A file as it will be stored and sent: its bytes and what a message says of it."""

    data: bytes
    sha256: str
    mime: str
    name: str
    width: int | None = None
    height: int | None = None
    pages: int | None = None
    # A PDF's text (pypdf's), sent instead of the PDF to a model that cannot read one.
    text: str | None = None

    def ref(self) -> dict[str, Any]:
        """The reference a chunk's `attachments` holds."""
        return reference(self.sha256, self.name, self.mime, len(self.data), self)


def reference(sha256: str, name: str, mime: str, size: int, dims: Any) -> dict[str, Any]:
    ref: dict[str, Any] = {"sha256": sha256, "name": name, "mime": mime, "size": size}
    for key in ("width", "height", "pages"):
        if getattr(dims, key) is not None:
            ref[key] = getattr(dims, key)
    return ref


def human_bytes(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MB" if n >= 1024 * 1024 else f"{math.ceil(n / 1024)} KB"


# --- Normalisation (pure) ---------------------------------------------------------


def normalise(data: bytes, name: str) -> Normalised:
    """The stored form of a file called `name`; AttachmentError when it is refused."""
    shown = check_name(name)
    if not data:
        raise AttachmentError(f"{shown} is empty (0 bytes).")
    if len(data) > MAX_UPLOAD_BYTES:
        raise AttachmentError(
            f"{shown} is {human_bytes(len(data))}; the most a file may be is "
            f"{human_bytes(MAX_UPLOAD_BYTES)}."
        )
    if data.startswith(b"%PDF-"):
        return _pdf(data, shown)
    if SVG_START.match(data[:4096]):
        raise AttachmentError(
            f"{shown} is an SVG image, which can carry scripts and is not accepted: export "
            "it as PNG and attach that."
        )
    return _image(data, shown)


def check_name(name: str) -> str:
    """`name` as a file name to keep: refused when it holds a path or control characters
    (a browser sends only the file's own name), cut when too long."""
    name = unicodedata.normalize("NFC", name).strip()
    if not name:
        raise AttachmentError("A file has no name.")
    if any(unicodedata.category(ch) in ("Cc", "Cf") for ch in name):
        raise AttachmentError(f"The file name {name!r} holds control characters.")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise AttachmentError(
            f"The file name {name!r} is a path: attach the file under its own name."
        )
    if len(name) > MAX_NAME_CHARS:
        stem, ext = os.path.splitext(name)
        ext = ext if len(ext) <= 10 else ""
        name = stem[: MAX_NAME_CHARS - len(ext) - 1] + "…" + ext
    return name


def _named(shown: str, source: str, stored: str) -> str:
    """The stored name of a file called `shown` whose content is of Pillow format (or
    "PDF") `source`, stored as type `stored`: its extension becomes the stored type's.
    Refused when the name says it is another kind of file."""
    stem, ext = os.path.splitext(shown)
    ext = ext.lower()
    if ext in EXTENSIONS[source]:
        return shown if ext in STORED_EXTENSIONS[stored] else stem + STORED_EXTENSIONS[stored][0]
    if ext in OTHER_EXTENSIONS or any(ext in names for names in EXTENSIONS.values()):
        raise AttachmentError(
            f"{shown} is a {KIND_NAMES[source]}, not what its name says: rename it to "
            f"{stem}{EXTENSIONS[source][0]} if that is right."
        )
    return shown + STORED_EXTENSIONS[stored][0]


def stored_name(name: str, mime: str) -> str:
    """`name` (already checked) ending in an extension of type `mime`: a name that came
    back from a page may have been changed there."""
    if os.path.splitext(name)[1].lower() in STORED_EXTENSIONS[mime]:
        return name
    return name + STORED_EXTENSIONS[mime][0]


def _pdf(data: bytes, shown: str) -> Normalised:
    name = _named(shown, "PDF", PDF)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise AttachmentError(
            f"{shown} is {human_bytes(len(data))}; the most a PDF may be is "
            f"{human_bytes(MAX_DOCUMENT_BYTES)}."
        )
    read = _read_pdf(data, shown)
    refused = read.get("refused")
    if refused == "encrypted":
        raise AttachmentError(f"{shown} is password-protected: attach a copy without the password.")
    if refused == "pages":
        raise AttachmentError(
            f"{shown} has {read['pages']} pages; the most a PDF may have is {MAX_PDF_PAGES}."
        )
    if refused == "content":
        raise AttachmentError(
            f"{shown}: this PDF is too complex to read: its pages hold more than "
            f"{human_bytes(MAX_PDF_CONTENT_BYTES)} of drawing instructions."
        )
    if refused in ("limit", "memory"):
        raise AttachmentError(
            f"{shown}: this PDF is too complex to read: "
            + (_first_line(read["reason"]) if refused == "limit" else "it needs too much memory.")
        )
    if refused is not None:
        reason = _first_line(read.get("reason", "")) or read.get("kind", "damaged")
        raise AttachmentError(f"{shown} is not a readable PDF ({reason}).")
    if read["pages"] == 0:
        raise AttachmentError(f"{shown} is not a readable PDF (no pages found).")
    sha = hashlib.sha256(data).hexdigest()
    return Normalised(data, sha, PDF, name, pages=read["pages"], text=read["text"])


def _read_pdf(data: bytes, shown: str) -> dict[str, Any]:
    """What chat/pdftext.py makes of `data`: read in a process of its own, bounded in
    work, CPU time and memory, so that the caller (a request's thread) waits at most
    PDF_SECONDS and the server's event loop shares no interpreter with pypdf."""
    too_slow = AttachmentError(
        f"{shown}: this PDF is too complex to read: reading it took more than "
        f"{PDF_SECONDS} seconds."
    )
    limits = (MAX_PDF_PAGES, MAX_PDF_CONTENT_BYTES, MAX_PDF_TEXT_CHARS, PDF_SECONDS)
    try:
        done = subprocess.run(
            [sys.executable, "-I", str(PDFTEXT_SCRIPT), *map(str, limits)],
            input=data,
            capture_output=True,
            # CPU time is the child's own limit; this is for a machine too busy to
            # give it that time.
            timeout=PDF_SECONDS * 2,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise too_slow from exc
    if done.returncode == -signal.SIGXCPU or done.returncode == -signal.SIGKILL:
        raise too_slow
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        logger.error("reading a PDF failed: %s", done.stderr.decode(errors="replace")[-2000:])
        raise AttachmentError(f"{shown} could not be read (the PDF reader failed).") from exc


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0][:200] if text else type(exc).__name__) or type(exc).__name__


def _image(data: bytes, shown: str) -> Normalised:
    if data.startswith(PNG_SIGNATURE):
        data = _png_checked(data, shown)
    try:
        im = Image.open(io.BytesIO(data), formats=DECODERS)
    except Image.DecompressionBombError as exc:
        raise AttachmentError(
            f"{shown} has more pixels than an image may have "
            f"({MAX_SOURCE_PIXELS // 1_000_000} megapixels at most)."
        ) from exc
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise _unreadable(data, shown) from exc
    with im:
        width, height = im.size
        fmt = _format(im)
        if width * height > MAX_SOURCE_PIXELS:
            raise AttachmentError(
                f"{shown} is {width}×{height} pixels; the most an image may have is "
                f"{MAX_SOURCE_PIXELS // 1_000_000} megapixels."
            )
        if max(width, height) > MAX_SOURCE_SIDE:
            raise AttachmentError(
                f"{shown} is {width}×{height} pixels; an image may be at most "
                f"{MAX_SOURCE_SIDE:,} pixels on a side."
            )
        if fmt in ANIMATED_FORMATS and getattr(im, "is_animated", False):
            raise AttachmentError(
                f"{shown} is animated: attach one frame of it as a PNG image instead."
            )
        stored = IMAGE_FORMATS[fmt] or _webp_type(im)
        name = _named(shown, fmt, stored)
        try:
            encoded, size = _encode(_decoded(im, data, stored, shown), stored)
        except AttachmentError:
            raise
        except (OSError, ValueError, SyntaxError, zlib.error, Image.DecompressionBombError) as exc:
            raise AttachmentError(f"{shown} is a damaged image ({_reason(exc)}).") from exc
        except MemoryError as exc:
            # Past every bound above, a decoder may still ask for more than there is.
            raise AttachmentError(
                f"{shown} takes more memory to read than this server has to spare."
            ) from exc
    sha = hashlib.sha256(encoded).hexdigest()
    return Normalised(encoded, sha, stored, name, width=size[0], height=size[1])


def _unreadable(data: bytes, shown: str) -> AttachmentError:
    """Why `data` is refused: what the decoder of the format its first bytes announce
    says is wrong with it, or that it is no accepted kind of file."""
    for fmt in DECODERS:
        factory, accept = Image.OPEN[fmt]
        if accept is None or accept(data[:16]) is not True:
            continue
        try:
            # As Image.open calls it for a file object: no file name.
            factory(io.BytesIO(data), "").close()
        except (SyntaxError, OSError, ValueError, IndexError, TypeError, struct.error) as exc:
            return AttachmentError(f"{shown} is a damaged {KIND_NAMES[fmt]} ({_reason(exc)}).")
        break
    return AttachmentError(f"{shown} is not a file that can be attached (accepted: {ACCEPTED}).")


def _png_chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """Each whole chunk of a PNG: its type, where it starts (its length) and where it
    ends (past its checksum); up to IEND, or to a chunk cut short (Pillow says what)."""
    at = len(PNG_SIGNATURE)
    while at + 12 <= len(data):
        end = at + 12 + int.from_bytes(data[at : at + 4])
        if end > len(data):
            return
        kind = data[at + 4 : at + 8]
        yield kind, at, end
        if kind == b"IEND":
            return
        at = end


def _png_checked(data: bytes, shown: str) -> bytes:
    """A PNG without its ancillary chunks (a colour profile, text) whose checksum is
    wrong: browsers show such a file, dropping the chunk as libpng does, while Pillow
    refuses it whole. A critical chunk's wrong checksum (the header, the pixels, the
    palette) refuses the file."""
    if next(_png_chunks(data), (b"",))[0] != b"IHDR":
        raise AttachmentError(
            f"{shown} is a damaged PNG image (its header chunk is missing or cut short)."
        )
    kept, dropped, end = [PNG_SIGNATURE], False, len(PNG_SIGNATURE)
    for kind, start, end in _png_chunks(data):
        if zlib.crc32(data[start + 4 : end - 4]) == int.from_bytes(data[end - 4 : end]):
            kept.append(data[start:end])
        elif kind.isalpha() and kind[0] & 0x20:
            dropped = True
        else:
            name = kind.decode("latin-1")
            raise AttachmentError(
                f"{shown} is a damaged PNG image (the checksum of its {name} chunk is wrong)."
            )
    return b"".join([*kept, data[end:]]) if dropped else data


def _format(im: Image.Image) -> str:
    """The format of an image Image.open read (the decoder it chose sets it)."""
    assert im.format is not None
    return im.format


def _webp_type(im: Image.Image) -> str:
    return PNG if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info else JPEG


def bounded(width: int, height: int) -> tuple[int, int]:
    """The size of an image of `width` x `height` once within MAX_EDGE and MAX_PIXELS."""
    scale = min(1.0, MAX_EDGE / max(width, height), math.sqrt(MAX_PIXELS / (width * height)))
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def _decoded(im: ImageFile.ImageFile, data: bytes, mime: str, shown: str) -> Image.Image:
    """The pixels of `im` (opened from `data`, to be stored as `mime`) in the mode they
    are worked on, at the size they are stored at, not yet turned upright. Decoded
    within DECODE_BUDGET: the pixels are reduced by a whole factor while they are read
    (a JPEG's decoder scales; a PNG is read in strips) or at once after."""
    target = bounded(*im.size)
    width, height = im.size
    fmt = _format(im)
    if fmt in ("JPEG", "MPO"):
        # Decodes at 1/2, 1/4 or 1/8 of the size when that is still at least the target.
        im.draft("RGB", target)
    factor = max(1, min(im.width // target[0], im.height // target[1]))
    per_pixel = (
        DECODER_BYTES_PER_PIXEL.get(fmt, 0)
        + MODE_BYTES_PER_PIXEL.get(im.mode, 4)
        + (0 if im.mode == _working_mode(im, mime) else 4)
    )
    if im.width * im.height * per_pixel <= DECODE_BUDGET:
        im.load()
        pixels = _working(im, mime)
        pixels = pixels if factor == 1 else pixels.reduce(factor)
    elif fmt == "PNG" and (strips := _png_strips(im, data, factor, mime)) is not None:
        pixels = strips
    else:
        most = DECODE_BUDGET // per_pixel / 1_000_000
        raise AttachmentError(
            f"{shown} is {width}×{height} pixels, more than a {KIND_NAMES[fmt]} may "
            f"have to be read here ({most:.0f} megapixels at most): attach a smaller copy."
        )
    return pixels if pixels.size == target else pixels.resize(target, Image.Resampling.LANCZOS)


def _working_mode(im: Image.Image, mime: str) -> str:
    """The mode an image is scaled in: RGBA for a PNG with any transparency (opaque ones
    become RGB when saved: _plain_mode), L for grey, RGB for the rest."""
    if mime == PNG and (im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info):
        return "RGBA"
    return "L" if im.mode in ("1", "L") else "RGB"


def _working(im: Image.Image, mime: str) -> Image.Image:
    mode = _working_mode(im, mime)
    return im if im.mode == mode and "transparency" not in im.info else im.convert(mode)


def _png_strips(im: ImageFile.ImageFile, data: bytes, factor: int, mime: str) -> Image.Image | None:
    """The pixels of a PNG too large to decode whole, reduced by `factor`, read a strip
    of rows at a time: never whole in memory. Each strip is a PNG of its own made of
    the file's rows as they are stored (filtered: a row is read from the one above), led
    by the row before it unfiltered. None for a PNG whose rows cannot be carried over
    so (interlaced, 16-bit colour)."""
    rawmode = im.tile[0].args[0] if isinstance(im.tile[0].args, tuple) else im.tile[0].args
    width, height = im.size
    depth, colour, interlace = data[24], data[25], data[28]
    rows = max(factor, STRIP_BYTES // (width * 4) // factor * factor)
    if interlace or rawmode not in STRIP_RAWMODES or width * rows * 4 > DECODE_BUDGET:
        return None
    chunks = list(_png_chunks(data))
    palette = b"".join(data[a:b] for kind, a, b in chunks if kind in (b"PLTE", b"tRNS"))
    deflated = (data[a + 8 : b - 4] for kind, a, b in chunks if kind == b"IDAT")
    stride = 1 + math.ceil(width * depth * {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour] / 8)
    inflate = zlib.decompressobj()
    out: Image.Image | None = None
    above = tail = b""
    for y in range(0, height, rows):
        count = min(rows, height - y)
        filtered = b""
        while len(filtered) < count * stride:
            # Fed an IDAT at a time (what is left of one is all that is copied again).
            more = inflate.decompress(tail, count * stride - len(filtered))
            tail = inflate.unconsumed_tail
            if more:
                filtered += more
            elif tail or inflate.eof or not (tail := next(deflated, b"")):
                break
        if len(filtered) < count * stride:
            # Pixels that end early: the rows there are, the rest left blank, as Pillow
            # (and a browser) shows such a file read whole.
            count = len(filtered) // stride
            if not count:
                break
            filtered = filtered[: count * stride]
        head = width.to_bytes(4) + (count + bool(above)).to_bytes(4) + data[24:29]
        strip_png = b"".join(
            (PNG_SIGNATURE, _chunk(b"IHDR", head), palette)
            + (_chunk(b"IDAT", zlib.compress(above + filtered, 0)), _chunk(b"IEND", b""))
        )
        with Image.open(io.BytesIO(strip_png), formats=["PNG"]) as strip:
            strip.load()
            part = strip.crop((0, 1, width, count + 1)) if above else strip.copy()
        above = b"\0" + part.crop((0, count - 1, width, count)).tobytes("raw", rawmode)
        part = _working(part, mime)
        part = part if factor == 1 else part.reduce(factor)
        if out is None:
            out = Image.new(part.mode, (-(-width // factor), -(-height // factor)))
        out.paste(part, (0, y // factor))
    if out is None:
        raise ValueError("it holds no rows of pixels")
    if "icc_profile" in im.info:
        out.info["icc_profile"] = im.info["icc_profile"]
    exif = next((data[a + 8 : b - 4] for kind, a, b in chunks if kind == b"eXIf"), None)
    if exif is not None:
        out.info["exif"] = b"Exif\0\0" + exif
    return out


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4) + kind + body + zlib.crc32(kind + body).to_bytes(4)


def _encode(im: Image.Image, mime: str) -> tuple[bytes, tuple[int, int]]:
    """`im` (_decoded) upright, in sRGB, in its stored mode, encoded; scaled down
    further until it is at most MAX_IMAGE_BYTES."""
    im = _plain_mode(_srgb(_upright(im)), mime)
    size = im.size
    while True:
        out = im if im.size == size else im.resize(size, Image.Resampling.LANCZOS)
        encoded = _save(out, mime)
        if len(encoded) <= MAX_IMAGE_BYTES:
            return encoded, size
        size = (
            max(1, math.floor(size[0] * DOWNSCALE_STEP)),
            max(1, math.floor(size[1] * DOWNSCALE_STEP)),
        )


def _upright(im: Image.Image) -> Image.Image:
    """Turned as the camera's orientation tag says: the tag itself is dropped with the
    rest of the metadata, and the model would see a phone photo on its side."""
    return ImageOps.exif_transpose(im) or im


_SRGB = ImageCms.createProfile("sRGB")


def _srgb(im: Image.Image) -> Image.Image:
    """The pixels in sRGB: the colour profile goes with the metadata, and a wide-gamut
    photo (a phone's Display P3) would look washed out without it."""
    icc = im.info.get("icc_profile")
    if not icc or im.mode not in ("RGB", "RGBA"):
        return im
    try:
        source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        return ImageCms.profileToProfile(im, source, _SRGB, outputMode=im.mode) or im
    except (ImageCms.PyCMSError, OSError, ValueError):
        return im  # an unreadable profile: the pixels as they are


def _plain_mode(im: Image.Image, mime: str) -> Image.Image:
    """RGB, or L for grey; RGBA only for a PNG whose transparency is used."""
    if mime == PNG and (im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info):
        rgba = im.convert("RGBA")
        if rgba.getchannel("A").getextrema() != (255, 255):
            return rgba
        return rgba.convert("RGB")
    return im.convert("L") if im.mode in ("1", "L") else im.convert("RGB")


def _save(im: Image.Image, mime: str) -> bytes:
    out = io.BytesIO()
    if mime == PNG:
        im.save(out, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        im.save(out, "JPEG", quality=JPEG_QUALITY, subsampling="4:2:0", optimize=False)
    return out.getvalue()


def normalise_uploads(uploads: Sequence[Any]) -> list[Normalised]:
    """The normalised forms of a request's files (Django UploadedFiles), each checked
    for size before it is read; AttachmentError for the first one refused."""
    if not uploads:
        raise AttachmentError("Choose a file to attach.")
    if len(uploads) > MAX_FILES:
        raise AttachmentError(
            f"{len(uploads)} files at once; the most one message may carry is {MAX_FILES}."
        )
    out = []
    for upload in uploads:
        if upload.size > MAX_UPLOAD_BYTES:
            raise AttachmentError(
                f"{upload.name} is {human_bytes(upload.size)}; the most a file may be is "
                f"{human_bytes(MAX_UPLOAD_BYTES)}."
            )
        out.append(normalise(upload.read(), upload.name or ""))
    return out


# --- Storage ------------------------------------------------------------------------


def root() -> Path:
    return Path(settings.DATA_DIR) / "blobs"


def path_of(sha256: str) -> Path:
    return root() / sha256[:2] / sha256[2:4] / sha256


def _text_path(sha256: str) -> Path:
    return path_of(sha256).with_name(sha256 + ".txt")


def _thumb_path(sha256: str) -> Path:
    return path_of(sha256).with_name(sha256 + ".thumb")


def _write(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all: written to a temporary name beside it,
    flushed, then renamed over it."""
    # The owner's only, as the data dir is (0700): uploads are private.
    make_private(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, settings.DATA_FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def store(normalised: Normalised) -> Blob:
    """The Blob of `normalised`, its bytes on disk: the same row and file for the same
    bytes, however often it is stored. The row is locked while the file is checked, so
    `collect` never deletes a file a store is about to reuse."""
    n = normalised
    with transaction.atomic():
        blob, _ = Blob.objects.select_for_update().get_or_create(
            sha256=n.sha256,
            defaults={
                "mime": n.mime,
                "size": len(n.data),
                "width": n.width,
                "height": n.height,
                "pages": n.pages,
            },
        )
        if n.text is not None and not _text_path(n.sha256).exists():
            _write(_text_path(n.sha256), n.text.encode())
        if not path_of(n.sha256).exists():
            _write(path_of(n.sha256), n.data)
    return blob


def read(sha256: str) -> bytes | None:
    """A blob's bytes; None when they are gone (a wiped blob named by an imported tab)."""
    try:
        return path_of(sha256).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def text(sha256: str) -> str | None:
    """A PDF's extracted text; None when it is gone."""
    try:
        return _text_path(sha256).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None


class Reader:
    """The blob reader a request carries (chat.providers.base.BlobReader): files on disk,
    no database."""

    def data(self, sha256: str) -> bytes | None:
        return read(sha256)

    def text(self, sha256: str) -> str | None:
        return text(sha256)


READER = Reader()


def thumbnail(blob: Blob) -> Path | None:
    """The path of an image blob's thumbnail (THUMB_EDGE long edge, the blob's own type),
    made once and kept beside it; None for a blob that is no image or whose bytes are gone."""
    if blob.width is None or blob.mime not in (PNG, JPEG):
        return None
    path = _thumb_path(blob.sha256)
    if path.exists():
        return path
    data = read(blob.sha256)
    if data is None:
        return None
    with Image.open(io.BytesIO(data), formats=["PNG", "JPEG"]) as im:
        im.load()
        scale = min(1.0, THUMB_EDGE / max(im.size))
        size = (max(1, math.floor(im.width * scale)), max(1, math.floor(im.height * scale)))
        small = im if size == im.size else im.resize(size, Image.Resampling.LANCZOS)
        _write(path, _save(small, blob.mime))
    return path


# --- References and garbage ------------------------------------------------------------


def attach(tab_id: Any, blob: Blob, name: str, *, sent: bool) -> Attachment:
    """Record that a tab uses `blob`: an upload waiting in its composer (`sent=False`),
    or a file in its log."""
    return Attachment.objects.create(tab_id=tab_id, blob=blob, name=name, sent=sent)


def add_uploads(tab_id: Any, files: Iterable[Normalised]) -> list[str]:
    """Store `files` as uploads waiting in the tab's composer, all in one transaction;
    their `<sha256>:<name>` values, as the message form sends them to turns.submit."""
    files = list(files)
    with transaction.atomic():
        for n in files:
            attach(tab_id, store(n), n.name, sent=False)
    return [f"{n.sha256}:{n.name}" for n in files]


def owned(user: Any, sha256: str) -> bool:
    """Whether `user` may read blob `sha256`: one of their tabs uses it."""
    return Attachment.objects.filter(blob_id=sha256, tab__owner=user).exists()


def refs(owner_id: Any, values: Iterable[str]) -> list[dict[str, Any]]:
    """The attachment references of a message, from the composer's `<sha256>:<name>`
    values: each must be a blob one of the user's tabs uses (an upload of theirs). Raises
    AttachmentError (nothing is recorded) otherwise, or when there are too many."""
    values = list(values)
    if len(values) > MAX_FILES:
        raise AttachmentError(
            f"{len(values)} files attached; the most one message may carry is {MAX_FILES}."
        )
    wanted: list[tuple[str, str]] = []
    for value in values:
        sha, sep, name = value.partition(":")
        if not sep or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise AttachmentError(f"{value[:80]!r} is not an attachment of this app.")
        wanted.append((sha, name))
    blobs = {
        b.sha256: b
        for b in Blob.objects.filter(
            sha256__in=[sha for sha, _ in wanted], attachments__tab__owner_id=owner_id
        ).distinct()
    }
    out = []
    for sha, name in wanted:
        blob = blobs.get(sha)
        if blob is None:
            raise AttachmentError(
                "An attached file is no longer stored (or is not yours): attach it again."
            )
        out.append(
            reference(sha, stored_name(check_name(name), blob.mime), blob.mime, blob.size, blob)
        )
    return out


def adopt(tab_id: Any, owner_id: Any, refs: Iterable[Any]) -> None:
    """An imported tab uses the blobs its references name that one of its owner's tabs
    already uses (an export imported again here); transfer has replaced any other: a
    hash in a file is no proof of having had the file."""
    names = {
        ref["sha256"]: str(ref.get("name") or "attachment")
        for ref in refs
        if isinstance(ref, dict) and isinstance(ref.get("sha256"), str)
    }
    Attachment.objects.bulk_create(
        Attachment(tab_id=tab_id, blob_id=sha, name=names[sha], sent=True)
        for sha in owned_of(owner_id, names)
    )


def owned_of(owner_id: Any, shas: Iterable[str]) -> set[str]:
    """Those of `shas` that are blobs one of the user's tabs uses."""
    return set(
        Blob.objects.filter(sha256__in=list(shas), attachments__tab__owner_id=owner_id)
        .values_list("sha256", flat=True)
        .distinct()
    )


def mark_sent(tab_id: Any, attachments: Iterable[dict[str, Any]]) -> None:
    """The tab's log uses these blobs now: their rows stay while the tab does."""
    for ref in attachments:
        row = Attachment.objects.filter(tab_id=tab_id, blob_id=ref["sha256"], sent=False).first()
        if row is not None:
            Attachment.objects.filter(pk=row.pk).update(sent=True, name=ref["name"])
        else:
            Attachment.objects.create(
                tab_id=tab_id, blob_id=ref["sha256"], name=ref["name"], sent=True
            )


def copy_refs(from_tab: Any, to_tab: Any) -> None:
    """A branch uses the blobs its parent's log used: deleting the parent must not take
    them from it."""
    Attachment.objects.bulk_create(
        Attachment(tab_id=to_tab, blob_id=sha, name=name, sent=True)
        for sha, name in Attachment.objects.filter(tab_id=from_tab, sent=True).values_list(
            "blob_id", "name"
        )
    )


@dataclass(frozen=True)
class Garbage:
    count: int
    bytes: int


def garbage() -> Garbage:
    """What `collect` would delete now."""
    rows = _unused()
    return Garbage(rows.count(), rows.aggregate(n=Sum("size"))["n"] or 0)


def stored_bytes() -> int:
    """The bytes of every stored blob."""
    return Blob.objects.aggregate(n=Sum("size"))["n"] or 0


def _unused():
    return Blob.objects.filter(attachments__isnull=True)


def collect() -> Garbage:
    """Delete composer uploads older than PENDING_TTL, then every blob no tab uses (its
    row, then its files). Each blob is deleted under its row lock, rechecked, so a
    `store` of the same bytes waits for it and then writes the file again."""
    Attachment.objects.filter(sent=False, created_at__lt=timezone.now() - PENDING_TTL).delete()
    count = size = 0
    for sha in list(_unused().values_list("sha256", flat=True)):
        with transaction.atomic():
            blob = (
                Blob.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(sha256=sha, attachments__isnull=True)
                .first()
            )
            if blob is None:
                continue
            # Files first, while the row is locked: a crash between leaves a row
            # without bytes (read() says so), never bytes no row accounts for.
            remove_files(sha)
            blob.delete()
        count += 1
        size += blob.size
    return Garbage(count, size)


def remove_files(sha256: str) -> None:
    for path in (path_of(sha256), _text_path(sha256), _thumb_path(sha256)):
        path.unlink(missing_ok=True)


def remove_all_files() -> None:
    """Every blob's files (the wipe of the whole history, whose rows are gone)."""
    shutil.rmtree(root(), ignore_errors=True)


# --- The workspace ------------------------------------------------------------------------


def place(workspace: Path, ref: dict[str, Any]) -> None:
    """Copy an attachment of a message into the workspace at its upload_path (unless it
    is there): a model that cannot take the file is told where its tools find it, and
    any model's tools can work on it. The model's tools write the workspace too, so each
    directory on the way is made or opened under its parent's descriptor without
    following a link, and the file is written under the last one's: a link anywhere on
    the way is refused before anything is made beyond it."""
    *folders, name = upload_path(ref["sha256"], ref["name"]).split("/")
    try:
        root = Path(workspace)
        make_private(root)
        here = os.open(root.resolve(), _DIR_FLAGS)
    except OSError:
        logger.warning("could not place %s: no workspace at %s", name, workspace, exc_info=True)
        return
    try:
        for folder in folders:
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o755, dir_fd=here)
            inner = os.open(folder, _DIR_FLAGS, dir_fd=here)
            os.close(here)
            here = inner
        try:
            os.stat(name, dir_fd=here, follow_symlinks=False)
            return  # placed before (or something the model put there: left alone)
        except FileNotFoundError:
            pass
        data = read(ref["sha256"])
        if data is not None:
            _write_at(here, name, data)
    except OSError:
        # A link on the way gives ELOOP or ENOTDIR.
        logger.warning(
            "not placing %s in the workspace (a link on the way?)", "/".join(folders), exc_info=True
        )
    finally:
        os.close(here)


# Directories are opened without following a link, and never leak into a child process.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_at(folder: int, name: str, data: bytes) -> None:
    """`data` as `name` in the directory open as `folder`, whole or not at all."""
    tmp = f".{secrets.token_hex(8)}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=folder,
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
