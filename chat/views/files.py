"""Files: the composer's uploads, attachments' bytes and thumbnails (owner-checked), and
a tool output's plain-text view.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import (
    Http404,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.utils.http import content_disposition_header
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_POST

from chat import blobs
from chat import render as chat_render
from chat.chunks import Kind
from chat.models import Attachment, Blob, Chunk, Tab
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest

# A tool output's plain-text view goes out in pieces of this many characters: an
# imported log may hold a huge one, which is then never encoded whole at once.
OUTPUT_PIECE_CHARS = 64 * 1024


@login_required
@require_POST
@csrf_exempt
def tab_attachments(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Files for the composer (multipart, field `file`, several allowed): each checked
    and normalised, then all stored, or none (400, one line of plain text saying why).
    The answer is one tray item per file (chat/_attachment.html), whose hidden input
    the message form sends. The size is checked before the body is read, which is why
    the CSRF check (it reads the body) comes after, in _tab_attachments."""
    tab = common.tab_for_user(request, tab_id)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > blobs.MAX_REQUEST_BYTES:
        return _refused(
            f"Too much at once: at most {blobs.MAX_FILES} files of "
            f"{blobs.human_bytes(blobs.MAX_UPLOAD_BYTES)} each."
        )
    return _tab_attachments(request, tab)


@csrf_protect
def _tab_attachments(request: AuthenticatedHttpRequest, tab: Tab) -> HttpResponse:
    try:
        files = blobs.normalise_uploads(request.FILES.getlist("file"))
    except blobs.AttachmentError as exc:
        return _refused(str(exc))
    blobs.add_uploads(tab.pk, files)
    html = "".join(render_to_string("chat/_attachment.html", {"a": _tray_item(n)}) for n in files)
    return HttpResponse(html)


def _tray_item(n: blobs.Normalised) -> dict[str, Any]:
    return {
        "sha256": n.sha256,
        "name": n.name,
        "mime": n.mime,
        "size": len(n.data),
        "width": n.width,
        "height": n.height,
    }


def _refused(message: str) -> HttpResponse:
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


# The only types a blob is served as inline: what chat.blobs stores images as. Anything
# else (a PDF) is a download, never rendered by the browser on this origin.
INLINE_TYPES = frozenset({blobs.PNG, blobs.JPEG})


# A blob never changes (its address is its hash): a browser may keep it, but only for
# this user (it is owner-checked).
BLOB_CACHE_CONTROL = "private, max-age=31536000, immutable"


# Nothing a blob holds may run or load anything, even if a browser took it for a page.
BLOB_CSP = "default-src 'none'; img-src 'self'; sandbox"


@login_required
@require_GET
def blob(request: AuthenticatedHttpRequest, sha256: str) -> HttpResponse:
    """An attachment's bytes, for a user one of whose tabs uses it (else 404): an image
    inline, anything else as a download under its name."""
    row, name = _owned_blob(request, sha256)
    data = blobs.read(row.sha256)
    if data is None:
        raise Http404("That file is no longer stored.")
    response = HttpResponse(data, content_type=row.mime)
    as_download = row.mime not in INLINE_TYPES
    response["Content-Disposition"] = content_disposition_header(as_download, name) or "inline"
    return _blob_headers(response)


@login_required
@require_GET
def blob_thumb(request: AuthenticatedHttpRequest, sha256: str) -> HttpResponse:
    """An image attachment's thumbnail (chat.blobs.thumbnail), owner-checked as `blob`."""
    row, _ = _owned_blob(request, sha256)
    path = blobs.thumbnail(row)
    if path is None:
        raise Http404("That file has no thumbnail.")
    return _blob_headers(HttpResponse(path.read_bytes(), content_type=row.mime))


def _owned_blob(request: AuthenticatedHttpRequest, sha256: str) -> tuple[Blob, str]:
    """The blob and the name the user gave it; 404 unless one of their tabs uses it."""
    use = (
        Attachment.objects.filter(blob_id=sha256, tab__owner=request.user)
        .select_related("blob")
        .order_by("-sent", "id")
        .first()
    )
    if use is None:
        raise Http404("No such file.")
    return use.blob, use.name


def _blob_headers(response: HttpResponse) -> HttpResponse:
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = BLOB_CACHE_CONTROL
    response["Content-Security-Policy"] = BLOB_CSP
    return response


@login_required
@require_GET
def tab_chunk_output(
    request: AuthenticatedHttpRequest, tab_id: uuid.UUID, seq: int
) -> StreamingHttpResponse:
    """A tool result's output as plain text, whole: its card's "Full view" (the card's
    box scrolls). The tab's owner's only; any other chunk is a 404. nosniff: the output
    is whatever a command printed, and must never be taken for HTML."""
    chunk = get_object_or_404(
        Chunk, tab_id=tab_id, tab__owner=request.user, seq=seq, type=Kind.TOOL_RESULT
    )
    text = chat_render.output_text(chunk.data or {})
    response = StreamingHttpResponse(_pieces(text), content_type="text/plain; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = f'inline; filename="tool-output-{seq}.txt"'
    return response


async def _pieces(text: str) -> AsyncIterator[bytes]:
    # Async: Django reads a sync iterator whole under ASGI. "replace": always valid
    # UTF-8, even for a lone surrogate an imported log may hold.
    for start in range(0, len(text), OUTPUT_PIECE_CHARS):
        yield text[start : start + OUTPUT_PIECE_CHARS].encode("utf-8", "replace")
