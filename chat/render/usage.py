"""Tokens and cost (chat.usage's totals) as the page shows them: a turn's usage line,
where it goes, and the tab's totals in its header.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from chat.chunks import Kind
from chat.render.figures import tokens
from chat.render.item import Item
from chat.usage import Totals, format_usd

# Chunks a finished turn's usage line never goes in: a thinking block's line would hide
# in its fold, a card's sit among its results, a plan's in a revision a later one hides.
# It goes in the turn's last other top-level chunk, at its end (in an error's card),
# where `usage_target` finds it too.
NO_USAGE_LINE = (Kind.THINKING, Kind.TOOL_CALL, Kind.PLAN)


def usage_line(totals: Totals, turn_id: Any = None) -> dict[str, Any]:
    """What the `turn_usage` and `tab_usage` partials show of some steps' totals.

    `turn_id`: a turn's line (its element's id, and where a live one goes)."""
    t = totals.tokens
    share = t.cache_share
    if share is None:
        cached = None
    elif 0 < share < 0.005:
        cached = "<1"
    else:
        cached = str(int(share * 100 + 0.5))
    if totals.free:
        cost = "free"
    elif totals.priced:
        cost = format_usd(totals.usd)
    elif totals.usd:
        cost = f"{format_usd(totals.usd)} + price unknown"
    else:
        cost = "price unknown"
    detail = [
        f"input {t.input:,} (uncached)",
        f"cache read {t.cache_read:,}",
        f"cache write {t.cache_write:,}",
        f"output {t.output:,}" + (f" ({t.reasoning:,} reasoning)" if t.reasoning else ""),
        f"{totals.steps} request{'s' if totals.steps != 1 else ''}",
        ", ".join(totals.models),
    ]
    if totals.free:
        detail.append("the offline demo model costs nothing")
    elif totals.unknown:
        detail.append(f"no price for {', '.join(totals.unknown)} in the price table")
    turn = str(turn_id) if turn_id else ""
    return {
        "turn_id": turn,
        "target": usage_target(turn) if turn else "",
        "steps": totals.steps,
        "prompt": tokens(t.prompt),
        "output": tokens(t.output),
        "cached": cached,
        "cost": cost,
        "unknown": bool(totals.unknown),
        "detail": " · ".join(part for part in detail if part),
        # Each count at a glance and exact, for the tables of Settings and the admin.
        "compact": {
            "input": tokens(t.input),
            "cache_read": tokens(t.cache_read),
            "cache_write": tokens(t.cache_write),
            "steps": tokens(totals.steps),
        },
        "exact": {
            "input": f"{t.input:,}",
            "cache_read": f"{t.cache_read:,}",
            "cache_write": f"{t.cache_write:,}",
            "output": f"{t.output:,}",
            "steps": f"{totals.steps:,}",
        },
    }


def usage_target(turn_id: str) -> str:
    """The element a turn's usage line goes at the end of, live: the chunk a page render
    puts it in (`mark_usage`), so a reload shows it in the same place."""
    ours = f'.chunk[data-turn="{turn_id}"]:not(.t-thinking):not(.t-tool-call):not(.t-plan)'
    last = f"#log > {ours}:not(:has(~ {ours}))"
    return f"{last}:not(.t-error), {last}.t-error > .card"


def mark_usage(items: Sequence[Item], totals: dict[Any, Totals]) -> None:
    """Put each turn's usage line (`totals` by turn id: the turns that ended on this
    page) on its last chunk that can carry one."""
    last: dict[Any, Item] = {}
    for item in items:
        if item.turn_id in totals and item.type not in NO_USAGE_LINE:
            last[item.turn_id] = item
    for turn_id, item in last.items():
        item.usage = usage_line(totals[turn_id], turn_id)


def turn_end_context(status: dict[str, Any]) -> dict[str, Any]:
    """The usage line of the turn that just ended and the tab's new totals, from the
    runner's idle status (`turn_end`, chat.usage.turn_end)."""
    end = status.get("turn_end")
    if (status.get("state") or "idle") != "idle" or not isinstance(end, dict):
        return {"turn_usage": None, "tab_usage": None}
    try:
        turn_id = uuid.UUID(str(end.get("turn_id")))
    except ValueError:
        turn_id = None
    turn = Totals.from_dict(end.get("turn") or {})
    return {
        "turn_usage": usage_line(turn, turn_id) if turn.steps and turn_id else None,
        "tab_usage": usage_line(Totals.from_dict(end.get("tab") or {})),
    }
