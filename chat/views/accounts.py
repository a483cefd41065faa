"""Accounts: the first run's owner setup, signing in and out."""

from __future__ import annotations

from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render

from chat.forms import OwnerForm
from chat.models import Setting

# The row whose lock makes "no user yet, create the owner" one step across processes.
SETUP_LOCK_KEY = "owner_setup"


def setup(request: HttpRequest) -> HttpResponse:
    """First run: create the owner account. Gone once any user exists."""
    User = get_user_model()
    if User.objects.exists():
        return redirect("login")
    form = OwnerForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            lock, _ = Setting.objects.get_or_create(key=SETUP_LOCK_KEY, defaults={"value": True})
            Setting.objects.select_for_update().filter(pk=lock.pk).get()
            if User.objects.exists():
                # Someone else finished the form first.
                return redirect("login")
            user = form.save(commit=False)
            user.is_staff = True
            user.is_superuser = True
            user.save()
        # Named: with axes' backend first there are two, and only this one logs in.
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return redirect("home")
    return render(request, "chat/setup.html", {"form": form})


def login_view(request: HttpRequest) -> HttpResponseBase:
    if not get_user_model().objects.exists():
        return redirect("setup")
    return auth_views.LoginView.as_view(
        template_name="chat/login.html", redirect_authenticated_user=True
    )(request)


logout_view = auth_views.LogoutView.as_view()
