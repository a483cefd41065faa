"""`manage.py wake add|list|remove|run|run-due`: wakes from the command line
(ARCHITECTURE.md, Wakes)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from chat import schedule, wakes
from chat.models import Profile, Tab, Wake


class Command(BaseCommand):
    help = "Add, list, remove and run wakes (prompts sent on a schedule)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="Add a wake.")
        add.add_argument("--owner", required=True, help="The user it runs as (username).")
        target = add.add_mutually_exclusive_group(required=True)
        target.add_argument("--tab", help="The id of the tab to send the prompt to.")
        target.add_argument("--new-tab", action="store_true", help="A new tab each time.")
        add.add_argument("--prompt", required=True)
        add.add_argument("--name", default="")
        when = add.add_mutually_exclusive_group(required=True)
        when.add_argument("--cron", help="Five fields: minute hour day month weekday.")
        when.add_argument("--every", type=int, metavar="SECONDS", help="An interval.")
        when.add_argument("--at", help="Once, at this local time: YYYY-MM-DD HH:MM.")
        add.add_argument("--timezone", default="UTC", help="IANA name; default UTC.")
        add.add_argument("--overlap", choices=Wake.Overlap.values, default=Wake.Overlap.QUEUE)
        add.add_argument("--catch-up", choices=Wake.CatchUp.values, default=Wake.CatchUp.LATEST)
        add.add_argument("--approval", choices=Wake.Approval.values, default=Wake.Approval.WAIT)
        add.add_argument("--model", default="", help="A new tab's model.")
        add.add_argument("--profile", default="", help="A new tab's profile (its name).")
        add.add_argument("--expires", help="Stop after this local time: YYYY-MM-DD HH:MM.")
        sub.add_parser("list", help="List the wakes.")
        remove = sub.add_parser("remove", help="Delete a wake and its run history.")
        remove.add_argument("wake_id", type=int)
        run = sub.add_parser("run", help="Run a wake once now, outside its schedule.")
        run.add_argument("wake_id", type=int)
        sub.add_parser(
            "run-due",
            help="Fire every due wake now, as a worker's scheduler does (safe beside them).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, "_" + options["action"].replace("-", "_"))(options)

    def _add(self, options: dict[str, Any]) -> None:
        now = timezone.now()
        owner = get_user_model().objects.filter(username=options["owner"]).first()
        if owner is None:
            raise CommandError(f"No user {options['owner']!r}.")
        tab = None
        if options["tab"]:
            try:
                tab = Tab.objects.get(pk=uuid.UUID(options["tab"]), owner=owner)
            except (ValueError, Tab.DoesNotExist):
                raise CommandError(f"{options['owner']} has no tab {options['tab']!r}.") from None
        profile = None
        if options["profile"]:
            profile = Profile.objects.filter(name=options["profile"]).first()
            if profile is None:
                raise CommandError(f"No profile {options['profile']!r}.")
        tz = options["timezone"]
        try:
            kind = (
                Wake.Kind.CRON
                if options["cron"] is not None
                else Wake.Kind.INTERVAL
                if options["every"] is not None
                else Wake.Kind.ONCE
            )
            wake = Wake(
                owner=owner,
                name=options["name"],
                tab=tab,
                new_tab=options["new_tab"],
                prompt=options["prompt"],
                kind=kind,
                cron=schedule.check_cron(options["cron"], tz) if options["cron"] else "",
                timezone=schedule.zone(tz).key,
                interval_seconds=options["every"],
                once_at=_local(options["at"], tz),
                overlap=options["overlap"],
                catch_up=options["catch_up"],
                approval=options["approval"],
                model=options["model"],
                profile=profile,
                expires_at=_local(options["expires"], tz),
            )
            wakes.reschedule(wake, now)
        except schedule.ScheduleError as exc:
            raise CommandError(str(exc)) from None
        if not wake.prompt.strip():
            raise CommandError("The prompt is empty.")
        wake.save()
        wakes.changed()
        self.stdout.write(f"Added wake {wake.pk}: next run {_shown(wake)}.")

    def _list(self, options: dict[str, Any]) -> None:
        rows = Wake.objects.select_related("owner", "tab").order_by("id")
        if not rows:
            self.stdout.write("No wakes.")
        for wake in rows:
            target = "new tab each time" if wake.new_tab else (wake.tab_id or "tab deleted")
            state = "enabled" if wake.enabled else "disabled"
            self.stdout.write(
                f"{wake.pk}\t{wake}\t{wake.owner}\t{_what(wake)}\t{target}\t{state}\t"
                f"next: {_shown(wake)}"
            )

    def _remove(self, options: dict[str, Any]) -> None:
        deleted, _ = Wake.objects.filter(pk=options["wake_id"]).delete()
        if not deleted:
            raise CommandError(f"No wake {options['wake_id']}.")
        wakes.changed()
        self.stdout.write(f"Removed wake {options['wake_id']}.")

    def _run(self, options: dict[str, Any]) -> None:
        wake = Wake.objects.filter(pk=options["wake_id"]).first()
        if wake is None:
            raise CommandError(f"No wake {options['wake_id']}.")
        run = wakes.run_now(wake, timezone.now())
        self._report(run)
        if run.status == run.Status.FAILED:
            raise CommandError(run.reason)

    def _run_due(self, options: dict[str, Any]) -> None:
        for run in wakes.run_due(timezone.now()):
            self._report(run)

    def _report(self, run: Any) -> None:
        where = f" in tab {run.tab_id}" if run.tab_id else ""
        why = f": {run.reason}" if run.reason else ""
        self.stdout.write(
            f"Wake {run.wake_id} at {run.scheduled_for:%Y-%m-%d %H:%M:%S} UTC: "
            f"{run.status}{where}{why}"
        )


def _local(text: str | None, tz: str) -> datetime | None:
    if not text:
        return None
    try:
        naive = datetime.fromisoformat(text)
    except ValueError:
        raise schedule.ScheduleError(f"{text!r} is not a time YYYY-MM-DD HH:MM.") from None
    if naive.tzinfo is not None:
        raise schedule.ScheduleError(f"Give {text!r} without an offset: --timezone says it.")
    return schedule.local_to_utc(naive, tz)


def _what(wake: Wake) -> str:
    if wake.kind == Wake.Kind.CRON:
        return f"cron {wake.cron} ({wake.timezone})"
    if wake.kind == Wake.Kind.INTERVAL:
        return f"every {wake.interval_seconds} s"
    return f"once at {wake.once_at:%Y-%m-%d %H:%M} UTC"


def _shown(wake: Wake) -> str:
    if wake.next_run_at is None:
        return "never"
    local = wake.next_run_at.astimezone(schedule.zone(wake.timezone))
    return f"{local:%Y-%m-%d %H:%M %Z}"
