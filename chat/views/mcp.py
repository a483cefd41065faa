"""MCP servers, a section of Settings: which server a form edits, removing and testing
one. Staff see them; only superusers change them (a stdio server is a program run
on this machine).
"""

from __future__ import annotations

from asgiref.sync import async_to_sync
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from chat.models import McpServer
from chat.tools import mcp
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest


def require_superuser(request: AuthenticatedHttpRequest) -> None:
    # A stdio server is a program run on this machine: other staff only see the servers.
    if not request.user.is_superuser:
        raise PermissionDenied("Only superusers can add, change or remove MCP servers.")


def edited_server(server_id: str | None) -> McpServer | None:
    """The MCP server a Settings form edits (?mcp=<id>, or the form's `server`)."""
    if not server_id:
        return None
    if not server_id.isdigit():
        raise Http404("No such MCP server.")
    return get_object_or_404(McpServer, pk=int(server_id))


@login_required
@require_POST
def mcp_server_delete(request: AuthenticatedHttpRequest, server_id: int) -> HttpResponse:
    common.require_staff(request)
    require_superuser(request)
    server = get_object_or_404(McpServer, pk=server_id)
    server.delete()
    messages.success(request, f"Removed the MCP server {server.name}.")
    return redirect(reverse("settings_section", args=["tools"]) + "#mcp")


@login_required
@require_POST
def mcp_server_test(request: AuthenticatedHttpRequest, server_id: int) -> HttpResponse:
    """Connect to the server as saved (enabled or not), list its tools, disconnect; one
    that mounts the workspace mounts the tester's, as a tab of theirs would."""
    common.require_staff(request)
    server = get_object_or_404(McpServer, pk=server_id)
    config = mcp.ServerConfig.from_row(server)
    names, problems = async_to_sync(mcp.test)(config, request.user.pk)
    for problem in problems:
        messages.error(request, problem)
    if names:
        messages.success(
            request, f"Server {server.name} offers {len(names)} tools: {', '.join(names)}."
        )
    elif not problems:
        messages.warning(request, f"Server {server.name} answered, offering no tools.")
    # The page's top, where messages show.
    return redirect("settings_section", section="tools")
