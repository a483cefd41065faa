"""Profiles, staff only as the Settings page: a profile sets what every tab made from
it may do.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from chat.forms import OFFLINE_MODEL, ProfileForm, known_models
from chat.models import Profile
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


@login_required
@require_http_methods(["GET", "POST"])
def profile_edit(request: AuthenticatedHttpRequest, profile_id: int | None = None) -> HttpResponse:
    """Add a profile, or change one (tabs made from it keep their copy)."""
    common.require_staff(request)
    profile = get_object_or_404(Profile, pk=profile_id) if profile_id is not None else None
    form = ProfileForm(request.POST if request.method == "POST" else None, instance=profile)
    if form.is_valid():
        saved = form.save()
        messages.success(request, f"Saved the profile {saved.name}.")
        return redirect(reverse("settings_section", args=["profiles"]))
    context = {
        "tabs": common.sidebar_tabs(request),
        "form": form,
        "profile": profile,
        "models": known_models(),
        "offline_model": OFFLINE_MODEL,
    }
    return render(request, "chat/profile.html", context, status=422 if form.errors else 200)


@login_required
@require_POST
def profile_delete(request: AuthenticatedHttpRequest, profile_id: int) -> HttpResponse:
    common.require_staff(request)
    profile = get_object_or_404(Profile, pk=profile_id)
    profile.delete()
    messages.success(request, f"Deleted the profile {profile.name}; its tabs keep their copy.")
    return redirect(reverse("settings_section", args=["profiles"]))
