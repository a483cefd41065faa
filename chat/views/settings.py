"""The Settings page (staff only: it holds every user's API keys): preferences, API
keys, provider endpoints (superusers), MCP servers' forms, profiles' list, usage.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from chat import preferences, usage
from chat import render as chat_render
from chat.acp import config as acp_config
from chat.acp.seam import AgentConfig
from chat.forms import (
    OFFLINE_MODEL,
    AcpAgentForm,
    ApiKeyForm,
    EndpointForm,
    McpServerForm,
    SettingsForm,
    key_elsewhere_note,
    key_providers,
    known_models,
    masked_pairs,
)
from chat.models import AcpAgent, ApiKey, McpServer, Profile, ProviderEndpoint, UsageRecord
from chat.providers.registry import PROVIDERS, endpoint_now
from chat.tools import mcp, sandbox
from chat.views import agents, common
from chat.views.common import AuthenticatedHttpRequest
from chat.views.mcp import edited_server, require_superuser


@login_required
@require_http_methods(["GET", "POST"])
def settings_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    common.require_staff(request)
    period = request.GET.get("usage", usage.DEFAULT_PERIOD)
    if period not in usage.PERIODS:
        names = ", ".join(usage.PERIODS)
        return HttpResponseBadRequest(f"?usage= must be one of {names}, not {period!r}.")
    conf = preferences.load()
    settings_form = SettingsForm(initial=SettingsForm.initial_from(conf))
    key_form = ApiKeyForm()
    endpoint_form = EndpointForm()
    mcp_form = McpServerForm(instance=edited_server(request.GET.get("mcp")))
    agent_form = AcpAgentForm(instance=agents.edited_agent(request.GET.get("agent")))
    status = 200
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "settings":
            settings_form = SettingsForm(request.POST)
            if settings_form.is_valid():
                settings_form.save()
                messages.success(request, "Settings saved.")
                return redirect("settings")
        elif action == "key":
            key_form = ApiKeyForm(request.POST)
            if key_form.is_valid():
                row = key_form.save()
                messages.success(
                    request, f"Saved the {row.provider} key ({row.masked}) for {row.endpoint}."
                )
                return redirect("settings")
        elif action == "endpoint":
            _endpoint_superuser(request)
            endpoint_form = EndpointForm(request.POST)
            if endpoint_form.is_valid():
                note = endpoint_form.save()
                messages.success(
                    request, f"Saved the {endpoint_form.cleaned_data['provider']} endpoint."
                )
                if note:
                    messages.warning(request, note)
                return redirect("settings")
        elif action == "mcp":
            require_superuser(request)
            editing = edited_server(request.POST.get("server"))
            mcp_form = McpServerForm(request.POST, instance=editing)
            if mcp_form.is_valid():
                server = mcp_form.save()
                messages.success(request, f"Saved the MCP server {server.name}.")
                return redirect(reverse("settings") + "#mcp")
        elif action == "agent":
            agents.require_superuser(request)
            agent_form = AcpAgentForm(
                request.POST, instance=agents.edited_agent(request.POST.get("agent"))
            )
            if agent_form.is_valid():
                agent = agent_form.save()
                messages.success(request, f"Saved the agent {agent.name}: acp/{agent.name}.")
                return redirect(reverse("settings") + "#agents")
        else:
            return HttpResponseBadRequest("Unknown settings action.")
        status = 422
    forms = {
        "settings_form": settings_form,
        "key_form": key_form,
        "endpoint_form": endpoint_form,
        "mcp_form": mcp_form,
        "agent_form": agent_form,
    }
    return render(
        request, "chat/settings.html", _settings_page(request, period, forms), status=status
    )


def _settings_page(
    request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]
) -> dict[str, Any]:
    """The Settings page's context around its forms (as posted, or fresh)."""
    labels = dict(key_providers())
    stored = set(ApiKey.objects.values_list("provider", flat=True))
    return {
        "tabs": common.sidebar_tabs(request),
        **forms,
        "keys": [
            (labels.get(k.provider, k.provider), k, endpoint_now(k.provider))
            for k in ApiKey.objects.order_by("provider")
        ],
        "endpoints": [
            (labels.get(e.provider, e.provider), e)
            for e in ProviderEndpoint.objects.order_by("provider")
        ],
        "models": known_models(),
        "providers": _provider_status(stored),
        "offline_model": OFFLINE_MODEL,
        "sandbox": sandbox.state(sandbox.policy_from(settings)),
        "mcp_servers": [
            (
                server,
                masked_pairs({**(server.get_env() or {}), **(server.get_headers() or {})}),
                mcp.shown_url(server.url),
            )
            for server in McpServer.objects.all()
        ],
        **_agents_section(),
        "profiles": Profile.objects.all(),
        **_usage_section(period),
    }


def _agents_section() -> dict[str, Any]:
    """The agents saved here, and the ones the environment or a preset gives (read-only)."""
    saved = list(AcpAgent.objects.all())
    in_effect = acp_config.stored()
    return {
        "agents": [
            (agent, shlex.join(agent.command), masked_pairs(agent.get_env())) for agent in saved
        ],
        "agents_available": [
            (name, _agent_source(agent, {a.name for a in saved}), shlex.join(agent.command))
            for name, agent in acp_config.agents().items()
            if agent not in in_effect
        ],
    }


def _agent_source(agent: AgentConfig, saved: set[str]) -> str:
    if agent.preset:
        return "found on PATH"
    if agent.name in saved:
        return "DISPATCH_ACP_AGENTS, replacing the saved one"
    return "DISPATCH_ACP_AGENTS"


def _usage_section(period: str) -> dict[str, Any]:
    """Settings' usage table: every user's tokens and cost per model over `period` (one
    query)."""
    start = timezone.now() - usage.PERIODS[period]
    rows, total = usage.by_user_and_model(UsageRecord.objects.filter(created_at__gte=start))
    return {
        "usage_period": period,
        "usage_periods": list(usage.PERIOD_LABELS.items()),
        "usage_since": start,
        "usage_rows": [
            {"user": row.user, "model": row.model, "u": chat_render.usage_line(row.totals)}
            for row in rows
        ],
        "usage_total": chat_render.usage_line(total),
        "prices_version": usage.PRICES_VERSION,
    }


def _provider_status(stored: set[str]) -> list[dict[str, Any]]:
    """Where each provider's key comes from: the environment wins over a stored key."""
    rows = []
    for name, spec in PROVIDERS.items():
        if spec.adapter == "offline":
            continue
        from_env = bool(spec.key_env and os.environ.get(spec.key_env, "").strip())
        rows.append(
            {
                "label": spec.label,
                "env": spec.key_env,
                "from_env": from_env,
                "stored": name in stored,
            }
        )
    return rows


@login_required
@require_POST
def apikey_delete(request: AuthenticatedHttpRequest, provider: str) -> HttpResponse:
    common.require_staff(request)
    deleted, _ = ApiKey.objects.filter(provider=provider).delete()
    if deleted:
        messages.success(request, f"Deleted the {provider} key.")
    else:
        messages.error(request, f"There is no stored {provider} key.")
    return redirect(reverse("settings"))


def _endpoint_superuser(request: AuthenticatedHttpRequest) -> None:
    # The stored keys are sent to the endpoints: other staff only see where.
    if not request.user.is_superuser:
        raise PermissionDenied(
            "Only superusers can add, change or remove provider endpoints: the stored API "
            "keys are sent there."
        )


@login_required
@require_POST
def endpoint_delete(request: AuthenticatedHttpRequest, provider: str) -> HttpResponse:
    common.require_staff(request)
    _endpoint_superuser(request)
    deleted, _ = ProviderEndpoint.objects.filter(provider=provider).delete()
    if deleted:
        messages.success(request, f"Removed the {provider} endpoint; the SDK default applies.")
        if note := key_elsewhere_note(provider):
            messages.warning(request, note)
    else:
        messages.error(request, f"There is no stored {provider} endpoint.")
    return redirect(reverse("settings"))
