"""WebSocket routes and the background channel that runs turns."""

from __future__ import annotations

websocket_urlpatterns: list = []
channel_routes: dict = {}
