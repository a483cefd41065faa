"""The sidebar's full-text search."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.timesince import timesince
from django.views.decorators.http import require_GET

from chat import search
from chat.models import Tab
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
            hits = one_per_conversation(search.search(request.user, q, limit=search.MAX_LIMIT))
            context["hits"] = [
                {"hit": hit, "when": when(hit.created_at)} for hit in hits[: search.DEFAULT_LIMIT]
            ]
        except search.SearchError as exc:
            context["search_error"] = str(exc)
            status = 422
    if getattr(request, "htmx", False):
        return render(request, "chat/_search_results.html", context, status=status)
    context["tabs"] = common.sidebar_tabs(request)
    return render(request, "chat/app.html", context, status=status)


def one_per_conversation(hits: list[search.Hit]) -> list[search.Hit]:
    """A chunk once, however many versions of its conversation copy it (a branch copies
    its parent's chunks whole: same seq, same created_at): the newest copy, which is in
    the newest version (hits come newest first)."""
    conversations = dict(
        Tab.objects.filter(pk__in={hit.tab_id for hit in hits}).values_list("pk", "conversation")
    )
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for hit in hits:
        key = (conversations.get(hit.tab_id, hit.tab_id), hit.seq, hit.created_at)
        if key not in seen:
            seen.add(key)
            kept.append(hit)
    return kept


# Younger than this, a hit's chunk was written "just now" (timesince says "0 minutes").
JUST_NOW_SECONDS = 60


def when(at: datetime | None) -> str:
    """How long ago a hit's chunk was written, in words ("" when unknown)."""
    if at is None:
        return ""
    if (timezone.now() - at).total_seconds() < JUST_NOW_SECONDS:
        return "just now"
    return f"{timesince(at, depth=1)} ago"
