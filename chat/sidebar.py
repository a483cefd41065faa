"""The sidebar's tab list and the user channel that keeps it live on every open page.

Each tab in the list has a state: idle, running, or waiting for approval (a
`RunningTurn` in status `waiting`). A page load reads it from the database
(`tabs`); afterwards the user's group (`bus.user_group`) carries one `user.tab`
message per change of a tab's state, sent by whichever worker runs the turn, with
the tab's sidebar entry read and rendered once by that worker: the entry a reload
would show. Each of the user's sockets (a tab page's `TabSocket`, any other page's
`UserSocket`) only forwards it — a socket that read the database itself made every
change cost a query per open page, and a user with a hundred open tabs a hundred
times a hundred. A tab the page's list lacks (a wake's new tab, a sub-agent's child)
is inserted at the top. A frame per change of state, never per token: the worker
compares each status it publishes with the last state it announced.

One entry per conversation (`Tab.conversation`: a tab and the versions Edit,
Regenerate and Retry made of it), linking to its most recently active tab, with the
state of any of them; its element's id is the conversation's, so a change of any of
its tabs replaces it in place. A tab never sent to (a "+ New tab" left empty) has no
entry: it shows once its first message is queued.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from django.db.models import BooleanField, Exists, F, OuterRef, Q, QuerySet, Value
from django.template.loader import render_to_string

from chat import bus
from chat.models import QueuedMessage, RunningTurn, Tab

# The sidebar lists the most recently active tabs; an old tab is still reachable by URL.
SIDEBAR_TABS = 100
# A page's report of what its list holds (the sidebar hello) is read up to this many
# entries: the list never holds more than SIDEBAR_TABS, and a hostile page gets no more.
HELD_MAX = 2 * SIDEBAR_TABS

IDLE, RUNNING, WAITING = "idle", "running", "waiting"

# What an entry shows of a tab (the `tablink` partial) and what picks the entry.
ENTRY_FIELDS = (
    "id",
    "owner_id",
    "title",
    "conversation",
    "last_seq",
    "fork_seq",
    "lineage",
    "parent_call_id",
    "updated_at",
)


def state_of(status: dict[str, Any]) -> str:
    """The sidebar's state of a turn status (chat.turn.state.TurnStatus.as_dict): compacting,
    stopping and the rest are "running" to a list that only marks activity."""
    state = status.get("state")
    if state in (IDLE, WAITING):
        return state
    return RUNNING


def _with_state(tabs: QuerySet[Tab]) -> QuerySet[Tab]:
    # A finishing turn has sent its idle status already: the tab is idle. Any tab of the
    # conversation counts: its one entry stands for all of them.
    turn = RunningTurn.objects.filter(
        tab__conversation=OuterRef("conversation"), tab__owner_id=OuterRef("owner_id")
    )
    return tabs.annotate(
        running=Exists(turn.exclude(status=RunningTurn.Status.FINISHING)),
        waiting=Exists(turn.filter(status=RunningTurn.Status.WAITING)),
    )


def kept(tabs: QuerySet[Tab]) -> QuerySet[Tab]:
    """Tabs worth an entry: ever sent to (a log, or a message queued for the first turn),
    or given a title. A "+ New tab" left empty is not one (chat.views.tabs reuses it)."""
    return tabs.filter(Q(last_seq__gt=0) | ~Q(title="") | _queued())


def unsent(owner: Any) -> QuerySet[Tab]:
    """The owner's plain tabs that `kept` leaves out (never sent to, no title), newest
    first: not branches, not sub-agents."""
    return (
        Tab.objects.filter(owner=owner, last_seq=0, title="", fork_seq=None, parent_call_id="")
        .exclude(_queued())
        .order_by("-updated_at", "-pk")
    )


def _queued() -> Exists:
    """The tab has a message queued for its first turn (not in its log yet)."""
    return Exists(QueuedMessage.objects.filter(tab=OuterRef("pk")))


def _latest(tabs: QuerySet[Tab]) -> QuerySet[Tab]:
    """Each conversation's most recently active tab among `tabs`."""
    newer = tabs.filter(conversation=OuterRef("conversation")).filter(
        Q(updated_at__gt=OuterRef("updated_at"))
        | Q(updated_at=OuterRef("updated_at"), pk__gt=OuterRef("pk"))
    )
    return tabs.exclude(Exists(newer))


def tabs(owner: Any) -> list[Tab]:
    """The owner's sidebar: one tab per conversation, its most recently active, most
    recently active first, each with `running` and `waiting`."""
    entries = _latest(kept(Tab.objects.filter(owner=owner)))
    # What an entry shows: a tab's tool list and prompt are no part of it, and a hundred
    # of them decoded cost the page more than its query.
    entries = entries.only(*ENTRY_FIELDS)
    return list(_with_state(entries).order_by("-updated_at", "-pk")[:SIDEBAR_TABS])


def conversation(tab: Tab) -> list[Tab]:
    """The tabs of `tab`'s conversation that its owner has (chat.render.versions groups
    them): another user's tab is never a version here, whatever its lineage says."""
    return list(
        Tab.objects.filter(conversation=tab.conversation, owner_id=tab.owner_id).only(
            "id", "lineage", "created_at"
        )
    )


def state(tab: Tab) -> str:
    if getattr(tab, "waiting", False):
        return WAITING
    return RUNNING if getattr(tab, "running", False) else IDLE


def message(tab_id: uuid.UUID | str, state: str, approval: dict[str, Any] | None) -> dict:
    """The user group's message for a tab whose state changed. Only the call's id and
    tool name go with it (for the notification): arguments may be large."""
    ask = None
    if approval and state == WAITING:
        ask = {"call_id": str(approval.get("call_id", "")), "name": str(approval.get("name", ""))}
    return {"type": "user.tab", "tab_id": str(tab_id), "state": state, "approval": ask}


@dataclass(frozen=True)
class Stated:
    """A tab's conversation as its owner's pages show it: its entry, with its state, and
    the ids of its versions."""

    entry: Tab
    versions: list[str]


def stated(tab_id: uuid.UUID | str) -> Stated | None:
    """The sidebar entry of the tab's conversation with its state, whoever owns it (the
    announcer learns the owner from it); None when the tab is gone.

    One plain query, the rest in Python: the same choice as `tabs` (`kept`, `_latest`,
    `_with_state`) for the handful of tabs a conversation has. Every turn announces its
    tab twice, and the annotated queryset cost more to build and compile than to run."""
    tab_id = uuid.UUID(str(tab_id))
    rows = list(
        Tab.objects.filter(conversation__in=Tab.objects.filter(pk=tab_id).values("conversation"))
        # The state is the conversation's (set below); the placeholders give every row
        # the attributes `tabs` annotates, which the entry's template reads.
        .annotate(
            turn_status=F("runningturn__status"),
            running=Value(False, output_field=BooleanField()),
            waiting=Value(False, output_field=BooleanField()),
        )
        .only(*ENTRY_FIELDS)
    )
    tab = next((row for row in rows if row.pk == tab_id), None)
    if tab is None:
        return None
    same = [row for row in rows if row.owner_id == tab.owner_id]
    running = any(row.turn_status not in (None, RunningTurn.Status.FINISHING) for row in same)
    waiting = any(row.turn_status == RunningTurn.Status.WAITING for row in same)
    sent = {row.pk for row in same if row.last_seq > 0 or row.title}
    if unsent := [row.pk for row in same if row.pk not in sent]:
        # A tab never sent to has an entry once its first message is queued (`kept`).
        queued = QueuedMessage.objects.filter(tab_id__in=unsent).values_list("tab_id", flat=True)
        sent |= set(queued)
    kept = [row for row in same if row.pk in sent]
    # A tab never sent to has no entry, but a change of its state is still news.
    entry = max(kept, key=lambda row: (row.updated_at, row.pk)) if kept else tab
    entry.running, entry.waiting = running, waiting
    return Stated(entry, [str(row.pk) for row in same])


def with_entries(change: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The change as its owner's group carries it, and the owner: with its conversation's
    entry rendered for a page that shows another conversation ("other") and for a page
    of one of the conversation's tabs, `versions` ("current"). None when the tab is gone
    (deleted meanwhile) or owned by no one (an import not finished yet, shown to no one):
    nothing to show."""
    found = stated(change["tab_id"])
    if found is None or (owner_id := found.entry.owner_id) is None:
        return None
    tab = found.entry
    approval = change.get("approval")
    entries = {
        "other": entry(tab, approval=approval),
        "current": entry(tab, current=tab.pk, approval=approval),
    }
    # The pages of any of these show the conversation: its entry is current there.
    return owner_id, {**change, "entries": entries, "versions": found.versions}


def announce(tab_id: uuid.UUID | str, state: str) -> None:
    """From sync code (lease recovery): the tab's state changed."""
    told = with_entries(message(tab_id, state, None))
    if told is not None:
        owner_id, sent = told
        bus.group_send(bus.user_group(owner_id), sent)


def entry(
    tab: Tab,
    *,
    current: uuid.UUID | str | None = None,
    approval: dict[str, Any] | None = None,
) -> str:
    """The tab's sidebar entry as an insert at the top of the list; the page's script
    turns it into a replace in place when the entry is there already."""
    ask = approval if approval and state(tab) == WAITING else None
    shown = {"conversation": tab.conversation} if current else None
    return render_to_string(
        "chat/app.html#tablink_insert", {"t": tab, "current_tab": shown, "ask": ask}
    )


def held(report: Any) -> dict[str, str]:
    """A page's sidebar hello, `{tab id: state}`, checked: unknown ids and states are
    left out (they are then sent as if missing), never an error."""
    if not isinstance(report, dict):
        return {}
    out: dict[str, str] = {}
    for key, value in list(report.items())[:HELD_MAX]:
        try:
            tab_id = str(uuid.UUID(str(key)))
        except ValueError:
            continue
        if value in (IDLE, RUNNING, WAITING):
            out[tab_id] = value
    return out


def catch_up(owner: Any, report: dict[str, str], current: uuid.UUID | str | None) -> list[str]:
    """The entries a page's list lacks or shows in another state (changes while its
    socket was not connected: between the page's render and the connect, or a drop).
    An entry is held by the tab it links to: a conversation whose latest tab changed
    (a new version) is sent again."""
    frames = []
    conversation = None
    if current is not None:
        shown = Tab.objects.filter(pk=current, owner=owner).values_list("conversation", flat=True)
        conversation = shown.first()
    # Oldest first: each insert goes on top, so the newest ends up there.
    for tab in reversed(tabs(owner)):
        if report.get(str(tab.pk)) != state(tab):
            mine = tab.conversation == conversation
            frames.append(entry(tab, current=tab.pk if mine else None))
    return frames
