"""API tokens: every signed-in user's own page, not a Settings section (Settings is
staff-only, and a token only ever acts as the user who made it).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from chat.models import ApiToken
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest

# ApiToken.name's column.
API_TOKEN_NAME_MAX_CHARS = 100


@login_required
@require_http_methods(["GET", "POST"])
def api_tokens_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """List, and create, the user's own API tokens."""
    if request.method != "POST":
        return _api_tokens_page(request)
    name = request.POST.get("name", "").strip()
    if not name:
        error = "Give the token a name, so you can tell it apart when you revoke it."
        return _api_tokens_page(request, error=error, status=422)
    if len(name) > API_TOKEN_NAME_MAX_CHARS:
        error = f"A token's name has at most {API_TOKEN_NAME_MAX_CHARS} characters."
        return _api_tokens_page(request, error=error, name=name, status=422)
    read_only = request.POST.get("read_only") == "on"
    # Rendered, not redirected: the plain token must not pass through the messages
    # cookie or the session, and is shown this once.
    _, new_token = ApiToken.issue(request.user, name=name, read_only=read_only)
    return _api_tokens_page(request, new_token=new_token)


@login_required
@require_POST
def api_token_revoke(request: AuthenticatedHttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the user's own API tokens: the row goes, and the token with it."""
    token = ApiToken.objects.filter(pk=token_id, user=request.user).first()
    if token is None:
        # Another user's token looks exactly like one that never existed.
        error = "There is no such API token of yours; it may already have been revoked."
        return _api_tokens_page(request, error=error, status=404)
    token.delete()
    messages.success(request, f"Revoked the API token {token.prefix}….")
    return redirect(reverse("api_tokens"))


def _api_tokens_page(
    request: AuthenticatedHttpRequest,
    *,
    new_token: str = "",
    error: str = "",
    name: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "tabs": common.sidebar_tabs(request),
        "api_tokens": ApiToken.objects.filter(user=request.user),
        "new_token": new_token,
        "token_error": error,
        "name": name,
        "name_max": API_TOKEN_NAME_MAX_CHARS,
    }
    return render(request, "chat/api_tokens.html", context, status=status)
