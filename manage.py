#!/usr/bin/env python
"""Django's command line. A bad setting, or a database that does not answer, stops it
with one line naming the variable and the fix: a traceback would bury it."""

from __future__ import annotations

import os
import sys

import django
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import execute_from_command_line
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

from chat.dbcheck import database_unreachable
from chat.envcheck import (
    EXIT_UNAVAILABLE,
    exit_configuration_error,
    exit_with,
    unreachable_line,
)

# Commands that need no database (`check` validates the settings, a database's too).
WITHOUT_DATABASE = frozenset(
    {"help", "--help", "-h", "version", "--version", "check", "makemigrations"}
)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch.settings")
    try:
        if sys.argv[1:2] and sys.argv[1] not in WITHOUT_DATABASE:
            django.setup()
            # PostgreSQL's connections come from a pool, which retries a server that does
            # not answer until its timeout and then says only that it timed out.
            if connections[DEFAULT_DB_ALIAS].vendor == "postgresql" and (
                exc := database_unreachable()
            ):
                exit_with(
                    unreachable_line("the database", settings.DATABASE_URL, "DATABASE_URL", exc),
                    EXIT_UNAVAILABLE,
                )
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        exit_configuration_error(exc)
    except OperationalError as exc:
        # Only a failed connect (no connection was made) is the database not
        # answering; an error on a working connection keeps its traceback.
        if connections[DEFAULT_DB_ALIAS].connection is not None:
            raise
        exit_with(
            unreachable_line("the database", settings.DATABASE_URL, "DATABASE_URL", exc),
            EXIT_UNAVAILABLE,
        )


if __name__ == "__main__":
    main()
