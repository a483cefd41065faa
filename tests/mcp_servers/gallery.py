"""tools.py's server with one more tool, `gallery`: a result of several blocks whose
images are good, hostile and damaged (tests/test_mcp_images.py). Served over streamable
HTTP: `python tests/mcp_servers/gallery.py http [PORT]`."""

from __future__ import annotations

import struct
import zlib

from tools import Image, serve_http, server


def _chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def _png(rgb: bytes, *, before_pixels: bytes = b"", pixels_crc: int | None = None) -> bytes:
    """A 1x1 PNG of colour `rgb`, with chunks before its pixels and a checksum for them."""
    header = _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    pixels = _chunk(b"IDAT", zlib.compress(b"\0" + rgb), pixels_crc)
    return b"\x89PNG\r\n\x1a\n" + header + before_pixels + pixels + _chunk(b"IEND", b"")


@server.tool()
def gallery() -> list[str | Image]:
    """Text, three images and text: a green pixel whose colour profile's checksum is
    wrong (browsers show it, as server-everything's tiny image), a damaged one (its
    pixels' checksum is wrong) and a blue one."""
    profile = _chunk(b"iCCP", b"p\0\0" + zlib.compress(b"not a profile"), crc=0)
    return [
        "before",
        Image(data=_png(b"\0\xff\0", before_pixels=profile), format="png"),
        Image(data=_png(b"\xff\0\0", pixels_crc=0), format="png"),
        Image(data=_png(b"\0\0\xff"), format="png"),
        "after",
    ]


if __name__ == "__main__":
    serve_http()
