"""The user's permission rules: every signed-in user's own page, like API tokens (a
user's rules decide their own tabs' calls).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from chat import rules
from chat.models import PermissionRule
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


@login_required
@require_http_methods(["GET", "POST"])
def rules_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    """List the user's permission rules, and add one (a bad pattern is refused, saying why)."""
    if request.method != "POST":
        return _rules_page(request)
    action, pattern = request.POST.get("action", ""), request.POST.get("pattern", "")
    try:
        rule = rules.parse(action, pattern)
    except rules.RuleError as exc:
        return _rules_page(request, error=str(exc), action=action, pattern=pattern, status=422)
    PermissionRule.objects.create(user=request.user, action=rule.action, pattern=rule.pattern)
    messages.success(request, f"Added the rule {rule.action} `{rule.pattern}`.")
    return redirect(reverse("permission_rules"))


@login_required
@require_POST
def rule_delete(request: AuthenticatedHttpRequest, rule_id: int) -> HttpResponse:
    rule = PermissionRule.objects.filter(pk=rule_id, user=request.user).first()
    if rule is None:
        # Another user's rule looks exactly like one that never existed.
        error = "There is no such rule of yours; it may already have been removed."
        return _rules_page(request, error=error, status=404)
    rule.delete()
    messages.success(request, f"Removed the rule {rule.action} `{rule.pattern}`.")
    return redirect(reverse("permission_rules"))


def _rules_page(
    request: AuthenticatedHttpRequest,
    *,
    error: str = "",
    action: str = rules.ALLOW,
    pattern: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "tabs": common.sidebar_tabs(request),
        "rules": PermissionRule.objects.filter(user=request.user),
        "actions": rules.ACTIONS,
        "rule_error": error,
        "action": action,
        "pattern": pattern,
        "pattern_max": rules.MAX_PATTERN_CHARS,
    }
    return render(request, "chat/rules.html", context, status=status)
