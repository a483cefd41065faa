"""The Settings pages (staff only: they hold every user's API keys), one URL per section:
Connections (API keys and base URLs, each with a Test), Models, Tools and MCP, Rules,
Profiles, Appearance, Advanced. Every section's forms post to its own URL; a form that
does not validate is shown again in its section.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse, HttpResponseBadRequest
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
    check_runnable,
    key_elsewhere_note,
    known_models,
    masked_pairs,
    validate_model_id,
)
from chat.models import (
    AcpAgent,
    ApiKey,
    McpServer,
    Profile,
    ProviderEndpoint,
    UsageRecord,
    set_setting,
)
from chat.providers import check
from chat.providers.registry import (
    PROVIDERS,
    ProviderConfigError,
    base_url_now,
    credentials,
    endpoint_now,
    from_env,
    has_key,
)
from chat.tools import mcp, sandbox
from chat.views import agents, common
from chat.views.common import AuthenticatedHttpRequest
from chat.views.mcp import edited_server, require_superuser

# The sections, in the order of the navigation: a newcomer's first need first.
SECTIONS = {
    "connections": "Connections",
    "models": "Models",
    "tools": "Tools and MCP",
    "rules": "Rules",
    "profiles": "Profiles",
    "appearance": "Appearance",
    "advanced": "Advanced",
}
# The section each form's action belongs to ("settings" says its own).
ACTION_SECTIONS = {
    "key": "connections",
    "test_key": "connections",
    "endpoint": "connections",
    "use_model": "connections",
    "mcp": "tools",
    "agent": "models",
}


def section_url(section: str, anchor: str = "") -> str:
    path = (
        reverse("settings")
        if section == "connections"
        else reverse("settings_section", args=[section])
    )
    return f"{path}#{anchor}" if anchor else path


@login_required
@require_http_methods(["GET", "POST"])
def settings_view(request: AuthenticatedHttpRequest, section: str = "connections") -> HttpResponse:
    common.require_staff(request)
    if section not in SECTIONS:
        raise Http404(f"Settings has no section {section!r}.")
    period = request.GET.get("usage", usage.DEFAULT_PERIOD)
    if period not in usage.PERIODS:
        names = ", ".join(usage.PERIODS)
        return HttpResponseBadRequest(f"?usage= must be one of {names}, not {period!r}.")
    forms: dict[str, Any] = {}
    status = 200
    if request.method == "POST":
        action = request.POST.get("action", "")
        handler = POST_ACTIONS.get(action)
        if handler is None:
            return HttpResponseBadRequest("Unknown settings action.")
        if action == "settings":
            section = request.POST.get("section") or section
            if section not in SECTIONS:
                return HttpResponseBadRequest(f"Settings has no section {section!r}.")
        else:
            section = ACTION_SECTIONS[action]
        outcome = handler(request, section)
        if isinstance(outcome, HttpResponse):
            return outcome
        forms, status = outcome
    context = SECTION_CONTEXT[section](request, period, forms)
    return render(
        request,
        "chat/settings.html",
        {
            "tabs": common.sidebar_tabs(request),
            "section": section,
            "section_template": f"chat/_settings_{section}.html",
            "sections": [(key, label, section_url(key)) for key, label in SECTIONS.items()],
            "section_label": SECTIONS[section],
            **context,
        },
        status=status,
    )


# --- posts: each returns a redirect, or the forms to show again and a status ------------

PostResult = HttpResponse | tuple[dict[str, Any], int]


def _post_settings(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    if section not in SETTINGS_FORM_SECTIONS:
        return HttpResponseBadRequest(f"The {SECTIONS[section]} section has no preferences.")
    form = SettingsForm(request.POST, section=section)
    if form.is_valid():
        form.save()
        messages.success(request, "Settings saved.")
        return redirect(section_url(section))
    return {"settings_form": form}, 422


def _post_key(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    form = ApiKeyForm(request.POST)
    if not form.is_valid():
        return {"key_form": form}, 422
    row, kept = form.save()
    messages.success(request, f"Saved the {row.provider} key ({row.masked}) for {row.endpoint}.")
    _say_test(request, row.provider, _test(row.provider, form.cleaned_data["key"]))
    if kept:
        messages.info(
            request,
            f"New tabs and wakes still use {kept}: saving a key changes no default. "
            "Choose another under Models, or with the button below.",
        )
    return redirect(section_url("connections"))


def _post_test_key(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    """Test the key typed (else the one in effect) without saving anything."""
    provider = request.POST.get("provider", "")
    if provider not in PROVIDERS or PROVIDERS[provider].adapter == "offline":
        return HttpResponseBadRequest("Unknown provider.")
    form = ApiKeyForm(request.POST)
    typed = request.POST.get("key", "").strip()
    if typed:
        if not form.is_valid():
            return {"key_form": form}, 422
        result = _test(provider, form.cleaned_data["key"])
    else:
        try:
            creds = credentials(provider)
        except ProviderConfigError as exc:
            result = check.KeyCheck(check.Outcome.FAILED, str(exc))
        else:
            if creds.api_key is None:
                result = check.KeyCheck(
                    check.Outcome.FAILED, "There is no key to test: paste one first."
                )
            else:
                result = check.check_key(provider, creds.api_key, creds.base_url)
    # The typed key stays in its field, so a key that failed can be fixed and saved.
    form.fields["key"].widget.render_value = True
    return {"key_form": form, "key_test": (provider, result)}, 200


def _post_endpoint(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    _endpoint_superuser(request)
    form = EndpointForm(request.POST)
    if not form.is_valid():
        return {"endpoint_form": form}, 422
    note = form.save()
    provider = form.cleaned_data["provider"]
    messages.success(request, f"Saved the {provider} endpoint.")
    if note:
        messages.warning(request, note)
    if form.cleaned_data["key"]:
        _say_test(request, provider, _test(provider, form.cleaned_data["key"]))
    return redirect(section_url("connections"))


def _post_use_model(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    """Make a model the default of new tabs and wakes: the explicit choice a saved key
    offers instead of changing the default on its own."""
    value = request.POST.get("model", "")
    try:
        model = check_runnable(validate_model_id(value))
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect(section_url("connections"))
    set_setting("default_model", model)
    messages.success(request, f"New tabs and wakes now use {model}.")
    return redirect(section_url("connections"))


def _post_mcp(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    require_superuser(request)
    form = McpServerForm(request.POST, instance=edited_server(request.POST.get("server")))
    if form.is_valid():
        server = form.save()
        messages.success(request, f"Saved the MCP server {server.name}.")
        return redirect(section_url("tools", "mcp"))
    return {"mcp_form": form}, 422


def _post_agent(request: AuthenticatedHttpRequest, section: str) -> PostResult:
    agents.require_superuser(request)
    form = AcpAgentForm(request.POST, instance=agents.edited_agent(request.POST.get("agent")))
    if form.is_valid():
        agent = form.save()
        messages.success(request, f"Saved the agent {agent.name}: acp/{agent.name}.")
        return redirect(section_url("models", "agents"))
    return {"agent_form": form}, 422


POST_ACTIONS: dict[str, Callable[[AuthenticatedHttpRequest, str], PostResult]] = {
    "settings": _post_settings,
    "key": _post_key,
    "test_key": _post_test_key,
    "endpoint": _post_endpoint,
    "use_model": _post_use_model,
    "mcp": _post_mcp,
    "agent": _post_agent,
}


def _test(provider: str, key: str) -> check.KeyCheck:
    """`key` tested at the base URL a request of `provider` goes to now."""
    return check.check_key(provider, key, base_url_now(provider))


def _say_test(request: AuthenticatedHttpRequest, provider: str, result: check.KeyCheck) -> None:
    if result.ok:
        messages.success(request, f"Tested: {result.message}")
    else:
        messages.error(request, f"The test failed: {result.message} The key is saved anyway.")
    spec = PROVIDERS[provider]
    if from_env(spec.key_env):
        messages.warning(
            request, f"{spec.key_env} is set in the server's environment: it wins over this key."
        )


# --- each section's context -------------------------------------------------------------

SETTINGS_FORM_SECTIONS = ("models", "tools", "appearance", "advanced")


def _settings_form(section: str, forms: dict[str, Any]) -> SettingsForm:
    return forms.get("settings_form") or SettingsForm(
        initial=SettingsForm.initial_from(preferences.load()), section=section
    )


def _connections(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    key_form = forms.get("key_form")
    endpoint_form = forms.get("endpoint_form")
    tested, result = forms.get("key_test", ("", None))
    keys = {k.provider: k for k in ApiKey.objects.all()}
    urls = {e.provider: e for e in ProviderEndpoint.objects.all()}
    prefs = preferences.load()
    rows = []
    for name, spec in PROVIDERS.items():
        if spec.adapter == "offline":
            continue
        posted = key_form is not None and key_form.data.get("provider") == name
        url_posted = endpoint_form is not None and endpoint_form.data.get("provider") == name
        rows.append(
            {
                "name": name,
                "spec": spec,
                "key_from_env": bool(from_env(spec.key_env)),
                "url_from_env": from_env(spec.url_env),
                "stored": keys.get(name),
                "endpoint": urls.get(name),
                "now": endpoint_now(name),
                "ready": has_key(name),
                "key_form": _ids(key_form if posted else ApiKeyForm(), name),
                "endpoint_form": _ids(
                    endpoint_form
                    if url_posted
                    else EndpointForm(
                        initial={
                            "base_url": urls[name].base_url if name in urls else "",
                            "api_style": urls[name].api_style if name in urls else "",
                        }
                    ),
                    f"{name}_url",
                ),
                "endpoint_posted": url_posted,
                "test": result if tested == name else None,
                "offer_default": has_key(name)
                and prefs.new_tab_model != spec.default_model
                and not getattr(settings, "DISPATCH_MODEL", ""),
            }
        )
    return {"providers": rows, "default_now": prefs.new_tab_model, "key_form": key_form}


def _ids(form: Any, prefix: str) -> Any:
    """`form` with element ids of its own: one page holds two forms per provider."""
    form.auto_id = f"id_{prefix}_%s"
    return form


def _models(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    return {
        "settings_form": _settings_form("models", forms),
        "models": known_models(),
        "offline_model": OFFLINE_MODEL,
        "agent_form": forms.get("agent_form")
        or AcpAgentForm(instance=agents.edited_agent(request.GET.get("agent"))),
        **_agents_section(),
        **_usage_section(period),
    }


def _tools(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    return {
        "settings_form": _settings_form("tools", forms),
        "sandbox": sandbox.state(sandbox.policy_from(settings)),
        "mcp_form": forms.get("mcp_form")
        or McpServerForm(instance=edited_server(request.GET.get("mcp"))),
        "mcp_servers": [
            (
                server,
                masked_pairs({**(server.get_env() or {}), **(server.get_headers() or {})}),
                mcp.shown_url(server.url),
            )
            for server in McpServer.objects.all()
        ],
    }


def _rules(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    return {}


def _profiles(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    return {"profiles": Profile.objects.all()}


def _appearance(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    return {"settings_form": _settings_form("appearance", forms)}


def _advanced(request: AuthenticatedHttpRequest, period: str, forms: dict[str, Any]) -> dict:
    return {"settings_form": _settings_form("advanced", forms)}


SECTION_CONTEXT: dict[
    str, Callable[[AuthenticatedHttpRequest, str, dict[str, Any]], dict[str, Any]]
] = {
    "connections": _connections,
    "models": _models,
    "tools": _tools,
    "rules": _rules,
    "profiles": _profiles,
    "appearance": _appearance,
    "advanced": _advanced,
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


@login_required
@require_POST
def apikey_delete(request: AuthenticatedHttpRequest, provider: str) -> HttpResponse:
    common.require_staff(request)
    deleted, _ = ApiKey.objects.filter(provider=provider).delete()
    if deleted:
        messages.success(request, f"Deleted the {provider} key.")
    else:
        messages.error(request, f"There is no stored {provider} key.")
    return redirect(section_url("connections"))


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
    return redirect(section_url("connections"))
