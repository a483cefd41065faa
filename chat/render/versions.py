"""Versions in place: where the page shows "‹ 2 / 3 ›" between sibling branches.

Storage is unchanged (ARCHITECTURE.md, "Branches and continue"): Edit, Regenerate
and Retry each make a branch, a tab with its own dense copy of the log. What the
reader sees is one conversation whose messages have versions. A branch made by one
of them keeps its parent's `conversation` and a `lineage`: [[tab id, seq], ...],
oldest first, each entry the tab whose chunks 1..seq were copied. A version point is
one such entry, (tab, seq): the log of `tab` up to `seq`, after which its versions
diverge. Its versions are `tab` itself (version 1) and every tab whose lineage ends
with that entry, oldest first.

Seqs survive copying (log.copy keeps them), so a point's `seq` is the same number in
every tab that holds that prefix, and a point is shown on any tab that holds it: a
page shows the versions of each point its log passes. A deleted tab stays a valid
key: its versions are still grouped, and its slot is left out unless the page's own
tab stands in it.

A version point is normalised when the branch is made (`lineage_for`): a cut inside
what the parent copied from an ancestor, or right after its own `forked` notice (a
regenerated branch regenerated again), is the ancestor's point, so the third
version of an answer is "3 / 3", not "2 / 2" of another group.

Pure: the rows come from the caller (chat.sidebar.versions_of reads them).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

Lineage = list[list[Any]]

# The actions of chat.turns that make a version (a plain "branch" starts a new
# conversation): what a `forked` notice's `action` says.
VERSION_ACTIONS = frozenset({"edit", "regenerate", "retry"})


def _entries(lineage: Any) -> list[tuple[str, int]]:
    """A stored lineage, read defensively: entries that are not [id, seq] are skipped."""
    out: list[tuple[str, int]] = []
    for entry in lineage if isinstance(lineage, list) else []:
        if isinstance(entry, list | tuple) and len(entry) == 2:
            try:
                out.append((str(uuid.UUID(str(entry[0]))), int(entry[1])))
            except (TypeError, ValueError):
                continue
    return out


def _reach(entries: Sequence[tuple[str, int]]) -> list[int]:
    """How far each entry's tab is held by the last one: its chunks 1..reach[i]."""
    reach: list[int] = []
    low: int | None = None
    for _, seq in reversed(entries):
        low = seq if low is None else min(low, seq)
        reach.append(low)
    return reach[::-1]


def lineage_for(parent_lineage: Any, parent_id: uuid.UUID | str, cut: int) -> Lineage:
    """A new version's lineage: branched from the parent (whose lineage is given) with
    its chunks 1..`cut`, `cut` being the last chunk that is not a system notice (a
    `forked` notice adds nothing to diverge from). The cut goes to the oldest tab that
    holds those chunks, so versions made from any of their copies are siblings."""
    entries = _entries(parent_lineage)
    for n, ((tab_id, _), reach) in enumerate(zip(entries, _reach(entries), strict=True)):
        if cut <= reach:
            return [[t, s] for t, s in entries[:n]] + [[tab_id, cut]]
    return [[t, s] for t, s in entries] + [[str(parent_id), cut]]


class Versioned(Protocol):
    """A tab as grouping reads it (a Tab row is one)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def lineage(self) -> Any: ...
    @property
    def created_at(self) -> datetime: ...


@dataclass(frozen=True)
class Row:
    """A tab of the conversation, as grouping needs it."""

    id: uuid.UUID
    lineage: Any
    created_at: datetime


@dataclass(frozen=True)
class Point:
    """One version point as a tab's page shows it: after chunk `after`, the versions'
    tab ids in order (version n is slots[n - 1]) and which one this page is."""

    after: int
    slots: tuple[uuid.UUID, ...]
    current: int


def points(tab: Versioned, rows: Iterable[Versioned]) -> list[Point]:
    """Every version point `tab`'s log passes that has more than one version, by seq.
    `rows`: the conversation's tabs (the owner's, not deleted), `tab` among them or not."""
    alive: dict[uuid.UUID, Versioned] = {row.id: row for row in rows}
    alive.setdefault(tab.id, tab)
    members: dict[tuple[str, int], list[Versioned]] = {}
    for row in alive.values():
        entries = _entries(row.lineage)
        if entries:
            members.setdefault(entries[-1], []).append(row)
    entries = _entries(tab.lineage)
    path = [tab_id for tab_id, _ in entries] + [str(tab.id)]
    reach = [*_reach(entries), None]
    found: list[Point] = []
    for n, tab_id in enumerate(path):
        # Where this tab's page stands in for path[n]: the points of path[n]'s own log.
        held = reach[n]
        for (base, seq), versions in members.items():
            if base != tab_id or (held is not None and seq >= held):
                continue
            found.append(_point(seq, base, versions, alive, uuid.UUID(base)))
        if n < len(entries):
            # Where path[n + 1] (this tab, or an ancestor it holds) left path[n].
            seq = entries[n][1]
            versions = members.get(entries[n], [])
            found.append(_point(seq, tab_id, versions, alive, uuid.UUID(path[n + 1]), tab))
    return sorted((p for p in found if len(p.slots) > 1), key=lambda p: p.after)


def _point(
    seq: int,
    base: str,
    versions: list[Versioned],
    alive: dict[uuid.UUID, Versioned],
    mine: uuid.UUID,
    tab: Versioned | None = None,
) -> Point:
    """The point's slots: its base first (unless deleted), then its versions oldest first;
    `mine` is the slot this page stands in, kept even when that tab was deleted."""
    ordered: list[Versioned] = sorted(versions, key=_age)
    if mine not in {row.id for row in ordered} and mine != uuid.UUID(base):
        # A deleted version this page descends from: placed by the page's own age.
        stand_in = tab or alive[mine]
        ordered = sorted([*ordered, Row(mine, [], stand_in.created_at)], key=_age)
    slots = [row.id for row in ordered]
    base_id = uuid.UUID(base)
    if base_id in alive or base_id == mine:
        slots.insert(0, base_id)
    return Point(after=seq, slots=tuple(slots), current=slots.index(mine))


def _age(row: Versioned) -> tuple[datetime, str]:
    return (row.created_at, str(row.id))


@dataclass
class Switcher:
    """The "‹ n / total ›" control under a message (chat/_versions.html)."""

    index: int
    total: int
    previous: uuid.UUID | None
    next: uuid.UUID | None
    # Under one of the user's messages (an edit's versions), else under an answer.
    user: bool = False
    label: str = field(init=False)

    def __post_init__(self) -> None:
        self.label = f"Version {self.index} of {self.total}"


def switcher(point: Point) -> Switcher:
    slots, n = point.slots, point.current
    return Switcher(
        index=n + 1,
        total=len(slots),
        previous=slots[n - 1] if n > 0 else None,
        next=slots[n + 1] if n + 1 < len(slots) else None,
    )


def mark(items: Sequence[Any], found: Iterable[Point], *, at_end: bool) -> None:
    """Put each point's switcher under the message where its versions diverge: the first
    chunk after `after` that is not a notice (a user message: under it; an answer: under
    the last chunk of its turn on the page). A version with nothing of its own yet (an
    edit not sent, an answer not started) has it under its last chunk, when the page
    ends where the log does. A point whose place is not on this page shows nothing."""
    for point in found:
        at = _anchor(items, point.after, at_end=at_end)
        if at is None:
            continue
        control = switcher(point)
        control.user = getattr(items[at], "role", None) == "user"
        items[at].versions.append(control)


def _anchor(items: Sequence[Any], after: int, *, at_end: bool) -> int | None:
    first = next(
        (
            n
            for n, item in enumerate(items)
            if item.seq is not None and item.seq > after and not _notice(item)
        ),
        None,
    )
    if first is None:
        last = len(items) - 1
        if at_end and last >= 0 and items[last].seq is not None and items[last].seq > after:
            return last
        return None
    if items[first].role == "user":
        return first
    turn = items[first].turn_id
    end = first
    while end + 1 < len(items) and items[end + 1].turn_id == turn and turn is not None:
        end += 1
    return end


def _notice(item: Any) -> bool:
    return bool(getattr(item, "kind_is_notice", False))
