"""The web UI's views: accounts, tabs, the chat page and its actions, settings.

Thin: rendering of chunks is chat.render's, turns are chat.turns'. Every view
but the first-run page and the login page needs a logged-in user, and a tab is
only ever looked up together with its owner.
"""

from __future__ import annotations

import functools
import os
import uuid
import zoneinfo
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import F
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import content_disposition_header
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from chat import (
    blobs,
    cuts,
    log,
    preferences,
    resume,
    rules,
    schedule,
    search,
    sidebar,
    transfer,
    turns,
    usage,
    wakes,
)
from chat import render as chat_render
from chat.forms import (
    MAX_MESSAGE_CHARS,
    MAX_SYSTEM_PROMPT_CHARS,
    OFFLINE_MODEL,
    ApiKeyForm,
    EndpointForm,
    McpServerForm,
    MessageForm,
    NewTabForm,
    OwnerForm,
    ProfileForm,
    RenameForm,
    SettingsForm,
    TabModelForm,
    TabSystemPromptForm,
    WakeForm,
    key_elsewhere_note,
    key_providers,
    known_models,
    masked_pairs,
    model_choices,
)
from chat.models import (
    ApiKey,
    ApiToken,
    Attachment,
    Blob,
    Chunk,
    McpServer,
    PermissionRule,
    Profile,
    ProviderEndpoint,
    Setting,
    Tab,
    UsageRecord,
    Wake,
    WakeRun,
)
from chat.providers.registry import PROVIDERS, endpoint_now
from chat.stream import Kind, Role
from chat.tools import files as workspace_files
from chat.tools import mcp, sandbox, workdir
from chat.tools.workdir import BadWorkdir
from chat.turn import lease

# The row whose lock makes "no user yet, create the owner" one step across processes.
SETUP_LOCK_KEY = "owner_setup"
# ApiToken.name's column.
API_TOKEN_NAME_MAX_CHARS = 100
# A tab's menu and its "⑂ N branches" controls list its first this many branches: a
# tab branched more often than that is rare, and each branch is in the sidebar anyway.
MAX_BRANCHES_LISTED = 100
# A tool output's plain-text view goes out in pieces of this many characters: an
# imported log may hold a huge one, which is then never encoded whole at once.
OUTPUT_PIECE_CHARS = 64 * 1024
# The approval form's answers: each names the call it answers.
APPROVAL_ANSWERS = ("approve", "deny", "always_tab", "always_user")


def _get_tab_for_user(request: HttpRequest, tab_id: uuid.UUID) -> Tab:
    return get_object_or_404(Tab, pk=tab_id, owner=request.user)


def tab_gone_is_404(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A tab deleted while the request ran (found, then gone when turns locks it) is a
    404, as if it had been gone from the start, not a server error."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except Tab.DoesNotExist:
            raise Http404("That tab was deleted.") from None

    return wrapper


def _sidebar_tabs(request: HttpRequest) -> list[Tab]:
    return sidebar.tabs(request.user)


def _staff(request: HttpRequest) -> None:
    # Settings hold every user's API keys: only the install's staff may see them.
    if not request.user.is_staff:
        raise PermissionDenied("Only staff can change the settings.")


def _endpoint_superuser(request: HttpRequest) -> None:
    # The stored keys are sent to the endpoints: other staff only see where.
    if not request.user.is_superuser:
        raise PermissionDenied(
            "Only superusers can add, change or remove provider endpoints: the stored API "
            "keys are sent there."
        )


def _mcp_superuser(request: HttpRequest) -> None:
    # A stdio server is a program run on this machine: other staff only see the servers.
    if not request.user.is_superuser:
        raise PermissionDenied("Only superusers can add, change or remove MCP servers.")


# --- Accounts ------------------------------------------------------------------------


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


def login_view(request: HttpRequest) -> HttpResponse:
    if not get_user_model().objects.exists():
        return redirect("setup")
    return auth_views.LoginView.as_view(
        template_name="chat/login.html", redirect_authenticated_user=True
    )(request)


logout_view = auth_views.LogoutView.as_view()


# --- Tabs ---------------------------------------------------------------------------------


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    tabs = _sidebar_tabs(request)
    if tabs:
        return redirect("tab", tab_id=tabs[0].id)
    return render(request, "chat/home.html", {"tabs": tabs})


@login_required
@require_http_methods(["GET", "POST"])
def tab_new(request: HttpRequest) -> HttpResponse:
    """A new tab: the sidebar's button posts nothing (the Settings page's defaults);
    GET is the form with a profile and a working directory."""
    form = NewTabForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        try:
            tab = preferences.new_tab(
                request.user,
                profile=form.cleaned_data["profile"],
                workdir=form.cleaned_data["workdir"],
            )
        except BadWorkdir as exc:  # the folder could not be made, or is a link
            form.add_error("workdir", str(exc))
        else:
            return redirect("tab", tab_id=tab.id)
    context = {"tabs": _sidebar_tabs(request), "form": form}
    return render(request, "chat/tab_new.html", context, status=422 if form.errors else 200)


@login_required
@require_GET
def tab(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """The tab's latest page; with ?seq=N (a search result) the page around that chunk.

    A window that ends before the live end is detached, as after scrolling far
    back: the "newer" link instead of live chunks, and `live_seq` for the
    socket's hello, so it sends what came since and never replaces the window.
    """
    tab = _get_tab_for_user(request, tab_id)
    conf = preferences.load()
    hit = None
    if "seq" in request.GET:
        try:
            hit = int(request.GET["seq"])
        except ValueError:
            return HttpResponseBadRequest("?seq= must be a chunk seq (a whole number).")
        if hit < 1:
            return HttpResponseBadRequest("?seq= must be at least 1.")
    # Half a page after the hit, the rest before it.
    end = hit + conf.page_size // 2 if hit is not None else None
    detached = end is not None and end < tab.last_seq
    chunks = log.page(tab.id, before=end + 1 if detached else None, limit=conf.page_size)
    has_more, continues = log.page_bounds(tab.id, chunks)
    items, status = chat_render.page_items(chunks, lease.status(tab.id), continues=continues)
    branches = _branches(tab)
    _mark_page(tab, chunks, items, at_end=not detached, branches=branches)
    if hit is not None:
        chat_render.mark_hit(items, hit)
    return render(
        request,
        "chat/tab.html",
        {
            "tab": tab,
            "tabs": _sidebar_tabs(request),
            "current_tab": tab,
            "items": items,
            "s": status,
            "page": True,
            "expand_thinking": conf.expand_thinking,
            "dom_window": conf.dom_window,
            "has_more": has_more,
            "detached": detached,
            "live_seq": tab.last_seq,
            "tab_id": tab.id,
            "before": chunks[0].seq if chunks else 0,
            "model_choices": model_choices(tab.model),
            "tab_model": tab.model,
            "offline_model": OFFLINE_MODEL,
            "max_message": MAX_MESSAGE_CHARS,
            "max_system_prompt": MAX_SYSTEM_PROMPT_CHARS,
            "default_system_prompt": conf.new_tab_system_prompt,
            "tu": chat_render.usage_line(usage.tab_totals(tab.id)),
            "branches": branches,
            # Shown only while it is still this user's (the admin may give a tab away).
            "parent": tab.parent if tab.parent and tab.parent.owner_id == tab.owner_id else None,
        },
    )


def _branches(tab: Tab) -> list[chat_render.Fork]:
    """The tab's branches, oldest first, each with the action its `forked` chunk names."""
    rows = (
        Chunk.objects.filter(
            tab__parent=tab,
            tab__owner_id=tab.owner_id,
            seq=F("tab__fork_seq") + 1,
            type=Kind.SYSTEM,
        )
        .select_related("tab")
        .order_by("-tab__created_at")[:MAX_BRANCHES_LISTED]
    )
    # The newest when there are too many, shown oldest first.
    return [
        chat_render.Fork(
            id=row.tab_id,
            action=str((row.data or {}).get("action") or "branch"),
            fork_seq=row.tab.fork_seq,
            created_at=row.tab.created_at,
        )
        for row in list(rows)[::-1]
    ]


def _mark_page(
    tab: Tab,
    chunks: list[Chunk],
    items: list[chat_render.Item],
    *,
    at_end: bool,
    branches: list[chat_render.Fork],
) -> None:
    """What a page of the log offers: branch points, edits, Regenerate and Continue
    on the tab's last turn (`at_end`: the page ends where the log does), where the
    tab's branches start, which tabs its `forked` notices name are gone, and the
    tokens and cost of each turn that ends on it."""
    if not chunks:
        return
    after = None
    if not at_end:
        # Whether a page's last chunk ends its step depends on the chunk after it.
        after = Chunk.objects.filter(tab_id=tab.id, seq=chunks[-1].seq + 1).first()
    running = lease.running_turn(tab.id)
    window = [*chunks, after] if after is not None else chunks
    valid = cuts.valid_cuts(window, running_turn=running)
    if after is not None:
        valid.discard(after.seq)
    last_answer = resumable = None
    # The last chunk of the last turn that is not one of notices alone (a compaction
    # asked for after it).
    answered = next(
        (c for c in reversed(chunks) if c.turn_id is not None and c.role != Role.SYSTEM), None
    )
    last = answered and next(c for c in reversed(chunks) if c.turn_id == answered.turn_id)
    # A finished turn ends at a valid cut; the running one has none.
    if at_end and last is not None and last.seq in valid:
        turn = [c for c in chunks if c.turn_id == last.turn_id]
        # A turn of the user's messages alone (a branch cut after a question) has no answer.
        if last.role != Role.USER:
            last_answer = last.seq
        if (cut_short := resume.ending(turn)) is not None:
            resumable = cut_short.seq
    # Right after a question is a cut Regenerate makes (and the API): a branch there
    # would end on a question nothing answers, so the page does not offer it.
    user_seqs = {c.seq for c in chunks if c.role == Role.USER}
    chat_render.mark_page(
        items,
        cuts=valid - user_seqs,
        running_turn=running,
        last_answer=last_answer,
        resumable=resumable,
        forks=branches,
        gone=_gone_origins(tab, chunks),
    )
    _mark_usage(tab, chunks, items, at_end=at_end, running=running, after=after)


def _mark_usage(
    tab: Tab,
    chunks: list[Chunk],
    items: list[chat_render.Item],
    *,
    at_end: bool,
    running: uuid.UUID | None,
    after: Chunk | None,
) -> None:
    """Each finished turn whose end is on the page gets its tokens and cost on its last
    chunk: one query for all of them. A turn's end is on the page when a chunk of
    another turn follows it there (or right after the page), or when the page ends
    where the log does and the turn is not running."""
    ended = set()
    for chunk, following in zip(chunks, [*chunks[1:], after], strict=True):
        if chunk.turn_id is None or chunk.turn_id == running:
            continue
        if following is None:
            if at_end:
                ended.add(chunk.turn_id)
        elif following.turn_id != chunk.turn_id:
            ended.add(chunk.turn_id)
    chat_render.mark_usage(items, usage.turn_totals(tab.id, ended))


def _gone_origins(tab: Tab, chunks: list[Chunk]) -> set[str]:
    """The tabs named by `forked` notices among `chunks` that no longer exist (as strings)."""
    named = set()
    for chunk in chunks:
        data = chunk.data or {}
        if chunk.type == Kind.SYSTEM and data.get("kind") == "forked":
            try:
                named.add(uuid.UUID(str(data.get("from_tab"))))
            except ValueError:
                continue  # not a tab id (an imported log): nothing to link or to say
    if not named:
        return set()
    alive = Tab.objects.filter(owner_id=tab.owner_id, pk__in=named).values_list("pk", flat=True)
    return {str(tab_id) for tab_id in named - set(alive)}


@login_required
@require_GET
def search_view(request: HttpRequest) -> HttpResponse:
    """The sidebar's search: hits as a fragment (htmx), or the page with them in its sidebar."""
    q = request.GET.get("q", "")
    context: dict[str, Any] = {"q": q, "hits": [], "search_error": "", "searched": bool(q.strip())}
    status = 200
    if context["searched"]:
        try:
            context["hits"] = search.search(request.user, q)
        except search.SearchError as exc:
            context["search_error"] = str(exc)
            status = 422
    if getattr(request, "htmx", False):
        return render(request, "chat/app.html#search_results", context, status=status)
    context["tabs"] = _sidebar_tabs(request)
    return render(request, "chat/app.html", context, status=status)


def _results_shown_alone(
    tab_id: uuid.UUID, items: list[chat_render.Item], before: int
) -> list[Chunk]:
    """Results at `before` or later of this page's unanswered calls.

    The page below shows them on their own, since their cards were not on it: the
    older page nests them in their cards and takes them from where they were.
    """
    calls = [i for i in items if i.type == Kind.TOOL_CALL and not i.answered]
    if not calls:
        return []
    slots = {call.slot for call in calls}
    results = Chunk.objects.filter(
        tab_id=tab_id,
        seq__gte=before,
        type=Kind.TOOL_RESULT,
        turn_id__in={call.turn_id for call in calls},
        step__in={call.step for call in calls},
    ).order_by("seq")
    return [r for r in results if chat_render.Item.of(r).slot in slots]


@login_required
@require_GET
def tab_older(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """The page of chunks before `?before=<seq>`, and the trigger for the one before it."""
    tab = _get_tab_for_user(request, tab_id)
    try:
        before = int(request.GET.get("before", ""))
    except ValueError:
        return HttpResponseBadRequest("?before= must be a chunk seq (a whole number).")
    if before < 1:
        return HttpResponseBadRequest("?before= must be at least 1.")
    conf = preferences.load()
    chunks = log.page(tab.id, before=before, limit=conf.page_size)
    has_more, continues = log.page_bounds(tab.id, chunks)
    items = chat_render.group(chunks, continues=continues)
    moved = _results_shown_alone(tab.id, items, before)
    if moved:
        items = chat_render.group([*chunks, *moved], continues=continues)
    _mark_page(tab, chunks, items, at_end=False, branches=_branches(tab))
    return render(
        request,
        "chat/tab.html#older_page",
        {
            "items": items,
            "moved": moved,
            "page": True,
            "expand_thinking": conf.expand_thinking,
            "has_more": has_more,
            "tab_id": tab.id,
            "before": chunks[0].seq if chunks else before,
        },
    )


@login_required
@require_POST
def tab_rename(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = _get_tab_for_user(request, tab_id)
    form = RenameForm(request.POST)
    if form.is_valid():
        tab.title = form.cleaned_data["title"].strip()
        tab.save(update_fields=["title", "updated_at"])
    else:
        _form_errors(request, form)
    return redirect("tab", tab_id=tab.id)


@login_required
@require_POST
@tab_gone_is_404
def tab_system_prompt(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """A new tab's own system prompt: saved until its first message, refused after."""
    tab = _get_tab_for_user(request, tab_id)
    form = TabSystemPromptForm(request.POST)
    if not form.is_valid():
        _form_errors(request, form)
    else:
        try:
            turns.set_system_prompt(tab, form.cleaned_data["system_prompt"].strip())
        except ValueError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, "Saved this tab's system prompt.")
    return redirect("tab", tab_id=tab.id)


@login_required
@require_http_methods(["GET", "POST"])
def tab_delete(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = _get_tab_for_user(request, tab_id)
    if request.method == "POST":
        # A running turn must stop writing before its tab goes.
        turns.cancel(tab.id)
        title = str(tab)
        tab.delete()
        blobs.collect()
        messages.success(request, f"Deleted “{title}”.")
        return redirect("home")
    return render(
        request,
        "chat/tab_delete.html",
        {
            "tab": tab,
            "tabs": _sidebar_tabs(request),
            "current_tab": tab,
            "chunk_count": log.count(tab.id),
        },
    )


@login_required
@require_POST
def tab_model(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = _get_tab_for_user(request, tab_id)
    form = TabModelForm(request.POST, current=tab.model)
    if form.is_valid():
        previous, tab.model = tab.model, form.cleaned_data["model"]
        tab.save(update_fields=["model", "updated_at"])
        if tab.model != previous:
            turns.notice(tab.id, "model-changed", f"Model changed from {previous} to {tab.model}.")
    else:
        _form_errors(request, form)
    return redirect("tab", tab_id=tab.id)


def _form_errors(request: HttpRequest, form: Any) -> None:
    for errors in form.errors.values():
        for error in errors:
            messages.error(request, error)


# --- The composer -------------------------------------------------------------------------


def _composer_error(request: HttpRequest, tab: Tab, error: str, status: int) -> HttpResponse:
    if not getattr(request, "htmx", False):
        messages.error(request, error)
        return redirect("tab", tab_id=tab.id)
    html = render_to_string("chat/tab.html#composer_error", {"error": error})
    return HttpResponse(html, status=status)


@login_required
@require_POST
@tab_gone_is_404
def tab_send(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = _get_tab_for_user(request, tab_id)
    form = MessageForm(request.POST)
    if not form.is_valid():
        return _composer_error(request, tab, form.errors["text"][0], 422)
    untitled = not tab.title
    text = form.cleaned_data["text"]
    try:
        if (focus := turns.compact_command(text)) is not None:
            turns.compact(tab, instructions=focus)
        else:
            turns.submit(tab, text, attachments=request.POST.getlist("attachment"))
    except ValueError as exc:
        return _composer_error(request, tab, str(exc), 422)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    # The message itself shows up over the socket (queued, then in the log): this
    # response clears the error, and shows the title the first message gave the tab.
    context = {"error": "", "tab": tab, "retitled": untitled and bool(tab.title)}
    return HttpResponse(render_to_string("chat/tab.html#sent", context))


@login_required
@require_POST
def tab_stop(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    tab = _get_tab_for_user(request, tab_id)
    try:
        turn_id = uuid.UUID(request.POST["turn"]) if request.POST.get("turn") else None
    except ValueError:
        return HttpResponseBadRequest("Not a turn id.")
    turns.cancel(tab.id, turn_id)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(status=204)


@login_required
@require_POST
def tab_approve(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Answer a pending approval: the button says approve=<call_id> or deny=<call_id>, or
    always_tab / always_user=<call_id>: approve it and add the call's rule
    (chat.rules.natural) to this tab or to all the user's tabs."""
    tab = _get_tab_for_user(request, tab_id)
    given = [(key, request.POST[key]) for key in APPROVAL_ANSWERS if request.POST.get(key)]
    if len(given) != 1:
        return HttpResponseBadRequest(
            "Send one of approve, deny, always_tab or always_user = <call id>."
        )
    answer, call_id = given[0]
    rule = None
    if answer in ("always_tab", "always_user"):
        source = rules.TAB if answer == "always_tab" else rules.USER
        try:
            rule = _always_allow(request, tab, call_id, source)
        except rules.RuleError as exc:
            # Plain text: the message may quote the call id the request sent.
            return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    turns.approve(tab.id, call_id, answer != "deny", rule=rule)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(status=204)


def _always_allow(request: HttpRequest, tab: Tab, call_id: str, source: str) -> dict[str, Any]:
    """Add the call's own rule for this tab or the user, unless a rule already allows the
    call or an ask or deny rule would still win over it. Returns what the runner logs."""
    call = (
        Chunk.objects.filter(tab=tab, type=Kind.TOOL_CALL, data__call_id=call_id)
        .order_by("-seq")
        .first()
    )
    if call is None:
        raise rules.RuleError(f"There is no call {call_id!r} in this tab.")
    name, arguments = str(call.data.get("name") or ""), call.data.get("arguments") or {}
    pattern = rules.natural(name, arguments) if isinstance(arguments, dict) else None
    if pattern is None:
        raise rules.RuleError(
            "This call has no rule to always allow (a compound command, a wildcard, a "
            "redirection to a file or a path outside the workspace): approve it once, or add "
            "a rule in Permission rules."
        )
    new = rules.parse(rules.ALLOW, pattern, source=source)
    where = "this tab" if source == rules.TAB else "all your tabs"
    note: dict[str, Any] = {"action": rules.ALLOW, "pattern": pattern, "source": source}

    def resolve(path: str) -> str:
        # The runner's own (chat.turn.calls): decided as the runner decides, an ask rule that
        # matches where a link leads still decides first, so no rule is added for it.
        return workspace_files.resolve(
            workdir.ensure(workdir.user_workspace(tab.owner_id), tab.workdir), path
        )

    with transaction.atomic():
        locked = Tab.objects.select_for_update().get(pk=tab.pk)
        before = rules.decide(_rules_of(locked), name, arguments, resolve=resolve)
        if before is not None and before.action == rules.ALLOW:
            text = f"Approved; no rule added: {before.text} already allows this call"
        elif before is not None:
            text = f"Approved once; no rule added: {before.text} would still decide first"
        else:
            if source == rules.TAB:
                entry = {"action": rules.ALLOW, "pattern": new.pattern}
                Tab.objects.filter(pk=tab.pk).update(rules=[*locked.rules, entry])
            else:
                PermissionRule.objects.create(
                    user=request.user, action=rules.ALLOW, pattern=new.pattern
                )
            text = f"Rule added for {where}: allow `{pattern}`"
            note["added"] = True
    return {"text": text, "rule": note}


@login_required
@require_POST
@tab_gone_is_404
def tab_rule_delete(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Remove one of the tab's own rules (the tab menu), named by its action and pattern."""
    tab = _get_tab_for_user(request, tab_id)
    action, pattern = request.POST.get("action", ""), request.POST.get("pattern", "")
    with transaction.atomic():
        locked = Tab.objects.select_for_update().get(pk=tab.pk)
        kept = list(locked.rules or [])
        index = next(
            (
                i
                for i, entry in enumerate(kept)
                if isinstance(entry, dict)
                and entry.get("action") == action
                and entry.get("pattern") == pattern
            ),
            None,
        )
        if index is not None:
            del kept[index]
            Tab.objects.filter(pk=tab.pk).update(rules=kept)
    if index is None:
        messages.error(request, f"This tab has no rule {action} `{pattern}` (already removed?).")
    else:
        messages.success(request, f"Removed this tab's rule {action} `{pattern}`.")
    return redirect("tab", tab_id=tab.id)


def _rules_of(tab: Tab) -> list[rules.Rule]:
    """The rules that decide the tab's calls, in order: its own, then its owner's."""
    own, _ = rules.parse_all(tab.rules or [], source=rules.TAB)
    rows = PermissionRule.objects.filter(user_id=tab.owner_id).values("action", "pattern")
    users, _ = rules.parse_all(rows, source=rules.USER)
    return own + users


# --- Branches and continue (DESIGN §11) -----------------------------------------------------


def _branch_view(
    request: HttpRequest, tab_id: uuid.UUID, make: Callable[[Tab, int], turns.Branched]
) -> HttpResponse:
    """A branch made from the chunk `seq` of the tab: the page goes to it. A cut that
    cannot be made says why where the composer shows its errors, and changes nothing.
    The same branch asked for twice (a double click) is the one made the first time."""
    tab = _get_tab_for_user(request, tab_id)
    try:
        seq = int(request.POST.get("seq", ""))
    except ValueError:
        return HttpResponseBadRequest("seq= must be a chunk seq (a whole number).")
    try:
        branched = make(tab, seq)
    except ValueError as exc:  # turns.CutError, with its message for the user
        return _composer_error(request, tab, str(exc), 422)
    url = reverse("tab", kwargs={"tab_id": branched.tab.id})
    if getattr(request, "htmx", False):
        return HttpResponseClientRedirect(url)
    return redirect(url)


@login_required
@require_POST
@tab_gone_is_404
def tab_branch(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """A new tab with this one's log up to and including `seq`."""
    return _branch_view(request, tab_id, turns.branch)


@login_required
@require_POST
@tab_gone_is_404
def tab_edit(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Edit the user's message `seq`: a branch right before it, its text in the composer."""
    return _branch_view(request, tab_id, turns.edit)


@login_required
@require_POST
@tab_gone_is_404
def tab_regenerate(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Answer again the question of the turn chunk `seq` is in, in a new branch."""
    return _branch_view(request, tab_id, turns.regenerate)


@login_required
@require_POST
@tab_gone_is_404
def tab_retry(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Try again after the error chunk `seq`, in a new branch."""
    return _branch_view(request, tab_id, turns.retry)


@login_required
@require_POST
@tab_gone_is_404
def tab_continue(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Continue the tab's interrupted last turn, here: the new turn shows over the socket."""
    tab = _get_tab_for_user(request, tab_id)
    try:
        turns.continue_turn(tab)
    except ValueError as exc:
        return _composer_error(request, tab, str(exc), 422)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(render_to_string("chat/tab.html#composer_error", {"error": ""}))


@login_required
@require_POST
@tab_gone_is_404
def tab_compact(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Compact the tab's context: through the turn of chunk `seq` ("summarise up to
    here"), or everything; it runs when no turn does, and shows over the socket."""
    tab = _get_tab_for_user(request, tab_id)
    raw = request.POST.get("seq", "").strip()
    try:
        through = int(raw) if raw else None
    except ValueError:
        return _composer_error(request, tab, f"Not a chunk number: {raw[:40]!r}.", 422)
    try:
        turns.compact(tab, through=through, instructions=request.POST.get("instructions", ""))
    except ValueError as exc:
        return _composer_error(request, tab, str(exc), 422)
    if not getattr(request, "htmx", False):
        return redirect("tab", tab_id=tab.id)
    return HttpResponse(render_to_string("chat/tab.html#composer_error", {"error": ""}))


# --- Export and import -------------------------------------------------------------------


@login_required
@require_GET
def tab_export(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """The tab as a download: ?format=jsonl (lossless, importable) or markdown."""
    tab = _get_tab_for_user(request, tab_id)
    fmt = request.GET.get("format", "jsonl")
    if fmt not in transfer.FORMATS:
        return HttpResponseBadRequest(f"Unknown export format {fmt!r}: use jsonl or markdown.")
    return transfer.export_response(tab, fmt)


@login_required
@require_POST
@csrf_exempt
def tab_attachments(request: HttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """Files for the composer (multipart, field `file`, several allowed): each checked
    and normalised, then all stored, or none (400, one line of plain text saying why).
    The answer is one tray item per file (chat/_attachment.html), whose hidden input
    the message form sends. The size is checked before the body is read, which is why
    the CSRF check (it reads the body) comes after, in _tab_attachments."""
    tab = _get_tab_for_user(request, tab_id)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > blobs.MAX_REQUEST_BYTES:
        return _refused(
            f"Too much at once: at most {blobs.MAX_FILES} files of "
            f"{blobs.human_bytes(blobs.MAX_UPLOAD_BYTES)} each."
        )
    return _tab_attachments(request, tab)


@csrf_protect
def _tab_attachments(request: HttpRequest, tab: Tab) -> HttpResponse:
    try:
        files = blobs.normalise_uploads(request.FILES.getlist("file"))
    except blobs.AttachmentError as exc:
        return _refused(str(exc))
    blobs.add_uploads(tab.pk, files)
    html = "".join(render_to_string("chat/_attachment.html", {"a": _tray_item(n)}) for n in files)
    return HttpResponse(html)


def _tray_item(n: blobs.Normalised) -> dict[str, Any]:
    return {
        "sha256": n.sha256,
        "name": n.name,
        "mime": n.mime,
        "size": len(n.data),
        "width": n.width,
        "height": n.height,
    }


def _refused(message: str) -> HttpResponse:
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


# The only types a blob is served as inline: what chat.blobs stores images as. Anything
# else (a PDF) is a download, never rendered by the browser on this origin.
INLINE_TYPES = frozenset({blobs.PNG, blobs.JPEG})
# A blob never changes (its address is its hash): a browser may keep it, but only for
# this user (it is owner-checked).
BLOB_CACHE_CONTROL = "private, max-age=31536000, immutable"
# Nothing a blob holds may run or load anything, even if a browser took it for a page.
BLOB_CSP = "default-src 'none'; img-src 'self'; sandbox"


@login_required
@require_GET
def blob(request: HttpRequest, sha256: str) -> HttpResponse:
    """An attachment's bytes, for a user one of whose tabs uses it (else 404): an image
    inline, anything else as a download under its name."""
    row, name = _owned_blob(request, sha256)
    data = blobs.read(row.sha256)
    if data is None:
        raise Http404("That file is no longer stored.")
    response = HttpResponse(data, content_type=row.mime)
    response["Content-Disposition"] = content_disposition_header(row.mime not in INLINE_TYPES, name)
    return _blob_headers(response)


@login_required
@require_GET
def blob_thumb(request: HttpRequest, sha256: str) -> HttpResponse:
    """An image attachment's thumbnail (chat.blobs.thumbnail), owner-checked as `blob`."""
    row, _ = _owned_blob(request, sha256)
    path = blobs.thumbnail(row)
    if path is None:
        raise Http404("That file has no thumbnail.")
    return _blob_headers(HttpResponse(path.read_bytes(), content_type=row.mime))


def _owned_blob(request: HttpRequest, sha256: str) -> tuple[Blob, str]:
    """The blob and the name the user gave it; 404 unless one of their tabs uses it."""
    use = (
        Attachment.objects.filter(blob_id=sha256, tab__owner=request.user)
        .select_related("blob")
        .order_by("-sent", "id")
        .first()
    )
    if use is None:
        raise Http404("No such file.")
    return use.blob, use.name


def _blob_headers(response: HttpResponse) -> HttpResponse:
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = BLOB_CACHE_CONTROL
    response["Content-Security-Policy"] = BLOB_CSP
    return response


@login_required
@require_GET
def tab_chunk_output(request: HttpRequest, tab_id: uuid.UUID, seq: int) -> HttpResponse:
    """A tool result's output as plain text, whole: its card's "Full view" (the card's
    box scrolls). The tab's owner's only; any other chunk is a 404. nosniff: the output
    is whatever a command printed, and must never be taken for HTML."""
    chunk = get_object_or_404(
        Chunk, tab_id=tab_id, tab__owner=request.user, seq=seq, type=Kind.TOOL_RESULT
    )
    text = chat_render.output_text(chunk.data or {})
    response = StreamingHttpResponse(_pieces(text), content_type="text/plain; charset=utf-8")
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = f'inline; filename="tool-output-{seq}.txt"'
    return response


async def _pieces(text: str) -> AsyncIterator[bytes]:
    # Async: Django reads a sync iterator whole under ASGI. "replace": always valid
    # UTF-8, even for a lone surrogate an imported log may hold.
    for start in range(0, len(text), OUTPUT_PIECE_CHARS):
        yield text[start : start + OUTPUT_PIECE_CHARS].encode("utf-8", "replace")


@login_required
@require_http_methods(["GET", "POST"])
@csrf_exempt
def tab_import(request: HttpRequest) -> HttpResponse:
    """Upload a JSONL export as a new tab.

    The size is checked before anything reads the body, which is why the CSRF
    check (it parses the upload) comes after, in _tab_import.
    """
    if request.method == "POST" and transfer.declared_too_large(request, multipart=True):
        error = transfer.ImportTooLarge(transfer.IMPORT_MAX_BYTES)
        return _import_page(request, f"Not imported: {error}.", status=413)
    return _tab_import(request)


@csrf_protect
def _tab_import(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return _import_page(request, "")
    upload = request.FILES.get("file")
    if upload is None:
        return _import_page(request, "Choose a .jsonl file exported from Dispatch.", status=400)
    try:
        tab = transfer.import_jsonl(request.user, upload)
    except transfer.ImportRefused as exc:
        status = 413 if isinstance(exc, transfer.ImportTooLarge) else 400
        return _import_page(request, f"Not imported: {exc}.", status=status)
    messages.success(request, f"Imported {upload.name} as a new tab.")
    return redirect("tab", tab_id=tab.id)


def _import_page(request: HttpRequest, error: str, status: int = 200) -> HttpResponse:
    context = {
        "tabs": _sidebar_tabs(request),
        "error": error,
        "max_mb": transfer.IMPORT_MAX_BYTES // (1024 * 1024),
    }
    return render(request, "chat/tab_import.html", context, status=status)


# --- Settings ----------------------------------------------------------------------------


@login_required
@require_http_methods(["GET", "POST"])
def settings_view(request: HttpRequest) -> HttpResponse:
    _staff(request)
    period = request.GET.get("usage", usage.DEFAULT_PERIOD)
    if period not in usage.PERIODS:
        names = ", ".join(usage.PERIODS)
        return HttpResponseBadRequest(f"?usage= must be one of {names}, not {period!r}.")
    conf = preferences.load()
    settings_form = SettingsForm(initial=SettingsForm.initial_from(conf))
    key_form = ApiKeyForm()
    endpoint_form = EndpointForm()
    mcp_form = McpServerForm(instance=_mcp_server(request.GET.get("mcp")))
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
            _mcp_superuser(request)
            editing = _mcp_server(request.POST.get("server"))
            mcp_form = McpServerForm(request.POST, instance=editing)
            if mcp_form.is_valid():
                server = mcp_form.save()
                messages.success(request, f"Saved the MCP server {server.name}.")
                return redirect(reverse("settings") + "#mcp")
        else:
            return HttpResponseBadRequest("Unknown settings action.")
        status = 422
    forms = {
        "settings_form": settings_form,
        "key_form": key_form,
        "endpoint_form": endpoint_form,
        "mcp_form": mcp_form,
    }
    return render(
        request, "chat/settings.html", _settings_page(request, period, forms), status=status
    )


def _settings_page(request: HttpRequest, period: str, forms: dict[str, Any]) -> dict[str, Any]:
    """The Settings page's context around its forms (as posted, or fresh)."""
    labels = dict(key_providers())
    stored = set(ApiKey.objects.values_list("provider", flat=True))
    return {
        "tabs": _sidebar_tabs(request),
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
        "profiles": Profile.objects.all(),
        **_usage_section(period),
    }


def _mcp_server(server_id: str | None) -> McpServer | None:
    """The MCP server a Settings form edits (?mcp=<id>, or the form's `server`)."""
    if not server_id:
        return None
    if not server_id.isdigit():
        raise Http404("No such MCP server.")
    return get_object_or_404(McpServer, pk=int(server_id))


@login_required
@require_POST
def mcp_server_delete(request: HttpRequest, server_id: int) -> HttpResponse:
    _staff(request)
    _mcp_superuser(request)
    server = get_object_or_404(McpServer, pk=server_id)
    server.delete()
    messages.success(request, f"Removed the MCP server {server.name}.")
    return redirect(reverse("settings") + "#mcp")


@login_required
@require_POST
def mcp_server_test(request: HttpRequest, server_id: int) -> HttpResponse:
    """Connect to the server as saved (enabled or not), list its tools, disconnect; one
    that mounts the workspace mounts the tester's, as a tab of theirs would."""
    _staff(request)
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
    return redirect("settings")


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
def apikey_delete(request: HttpRequest, provider: str) -> HttpResponse:
    _staff(request)
    deleted, _ = ApiKey.objects.filter(provider=provider).delete()
    if deleted:
        messages.success(request, f"Deleted the {provider} key.")
    else:
        messages.error(request, f"There is no stored {provider} key.")
    return redirect(reverse("settings"))


# --- Permission rules ---------------------------------------------------------------------
# Every signed-in user's own page, like API tokens: a user's rules decide their own tabs' calls.


@login_required
@require_http_methods(["GET", "POST"])
def rules_view(request: HttpRequest) -> HttpResponse:
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
def rule_delete(request: HttpRequest, rule_id: int) -> HttpResponse:
    rule = PermissionRule.objects.filter(pk=rule_id, user=request.user).first()
    if rule is None:
        # Another user's rule looks exactly like one that never existed.
        error = "There is no such rule of yours; it may already have been removed."
        return _rules_page(request, error=error, status=404)
    rule.delete()
    messages.success(request, f"Removed the rule {rule.action} `{rule.pattern}`.")
    return redirect(reverse("permission_rules"))


def _rules_page(
    request: HttpRequest,
    *,
    error: str = "",
    action: str = rules.ALLOW,
    pattern: str = "",
    status: int = 200,
) -> HttpResponse:
    context = {
        "tabs": _sidebar_tabs(request),
        "rules": PermissionRule.objects.filter(user=request.user),
        "actions": rules.ACTIONS,
        "rule_error": error,
        "action": action,
        "pattern": pattern,
        "pattern_max": rules.MAX_PATTERN_CHARS,
    }
    return render(request, "chat/rules.html", context, status=status)


# --- API tokens ---------------------------------------------------------------------------
# Every signed-in user's own page, not a Settings section: Settings is staff-only, and a
# token only ever acts as the user who made it.


@login_required
@require_http_methods(["GET", "POST"])
def api_tokens_view(request: HttpRequest) -> HttpResponse:
    """List, and create, the user's own API tokens."""
    if request.method != "POST":
        return _api_tokens_page(request)
    name = request.POST.get("name", "").strip()
    if not name:
        error = "Give the token a name, so you can tell it apart when you revoke it."
        return _api_tokens_page(request, error=error, status=422)
    if len(name) > API_TOKEN_NAME_MAX_CHARS:
        error = f"A token's name has at most {API_TOKEN_NAME_MAX_CHARS} characters."
        return _api_tokens_page(request, error=error, name=name, status=422)
    read_only = request.POST.get("read_only") == "on"
    # Rendered, not redirected: the plain token must not pass through the messages
    # cookie or the session, and is shown this once.
    _, new_token = ApiToken.issue(request.user, name=name, read_only=read_only)
    return _api_tokens_page(request, new_token=new_token)


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke one of the user's own API tokens: the row goes, and the token with it."""
    token = ApiToken.objects.filter(pk=token_id, user=request.user).first()
    if token is None:
        # Another user's token looks exactly like one that never existed.
        error = "There is no such API token of yours; it may already have been revoked."
        return _api_tokens_page(request, error=error, status=404)
    token.delete()
    messages.success(request, f"Revoked the API token {token.prefix}….")
    return redirect(reverse("api_tokens"))


def _api_tokens_page(
    request: HttpRequest, *, new_token: str = "", error: str = "", name: str = "", status: int = 200
) -> HttpResponse:
    context = {
        "tabs": _sidebar_tabs(request),
        "api_tokens": ApiToken.objects.filter(user=request.user),
        "new_token": new_token,
        "token_error": error,
        "name": name,
        "name_max": API_TOKEN_NAME_MAX_CHARS,
    }
    return render(request, "chat/api_tokens.html", context, status=status)


@login_required
@require_POST
def endpoint_delete(request: HttpRequest, provider: str) -> HttpResponse:
    _staff(request)
    _endpoint_superuser(request)
    deleted, _ = ProviderEndpoint.objects.filter(provider=provider).delete()
    if deleted:
        messages.success(request, f"Removed the {provider} endpoint; the SDK default applies.")
        if note := key_elsewhere_note(provider):
            messages.warning(request, note)
    else:
        messages.error(request, f"There is no stored {provider} endpoint.")
    return redirect(reverse("settings"))


# --- Profiles ---------------------------------------------------------------------------
# Staff only, as the Settings page: a profile sets what every tab made from it may do.


@login_required
@require_http_methods(["GET", "POST"])
def profile_edit(request: HttpRequest, profile_id: int | None = None) -> HttpResponse:
    """Add a profile, or change one (tabs made from it keep their copy)."""
    _staff(request)
    profile = get_object_or_404(Profile, pk=profile_id) if profile_id is not None else None
    form = ProfileForm(request.POST if request.method == "POST" else None, instance=profile)
    if form.is_valid():
        saved = form.save()
        messages.success(request, f"Saved the profile {saved.name}.")
        return redirect(reverse("settings") + "#profiles")
    context = {
        "tabs": _sidebar_tabs(request),
        "form": form,
        "profile": profile,
        "models": known_models(),
        "offline_model": OFFLINE_MODEL,
    }
    return render(request, "chat/profile.html", context, status=422 if form.errors else 200)


@login_required
@require_POST
def profile_delete(request: HttpRequest, profile_id: int) -> HttpResponse:
    _staff(request)
    profile = get_object_or_404(Profile, pk=profile_id)
    profile.delete()
    messages.success(request, f"Deleted the profile {profile.name}; its tabs keep their copy.")
    return redirect(reverse("settings") + "#profiles")


# --- Wakes -------------------------------------------------------------------------------

# Runs listed under each wake on the Wakes page, most recent first.
WAKE_RUNS_SHOWN = 10
# Tabs offered as a wake's target: the most recently used.
WAKE_TARGET_TABS = 200


@login_required
def wakes_view(request: HttpRequest) -> HttpResponse:
    """The user's wakes, and a new one (each problem shown at its field)."""
    targets = list(
        Tab.objects.filter(owner=request.user).order_by("-updated_at")[:WAKE_TARGET_TABS]
    )
    if request.method != "POST":
        return _wakes_page(request, WakeForm(owner=request.user, tabs=targets))
    form = WakeForm(request.POST, owner=request.user, tabs=targets)
    if not form.is_valid() or form.wake is None:
        return _wakes_page(request, form, status=422)
    wake = form.wake
    wake.save()
    wakes.changed()
    messages.success(request, f"Added the wake “{wake}”: next run {_wake_when(wake)}.")
    return redirect(reverse("wakes"))


@login_required
@require_POST
def wake_action(request: HttpRequest, wake_id: int, action: str) -> HttpResponse:
    """enable, disable, run (now, once), keep (no expiry), delete."""
    wake = Wake.objects.filter(pk=wake_id, owner=request.user).first()
    if wake is None:
        messages.error(request, "There is no such wake of yours; it may have been deleted.")
        return redirect(reverse("wakes"))
    now = timezone.now()
    try:
        if action == "delete":
            wake.delete()
            messages.success(request, f"Deleted the wake “{wake}”.")
        elif action == "run":
            run = wakes.run_now(wake, now)
            if run.status == WakeRun.Status.SUBMITTED:
                messages.success(request, f"“{wake}” runs now.")
            elif run.status == WakeRun.Status.PENDING:
                messages.error(request, f"“{wake}” did not run yet: {run.reason}")
            else:
                messages.error(request, f"“{wake}” did not run: {run.reason}")
        elif action in ("enable", "disable", "keep"):
            # Written by conditional updates (chat.wakes): the scheduler may have moved
            # the wake on since it was read.
            {"enable": wakes.enable, "disable": wakes.disable, "keep": wakes.keep}[action](
                wake, now
            )
            wake = Wake.objects.filter(pk=wake.pk).first() or wake
            messages.success(request, f"“{wake}”: next run {_wake_when(wake)}.")
        else:
            raise Http404
    except schedule.ScheduleError as exc:
        messages.error(request, f"“{wake}” cannot run again: {exc}")
    wakes.changed()
    return redirect(reverse("wakes"))


def _wake_when(wake: Wake) -> str:
    """The next run in the wake's own time zone, as its schedule reads."""
    if wake.next_run_at is None:
        return "never"
    try:
        zone = schedule.zone(wake.timezone)
    except schedule.ScheduleError:
        return f"{wake.next_run_at:%Y-%m-%d %H:%M} UTC"
    return f"{wake.next_run_at.astimezone(zone):%Y-%m-%d %H:%M %Z}"


def _wakes_page(request: HttpRequest, form: WakeForm, status: int = 200) -> HttpResponse:
    rows = list(
        Wake.objects.filter(owner=request.user).select_related("tab", "profile").order_by("id")
    )
    now = timezone.now()
    for wake in rows:
        wake.when = _wake_when(wake)
        wake.every = schedule.every(wake.interval_seconds or 0)
        wake.expired = wake.expires_at is not None and wake.expires_at <= now
        wake.recent = list(wake.runs.select_related("tab")[:WAKE_RUNS_SHOWN])
    context = {
        "tabs": _sidebar_tabs(request),
        "wakes": rows,
        "form": form,
        "timezones": sorted(zoneinfo.available_timezones()),
    }
    return render(request, "chat/wakes.html", context, status=status)
