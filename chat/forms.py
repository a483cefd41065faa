"""The web UI's forms. The settings they write are read back by chat.preferences."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from django import forms
from django.contrib.auth.forms import UserCreationForm
from django.core.validators import URLValidator
from django.db import transaction

from chat import rules
from chat.models import McpServer, PermissionRule, Profile, set_setting
from chat.preferences import (
    DEFAULT_SYSTEM_PROMPT,
    DOM_WINDOW_MAX,
    PAGE_SIZE_MAX,
    PAGE_SIZE_MIN,
    Preferences,
)
from chat.providers import default_model, list_models
from chat.providers.registry import PROVIDERS
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
    return list(list_models())


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
        self.fields["model"].choices = model_choices(current)


# --- Settings --------------------------------------------------------------------------


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["default_model"].widget.attrs["placeholder"] = f"automatic: {default_model()}"
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

    def clean_default_model(self) -> str:
        value = self.cleaned_data["default_model"].strip()
        return validate_model_id(value) if value else ""

    def clean_fallback_model(self) -> str:
        value = self.cleaned_data["fallback_model"].strip()
        return validate_model_id(value) if value else ""

    def clean(self) -> dict[str, Any]:
        data = super().clean()
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


class ApiKeyForm(forms.Form):
    provider = forms.ChoiceField()
    key = forms.CharField(
        label="API key",
        strip=True,
        min_length=API_KEY_MIN_CHARS,
        max_length=API_KEY_MAX_CHARS,
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}, render_value=False),
        error_messages={
            "required": "Paste the key.",
            "min_length": "That is too short for an API key (at least %(limit_value)s characters).",
            "max_length": "That is too long for an API key (at most %(limit_value)s characters).",
        },
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = key_providers()

    def clean_key(self) -> str:
        key = self.cleaned_data["key"]
        if any(ch.isspace() for ch in key):
            raise forms.ValidationError("An API key has no spaces or line breaks in it.")
        if not key.isascii() or not key.isprintable():
            raise forms.ValidationError("An API key is plain ASCII text; check what was pasted.")
        return key


class EndpointForm(forms.Form):
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = key_providers()


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
        self.fields["system_prompt"].max_length = MAX_SYSTEM_PROMPT_CHARS
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
