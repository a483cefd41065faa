"""Tabs: the home redirect, a new tab, and what the tab menu changes (title, system
prompt, model) or deletes.
"""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from chat import blobs, log, preferences, sidebar, turns
from chat.chunks import SystemKind
from chat.forms import NewTabForm, RenameForm, TabModelForm, TabSystemPromptForm
from chat.tools.workdir import BadWorkdir
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


@login_required
@require_GET
def home(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The most recently active conversation; with none, the new tab waiting unsent (it
    has no sidebar entry), else the page that offers one."""
    tabs = common.sidebar_tabs(request)
    waiting = tabs[0] if tabs else sidebar.unsent(request.user).first()
    if waiting is not None:
        return redirect("tab", tab_id=waiting.id)
    return render(request, "chat/home.html", {"tabs": tabs})


@login_required
@require_http_methods(["GET", "POST"])
def tab_new(request: AuthenticatedHttpRequest) -> HttpResponse:
    """A new tab: the sidebar's button posts nothing (the Settings page's defaults);
    GET is the form with a profile and a working directory.

    A tab never sent to has no sidebar entry (chat.sidebar.kept): a new tab asked for
    while one with the same profile and folder waits unsent is that one, its draft
    and model kept, so empty tabs never pile up."""
    form = NewTabForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        waiting = (
            sidebar.unsent(request.user)
            .filter(profile=form.cleaned_data["profile"])
            .filter(workdir=form.cleaned_data["workdir"])
            .first()
        )
        if waiting is not None:
            return redirect("tab", tab_id=waiting.id)
        try:
            tab = preferences.new_tab(
                request.user,
                profile=form.cleaned_data["profile"],
                workdir=form.cleaned_data["workdir"],
            )
        except BadWorkdir as exc:  # the folder could not be made, or is a link
            form.add_error("workdir", str(exc))
        else:
            return redirect("tab", tab_id=tab.id)
    context = {"tabs": common.sidebar_tabs(request), "form": form}
    return render(request, "chat/tab_new.html", context, status=422 if form.errors else 200)


@login_required
@require_POST
def tab_rename(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = common.tab_for_user(request, tab_id)
    form = RenameForm(request.POST)
    if form.is_valid():
        tab.title = form.cleaned_data["title"].strip()
        tab.save(update_fields=["title", "updated_at"])
    else:
        common.form_errors(request, form)
    return redirect("tab", tab_id=tab.id)


@login_required
@require_POST
@common.tab_gone_is_404
def tab_system_prompt(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """A new tab's own system prompt: saved until its first message, refused after."""
    tab = common.tab_for_user(request, tab_id)
    form = TabSystemPromptForm(request.POST)
    if not form.is_valid():
        common.form_errors(request, form)
    else:
        try:
            turns.set_system_prompt(tab, form.cleaned_data["system_prompt"].strip())
        except ValueError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, "Saved this tab's system prompt.")
    return redirect("tab", tab_id=tab.id)


@login_required
@require_http_methods(["GET", "POST"])
def tab_delete(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = common.tab_for_user(request, tab_id)
    if request.method == "POST":
        # A running turn must stop writing before its tab goes.
        turns.cancel(tab.id)
        title = str(tab)
        tab.delete()
        blobs.collect()
        messages.success(request, f"Deleted “{title}”.")
        return redirect("home")
    return render(
        request,
        "chat/tab_delete.html",
        {
            "tab": tab,
            "tabs": common.sidebar_tabs(request),
            "current_tab": tab,
            "chunk_count": log.count(tab.id),
        },
    )


@login_required
@require_POST
def tab_model(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = common.tab_for_user(request, tab_id)
    form = TabModelForm(request.POST, current=tab.model)
    if form.is_valid():
        previous, tab.model = tab.model, form.cleaned_data["model"]
        tab.save(update_fields=["model", "updated_at"])
        if tab.model != previous:
            turns.notice(
                tab.id, SystemKind.MODEL_CHANGED, f"Model changed from {previous} to {tab.model}."
            )
    else:
        common.form_errors(request, form)
    return redirect("tab", tab_id=tab.id)
