"""Shared fixtures."""

from __future__ import annotations

import pytest
from channels.layers import get_channel_layer


@pytest.fixture(autouse=True)
async def _clean_channel_layer():
    """Each test starts with an empty in-memory channel layer: no groups, no messages."""
    await get_channel_layer().flush()
    yield
