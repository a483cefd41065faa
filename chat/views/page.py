"""The tab page and its older pages: the log's chunks as chat.render presents them,
with what a page render knows about the log around them (cuts, the last answer, a
resumable turn, branches, usage).
"""

from __future__ import annotations

import uuid
from typing import cast

from django.contrib.auth.decorators import login_required
from django.db.models import F
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.http import require_GET

from chat import cuts, log, preferences, resume, sidebar, usage
from chat import render as chat_render
from chat.chunks import Kind, Role, SystemKind, SystemNotice
from chat.forms import MAX_MESSAGE_CHARS, MAX_SYSTEM_PROMPT_CHARS, OFFLINE_MODEL, model_picker
from chat.models import Chunk, Tab
from chat.providers.offline import SUGGESTIONS
from chat.render import versions
from chat.turn import lease
from chat.views import common
from chat.views.common import AuthenticatedHttpRequest

# A tab's menu and its "⑂ N branches" controls list its first this many branches: a
# tab branched more often than that is rare, and each branch is in the sidebar anyway.
MAX_BRANCHES_LISTED = 100


@login_required
@require_GET
def tab(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """The tab's latest page; with ?seq=N (a search result) the page around that chunk.

    A window that ends before the live end is detached, as after scrolling far
    back: the "newer" link instead of live chunks, and `live_seq` for the
    socket's hello, so it sends what came since and never replaces the window.
    """
    tab = common.tab_for_user(request, tab_id)
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
    before = end + 1 if end is not None and end < tab.last_seq else None
    detached = before is not None
    chunks = log.page(tab.id, before=before, limit=conf.page_size)
    has_more, continues = log.page_bounds(tab.id, chunks)
    items, status = chat_render.page_items(chunks, lease.status(tab.id), continues=continues)
    branches = _branches(tab)
    _mark_page(tab, chunks, items, at_end=not detached, branches=branches)
    versions.mark(items, versions.points(tab, sidebar.conversation(tab)), at_end=not detached)
    if hit is not None:
        chat_render.mark_hit(items, hit)
    return render(
        request,
        "chat/tab.html",
        {
            "tab": tab,
            "tabs": common.sidebar_tabs(request),
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
            "model_picker": model_picker(tab.model),
            "tab_model": tab.model,
            "offline_model": OFFLINE_MODEL,
            # An empty tab's starter prompts: one click sends one.
            "starters": SUGGESTIONS,
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
        # Versions (Edit, Regenerate, Retry) are the page's "‹ n / total ›" instead.
        .exclude(tab__conversation=tab.conversation)
        .select_related("tab")
        .order_by("-tab__created_at")[:MAX_BRANCHES_LISTED]
    )
    # The newest when there are too many, shown oldest first.
    return [
        chat_render.Fork(
            id=row.tab_id,
            action=str(cast(SystemNotice, row.data or {}).get("action") or "branch"),
            # The row is the branch's first chunk, right after its fork_seq.
            fork_seq=row.seq - 1,
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
        data = cast(SystemNotice, chunk.data or {})
        if chunk.type == Kind.SYSTEM and data.get("kind") == SystemKind.FORKED:
            try:
                named.add(uuid.UUID(str(data.get("from_tab"))))
            except ValueError:
                continue  # not a tab id (an imported log): nothing to link or to say
    if not named:
        return set()
    alive = Tab.objects.filter(owner_id=tab.owner_id, pk__in=named).values_list("pk", flat=True)
    return {str(tab_id) for tab_id in named - set(alive)}


def _results_shown_alone(
    tab_id: uuid.UUID, items: list[chat_render.Item], before: int
) -> list[Chunk]:
    """Results at `before` or later of this page's unanswered calls.

    The page below shows them on their own, since their cards were not on it: the
    older page nests them in their cards and takes them from where they were.
    """
    calls = [i for i in items if isinstance(i, chat_render.ToolCall) and not i.answered]
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
    return [
        row
        for row in results
        if isinstance(result := chat_render.present(row), chat_render.ToolResult)
        and result.slot in slots
    ]


@login_required
@require_GET
def tab_older(request: AuthenticatedHttpRequest, tab_id: uuid.UUID) -> HttpResponse:
    """The page of chunks before `?before=<seq>`, and the trigger for the one before it."""
    tab = common.tab_for_user(request, tab_id)
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
    versions.mark(items, versions.points(tab, sidebar.conversation(tab)), at_end=False)
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
