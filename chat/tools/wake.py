"""The `schedule_wake` tool: the model asks for a prompt to be sent later (a Wake row;
ARCHITECTURE.md, Wakes). It always waits for the user's approval (registry.ALWAYS_ASK: no allow
rule and no "don't ask" setting lets it through), since a wake acts later with nobody
watching. A recurring wake it makes expires after AGENT_WAKE_LIFETIME unless the user
keeps it on the Wakes page.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from chat import bus, schedule
from chat.models import Tab, Wake
from chat.tools.base import ToolError, ToolOutcome

NAME = "schedule_wake"

# A wake the model made and the user did not look at again stops on its own: an
# unattended prompt that recurs forever is the user's choice (Keep), never a default.
AGENT_WAKE_LIFETIME = timedelta(days=7)

DESCRIPTION = (
    "Schedule a prompt to be sent to you later (a wake), as if the user sent it: once at "
    "a time, every N seconds, or on a cron schedule in a time zone. Give exactly one of "
    "`cron`, `interval_seconds` or `at`. The user must approve it. A recurring wake you "
    f"create stops after {AGENT_WAKE_LIFETIME.days} days unless the user keeps it."
)

INPUT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "description": "A short name for it."},
        "prompt": {"type": "string", "minLength": 1, "description": "The message to send."},
        "cron": {
            "type": "string",
            "description": "Five fields: minute hour day-of-month month day-of-week.",
        },
        "interval_seconds": {
            "type": "integer",
            "minimum": int(schedule.MIN_INTERVAL.total_seconds()),
            "maximum": int(schedule.MAX_INTERVAL.total_seconds()),
            "description": "Run every this many seconds, the first time one interval from now.",
        },
        "at": {
            "type": "string",
            "description": "Run once at this local time, YYYY-MM-DDTHH:MM, in `timezone`.",
        },
        "timezone": {
            "type": "string",
            "description": "IANA time zone of `cron` and `at`, such as Europe/Berlin; default UTC.",
        },
        "target": {
            "type": "string",
            "description": "'this_tab' (default) or 'new_tab': a new tab each time it runs.",
        },
    },
    "required": ["name", "prompt"],
    "additionalProperties": False,
}


async def schedule_wake(args: Mapping[str, Any], tab_id: uuid.UUID | None) -> ToolOutcome:
    if tab_id is None:
        raise ToolError(f"{NAME} runs only in a tab's turn.")
    return await database_sync_to_async(_create)(args, tab_id, timezone.now())


def _create(args: Mapping[str, Any], tab_id: uuid.UUID, now: datetime) -> ToolOutcome:
    given = [key for key in ("cron", "interval_seconds", "at") if args.get(key) not in (None, "")]
    if len(given) != 1:
        raise ToolError("Give exactly one of cron, interval_seconds or at.")
    target = args.get("target") or "this_tab"
    if target not in ("this_tab", "new_tab"):
        raise ToolError(f"target must be 'this_tab' or 'new_tab', not {target!r}.")
    tz = args.get("timezone") or "UTC"
    try:
        once_at = None
        if "at" in given:
            try:
                naive = datetime.fromisoformat(args["at"])
            except ValueError:
                raise schedule.ScheduleError(
                    f"at must be a local time YYYY-MM-DDTHH:MM, not {args['at']!r}."
                ) from None
            if naive.tzinfo is not None:
                raise schedule.ScheduleError("Give `at` without an offset; `timezone` says it.")
            once_at = schedule.local_to_utc(naive, tz)
        kind = {"cron": schedule.CRON, "interval_seconds": schedule.INTERVAL, "at": schedule.ONCE}
        spec = schedule.parse(
            kind[given[0]],
            cron=args.get("cron") or "",
            timezone=tz,
            interval_seconds=args.get("interval_seconds"),
            once_at=once_at,
        )
        expires = None if spec.kind == schedule.ONCE else now + AGENT_WAKE_LIFETIME
        first = schedule.first_run(spec, now, expires)
    except schedule.ScheduleError as exc:
        raise ToolError(str(exc)) from None
    with transaction.atomic():
        tab = Tab.objects.select_related("profile").get(pk=tab_id)
        if target == "new_tab" and _from_sub_agent(tab):
            raise ToolError(
                "A sub-agent's tab (or a branch of one) can wake only itself (target "
                "'this_tab'): its profile was the model's choice, and a new tab would get "
                "that profile's allow rules."
            )
        if tab.owner_id is None:
            raise ToolError("A wake runs as its tab's owner, and this tab has none.")
        wake = Wake.objects.create(
            owner_id=tab.owner_id,
            name=args["name"].strip()[:200],
            tab=None if target == "new_tab" else tab,
            new_tab=target == "new_tab",
            prompt=args["prompt"],
            kind=spec.kind,
            cron=spec.cron,
            timezone=spec.timezone,
            interval_seconds=args.get("interval_seconds"),
            once_at=once_at,
            profile=tab.profile if target == "new_tab" else None,
            model=tab.model if target == "new_tab" else "",
            expires_at=expires,
            created_by=Wake.Creator.AGENT,
            next_run_at=first,
        )
    bus.wakes_changed()
    until = f"; it expires {expires:%Y-%m-%d %H:%M} UTC unless the user keeps it" if expires else ""
    return ToolOutcome(
        f"Scheduled wake {wake.pk} ({wake.name}): next run {first:%Y-%m-%d %H:%M} UTC{until}.",
        is_error=False,
    )


def _from_sub_agent(tab: Tab) -> bool:
    """A sub-agent's tab, or a branch of one: a tab whose profile a person never chose
    (chat.turn.agents), so new tabs made with it would have more than the tab has. Its
    inherited rules say so too, where a deleted tab broke the chain of branches."""
    if tab.profile_by_model or any(
        isinstance(r, dict) and r.get("source") for r in tab.rules or []
    ):
        return True
    seen: set[uuid.UUID] = set()
    branch: Tab | None = tab
    while branch is not None and branch.pk not in seen:
        if branch.parent_call_id:
            return True
        seen.add(branch.pk)
        branch = branch.parent
    return False
