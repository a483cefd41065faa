"""The embedded channel layer: Channels' in-memory layer, with its expiry sweep bounded.

The stock layer sweeps every channel and group for expired messages on every
send and receive: O(channels) per message, which dominated the server's CPU at
100 streaming tabs. Messages expire after a minute, so sweeping once a second
changes nothing a user can see.
"""

from __future__ import annotations

import time

from channels.layers import InMemoryChannelLayer

# Expiry is measured in tens of seconds; a sweep per second is plenty.
SWEEP_INTERVAL = 1.0


class EmbeddedChannelLayer(InMemoryChannelLayer):
    _last_sweep = 0.0

    def _clean_expired(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < SWEEP_INTERVAL:
            return
        self._last_sweep = now
        super()._clean_expired()
