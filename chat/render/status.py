"""The status line, the composer's buttons, the approval bar, the context meter and the
sub-agents' cards: the context their partials render from a turn's status.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.conf import settings

from chat.render.cards import ToolCall, approve_key
from chat.render.figures import count, tokens
from chat.render.usage import turn_end_context
from chat.tools import sandbox

STATE_LABELS = {
    "idle": "Idle",
    "running": "Running",
    "waiting": "Waiting for approval",
    "stopping": "Stopping",
    "compacting": "Compacting the conversation…",
}


def _epoch_ms(value: Any) -> int | None:
    if isinstance(value, int | float):
        return int(value * 1000)
    if isinstance(value, str) and value:
        try:
            return int(datetime.fromisoformat(value).timestamp() * 1000)
        except ValueError:
            return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return None


def elapsed(ms: int | None, now: float | None = None) -> str:
    if ms is None:
        return ""
    seconds = max(0, int((now if now is not None else time.time()) - ms / 1000))
    return f"{seconds // 60}:{seconds % 60:02d}"


def waited(ms: int | None, now: float | None = None) -> str:
    """How long the model has been silent, as the status line counts it."""
    if ms is None:
        return ""
    seconds = max(0, int((now if now is not None else time.time()) - ms / 1000))
    return f"waiting for the model · {seconds} s"


# The meter's bar is an SVG (the CSP allows no style attribute to set a width): its
# user units, the bar being this long.
METER_UNITS = 100


def context_meter(raw: Any) -> dict[str, Any] | None:
    """What the `meter` partial shows of a status's `context` (chat.context.Meter.as_dict):
    used / window at a glance, the bar with its compaction tick, the cached share, and
    the exact figures in its title. None for no meter (a status without one, whose page
    keeps the last it showed)."""
    if not isinstance(raw, dict):
        return None
    window = count(raw.get("window"))
    if window is None:
        return None
    used = count(raw.get("used")) or 0
    compact_at = min(count(raw.get("compact_at")) or window, window)
    estimated = raw.get("estimated") is True
    known = raw.get("window_known") is not False
    cached = raw.get("cached")
    if not isinstance(cached, int | float) or isinstance(cached, bool) or not 0 <= cached <= 1:
        cached = 0
    # A share of an estimate's cache is meaningless: an estimate has no cache reads.
    cached_pct = round(cached * 100) if used and not estimated else None
    share = min(used / window, 1.0)
    pct = round(share * 100)
    if not used:
        title = [f"Context: nothing sent yet; the window is {window:,} tokens."]
    elif estimated:
        title = [
            f"Context: about {used:,} of {window:,} tokens ({pct}%), estimated since the "
            "compaction; the next request counts it."
        ]
    else:
        title = [
            f"Context: {used:,} of {window:,} tokens ({pct}%); the last request read "
            f"{cached_pct}% of its input from the prompt cache."
        ]
    title.append(
        f"The conversation is compacted when a turn would start above {compact_at:,} tokens "
        f"({round(compact_at / window * 100)}%)."
    )
    if not known:
        title.append(f"This model's context window is unknown: assuming {window:,} tokens.")
    return {
        "used": ("≈" if estimated else "") + tokens(used),
        "window": tokens(window),
        "window_known": known,
        "cached": cached_pct,
        "fill": round(share * METER_UNITS, 2),
        "tick": round(compact_at / window * METER_UNITS, 2),
        "near": used >= compact_at,
        "estimated": estimated,
        "title": " ".join(title),
    }


def approval_context(approval: dict[str, Any] | None) -> dict[str, Any] | None:
    """An approval request ({call_id, name, arguments}) as the approval bar shows it."""
    if not approval or not isinstance(approval, dict):
        return None
    call = ToolCall.asked(approval)
    return {
        "call_id": call.call_id,
        "name": call.name,
        "key": call.approve,
        "summary": call.command or call.args_summary,
        "rule": call.always_rule,
    }


# How a sub-agent's state reads on its call's card.
CHILD_STATES = {
    "queued": "starting",
    "running": "running",
    "waiting": "waiting for approval",
    "stopping": "stopping",
    "compacting": "compacting",
}


def children_context(entries: list[Any], path: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The status's sub-agents (chat.turn.state.TurnStatus.children) for the page: each with its
    card's key (its call's approve key: the parent's card for that call) and every approval
    pending in its subtree, each naming the tab that asks and answered there (`path`: the
    sub-agents above it, for a sub-agent's own sub-agents)."""
    out = []
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("tab"):
            continue
        title = str(entry.get("title") or "Sub-agent")
        state = str(entry.get("state") or "running")
        approval = approval_context(entry.get("approval"))
        own = (
            [{"tab": str(entry["tab"]), "title": title, "via": list(path), **approval}]
            if approval
            else []
        )
        nested = children_context(entry.get("children") or [], (*path, title))
        out.append(
            {
                "tab": str(entry["tab"]),
                "title": title,
                "call_id": str(entry.get("call_id") or ""),
                "key": approve_key(str(entry.get("call_id") or "")),
                "state": state,
                "label": CHILD_STATES.get(state, state),
                "step": entry.get("step") or 0,
                "approval": approval,
                "approvals": own + [a for k in nested for a in k["approvals"]],
            }
        )
    return out


def children_line(kids: list[dict[str, Any]]) -> str:
    """The status line's short word on the sub-agents (their cards say the rest)."""
    if not kids:
        return ""
    asking = sum(len(k["approvals"]) for k in kids)
    if len(kids) == 1:
        return "sub-agent asks approval" if asking else f"sub-agent {kids[0]['label']}"
    verb = "asks" if asking == 1 else "ask"
    return f"{len(kids)} sub-agents" + (f" · {asking} {verb} approval" if asking else "")


def status_context(status: dict[str, Any], *, oob: bool = False) -> dict[str, Any]:
    """What the status partials need, from chat.turns.status() or the runner's status."""
    state = status.get("state") or "idle"
    usage = status.get("usage") or {}
    started = _epoch_ms(status.get("started_at")) if state != "idle" else None
    # Set by the runner once a stream has been silent a while (turn.step.WAITING_STATUS_AFTER).
    waiting = _epoch_ms(status.get("waiting_since")) if state == "running" else None
    approval = approval_context(status.get("approval"))
    kids = children_context(status.get("children") or []) if state != "idle" else []
    label = STATE_LABELS.get(state, state.capitalize())
    if status.get("stale"):
        label = "Not responding"
    return {
        "oob": oob,
        "state": state,
        "label": label,
        "running": state != "idle",
        "turn_id": status.get("turn_id") or "",
        "step": status.get("step") or 0,
        "model": status.get("model") or "",
        "started_ms": started,
        "elapsed": elapsed(started),
        "waiting_ms": waiting,
        "waiting": waited(waiting),
        "usage": {
            "input": tokens(usage.get("input")),
            "output": tokens(usage.get("output")),
            "cache_read": tokens(usage.get("cache_read")),
            "cache_write": tokens(usage.get("cache_write")),
            "has_cache_write": bool(usage.get("cache_write")),
        },
        # Once idle, the turn's tokens are its usage line's (and a reload has no status usage).
        "has_usage": state != "idle"
        and any(usage.get(k) for k in ("input", "output", "cache_read", "cache_write")),
        "approval": approval,
        # Sub-agents the turn waits for (chat.turn.agents), each shown on its call's card;
        # their approvals (a sub-agent's own sub-agents' too) in the approval bar.
        "children": kids,
        "child_approvals": [a for k in kids for a in k["approvals"]],
        "children_line": children_line(kids),
        "has_queued": "queued" in status,
        "queued": status.get("queued") or [],
        "context": context_meter(status.get("context")),
        # A warning only when the shell is unsandboxed or unavailable (cached verdict).
        "sandbox": sandbox.state(sandbox.policy_from(settings)),
        **turn_end_context(status),
    }
