"""The page's view of a run of chunks: presenters grouped (results in their cards, which
chunk starts a bubble) and marked with what a page render knows about the log around
them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from chat.render.cards import ToolCall, ToolResult
from chat.render.item import Fork, Item
from chat.render.messages import Notice, Plan
from chat.render.presenters import present
from chat.render.status import status_context


def mark_page(
    items: Sequence[Item],
    *,
    cuts: set[int],
    running_turn: uuid.UUID | None = None,
    last_answer: int | None = None,
    resumable: int | None = None,
    forks: Sequence[Fork] = (),
    gone: AbstractSet[str] = frozenset(),
) -> None:
    """What a page render offers on its chunks (the view knows the log around them):
    `cuts` (chat.cuts.valid_cuts of the page), the seq that ends the last answer, the seq of
    the interrupted last turn's last notice, the tab's branches, and the tabs named
    by `forked` notices that no longer exist (ids as strings).

    The running turn's chunks are left as live ones are: where such a chunk turns
    out to end its turn is known only later, to CSS (see `Item.offers_end`)."""
    at: dict[int, list[Fork]] = {}
    for fork in forks:
        at.setdefault(fork.fork_seq, []).append(fork)
    for n, item in enumerate(items):
        for candidate in (item, *item.results):
            seq = candidate.seq
            if seq is None or (running_turn is not None and candidate.turn_id == running_turn):
                continue
            candidate.known = True
            candidate.cut = seq in cuts
            candidate.cut_before = seq - 1 in cuts
            candidate.last_answer = seq == last_answer
            candidate.resumable = seq == resumable
            candidate.origin_gone = (
                isinstance(candidate, Notice) and candidate.forked and candidate.from_tab in gone
            )
            item.forks.extend(at.get(seq, ()))
        if n == 0 and item.seq == 1:
            item.forks_before.extend(at.get(0, ()))


def group(chunks: Iterable[Any], *, continues: bool = False) -> list[Item]:
    """The top-level items of a run of chunks (seq order), results placed in their cards.

    `continues`: the chunk before the first one belongs to the same turn, so the
    first bubble is not a turn's start. Shown right after the "older" sentinel,
    such a bubble is drawn as partial (app.css), which stays true however the page
    later grows or trims around it.
    """
    items: list[Item] = []
    cards: dict[str, list[ToolCall]] = {}
    plans: dict[str, Plan] = {}
    for chunk in chunks:
        item = present(chunk)
        if isinstance(item, Plan):
            # A turn's later revisions go in the slot of its first plan.
            first = plans.setdefault(item.turn_attr, item)
            if first is not item:
                first.results.append(item)
                continue
        elif isinstance(item, ToolResult):
            card = _card_for(cards.get(item.slot, []))
            if card is not None:
                card.results.append(item)
                continue
            item.orphan = True
        elif isinstance(item, ToolCall):
            cards.setdefault(item.slot, []).append(item)
        items.append(item)
    previous: Item | None = None
    for item in items:
        if previous is None:
            item.turn_start = not continues
        else:
            item.turn_start = previous.turn_id != item.turn_id
        previous = item
    return items


def _card_for(cards: list[ToolCall]) -> ToolCall | None:
    """The call a result answers: the first with this key still unanswered.

    Some servers repeat a call id within a step; each result then goes to the
    first call not yet answered, as the reducer pairs them.
    """
    for card in cards:
        if not card.answered:
            return card
    return cards[-1] if cards else None


def page_items(
    chunks: Sequence[Any], status: dict[str, Any], *, continues: bool = False
) -> tuple[list[Item], dict[str, Any]]:
    """A page render's items and status context.

    The status in the database says "waiting" but not for which call (the
    runner holds that); it is the running turn's call that has no result yet.
    """
    status = dict(status)
    items = group(chunks, continues=continues)
    if status.get("state") == "waiting" and not status.get("approval"):
        for item in reversed(items):
            if isinstance(item, ToolCall) and item.turn_attr == str(status.get("turn_id")):
                if not item.answered:
                    status["approval"] = {
                        "call_id": item.call_id,
                        "name": item.name,
                        "arguments": item.arguments,
                    }
                break
    approval = status.get("approval")
    if approval:
        _mark_pending(items, str(approval.get("call_id") or ""))
    return items, status_context(status)


def mark_hit(items: Sequence[Item], seq: int) -> None:
    """Highlight the chunk of this seq, at the top level or as a result in its card."""
    for item in items:
        for candidate in (item, *item.results):
            if candidate.seq == seq:
                candidate.hit = True
                return


def _mark_pending(items: Sequence[Item], call_id: str) -> None:
    for item in reversed(items):
        if isinstance(item, ToolCall) and item.call_id == call_id and not item.answered:
            item.pending_approval = True
            return
