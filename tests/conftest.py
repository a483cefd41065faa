"""Shared fixtures."""

from __future__ import annotations

import pytest
from channels.layers import channel_layers, get_channel_layer


@pytest.fixture(autouse=True)
async def _clean_channel_layer():
    """Each test starts with a new, empty channel layer: no groups, no messages.

    A new instance, not only a flush: the Redis layer binds its receive state
    to the event loop it first ran on, and each test has its own loop.
    """
    channel_layers.backends.clear()
    await get_channel_layer().flush()
    yield
