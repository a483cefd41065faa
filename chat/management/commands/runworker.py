"""`manage.py runworker`: a turn worker process for the scaled mode (REDIS_URL set).

Replaces Channels' own runworker (chat is listed before channels in
INSTALLED_APPS) so that the worker also scans for turns whose worker died,
and stops gracefully on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from chat import startup
from chat.worker import run_worker


class Command(BaseCommand):
    help = "Run turns from the channel layer (needs REDIS_URL)."

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.REDIS_URL:
            raise CommandError(
                "REDIS_URL is not set: without Redis, turns run inside the web process "
                "(make run) and a separate worker could not receive them."
            )
        startup.check()
        self.stdout.write("Turn worker started; Ctrl+C or SIGTERM stops it.")
        asyncio.run(self._main())

    async def _main(self) -> None:
        task = asyncio.create_task(run_worker())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
