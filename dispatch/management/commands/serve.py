"""`manage.py serve`: the app on daphne, with the turn worker started at once.

SIGTERM or Ctrl+C drains like `runworker`: no new turns, running turns get
DISPATCH_SHUTDOWN_GRACE seconds to finish, then they are interrupted (the open
block sealed as it is, tools killed, a notice in the log, the lease released).
A second signal skips what is left of the grace period.

Plain `daphne dispatch.asgi:application` works too; it starts the embedded
worker on the first request instead, and has no drain: its turns are recovered
as interrupted at the next start.
"""

from __future__ import annotations

import asyncio
import signal
from types import FrameType
from typing import Any

from daphne.endpoints import build_endpoint_description_strings
from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.utils.module_loading import import_string
from twisted.internet import defer

from chat import startup, worker
from chat.providers import default_model
from chat.tools import sandbox

# daphne's Server, its request bodies bounded as they arrive; importing it installs the
# asyncio reactor Twisted must use, before anything imports Twisted's default one.
from dispatch.server import Server


class Command(BaseCommand):
    help = "Serve Dispatch over HTTP and WebSocket (daphne)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, host: str, port: int, **options: Any) -> None:
        # Before anything reads the database: a bad value or a dead service is one line.
        startup.check()

        # Loaded only now: importing it builds the app, which reads the
        # database the check above has just vouched for.
        application = import_string(settings.ASGI_APPLICATION)

        model = default_model()
        note = (
            " (the offline demo model: no API key needed)" if model.startswith("offline/") else ""
        )
        mode = "scaled: turns run in `manage.py runworker`" if settings.REDIS_URL else "embedded"
        self.stdout.write(
            f"Dispatch on http://{host}:{port}/\n"
            f"  data:  {settings.DATA_DIR}\n"
            f"  model: {model}{note}\n"
            f"  mode:  {mode}\n"
            "Press Ctrl+C to stop."
        )
        if warning := sandbox.root_warning():
            self.stderr.write(f"Warning: {warning}")
        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=self._ready,
        ).run()

    def _ready(self) -> None:
        # Imported here, after daphne.server has installed the asyncio reactor:
        # importing the reactor earlier would install Twisted's default one.
        from twisted.internet import reactor

        worker.start_embedded_worker()
        # Twisted waits for a "before shutdown" trigger's Deferred before it stops. Its
        # interfaces declare methods without `self`, and mypy (without the zope plugin)
        # takes the first parameter for it.
        reactor.addSystemEventTrigger("before", "shutdown", self._drain)  # type: ignore[arg-type]

    def _drain(self) -> defer.Deferred[None]:
        loop = asyncio.get_event_loop()

        def again(signum: int, frame: FrameType | None) -> None:
            loop.call_soon_threadsafe(worker.interrupt_turns)

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, again)
        return defer.Deferred.fromFuture(asyncio.ensure_future(worker.stop_embedded_worker()))
