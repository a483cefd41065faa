"""`manage.py serve`: the app on daphne, with the turn worker started at once.

Plain `daphne dispatch.asgi:application` works too; it starts the embedded
worker on the first request instead of at start-up.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve Dispatch over HTTP and WebSocket (daphne)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, host: str, port: int, **options):
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from chat.providers import default_model
        from chat.turns import start_embedded_worker
        from dispatch.asgi import application

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
        Server(
            application=application,
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=start_embedded_worker,
        ).run()
