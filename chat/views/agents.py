"""External agents, a section of Settings (chat.acp): which agent a form edits and
removing one. Staff see them; only superusers change them (an agent's command is a
program run on this machine).
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from chat.models import AcpAgent
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


def require_superuser(request: AuthenticatedHttpRequest) -> None:
    if not request.user.is_superuser:
        raise PermissionDenied("Only superusers can add, change or remove external agents.")


def edited_agent(agent_id: str | None) -> AcpAgent | None:
    """The agent a Settings form edits (?agent=<id>, or the form's `agent`)."""
    if not agent_id:
        return None
    if not agent_id.isdigit():
        raise Http404("No such agent.")
    return get_object_or_404(AcpAgent, pk=int(agent_id))


@login_required
@require_POST
def agent_delete(request: AuthenticatedHttpRequest, agent_id: int) -> HttpResponse:
    common.require_staff(request)
    require_superuser(request)
    agent = get_object_or_404(AcpAgent, pk=agent_id)
    agent.delete()
    messages.success(request, f"Removed the agent {agent.name}.")
    return redirect(reverse("settings_section", args=["models"]) + "#agents")
