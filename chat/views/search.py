"""The sidebar's full-text search."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from chat import search
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


@login_required
@require_GET
def search_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The sidebar's search: hits as a fragment (htmx), or the page with them in its sidebar."""
    q = request.GET.get("q", "")
    context: dict[str, Any] = {"q": q, "hits": [], "search_error": "", "searched": bool(q.strip())}
    status = 200
    if context["searched"]:
        try:
            context["hits"] = search.search(request.user, q)
        except search.SearchError as exc:
            context["search_error"] = str(exc)
            status = 422
    if getattr(request, "htmx", False):
        return render(request, "chat/app.html#search_results", context, status=status)
    context["tabs"] = common.sidebar_tabs(request)
    return render(request, "chat/app.html", context, status=status)
