"""A chunk's actions (the `acts` partial of chat/tab.html): branch, edit, regenerate and
retry make a new branch (see ARCHITECTURE.md, "Branches and continue"); continue and
compact run in the tab itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from chat import turns
from chat.models import Tab
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


def _branch_view(
    request: AuthenticatedHttpRequest,
    tab_id: uuid.UUID,
    make: Callable[[Tab, int], turns.Branched],
) -> HttpResponse:
    """A branch made from the chunk `seq` of the tab: the page goes to it. A cut that
    cannot be made says why where the composer shows its errors, and changes nothing.
    The same branch asked for twice (a double click) is the one made the first time."""
    tab = common.tab_for_user(request, tab_id)
    try:
        seq = int(request.POST.get("seq", ""))
    except ValueError:
        return HttpResponseBadRequest("seq= must be a chunk seq (a whole number).")
    try:
        branched = make(tab, seq)
    except ValueError as exc:  # turns.CutError, with its message for the user
        return common.composer_error(request, tab, str(exc), 422)
    url = reverse("tab", kwargs={"tab_id": branched.tab.id})
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    return redirect(url)


@login_required
@require_POST
@common.tab_gone_is_404
def tab_branch(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """A new tab with this one's log up to and including `seq`."""
    return _branch_view(request, tab_id, turns.branch)


@login_required
@require_POST
@common.tab_gone_is_404
def tab_edit(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Edit the user's message `seq`: a branch right before it, its text in the composer."""
    return _branch_view(request, tab_id, turns.edit)


@login_required
@require_POST
@common.tab_gone_is_404
def tab_regenerate(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Answer again the question of the turn chunk `seq` is in, in a new branch."""
    return _branch_view(request, tab_id, turns.regenerate)


@login_required
@require_POST
@common.tab_gone_is_404
def tab_retry(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Try again after the error chunk `seq`, in a new branch."""
    return _branch_view(request, tab_id, turns.retry)


@login_required
@require_POST
@common.tab_gone_is_404
def tab_continue(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Continue the tab's interrupted last turn, here: the new turn shows over the socket."""
    tab = common.tab_for_user(request, tab_id)
    try:
        turns.continue_turn(tab)
    except ValueError as exc:
        return common.composer_error(request, tab, str(exc), 422)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(render_to_string("chat/tab.html#composer_error", {"error": ""}))


@login_required
@require_POST
@common.tab_gone_is_404
def tab_compact(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Compact the tab's context: through the turn of chunk `seq` ("summarise up to
    here"), or everything; it runs when no turn does, and shows over the socket."""
    tab = common.tab_for_user(request, tab_id)
    raw = request.POST.get("seq", "").strip()
    try:
        through = int(raw) if raw else None
    except ValueError:
        return common.composer_error(request, tab, f"Not a chunk number: {raw[:40]!r}.", 422)
    try:
        turns.compact(tab, through=through, instructions=request.POST.get("instructions", ""))
    except ValueError as exc:
        return common.composer_error(request, tab, str(exc), 422)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(render_to_string("chat/tab.html#composer_error", {"error": ""}))
