"""The web UI's forms. The settings they write are read back by chat.preferences."""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, cast

from django import forms
from django.contrib.auth.forms import UserCreationForm
from django.core.validators import URLValidator
from django.db import transaction
from django.utils import timezone as dj_timezone

from chat import rules, schedule, wakes
from chat.acp import config as acp_config
from chat.envcheck import ACP_AGENT_NAME
from chat.models import (
    AcpAgent,
    ApiKey,
    McpServer,
    PermissionRule,
    Profile,
    ProviderEndpoint,
    Setting,
    Tab,
    Wake,
    set_setting,
)
from chat.preferences import (
    DEFAULT_SYSTEM_PROMPT,
    DOM_WINDOW_MAX,
    PAGE_SIZE_MAX,
    PAGE_SIZE_MIN,
    Preferences,
)
from chat.providers import default_model, list_models
from chat.providers.registry import (
    AGENT_PROVIDER,
    PROVIDERS,
    agent_models,
    endpoint_now,
    has_key,
)
from chat.tools import TOOLS, workdir

OFFLINE_MODEL = "offline/demo"
OFFLINE_LABEL = "Offline demo model"

# A message is typed or pasted: past this it is an accident, not a question.
MAX_MESSAGE_CHARS = 100_000
# Long enough for a detailed brief; it is sent with every request.
MAX_SYSTEM_PROMPT_CHARS = 20_000
# An API key is a long token: anything this short is a typo or a partial paste.
API_KEY_MIN_CHARS = 8
API_KEY_MAX_CHARS = 500


# --- Models --------------------------------------------------------------------------


def known_models() -> list[Any]:
    """The picker's models: the providers', then the configured external agents'."""
    return [*list_models(), *agent_models(acp_config.agents())]


def model_label(model: Any) -> str:
    if model.id == OFFLINE_MODEL:
        return OFFLINE_LABEL
    label = model.label or model.id
    return label if model.available else f"{label} (no key)"


def model_choices(current: str = "") -> list[tuple[str, str]]:
    """The picker's options; a tab's model the table no longer lists stays selectable."""
    choices = [(m.id, model_label(m)) for m in known_models()]
    if current and current not in {value for value, _ in choices}:
        choices.append((current, current))
    return choices


@dataclass(frozen=True)
class PickerEntry:
    """One model in the model picker (templates/chat/_model_picker.html)."""

    id: str
    label: str
    provider: str
    # Which provider's key it waits for ("" when it can run).
    needs_key: str = ""


def model_picker(current: str = "") -> dict[str, Any]:
    """The picker's models: those that can run first (in the table's order), then those
    waiting for a key, grouped by provider, each group with its provider's name."""
    ready, waiting = [], []
    for m in known_models():
        if m.available:
            ready.append(PickerEntry(m.id, model_label(m), m.provider))
        else:
            label = PROVIDERS[m.provider].label
            waiting.append(PickerEntry(m.id, m.label or m.id, m.provider, needs_key=label))
    if current and current not in {e.id for e in ready + waiting}:
        ready.append(PickerEntry(current, current, current.partition("/")[0]))
    groups: dict[str, list[PickerEntry]] = {}
    for entry in waiting:
        groups.setdefault(entry.provider, []).append(entry)
    return {
        "current": current,
        "current_label": next((e.label for e in ready + waiting if e.id == current), current),
        "ready": ready,
        "waiting": [(PROVIDERS[p].label, p, entries) for p, entries in groups.items()],
    }


def check_runnable(value: str) -> str:
    """`value` if its provider has a key (or needs none); a ValidationError naming the
    fix otherwise. The picker offers no such model: this is for a post made anyway."""
    provider = value.partition("/")[0]
    spec = PROVIDERS.get(provider)
    if spec is None or has_key(provider):
        return value
    raise forms.ValidationError(
        f"{value} cannot run: {spec.label} has no API key. Add one in Settings → "
        f"Connections (or set {spec.key_env}), then choose it again."
    )


def key_providers() -> list[tuple[str, str]]:
    """Providers that take an API key or an endpoint (every one but the offline demo)."""
    return [(name, spec.label) for name, spec in PROVIDERS.items() if spec.adapter != "offline"]


def validate_model_id(value: str) -> str:
    """A model id the providers serve: listed, or `provider/name` of a listed provider."""
    value = value.strip()
    models = known_models()
    if value in {m.id for m in models}:
        return value
    providers = sorted({m.provider for m in models})
    provider, _, name = value.partition("/")
    if not provider or not name:
        raise forms.ValidationError(
            f"“{value}” is not a model id: write provider/model, for example "
            f"{models[0].id if models else OFFLINE_MODEL}."
        )
    if provider == AGENT_PROVIDER:
        agents = ", ".join(m.id for m in models if m.provider == AGENT_PROVIDER) or "none"
        raise forms.ValidationError(f"No agent “{name}” is configured. Configured: {agents}.")
    if provider not in providers:
        raise forms.ValidationError(
            f"Unknown provider “{provider}”. Known providers: {', '.join(providers)}."
        )
    if provider == "offline":
        raise forms.ValidationError(f"The offline provider has one model: {OFFLINE_MODEL}.")
    return value


# --- Accounts ------------------------------------------------------------------------


class OwnerForm(UserCreationForm):
    """The first account: it owns the install (superuser and staff)."""


# --- Tabs ---------------------------------------------------------------------------------


class MessageForm(forms.Form):
    # Not required: a message may be only files (its `attachment` fields); turns.submit
    # refuses one with neither.
    text = forms.CharField(
        max_length=MAX_MESSAGE_CHARS,
        required=False,
        error_messages={
            "max_length": "The message is too long (at most %(limit_value)s characters).",
        },
    )


class RenameForm(forms.Form):
    title = forms.CharField(
        max_length=200,
        required=False,
        error_messages={"max_length": "A title has at most %(limit_value)s characters."},
    )


class TabSystemPromptForm(forms.Form):
    """A new tab's own system prompt, editable until its first message."""

    system_prompt = forms.CharField(
        max_length=MAX_SYSTEM_PROMPT_CHARS,
        required=False,
        strip=False,
        widget=forms.Textarea,
        error_messages={"max_length": "A system prompt has at most %(limit_value)s characters."},
    )


class NewTabForm(forms.Form):
    """A new tab's options: a profile, a working directory."""

    profile = forms.ModelChoiceField(
        queryset=Profile.objects.all(),
        required=False,
        empty_label="None: the Settings page's prompt and model, every tool",
        error_messages={"invalid_choice": "That profile does not exist (any more)."},
    )
    workdir = forms.CharField(
        label="Working directory",
        required=False,
        max_length=workdir.MAX_WORKDIR_CHARS,
        help_text="A folder in the workspace the tab's tools work in (made if missing), "
        "such as projects/site. Empty: the whole workspace.",
    )

    def clean_workdir(self) -> str:
        try:
            return workdir.check(self.cleaned_data["workdir"])
        except workdir.BadWorkdir as exc:
            raise forms.ValidationError(str(exc)) from None


class TabModelForm(forms.Form):
    model = forms.ChoiceField(
        error_messages={"invalid_choice": "“%(value)s” is not a model this server offers."}
    )

    def __init__(self, *args: Any, current: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current = current
        cast(forms.ChoiceField, self.fields["model"]).choices = model_choices(current)

    def clean_model(self) -> str:
        value = self.cleaned_data["model"]
        # The tab's own model stays choosable: choosing it again changes nothing.
        return value if value == self.current else check_runnable(value)


# --- Settings --------------------------------------------------------------------------

# Which preferences each Settings section shows and saves (chat.views.settings.SECTIONS).
SETTINGS_SECTIONS = {
    "models": ("default_model", "fallback_model", "system_prompt"),
    "tools": ("approve_tools",),
    "appearance": ("expand_thinking",),
    "advanced": ("page_size", "dom_window"),
}


class SettingsForm(forms.Form):
    default_model = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"list": "model-options", "autocomplete": "off"}),
        help_text="For new tabs. Empty: the first provider with a key, else the offline demo.",
    )
    fallback_model = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"list": "model-options", "autocomplete": "off"}),
        help_text="Used when the tab's model keeps failing (overloaded, rate limited).",
    )
    system_prompt = forms.CharField(
        required=False,
        max_length=MAX_SYSTEM_PROMPT_CHARS,
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text="For new tabs; a tab keeps the prompt it was created with.",
    )
    expand_thinking = forms.BooleanField(
        required=False, label="Show the model's reasoning expanded"
    )
    approve_tools = forms.BooleanField(required=False, label="Ask before running a tool call")
    page_size = forms.IntegerField(
        min_value=PAGE_SIZE_MIN,
        max_value=PAGE_SIZE_MAX,
        help_text="Chunks a tab page opens with; older ones load as you scroll up.",
    )
    dom_window = forms.IntegerField(
        max_value=DOM_WINDOW_MAX,
        label="DOM window",
        help_text="Most chunks a page keeps while it follows a long run.",
    )

    def __init__(self, *args: Any, section: str = "", **kwargs: Any) -> None:
        """`section`: only that Settings section's fields (SETTINGS_SECTIONS), so saving
        one section leaves the others' values (an unticked box is absent from a post,
        read as "off") as they are; "" for all of them."""
        super().__init__(*args, **kwargs)
        if section:
            keep = SETTINGS_SECTIONS[section]
            for name in [name for name in self.fields if name not in keep]:
                del self.fields[name]
        if "default_model" in self.fields:
            self.fields["default_model"].widget.attrs["placeholder"] = (
                f"automatic: {default_model()}"
            )
            self.fields["fallback_model"].widget.attrs["placeholder"] = "none"

    @classmethod
    def initial_from(cls, conf: Preferences) -> dict[str, Any]:
        return {
            "default_model": conf.default_model,
            "fallback_model": conf.fallback_model,
            "system_prompt": conf.system_prompt or DEFAULT_SYSTEM_PROMPT,
            "expand_thinking": conf.expand_thinking,
            "approve_tools": conf.approve_tools,
            "page_size": conf.page_size,
            "dom_window": conf.dom_window,
        }

    # A default or fallback that cannot run would fail every new tab and wake at its
    # first message: refused here, saying where the key goes.
    def clean_default_model(self) -> str:
        value = self.cleaned_data["default_model"].strip()
        return check_runnable(validate_model_id(value)) if value else ""

    def clean_fallback_model(self) -> str:
        value = self.cleaned_data["fallback_model"].strip()
        return check_runnable(validate_model_id(value)) if value else ""

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        default, fallback = data.get("default_model"), data.get("fallback_model")
        if fallback and default and fallback == default:
            self.add_error("fallback_model", "The fallback must differ from the default model.")
        page_size, window = data.get("page_size"), data.get("dom_window")
        if page_size is not None and window is not None and window < page_size:
            # A smaller window would drop part of the first page at the first update.
            self.add_error(
                "dom_window", f"The DOM window must hold at least one page ({page_size} chunks)."
            )
        return data

    def save(self) -> None:
        for key, value in self.cleaned_data.items():
            if key == "system_prompt" and value.strip() == DEFAULT_SYSTEM_PROMPT:
                value = ""  # keep following the built-in default
            set_setting(key, value)


def _key_field(**kwargs: Any) -> forms.CharField:
    return forms.CharField(
        strip=True,
        min_length=API_KEY_MIN_CHARS,
        max_length=API_KEY_MAX_CHARS,
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}, render_value=False),
        error_messages={
            "required": "Paste the key.",
            "min_length": "That is too short for an API key (at least %(limit_value)s characters).",
            "max_length": "That is too long for an API key (at most %(limit_value)s characters).",
        },
        **kwargs,
    )


def _pasted_key(key: str) -> str:
    if any(ch.isspace() for ch in key):
        raise forms.ValidationError("An API key has no spaces or line breaks in it.")
    if not key.isascii() or not key.isprintable():
        raise forms.ValidationError("An API key is plain ASCII text; check what was pasted.")
    return key


def store_key(provider: str, key: str) -> tuple[ApiKey, str]:
    """Save `provider`'s key, bound to the endpoint a request goes to now; and the default
    model `default_model_kept` wrote down ("" for none)."""
    with default_model_kept() as kept:
        row = ApiKey.objects.filter(provider=provider).first() or ApiKey(provider=provider)
        row.set_key(key, endpoint=endpoint_now(provider))
        row.save()
    return row, "".join(kept)


@contextlib.contextmanager
def default_model_kept() -> Iterator[list[str]]:
    """Around the saving of a key: an automatic default model follows the keys (the first
    provider with one), so a saved key would silently move every new tab and every wake
    without a model of its own to another provider. When it would, the model of before is
    written down as the default (and put in the list yielded); Settings offers the change
    as a button instead."""
    kept: list[str] = []
    with transaction.atomic():
        before = default_model() if not _stored_default() else ""
        yield kept
        if before and default_model() != before:
            set_setting("default_model", before)
            kept.append(before)


def _stored_default() -> str:
    return str(
        Setting.objects.filter(key="default_model").values_list("value", flat=True).first() or ""
    )


def key_elsewhere_note(provider: str) -> str:
    """What to say after an endpoint change when `provider`'s stored key is bound to
    another endpoint than the one now in effect ("" when it is not)."""
    row = ApiKey.objects.filter(provider=provider).first()
    now = endpoint_now(provider)
    if row is None or row.endpoint == now:
        return ""
    return (
        f"The stored {provider} key ({row.masked}) was saved for "
        f"{row.endpoint or 'no endpoint'}: it is not sent to {now or 'no endpoint'} until it "
        "is entered again."
    )


class ApiKeyForm(forms.Form):
    provider = forms.ChoiceField()
    key = _key_field(label="API key")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["provider"]).choices = key_providers()

    def clean_key(self) -> str:
        return _pasted_key(self.cleaned_data["key"])

    def clean_provider(self) -> str:
        provider = self.cleaned_data["provider"]
        spec = PROVIDERS[provider]
        if not endpoint_now(provider):
            raise forms.ValidationError(
                f"{spec.label} has no endpoint yet, and a stored key is bound to the endpoint "
                f"it is saved for: a superuser sets its base URL under Connections (or "
                f"{spec.url_env}) first."
            )
        return provider

    def save(self) -> tuple[ApiKey, str]:
        """The key's row, and the default model kept (see `store_key`)."""
        return store_key(self.cleaned_data["provider"], self.cleaned_data["key"])


class EndpointForm(forms.Form):
    """A provider's base URL, and its key entered again: a stored key is sent only to
    the endpoint it was saved for."""

    provider = forms.ChoiceField()
    base_url = forms.CharField(
        label="Base URL",
        max_length=500,
        validators=[
            URLValidator(
                schemes=["http", "https"],
                message="Enter an http:// or https:// URL, e.g. https://api.example.com/v1.",
            )
        ],
        error_messages={"required": "Enter the base URL, e.g. https://api.example.com/v1."},
    )
    key = _key_field(
        label="API key for this base URL",
        required=False,
        help_text="Optional. A stored key is sent only to the endpoint it was saved for: to "
        "use it at a new URL, enter it again here.",
    )
    api_style = forms.ChoiceField(
        label="API",
        choices=ProviderEndpoint.ApiStyle.choices,
        required=False,
        help_text="For an OpenAI-compatible endpoint: OpenAI's Responses API keeps a "
        "reasoning model's reasoning between the steps of a turn; most other servers "
        "speak only Chat Completions. <code>OPENAI_API_STYLE</code> overrides this.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["provider"]).choices = key_providers()

    def clean_key(self) -> str:
        return _pasted_key(self.cleaned_data["key"]) if self.cleaned_data["key"] else ""

    def save(self) -> str:
        """Save the endpoint (and bind the key entered with it to it); what to warn
        about a stored key now bound elsewhere ("" for nothing)."""
        provider = self.cleaned_data["provider"]
        with transaction.atomic():
            ProviderEndpoint.objects.update_or_create(
                provider=provider,
                defaults={
                    "base_url": self.cleaned_data["base_url"],
                    "api_style": self.cleaned_data["api_style"] or "",
                },
            )
            if self.cleaned_data["key"]:
                store_key(provider, self.cleaned_data["key"])
        return key_elsewhere_note(provider)


# --- Profiles ------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def unknown_tool_patterns(patterns: list[str], servers: list[str]) -> list[str]:
    """The allow-list patterns that can name no tool: none of the built-ins, and not
    `mcp__<server>__…` of a configured MCP server (a server's tools are known only
    once it is asked, at a turn's start)."""
    builtins = [tool.name for tool in TOOLS]
    unknown = []
    for pattern in patterns:
        if any(fnmatchcase(name, pattern) for name in builtins):
            continue
        if pattern.startswith("mcp__"):
            server = pattern.removeprefix("mcp__").partition("__")[0]
            if any(fnmatchcase(name, server) for name in servers):
                continue
        unknown.append(pattern)
    return unknown


class ProfileForm(forms.ModelForm):
    """A profile: the Settings page's and the admin's. The allowed tools and the rules
    are edited as text, one per line; the rules are the profile's PermissionRule rows."""

    tools = forms.CharField(
        label="Allowed tools",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One name or pattern a line (list_files, read_file, mcp__github__*). "
        "Empty: every tool.",
    )
    rules_text = forms.CharField(
        label="Rules",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One rule a line: allow, ask or deny, then what it matches, such as "
        "allow shell(git status) or deny write_file(secrets/**).",
    )

    class Meta:
        model = Profile
        fields = ["name", "description", "system_prompt", "model", "tools"]
        widgets = {
            "description": forms.TextInput(),
            "system_prompt": forms.Textarea(attrs={"rows": 5}),
            "model": forms.TextInput(attrs={"list": "model-options", "autocomplete": "off"}),
        }
        help_texts = {
            "system_prompt": "Empty: the Settings page's system prompt.",
            "model": "Empty: the Settings page's default model.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.CharField, self.fields["system_prompt"]).max_length = MAX_SYSTEM_PROMPT_CHARS
        if self.instance.pk is not None:
            self.initial["tools"] = "\n".join(self.instance.tools or [])
            self.initial["rules_text"] = "\n".join(
                f"{rule.action} {rule.pattern}" for rule in self.instance.rules.all()
            )

    def clean_model(self) -> str:
        value = self.cleaned_data["model"].strip()
        return validate_model_id(value) if value else ""

    def clean_tools(self) -> list[str]:
        patterns = _lines(self.cleaned_data["tools"])
        servers = list(McpServer.objects.values_list("name", flat=True))
        if unknown := unknown_tool_patterns(patterns, servers):
            names = ", ".join([tool.name for tool in TOOLS] + [f"mcp__{s}__*" for s in servers])
            raise forms.ValidationError(
                f"No such tool: {', '.join(unknown)}. The tools are: {names}."
            )
        return patterns

    def clean_rules_text(self) -> list[tuple[str, str]]:
        pairs, errors = [], []
        for number, line in enumerate(_lines(self.cleaned_data["rules_text"]), 1):
            action, _, pattern = line.partition(" ")
            if action not in PermissionRule.Action.values:
                errors.append(
                    f"Line {number}, “{line}”: start with allow, ask or deny, then a pattern."
                )
                continue
            try:
                rule = rules.parse(action, pattern, source=rules.TAB)
            except rules.RuleError as exc:
                errors.append(f"Line {number}, “{line}”: {exc}")
                continue
            pairs.append((rule.action, rule.pattern))
        if errors:
            raise forms.ValidationError(errors)
        return pairs

    @transaction.atomic
    def save(self, commit: bool = True) -> Profile:
        profile = super().save(commit=commit)
        if commit:
            self.save_rules()
        return profile

    def save_rules(self) -> None:
        """Replace the profile's rules with the form's (after the profile is saved)."""
        self.instance.rules.all().delete()
        PermissionRule.objects.bulk_create(
            PermissionRule(profile=self.instance, action=action, pattern=pattern)
            for action, pattern in self.cleaned_data["rules_text"]
        )


# --- MCP servers (staff only: a stdio server is a program run on this machine) -----------

# What a saved secret shows as; a line keeping it keeps the saved value.
SECRET_MASK = "••••••••"
# Environment variables or headers of one server: more is a paste gone wrong.
MCP_PAIRS_MAX = 50
MCP_TIMEOUT_MIN = 1.0
# An hour: a long build or a crawl; past that a hung server holds a turn for nothing.
MCP_TIMEOUT_MAX = 3600.0
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# RFC 9110 token characters.
HEADER_NAME = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"


def masked_pairs(values: dict[str, str] | None) -> str:
    """KEY=value lines with every value masked: what a form shows of saved secrets."""
    return "\n".join(f"{key}={SECRET_MASK}" for key in sorted(values or {}))


def parse_pairs(
    text: str, kept: dict[str, str] | None, *, what: str, name_pattern: str
) -> dict[str, str]:
    """`KEY=value` lines as a dict; a masked value keeps the `kept` one of that key."""
    pairs: dict[str, str] = {}
    errors = []
    for number, line in enumerate(_lines(text), 1):
        key, equals, value = line.partition("=")
        key = key.strip()
        if not equals or not re.fullmatch(name_pattern, key):
            errors.append(f"Line {number}: write NAME=value (a valid {what} name).")
        elif key in pairs:
            errors.append(f"Line {number}: {key} is given twice.")
        elif value == SECRET_MASK:
            if kept is None or key not in kept:
                errors.append(f"Line {number}: type the value of {key}; none is saved.")
            else:
                pairs[key] = kept[key]
        else:
            pairs[key] = value
    if len(pairs) > MCP_PAIRS_MAX:
        errors.append(f"At most {MCP_PAIRS_MAX} lines.")
    if errors:
        raise forms.ValidationError(errors)
    return pairs


def check_server_name(name: str, saved: str | None) -> None:
    """Refuse an MCP server name its tools' names cannot be read back from: `a__b` with a
    tool `c` and `a` with a tool `b__c` are both mcp__a__b__c (their names stay apart by a
    hash, but a rule or a profile's `mcp__a__b__*` would name the wrong server). The name
    a server has (`saved`) passes: its tabs' tool names must not change."""
    if name != saved and ("__" in name or name.endswith("_")):
        raise forms.ValidationError(
            "A server name cannot contain __ or end with _: its tools are called "
            "mcp__NAME__TOOL, and the name must read back from them."
        )


class McpServerForm(forms.Form):
    """Add or edit an MCP server (Settings; the admin has its own form on the same parts)."""

    name = forms.RegexField(
        regex=r"^[A-Za-z0-9_-]+$",
        max_length=40,
        help_text="Letters, digits, _ and -: its tools are called mcp__NAME__TOOL.",
        error_messages={"invalid": "Use letters, digits, _ and - only."},
    )
    transport = forms.ChoiceField(
        choices=[
            (McpServer.Transport.STDIO, "stdio: a program run here, in the shell's sandbox"),
            (McpServer.Transport.HTTP, "streamable HTTP: a URL"),
        ]
    )
    command = forms.CharField(
        max_length=500, required=False, help_text="stdio: the program, e.g. npx or uvx."
    )
    args = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        label="Arguments",
        help_text="stdio: one argument per line.",
    )
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        label="Environment",
        help_text="stdio: NAME=value lines, saved encrypted and shown masked; a masked line "
        "keeps its saved value.",
    )
    mount_workspace = forms.BooleanField(
        required=False,
        label="Mount the workspace",
        help_text="stdio: the tab owner's workspace is at /workspace, writable (name it in the "
        "arguments; the server runs once per user). Off, it sees no workspace.",
    )
    url = forms.URLField(
        max_length=500,
        required=False,
        label="URL",
        validators=[URLValidator(schemes=["http", "https"])],
        help_text="HTTP: the server's endpoint, e.g. https://example.com/mcp.",
    )
    headers = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        help_text="HTTP: Name=value lines (Authorization=Bearer …), saved encrypted and shown "
        "masked.",
    )
    timeout = forms.FloatField(
        min_value=MCP_TIMEOUT_MIN,
        max_value=MCP_TIMEOUT_MAX,
        initial=60.0,
        help_text="Seconds a connection or a call may take.",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, instance: McpServer | None = None, **kwargs: Any) -> None:
        self.instance = instance
        if instance is not None and not args and "initial" not in kwargs:
            kwargs["initial"] = {
                "name": instance.name,
                "transport": instance.transport,
                "command": instance.command,
                "args": "\n".join(instance.args or []),
                "env": masked_pairs(instance.get_env()),
                "mount_workspace": instance.mount_workspace,
                "url": instance.url,
                "headers": masked_pairs(instance.get_headers()),
                "timeout": instance.timeout,
                "enabled": instance.enabled,
            }
        super().__init__(*args, **kwargs)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        check_server_name(name, self.instance.name if self.instance else None)
        others = McpServer.objects.filter(name=name)
        if self.instance is not None:
            others = others.exclude(pk=self.instance.pk)
        if others.exists():
            raise forms.ValidationError(f"There is already a server named {name}.")
        return name

    def clean_env(self) -> dict[str, str]:
        kept = self.instance.get_env() if self.instance else {}
        return parse_pairs(self.cleaned_data["env"], kept, what="variable", name_pattern=ENV_NAME)

    def clean_headers(self) -> dict[str, str]:
        kept = self.instance.get_headers() if self.instance else {}
        return parse_pairs(
            self.cleaned_data["headers"], kept, what="header", name_pattern=HEADER_NAME
        )

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("transport") == McpServer.Transport.STDIO:
            if not data.get("command", "").strip():
                self.add_error("command", "A stdio server needs a command.")
            if data.get("url") or data.get("headers"):
                self.add_error("url", "A URL and headers are for HTTP servers.")
        elif data.get("transport") == McpServer.Transport.HTTP:
            if not data.get("url"):
                self.add_error("url", "An HTTP server needs its URL.")
            if data.get("command", "").strip() or data.get("args", "").strip() or data.get("env"):
                self.add_error("command", "A command, arguments and environment are for stdio.")
            if data.get("mount_workspace"):
                self.add_error("mount_workspace", "Only a stdio server can mount the workspace.")
        return data

    def save(self) -> McpServer:
        data = self.cleaned_data
        row = self.instance or McpServer()
        row.name = data["name"]
        row.transport = data["transport"]
        row.command = data["command"].strip()
        row.args = _lines(data["args"])
        row.mount_workspace = data["mount_workspace"]
        row.url = data["url"]
        row.timeout = data["timeout"]
        row.enabled = data["enabled"]
        row.set_env(data["env"])
        row.set_headers(data["headers"])
        row.save()
        return row


# --- External agents (ACP) --------------------------------------------------------------

# The longest command line an agent may have (its program and arguments, as typed).
MAX_AGENT_COMMAND_CHARS = 1000


class AcpAgentForm(forms.Form):
    """Add or edit an external agent (Settings, superusers only: its command runs here)."""

    # The same names as DISPATCH_ACP_AGENTS takes.
    name = forms.RegexField(
        regex=rf"^{ACP_AGENT_NAME.pattern}$",
        max_length=40,
        help_text="Lowercase letters, digits, _ and -: the model is acp/NAME.",
        error_messages={"invalid": "Use lowercase letters, digits, _ and - (not first)."},
    )
    command = forms.CharField(
        max_length=MAX_AGENT_COMMAND_CHARS,
        help_text="The program and its arguments, as in a shell (quotes group words), e.g. "
        "claude-code-acp. It runs in the shell's sandbox.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"}),
    )
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        label="Environment",
        help_text="NAME=value lines, saved encrypted and shown masked; a masked line keeps its "
        "saved value. Nothing else of the server's environment reaches the agent.",
    )
    provider = forms.ChoiceField(
        label="Credentials", choices=AcpAgent.Credentials.choices, required=False
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def __init__(self, *args: Any, instance: AcpAgent | None = None, **kwargs: Any) -> None:
        self.instance = instance
        if instance is not None and not args and "initial" not in kwargs:
            kwargs["initial"] = {
                "name": instance.name,
                "command": shlex.join(instance.command),
                "env": masked_pairs(instance.get_env()),
                "provider": instance.provider,
                "enabled": instance.enabled,
            }
        super().__init__(*args, **kwargs)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        others = AcpAgent.objects.filter(name=name)
        if self.instance is not None:
            others = others.exclude(pk=self.instance.pk)
        if others.exists():
            raise forms.ValidationError(f"There is already an agent named {name}.")
        return name

    def clean_command(self) -> list[str]:
        try:
            argv = shlex.split(self.cleaned_data["command"])
        except ValueError as exc:
            raise forms.ValidationError(f"The command could not be read: {exc}.") from None
        if not argv:
            raise forms.ValidationError("Name the program to run.")
        if any("\0" in word for word in argv):
            raise forms.ValidationError("The command holds a NUL character.")
        return argv

    def clean_env(self) -> dict[str, str]:
        kept = self.instance.get_env() if self.instance else {}
        return parse_pairs(self.cleaned_data["env"], kept, what="variable", name_pattern=ENV_NAME)

    def save(self) -> AcpAgent:
        data = self.cleaned_data
        row = self.instance or AcpAgent()
        row.name = data["name"]
        row.command = data["command"]
        row.provider = data["provider"]
        row.enabled = data["enabled"]
        row.set_env(data["env"])
        row.save()
        return row


# --- Wakes ---------------------------------------------------------------------------

# What a prompt that runs on its own may be: a message's bound.
MAX_WAKE_PROMPT_CHARS = MAX_MESSAGE_CHARS
NEW_TAB_TARGET = "new"


class WakeForm(forms.Form):
    """A new wake (chat.wakes): its times are read in its time zone and checked by
    chat.schedule; each problem is shown at the field it is about."""

    name = forms.CharField(max_length=200, required=False)
    target = forms.ChoiceField(label="Send to")
    prompt = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), max_length=MAX_WAKE_PROMPT_CHARS
    )
    kind = forms.ChoiceField(label="Schedule", choices=Wake.Kind.choices, initial=Wake.Kind.CRON)
    cron = forms.CharField(
        label="Cron expression",
        required=False,
        max_length=200,
        help_text="minute hour day-of-month month day-of-week, e.g. <code>0 9 * * 1-5</code>",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"}),
    )
    interval_seconds = forms.IntegerField(
        label="Every (seconds)",
        required=False,
        min_value=int(schedule.MIN_INTERVAL.total_seconds()),
        max_value=int(schedule.MAX_INTERVAL.total_seconds()),
        # The schedule's own words, whichever bound the value is past.
        error_messages={
            "min_value": f"The interval must be {schedule.INTERVAL_RANGE}.",
            "max_value": f"The interval must be {schedule.INTERVAL_RANGE}.",
        },
    )
    once_at = forms.DateTimeField(
        label="Once at",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    timezone = forms.CharField(
        label="Time zone",
        max_length=64,
        initial="UTC",
        help_text="An IANA name: Europe/Berlin, America/New_York, UTC.",
        widget=forms.TextInput(attrs={"list": "timezones", "autocomplete": "off"}),
    )
    overlap = forms.ChoiceField(
        choices=[
            (Wake.Overlap.QUEUE, "Queue behind a running turn"),
            (Wake.Overlap.SKIP, "Skip when a turn is running"),
        ],
        label="If the tab is busy",
    )
    catch_up = forms.ChoiceField(
        choices=[
            (Wake.CatchUp.LATEST, "Run once for the latest missed time"),
            (Wake.CatchUp.SKIP, "Skip missed times"),
        ],
        label="After downtime",
    )
    approval = forms.ChoiceField(
        choices=[
            (Wake.Approval.WAIT, "Wait for me (the tab shows it)"),
            (Wake.Approval.DENY, "Answer “not approved”"),
        ],
        label="A call needing approval",
    )
    profile = forms.ModelChoiceField(
        queryset=Profile.objects.order_by("name"), required=False, label="Profile (new tabs)"
    )
    model = forms.ChoiceField(required=False, label="Model (new tabs)")
    expires_at = forms.DateTimeField(
        label="Expires",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )

    def __init__(self, *args: Any, owner: Any, tabs: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner
        cast(forms.ChoiceField, self.fields["target"]).choices = [
            (NEW_TAB_TARGET, "A new tab each time")
        ] + [(str(t.pk), t.title or "New tab") for t in tabs]
        cast(forms.ChoiceField, self.fields["model"]).choices = [
            ("", "Profile's or default")
        ] + model_choices()
        self.wake: Wake | None = None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if self.errors:
            return data
        tz = data["timezone"].strip()
        target = data["target"]
        tab = None
        if target != NEW_TAB_TARGET:
            tab = Tab.objects.filter(pk=target, owner=self.owner).first()
            if tab is None:
                self.add_error("target", "That tab is gone: choose another.")
                return data
        try:
            zone = schedule.zone(tz)
        except schedule.ScheduleError as exc:
            self.add_error("timezone", str(exc))
            return data
        kind = data["kind"]
        wake = Wake(
            owner=self.owner,
            name=data["name"].strip(),
            tab=tab,
            new_tab=tab is None,
            prompt=data["prompt"],
            kind=kind,
            timezone=zone.key,
            overlap=data["overlap"],
            catch_up=data["catch_up"],
            approval=data["approval"],
            profile=data["profile"] if tab is None else None,
            model=data["model"] if tab is None else "",
        )
        try:
            if data["expires_at"] is not None:
                wake.expires_at = schedule.local_to_utc(_naive(data["expires_at"]), tz)
        except schedule.ScheduleError as exc:
            self.add_error("expires_at", str(exc))
            return data
        field = {Wake.Kind.CRON: "cron", Wake.Kind.INTERVAL: "interval_seconds"}.get(
            kind, "once_at"
        )
        try:
            if kind == Wake.Kind.CRON:
                wake.cron = schedule.check_cron(data["cron"], tz)
            elif kind == Wake.Kind.INTERVAL:
                wake.interval_seconds = data["interval_seconds"]
            elif data["once_at"] is not None:
                wake.once_at = schedule.local_to_utc(_naive(data["once_at"]), tz)
            wakes.reschedule(wake, dj_timezone.now())
        except schedule.ScheduleError as exc:
            self.add_error(field, str(exc))
            return data
        self.wake = wake
        return data


def _naive(value: Any) -> Any:
    """A datetime-local field's value as typed: Django makes it aware in the server's
    zone, and the wake's zone is the one that counts."""
    return dj_timezone.make_naive(value) if dj_timezone.is_aware(value) else value
