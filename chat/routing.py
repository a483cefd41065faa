"""WebSocket routes. The worker channel is routed by `worker.run_worker` itself."""

from __future__ import annotations

from django.urls import path

from chat.consumers import TabSocket, UserSocket

websocket_urlpatterns = [
    path("ws/tabs/<uuid:tab_id>/", TabSocket.as_asgi()),
    path("ws/user/", UserSocket.as_asgi()),
]
