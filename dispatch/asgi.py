"""ASGI entry point: HTTP through Django, WebSockets through Channels."""

import os

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured

from chat.envcheck import exit_configuration_error

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dispatch.settings")
# Django must be set up before anything imports models (routing does).
try:
    django_asgi_app = get_asgi_application()
except ImproperlyConfigured as exc:
    # Under plain daphne this would be a traceback: one line naming the variable instead.
    exit_configuration_error(exc)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from chat import routing, startup  # noqa: E402
from chat.worker import start_embedded_worker  # noqa: E402
from dispatch.bodylimit import BodyLimitMiddleware  # noqa: E402
from dispatch.origin import SameOriginValidator  # noqa: E402
from dispatch.wsauth import SessionAuthMiddleware  # noqa: E402

# What `manage.py serve` checks before serving, for plain daphne too; not the
# services: importing a module should not wait on the network.
startup.check(services=False)

router = ProtocolTypeRouter(
    {
        # One self-hosted process serves its own few static files; a reverse
        # proxy in front may serve STATIC_ROOT instead (see README). Bodies are
        # bounded (per route, and small until signed in) before Django reads them.
        "http": BodyLimitMiddleware(ASGIStaticFilesHandler(django_asgi_app)),
        # The page's own origin only: scheme, host and port (dispatch/origin.py).
        "websocket": SameOriginValidator(
            SessionAuthMiddleware(URLRouter(routing.websocket_urlpatterns))
        ),
    }
)


async def application(scope, receive, send):
    # Embedded mode (no REDIS_URL): turns run in this process, started with it.
    start_embedded_worker()
    await router(scope, receive, send)
