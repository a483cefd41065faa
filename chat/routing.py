"""WebSocket routes and the background channel that runs turns."""

from __future__ import annotations

from django.urls import path

from chat.consumers import TabSocket, TurnWorker
from chat.turns import WORKER_CHANNEL

websocket_urlpatterns = [
    path("ws/tabs/<uuid:tab_id>/", TabSocket.as_asgi()),
]

channel_routes = {
    WORKER_CHANNEL: TurnWorker.as_asgi(),
}
