"""`manage.py create_api_token <username> [--name N] [--read-only]`: a personal API token.

Prints the token once, on stdout alone (so `TOKEN=$(manage.py create_api_token me)`
works); only its hash is stored, so it cannot be shown again. Revoke it on the
user's API tokens page or in the admin.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chat.models import ApiToken

# ApiToken.name's column.
NAME_MAX_CHARS = 100


class Command(BaseCommand):
    help = "Create a personal API token for a user and print it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="What the token is for (a label).")
        parser.add_argument(
            "--read-only",
            action="store_true",
            help="The token may read tabs and chunks, never send, stop or approve.",
        )

    def handle(self, *args: Any, username: str, name: str, read_only: bool, **options: Any) -> None:
        name = name.strip()
        if len(name) > NAME_MAX_CHARS:
            raise CommandError(f"--name has at most {NAME_MAX_CHARS} characters.")
        User = get_user_model()
        user = User.objects.filter(**{User.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"There is no user {username!r}; nothing was created.")
        if not user.is_active:
            raise CommandError(f"The user {username!r} is deactivated; nothing was created.")
        row, token = ApiToken.issue(user, name=name, read_only=read_only)
        kind = "read-only" if read_only else "read-write"
        self.stderr.write(
            f"Created a {kind} API token {row.prefix}… for {username}. "
            "It is shown once, below; store it now."
        )
        self.stdout.write(token)
