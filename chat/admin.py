"""The operator's view of Dispatch in the Django admin (staff only).

The chunk log is append-only: chunks are read here, never added, edited or
deleted. Tabs are not added or deleted here either (a tab's system prompt is
frozen by the app when it creates one; history goes away with the app's own
delete or `manage.py wipe_history`). API keys are only ever shown masked.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG, IGNORED_PARAMS, PAGE_VAR, SEARCH_VAR
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import JsonLexer

from chat import log, schedule, usage, wakes
from chat import render as chat_render
from chat.chunks import Error, Kind, SystemNotice, Thinking, ToolCall, ToolResult
from chat.forms import (
    McpServerForm,
    ProfileForm,
    default_model_kept,
    key_elsewhere_note,
    key_providers,
    masked_pairs,
)
from chat.models import (
    ApiKey,
    ApiToken,
    Chunk,
    McpServer,
    Profile,
    ProviderEndpoint,
    RunningTurn,
    Setting,
    Tab,
    UsageRecord,
    Wake,
    WakeRun,
)
from chat.providers.registry import endpoint_now
from chat.tools import mcp
from chat.turn.lease import is_stale, turn_usage

# Dispatch's name on every admin page, where Django would say "Django administration".
admin.site.site_header = "Dispatch admin"
admin.site.site_title = "Dispatch admin"
admin.site.index_title = "Stored rows"

# A list row is one line: long enough to recognise a chunk, short enough not
# to wrap on a laptop screen next to the other columns.
PREVIEW_CHARS = 120
# Pygments needs about a second per megabyte; above this a payload is shown
# as plain (escaped) text so a huge tool result cannot stall the page.
HIGHLIGHT_MAX_CHARS = 200_000
# Counting more rows than this for a filtered chunk list costs more than the
# page itself; past it the list says "more than" and pages up to this bound.
CHUNK_COUNT_CAP = 10_000
# One turn is at most DISPATCH_MAX_STEPS steps of a few chunks each; this
# bound only stops a runaway turn from producing a page nobody can load.
TURN_VIEW_MAX_CHUNKS = 2_000
# Real provider keys are 40+ characters. A shorter one is a paste error, and
# the four characters the mask shows must stay a small part of the key.
API_KEY_MIN_LENGTH = 16

# ModelAdmin.fields: each a field's name, or the names shown on one line.
FieldGroups = list[str | list[str] | tuple[str, ...]]


class _TabListColumns(TypedDict):
    """What TabAdmin.get_queryset adds to each tab."""

    turns: int | None
    last_chunk_at: datetime | None


if TYPE_CHECKING:
    # django-stubs' helper (a dev package): annotations only.
    from django_stubs_ext import WithAnnotations

    # A tab as TabAdmin lists it.
    TabRow = WithAnnotations[Tab, _TabListColumns]

_JSON_FORMATTER = HtmlFormatter(cssclass="chunk-json", wrapcode=True)
# Light colours, and dark ones where the admin is dark: its own theme toggle
# (html[data-theme]) or, on "auto", the system's.
_DARK_JSON = HtmlFormatter(style="github-dark").get_style_defs
PYGMENTS_CSS = mark_safe(
    _JSON_FORMATTER.get_style_defs(".chunk-json")
    + "\n"
    + _DARK_JSON('html[data-theme="dark"] .chunk-json')
    + "\n@media (prefers-color-scheme: dark) {\n"
    + _DARK_JSON('html[data-theme="auto"] .chunk-json')
    + "\n}"
)


def pretty_json(data: Any) -> SafeString:
    """The payload as indented, syntax-coloured JSON (HTML-escaped by Pygments)."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    if len(text) > HIGHLIGHT_MAX_CHARS:
        return format_html(
            '<div class="chunk-json"><pre>{}</pre></div>'
            '<p class="help">{} characters: shown without colours.</p>',
            text,
            len(text),
        )
    return mark_safe(highlight(text, JsonLexer(), _JSON_FORMATTER))


def payload_preview(chunk_type: str, data: Any, limit: int = PREVIEW_CHARS) -> str:
    """One line that says what the chunk holds, cut to `limit` characters."""
    if not isinstance(data, dict):
        line = json.dumps(data, ensure_ascii=False)
    elif chunk_type in (Kind.TEXT, Kind.THINKING):
        thinking = cast(Thinking, data)
        line = thinking.get("text") or ""
        if not line and chunk_type == Kind.THINKING:
            line = "[redacted thinking]" if thinking.get("redacted_data") else "[signature only]"
    elif chunk_type == Kind.TOOL_CALL:
        call = cast(ToolCall, data)
        line = f"{call.get('name', '?')}({_compact(call.get('arguments', {}))})"
    elif chunk_type == Kind.TOOL_RESULT:
        tool_result = cast(ToolResult, data)
        result = tool_result.get("result")
        body = result if isinstance(result, str) else _compact(result)
        mark = "error: " if tool_result.get("is_error") else ""
        line = f"{tool_result.get('name', '?')} → {mark}{body}"
    elif chunk_type == Kind.ERROR:
        error = cast(Error, data)
        status = error.get("status_code")
        line = f"[{status}] {error.get('message', '')}" if status else str(error.get("message", ""))
    elif chunk_type == Kind.SYSTEM:
        notice = cast(SystemNotice, data)
        line = f"{notice.get('kind', '?')}: {notice.get('text', '')}"
    else:
        line = _compact(data)
    line = " ".join(str(line).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _tab_page_url(tab_id: uuid.UUID) -> str | None:
    """The app's page for the tab, or None while the app has no "tab" route."""
    try:
        return reverse("tab", kwargs={"tab_id": tab_id})
    except NoReverseMatch:
        return None


def _chunks_of_tab_url(tab_id: uuid.UUID) -> str:
    return f"{reverse('admin:chat_chunk_changelist')}?tab__id__exact={tab_id}"


def _turn_url(turn_id: uuid.UUID) -> str:
    return reverse("admin:chat_chunk_turn", kwargs={"turn_id": turn_id})


def _running_of(tab: Tab) -> RunningTurn | None:
    try:
        return tab.runningturn
    except RunningTurn.DoesNotExist:
        return None


# --- Tabs ---------------------------------------------------------------------


@admin.register(Tab)
class TabAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "owner",
        "created_at",
        "updated_at",
        "chunk_count",
        "turn_count",
        "running_state",
        "last_activity",
        "links",
    ]
    list_select_related = ["owner", "runningturn"]
    search_fields = ["title"]
    # By fork_seq, not parent: a branch whose parent was deleted is still one.
    list_filter = [("fork_seq", admin.EmptyFieldListFilter)]
    fields = [
        "title",
        "owner",
        "model",
        "system_prompt",
        "parent",
        "fork_seq",
        "created_at",
        "updated_at",
        "chunk_count",
        "turn_count",
        "running_state",
        "last_activity",
        "links",
    ]
    readonly_fields = [
        "model",
        "system_prompt",
        "parent",
        "fork_seq",
        "created_at",
        "updated_at",
        "chunk_count",
        "turn_count",
        "running_state",
        "last_activity",
        "links",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Tab]:
        chunks = Chunk.objects.filter(tab=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                turns=Subquery(
                    chunks.order_by()
                    .values("tab")
                    .annotate(n=Count("turn_id", distinct=True))
                    .values("n")
                ),
                # Walks the (tab, seq) index backwards: one row per tab.
                last_chunk_at=Subquery(chunks.order_by("-seq").values("created_at")[:1]),
            )
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Tab | None = None) -> bool:
        # The delete page would collect every chunk of the tab into memory to
        # list them, and chunks are not deletable here anyway.
        return False

    @admin.display(description="chunks", ordering="last_seq")
    def chunk_count(self, tab: Tab) -> int:
        # Exact: chat.log.append hands out seqs 1, 2, 3… under the tab lock and
        # chunks are never deleted one by one, so the last seq is the count.
        return tab.last_seq

    @admin.display(description="turns", ordering="turns")
    def turn_count(self, tab: TabRow) -> int:
        return tab.turns or 0

    @admin.display(description="running")
    def running_state(self, tab: Tab) -> str:
        running = _running_of(tab)
        if running is None:
            return "idle"
        state = f"{running.get_status_display().lower()}, step {running.step}"
        if running.cancel_requested:
            why = f" ({running.cancel_why})" if running.cancel_why else ""
            state += f", cancel requested{why}"
        if is_stale(running):
            state += " (stale lease)"
        return state

    @admin.display(description="last activity")
    def last_activity(self, tab: TabRow) -> datetime:
        running = _running_of(tab)
        moments = [m for m in (tab.last_chunk_at, running and running.heartbeat_at) if m]
        return max(moments) if moments else tab.created_at

    @admin.display(description="links")
    def links(self, tab: Tab) -> SafeString:
        chunks = format_html('<a href="{}">chunks</a>', _chunks_of_tab_url(tab.pk))
        page = _tab_page_url(tab.pk)
        if page is None:
            return chunks
        return format_html('{} · <a href="{}">open tab</a>', chunks, page)


# --- Chunks -------------------------------------------------------------------


class ChunkPaginator(Paginator):
    """A paginator that never counts a long tab's chunks row by row.

    `known_count` is a count the caller got for free (see ChunkAdmin); without
    one, rows are counted up to CHUNK_COUNT_CAP and `capped` says when there
    are more than that.
    """

    def __init__(self, *args: Any, known_count: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.known_count = known_count
        self.capped = False

    @cached_property
    def count(self) -> int:
        if self.known_count is not None:
            return self.known_count
        # ChunkAdmin pages a queryset of chunks.
        counted = cast(QuerySet[Chunk], self.object_list)[: CHUNK_COUNT_CAP + 1].count()
        if counted > CHUNK_COUNT_CAP:
            self.capped = True
            return CHUNK_COUNT_CAP
        return counted


class ChunkAdmin(admin.ModelAdmin):
    """Read-only: the log is append-only."""

    list_display = ["tab", "seq", "turn", "step", "role", "type", "preview"]
    list_display_links = ["seq"]
    list_select_related = ["tab"]
    list_filter = ["type", "role", "tab", "created_at"]
    # Key transforms search the decoded strings (so "café" matches on SQLite,
    # which stores JSON \u-escaped); a pasted turn id matches the turn exactly.
    search_fields = [
        "data__text",
        "data__message",
        "data__name",
        "data__arguments",
        "data__result",
        "data__shell_output",
        "turn_id__exact",
    ]
    search_help_text = "Searches the payload text (text, message, tool name, arguments, result)."
    # tab_id, not tab: "tab" would order by Tab's own ordering through a join
    # and lose the (tab, seq) index.
    ordering = ["tab_id", "seq"]
    show_full_result_count = False
    # Facet counts are one full count per filter choice.
    show_facets = admin.ShowFacets.NEVER
    fields = readonly_fields = (
        "tab",
        "seq",
        "turn",
        "step",
        "role",
        "type",
        "created_at",
        "payload",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Chunk | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Chunk | None = None) -> bool:
        return False

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> ChunkPaginator:
        return ChunkPaginator(
            queryset,
            per_page,
            orphans,
            allow_empty_first_page,
            known_count=self._free_count(request),
        )

    def _free_count(self, request: HttpRequest) -> int | None:
        """The list's row count when the tabs' last seqs give it for free, else None.

        No filter: the sum of every tab's last seq. Only a tab filter: that
        tab's last seq (see TabAdmin.chunk_count for why that is exact).
        """
        if request.GET.get(SEARCH_VAR):
            return None
        params = {
            key: values
            for key, values in request.GET.lists()
            if key not in IGNORED_PARAMS and key not in (PAGE_VAR, ERROR_FLAG)
        }
        if not params:
            return Tab.objects.aggregate(n=Sum("last_seq"))["n"] or 0
        if params.keys() == {"tab__id__exact"} and len(params["tab__id__exact"]) == 1:
            try:
                tab_id = uuid.UUID(params["tab__id__exact"][0])
            except ValueError:
                return None
            found = Tab.objects.filter(pk=tab_id).values_list("last_seq", flat=True).first()
            return found or 0
        return None

    def get_urls(self):
        turn_view = self.admin_site.admin_view(self.turn_view)
        return [
            path("turn/<uuid:turn_id>/", turn_view, name="chat_chunk_turn"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "pygments_css": PYGMENTS_CSS}
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="turn", ordering="turn_id")
    def turn(self, chunk: Chunk) -> SafeString | str:
        if chunk.turn_id is None:
            return "-"
        return format_html(
            '<a href="{}" title="{}">{}</a>',
            _turn_url(chunk.turn_id),
            chunk.turn_id,
            str(chunk.turn_id)[:8],
        )

    @admin.display(description="payload")
    def preview(self, chunk: Chunk) -> str:
        return payload_preview(chunk.type, chunk.data)

    @admin.display(description="payload")
    def payload(self, chunk: Chunk) -> SafeString:
        return pretty_json(chunk.data)

    def turn_view(self, request: HttpRequest, turn_id: uuid.UUID) -> TemplateResponse:
        """Every chunk of one turn in seq order, grouped by step, with each step's usage."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        chunks = list(
            Chunk.objects.filter(turn_id=turn_id)
            .select_related("tab")
            .order_by("seq")[: TURN_VIEW_MAX_CHUNKS + 1]
        )
        running = RunningTurn.objects.filter(turn_id=turn_id).select_related("tab").first()
        if not chunks and running is None:
            raise Http404("No chunk belongs to this turn.")
        truncated = len(chunks) > TURN_VIEW_MAX_CHUNKS
        chunks = chunks[:TURN_VIEW_MAX_CHUNKS]

        usage_by_step: dict[int, dict[str, int]] = {}
        for record in UsageRecord.objects.filter(turn_id=turn_id):
            step = usage_by_step.setdefault(
                record.step, {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
            )
            step["input"] += record.input_tokens
            step["output"] += record.output_tokens
            step["cache_read"] += record.cache_read_tokens
            step["cache_write"] += record.cache_write_tokens

        steps: dict[int, list[dict[str, Any]]] = {}
        for chunk in chunks:
            steps.setdefault(chunk.step, []).append(
                {
                    "chunk": chunk,
                    "url": reverse("admin:chat_chunk_change", args=[chunk.pk]),
                    "preview": payload_preview(chunk.type, chunk.data),
                    "json": pretty_json(chunk.data),
                }
            )
        # No chunks: the running turn is there (checked above).
        tab = chunks[0].tab if chunks else cast(RunningTurn, running).tab
        open_block = log.checkpointed(running.tab_id) if running else None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Turn {str(turn_id)[:8]}",
            "turn_id": turn_id,
            "tab": tab,
            "tab_chunks_url": _chunks_of_tab_url(tab.pk),
            "steps": [
                {"step": step, "chunks": rows, "usage": usage_by_step.get(step)}
                for step, rows in steps.items()
            ],
            "totals": turn_usage(turn_id),
            "truncated": truncated,
            "max_chunks": TURN_VIEW_MAX_CHUNKS,
            "running": running,
            "running_stale": running is not None and is_stale(running),
            "open_chunk_preview": (
                payload_preview(open_block.type, open_block.data) if open_block else None
            ),
            "pygments_css": PYGMENTS_CSS,
        }
        return TemplateResponse(request, "admin/chat/chunk/turn.html", context)


admin.site.register(Chunk, ChunkAdmin)


# --- Kept state ---------------------------------------------------------------


@admin.register(Setting)
class SettingAdmin(admin.ModelAdmin):
    list_display = ["key", "value", "updated_at"]
    search_fields = ["key"]


@admin.register(ProviderEndpoint)
class ProviderEndpointAdmin(admin.ModelAdmin):
    """Superusers add, change and remove endpoints: the stored keys are sent there. Other
    staff see them. A stored key saved for another endpoint is not sent to a changed one
    until it is entered again (the registry refuses; the page says so)."""

    list_display = ["provider", "base_url", "updated_at"]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        self._warn(request, [obj.provider])

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        super().delete_model(request, obj)
        self._warn(request, [obj.provider])

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        providers = list(queryset.values_list("provider", flat=True))
        super().delete_queryset(request, queryset)
        self._warn(request, providers)

    def _warn(self, request: HttpRequest, providers: list[str]) -> None:
        for provider in providers:
            if note := key_elsewhere_note(provider):
                self.message_user(request, note, level=messages.WARNING)


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    """The Settings page's form, so a profile is checked the same way in both places."""

    form = ProfileForm
    fields = ["name", "description", "system_prompt", "model", "tools", "rules_text"]
    list_display = ["name", "description", "model", "updated_at"]
    search_fields = ["name", "description"]

    def save_related(
        self, request: HttpRequest, form: ProfileForm, formsets: Any, change: bool
    ) -> None:
        super().save_related(request, form, formsets, change)
        form.save_rules()


class UsagePeriodFilter(admin.SimpleListFilter):
    """The periods Settings shows usage over (a value it does not offer filters nothing)."""

    title = "period"
    parameter_name = "period"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(usage.PERIOD_LABELS.items())

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        period = self.value()
        if period in usage.PERIODS:
            return queryset.filter(created_at__gte=timezone.now() - usage.PERIODS[period])
        return queryset


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Usage is a record of what happened: viewable and deletable, never edited. Above
    the list, the filtered steps' tokens and cost per user and model (one query)."""

    list_display = [
        "created_at",
        "user",
        "model",
        "tab_id",
        "turn",
        "step",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "cost",
    ]
    list_filter = [UsagePeriodFilter, "model", "created_at"]
    list_select_related = ["user"]
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UsageRecord | None = None) -> bool:
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> Any:
        response = super().changelist_view(request, extra_context)
        context: dict[str, Any] = getattr(response, "context_data", {})
        changelist = context.get("cl")
        if changelist is not None:
            rows, total = usage.by_user_and_model(changelist.queryset)
            context.update(
                usage_rows=[
                    {"user": r.user, "model": r.model, "u": chat_render.usage_line(r.totals)}
                    for r in rows
                ],
                usage_total=chat_render.usage_line(total),
                prices_version=usage.PRICES_VERSION,
            )
        return response

    @admin.display(description="cost")
    def cost(self, record: UsageRecord) -> str:
        tokens = usage.Tokens(
            record.input_tokens,
            record.output_tokens,
            record.cache_read_tokens,
            record.cache_write_tokens,
        )
        cost = usage.step_cost(record.model, tokens, record.created_at)
        return "price unknown" if cost is None else f"${usage.usd_text(cost)}"

    @admin.display(description="turn", ordering="turn_id")
    def turn(self, record: UsageRecord) -> SafeString:
        return format_html(
            '<a href="{}" title="{}">{}</a>',
            _turn_url(record.turn_id),
            record.turn_id,
            str(record.turn_id)[:8],
        )


class ApiKeyForm(forms.ModelForm):
    """Takes the key in plain text once and stores it encrypted; never shows it back."""

    provider = forms.ChoiceField(choices=key_providers)
    key = forms.CharField(
        label="API key",
        required=False,
        strip=True,
        # render_value=False: a re-displayed form (after an error) must not
        # carry the key back into the page.
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}),
    )

    class Meta:
        model = ApiKey
        fields = ["provider"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["key"].help_text = (
            "Stored encrypted; shown afterwards only by its last four characters."
            if self.instance._state.adding
            else "Type a new key to replace the stored one; leave empty to keep it."
        )

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        provider = data.get("provider") or self.instance.provider
        # The key is bound to where a request goes now (the registry refuses it elsewhere).
        self.endpoint = endpoint_now(provider)
        if provider and data.get("key") and not self.endpoint:
            raise ValidationError(
                f"{provider} has no endpoint yet, and a stored key is bound to the endpoint "
                "it is saved for: set one under Provider endpoints first."
            )
        return data

    def clean_key(self) -> str:
        key = self.cleaned_data["key"]
        if not key:
            if self.instance._state.adding:
                raise ValidationError("Enter the API key.")
            return ""
        if any(char.isspace() for char in key):
            raise ValidationError("An API key has no spaces or line breaks: check what was pasted.")
        if len(key) < API_KEY_MIN_LENGTH:
            raise ValidationError(
                f"This is too short for an API key (at least {API_KEY_MIN_LENGTH} characters)."
            )
        return key

    def save(self, commit: bool = True) -> ApiKey:
        api_key = super().save(commit=False)
        if self.cleaned_data.get("key"):
            api_key.set_key(self.cleaned_data["key"], endpoint=self.endpoint)
        if commit:
            api_key.save()
        return api_key


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    form = ApiKeyForm
    list_display = ["provider", "masked_key", "endpoint", "updated_at"]
    fields = ["provider", "key", "masked_key", "endpoint", "created_at", "updated_at"]
    readonly_fields = ["masked_key", "endpoint", "created_at", "updated_at"]

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        with default_model_kept() as kept:
            super().save_model(request, obj, form, change)
        if kept:
            self.message_user(
                request,
                f"New tabs and wakes still use {kept[0]}: saving a key changes no default "
                "(Settings → Connections offers the change).",
                messages.INFO,
            )

    def get_readonly_fields(self, request: HttpRequest, obj: ApiKey | None = None) -> list[str]:
        readonly = list(super().get_readonly_fields(request, obj))
        # Another provider's endpoint is another endpoint: a key is entered for one.
        return readonly if obj is None else ["provider", *readonly]

    @admin.display(description="stored key")
    def masked_key(self, api_key: ApiKey) -> str:
        return api_key.masked if api_key.last4 else "-"


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are issued on the API tokens page or by create_api_token, which show the plain
    token once; here they can be seen, renamed, made read-only, and revoked (deleted)."""

    list_display = ["prefix", "name", "user", "read_only", "created_at", "last_used_at"]
    list_filter = ["read_only"]
    list_select_related = ["user"]
    search_fields = ["name", "prefix", "user__username"]
    fields = ["user", "name", "prefix", "read_only", "created_at", "last_used_at", "token_hash"]
    readonly_fields = ["user", "prefix", "created_at", "last_used_at", "token_hash"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class McpServerAdminForm(forms.ModelForm):
    """env and headers as NAME=value lines, shown masked; a masked line keeps its value.
    Every check is the Settings form's (McpServerForm: name, timeout bounds, stdio or
    HTTP fields, an http or https URL, the lines), run on what was posted here."""

    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="stdio: NAME=value lines, stored encrypted, shown masked.",
    )
    headers = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        required=False,
        help_text="HTTP: Name=value lines, stored encrypted, shown masked.",
    )

    class Meta:
        model = McpServer
        fields = [
            "name",
            "transport",
            "command",
            "args",
            "mount_workspace",
            "url",
            "timeout",
            "enabled",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding:
            self.fields["env"].initial = masked_pairs(self.instance.get_env())
            self.fields["headers"].initial = masked_pairs(self.instance.get_headers())

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        args = data.get("args")
        listed = isinstance(args, list) and all(isinstance(arg, str) for arg in args)
        if "args" in data and not listed:
            self.add_error("args", 'Arguments are a JSON list of strings, e.g. ["-y", "server"].')

        def posted(name: str) -> str:
            return self.data.get(self.add_prefix(name), "")

        settings_form = McpServerForm(
            {
                "name": posted("name"),
                "transport": posted("transport"),
                "command": posted("command"),
                # listed: a list of strings.
                "args": "\n".join(cast(list[str], args)) if listed else "",
                "env": posted("env"),
                "mount_workspace": posted("mount_workspace"),
                "url": posted("url"),
                "headers": posted("headers"),
                "timeout": posted("timeout"),
                "enabled": posted("enabled"),
            },
            instance=None if self.instance._state.adding else self.instance,
        )
        if settings_form.is_valid():
            data["env"] = settings_form.cleaned_data["env"]
            data["headers"] = settings_form.cleaned_data["headers"]
            return data
        for name, errors in settings_form.errors.items():
            # A field whose own check here failed already says why: one message each.
            field = name if name in self.fields else None
            if field is None or not self.has_error(field):
                for error in errors:
                    self.add_error(field, error)
        return data

    def save(self, commit: bool = True) -> McpServer:
        server = super().save(commit=False)
        server.set_env(self.cleaned_data["env"])
        server.set_headers(self.cleaned_data["headers"])
        if commit:
            server.save()
        return server


@admin.register(McpServer)
class McpServerAdmin(admin.ModelAdmin):
    """Superusers add, change and remove servers: a stdio server is a program run on this
    machine, as whoever runs Dispatch. Other staff see them, secrets masked."""

    form = McpServerAdminForm
    list_display = [
        "name",
        "transport",
        "target",
        "secrets",
        "mount_workspace",
        "enabled",
        "timeout",
        "updated_at",
    ]
    list_filter = ["transport", "enabled", "mount_workspace"]

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return request.user.is_active and request.user.is_staff

    def has_add_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        # One by one: McpServer.delete removes each server's homes.
        for server in queryset:
            server.delete()

    def get_fields(self, request: HttpRequest, obj: McpServer | None = None) -> FieldGroups:
        fields = list(super().get_fields(request, obj))
        if self.has_change_permission(request, obj):
            return fields
        # A view-only page shows the URL as the list does: password and query masked.
        return ["shown_url" if name == "url" else name for name in fields if name != "shown_url"]

    def get_readonly_fields(self, request: HttpRequest, obj: McpServer | None = None) -> list[str]:
        readonly = list(super().get_readonly_fields(request, obj))
        return readonly if self.has_change_permission(request, obj) else [*readonly, "shown_url"]

    @admin.display(description="URL")
    def shown_url(self, server: McpServer) -> str:
        return mcp.shown_url(server.url)

    # Shown, masked, where the form's fields are not (a view-only page).
    @admin.display(description="env")
    def env(self, server: McpServer) -> str:
        return masked_pairs(server.get_env() or {})

    @admin.display(description="headers")
    def headers(self, server: McpServer) -> str:
        return masked_pairs(server.get_headers() or {})

    @admin.display(description="command or URL")
    def target(self, server: McpServer) -> str:
        # Its password and query (a ?token=) masked: staff who are not superusers see it.
        if server.transport == McpServer.Transport.HTTP:
            return mcp.shown_url(server.url)
        return server.command

    @admin.display(description="env and headers")
    def secrets(self, server: McpServer) -> str:
        return masked_pairs({**(server.get_env() or {}), **(server.get_headers() or {})})


class WakeAdminForm(forms.ModelForm):
    """The schedule is checked as on the Wakes page; the next run is computed, not typed:
    from now for a new wake or a change of when it runs, and kept otherwise (an edited
    prompt does not move the next run, and a once wake that fired can still be edited)."""

    class Meta:
        model = Wake
        exclude = ["next_run_at"]

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if self.errors:
            return data
        tab, owner = data.get("tab"), data.get("owner")
        if tab is not None and owner is not None and tab.owner_id != owner.pk:
            raise ValidationError({"tab": f"That tab is not {owner}'s: a wake runs as its owner."})
        probe = Wake(**{k: v for k, v in data.items() if k in _WAKE_SCHEDULE_FIELDS})
        try:
            if data.get("enabled") and self.restarts_schedule:
                wakes.reschedule(probe, timezone.now())
            else:
                wakes.schedule_of(probe)
        except schedule.ScheduleError as exc:
            raise ValidationError(str(exc)) from None
        return data

    @property
    def restarts_schedule(self) -> bool:
        return self.instance.pk is None or bool(
            set(self.changed_data) & {*_WAKE_SCHEDULE_FIELDS, "enabled"}
        )


_WAKE_SCHEDULE_FIELDS = ("kind", "cron", "timezone", "interval_seconds", "once_at", "expires_at")


class WakeRunInline(admin.TabularInline):
    model = WakeRun
    extra = 0
    can_delete = False
    fields = readonly_fields = (
        "scheduled_for",
        "status",
        "reason",
        "tab",
        "queued_id",
        "finished_at",
    )
    max_num = 0


@admin.register(Wake)
class WakeAdmin(admin.ModelAdmin):
    form = WakeAdminForm
    list_display = ["__str__", "owner", "kind", "cron", "timezone", "enabled", "next_run_at"]
    list_filter = ["enabled", "kind", "created_by"]
    readonly_fields = ["next_run_at", "created_at", "updated_at"]
    inlines = [WakeRunInline]

    def save_model(self, request: HttpRequest, obj: Wake, form: Any, change: bool) -> None:
        # The form checked that the schedule can start again from now.
        fields = list(form.changed_data)
        if form.restarts_schedule:
            wakes.reschedule(obj, timezone.now())
            fields.append("next_run_at")
        if change:
            # Only what the form changed: the scheduler may have moved next_run_at on
            # since the row was read, and writing the read value back would undo that.
            obj.save(update_fields=[*fields, "updated_at"])
        else:
            obj.save()
        wakes.changed()


@admin.register(WakeRun)
class WakeRunAdmin(admin.ModelAdmin):
    list_display = ["wake", "scheduled_for", "status", "tab", "finished_at"]
    list_filter = ["status"]
    readonly_fields = [f.name for f in WakeRun._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
