"""A tab's export (JSONL, Markdown) and the import of a JSONL export as a new tab."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods

from chat import transfer
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


@login_required
@require_GET
def tab_export(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponseBase:
    """The tab as a download: ?format=jsonl (lossless, importable) or markdown."""
    tab = common.tab_for_user(request, tab_id)
    fmt = request.GET.get("format", "jsonl")
    if fmt not in transfer.FORMATS:
        return HttpResponseBadRequest(f"Unknown export format {fmt!r}: use jsonl or markdown.")
    return transfer.export_response(tab, fmt)


@login_required
@require_http_methods(["GET", "POST"])
@csrf_exempt
def tab_import(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Upload a JSONL export as a new tab.

    The size is checked before anything reads the body, which is why the CSRF
    check (it parses the upload) comes after, in _tab_import.
    """
    if request.method == "POST" and transfer.declared_too_large(request, multipart=True):
        error = transfer.ImportTooLarge(transfer.IMPORT_MAX_BYTES)
        return _import_page(request, f"Not imported: {error}.", status=413)
    return _tab_import(request)


@csrf_protect
def _tab_import(request: AuthenticatedHttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _import_page(request, "")
    upload = request.FILES.get("file")
    if upload is None:
        return _import_page(request, "Choose a .jsonl file exported from Dispatch.", status=400)
    try:
        tab = transfer.import_jsonl(request.user, upload)
    except transfer.ImportRefused as exc:
        status = 413 if isinstance(exc, transfer.ImportTooLarge) else 400
        return _import_page(request, f"Not imported: {exc}.", status=status)
    messages.success(request, f"Imported {upload.name} as a new tab.")
    return redirect("tab", tab_id=tab.id)


def _import_page(request: AuthenticatedHttpRequest, error: str, status: int = 200) -> HttpResponse:
    context = {
        "tabs": common.sidebar_tabs(request),
        "error": error,
        "max_mb": transfer.IMPORT_MAX_BYTES // (1024 * 1024),
    }
    return render(request, "chat/tab_import.html", context, status=status)
