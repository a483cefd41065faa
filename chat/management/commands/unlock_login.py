"""`manage.py unlock_login`: list sign-in locks, or lift them.

Without options it lists the accounts and addresses locked now and for how
long. `--user NAME` forgets the failed sign-ins of that account (from every
address), `--ip ADDRESS` those from that address (for every account), `--all`
every one. The failures are rows in the database (django-axes), so this works
from any process, whichever web process counted them.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from axes.models import AccessAttempt
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Q
from django.utils import timezone

from chat import throttle


class Command(BaseCommand):
    help = "List sign-in locks (no options) or lift them (--user, --ip, --all)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", action="append", default=[], metavar="NAME")
        parser.add_argument("--ip", action="append", default=[], metavar="ADDRESS")
        parser.add_argument(
            "--all", action="store_true", dest="everything", help="forget every failed sign-in"
        )

    def handle(
        self, *args: Any, user: list[str], ip: list[str], everything: bool, **options: Any
    ) -> None:
        if everything and (user or ip):
            raise CommandError("--all already lifts every lock: drop --user / --ip.")
        for address in ip:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise CommandError(
                    f"--ip {address!r} is not an IP address (e.g. 203.0.113.7 or 2001:db8::7)."
                ) from None
        if everything or user or ip:
            self._unlock(user, ip, everything=everything)
        self._list()

    def _unlock(self, users: list[str], addresses: list[str], *, everything: bool) -> None:
        attempts = AccessAttempt.objects.all()
        if not everything:
            match = Q(username__in=users) | Q(ip_address__in=addresses)
            attempts = attempts.filter(match)
        failures = sum(attempts.values_list("failures_since_start", flat=True))
        attempts.delete()
        what = "everyone" if everything else ", ".join([*users, *addresses])
        self.stdout.write(f"Forgot {failures} failed sign-in(s) of {what}.")

    def _list(self) -> None:
        now = timezone.now()
        found = throttle.all_locks(now)
        if not found:
            self.stdout.write("No sign-in is locked.")
            return
        for lock in found:
            minutes = throttle.minutes_left(lock.until, now)
            self.stdout.write(f"locked: {lock.kind} {lock.value} for {minutes} more minute(s)")
