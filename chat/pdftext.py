"""Reading an uploaded PDF with pypdf, in a process of its own (chat.blobs runs this file
as a script): its page count, whether it is encrypted, and its text.

pypdf's text extraction is slow (about 10 µs a byte of a page's drawing instructions) and
does its work again for every page that draws a shared stream, so a small file can cost
hours of CPU. Here it is bounded three ways: the decoded drawing instructions of all pages
together (a stream counted once per page that draws it, all measured before any is read),
the text kept, and, for whatever else a file can make pypdf do (fonts, forms), the CPU time
and memory of this process. The server's own process never parses the PDF, so neither its
event loop nor its memory is touched by one.

Usage: python -I pdftext.py MAX_PAGES MAX_CONTENT_BYTES MAX_TEXT_CHARS CPU_SECONDS < file.pdf
Prints one JSON object: {"pages", "text"} for a PDF that was read, or {"refused": what,
...} for one that was not.
"""

from __future__ import annotations

import io
import json
import resource
import sys
import warnings

import pypdf
from pypdf.errors import LimitReachedError

# The memory this process may map: pypdf's own per-stream caps are 75 MB.
MAX_MEMORY_BYTES = 1024 * 1024 * 1024


def read(data: bytes, max_pages: int, max_content: int, max_chars: int) -> dict:
    reader = pypdf.PdfReader(io.BytesIO(data))
    if reader.is_encrypted:
        return {"refused": "encrypted"}
    pages = len(reader.pages)
    if pages > max_pages:
        return {"refused": "pages", "pages": pages}
    # Decoding is fast, parsing is not: every page is measured before any is read.
    content = 0
    for page in reader.pages:
        drawn = page.get_contents()
        content += len(drawn.get_data()) if drawn is not None else 0
        if content > max_content:
            return {"refused": "content"}
    texts: list[str] = []
    chars = 0
    for page in reader.pages:
        if chars >= max_chars:
            break
        text = (page.extract_text() or "").strip()
        texts.append(text[: max_chars - chars])
        chars += len(text)
    return {"pages": pages, "text": "\n\n".join(texts).strip()}


def main() -> None:
    max_pages, max_content, max_chars, cpu_seconds = map(int, sys.argv[1:5])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (MAX_MEMORY_BYTES, MAX_MEMORY_BYTES))
    data = sys.stdin.buffer.read()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = read(data, max_pages, max_content, max_chars)
    except LimitReachedError as exc:
        out = {"refused": "limit", "reason": str(exc)}
    except MemoryError:
        out = {"refused": "memory"}
    except Exception as exc:  # pypdf raises many kinds on a damaged file
        out = {"refused": "damaged", "reason": str(exc), "kind": type(exc).__name__}
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
