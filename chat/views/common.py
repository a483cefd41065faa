"""Helpers every surface's views share: the tab lookup (always with its owner), the
sidebar, the staff check, and how a form's or a tab action's error is shown.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string

from chat import sidebar
from chat.models import Tab


class AuthenticatedHttpRequest(HttpRequest):
    """A request past @login_required: its user is signed in, a User (for the type
    checker; django-stubs types `request.user` as possibly anonymous)."""

    user: User


def tab_for_user(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> Tab:
    return get_object_or_404(Tab, pk=tab_id, owner=request.user)


def tab_gone_is_404(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A tab deleted while the request ran (found, then gone when turns locks it) is a
    404, as if it had been gone from the start, not a server error."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except Tab.DoesNotExist:
            raise Http404("That tab was deleted.") from None

    return wrapper


def sidebar_tabs(request: AuthenticatedHttpRequest) -> list[Tab]:
    return sidebar.tabs(request.user)


def require_staff(request: AuthenticatedHttpRequest) -> None:
    # Settings hold every user's API keys: only the install's staff may see them.
    if not request.user.is_staff:
        raise PermissionDenied("Only staff can change the settings.")


def form_errors(request: HttpRequest, form: Any) -> None:
    for errors in form.errors.values():
        for error in errors:
            messages.error(request, error)


def composer_error(request: HttpRequest, tab: Tab, error: str, status: int) -> HttpResponse:
    if not getattr(request, "htmx", False):
        messages.error(request, error)
        return redirect("tab", tab_id=tab.id)
    html = render_to_string("chat/tab.html#composer_error", {"error": error})
    return HttpResponse(html, status=status)
