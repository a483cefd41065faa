"""Model providers: one adapter per wire format behind one interface.

`get_provider("anthropic/claude-sonnet-4-5").stream(request)` is an async
generator of the events in `base`; closing it early closes the connection.
The registry (models, options, credentials) is in `registry`, the choice of
adapter in `factory`, the SDK clients the adapters share in `clients`
(`aclose_clients` closes them before a process stops); importing this package
loads neither Django nor an SDK.
"""

from __future__ import annotations

from chat.providers.clients import aclose_clients
from chat.providers.factory import aget_provider, get_provider
from chat.providers.registry import (
    OFFLINE_MODEL,
    ModelInfo,
    ProviderConfigError,
    adefault_model,
    alist_models,
    default_model,
    list_models,
    model_info,
)

__all__ = [
    "OFFLINE_MODEL",
    "ModelInfo",
    "ProviderConfigError",
    "aclose_clients",
    "adefault_model",
    "aget_provider",
    "alist_models",
    "default_model",
    "get_provider",
    "list_models",
    "model_info",
]
