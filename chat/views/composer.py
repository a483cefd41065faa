"""The composer: sending a message (or a /compact command) and stopping the turn."""

from __future__ import annotations

import uuid

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from chat import turns
from chat.forms import MessageForm
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


@login_required
@require_POST
@common.tab_gone_is_404
def tab_send(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = common.tab_for_user(request, tab_id)
    form = MessageForm(request.POST)
    if not form.is_valid():
        return common.composer_error(request, tab, str(form.errors["text"][0]), 422)
    untitled = not tab.title
    text = form.cleaned_data["text"]
    try:
        if (focus := turns.compact_command(text)) is not None:
            turns.compact(tab, instructions=focus)
        else:
            turns.submit(tab, text, attachments=request.POST.getlist("attachment"))
    except ValueError as exc:
        return common.composer_error(request, tab, str(exc), 422)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    # The message itself shows up over the socket (queued, then in the log): this
    # response clears the error, and shows the title the first message gave the tab.
    context = {"error": "", "tab": tab, "retitled": untitled and bool(tab.title)}
    return HttpResponse(render_to_string("chat/tab.html#sent", context))


@login_required
@require_POST
def tab_stop(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = common.tab_for_user(request, tab_id)
    try:
        turn_id = uuid.UUID(request.POST["turn"]) if request.POST.get("turn") else None
    except ValueError:
        return HttpResponseBadRequest("Not a turn id.")
    turns.cancel(tab.id, turn_id)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(status=204)
