"""Model providers: one adapter per wire format behind one interface.

`get_provider("anthropic/claude-sonnet-4-5").stream(request)` is an async
generator of the events in `base`; closing it early closes the connection.
The registry (models, options, credentials) is in `registry`; importing this
package loads neither Django nor an SDK.
"""

from __future__ import annotations

from chat.providers.registry import (
    OFFLINE_MODEL,
    ModelInfo,
    ProviderConfigError,
    adefault_model,
    aget_provider,
    alist_models,
    default_model,
    get_provider,
    list_models,
    model_info,
)

__all__ = [
    "OFFLINE_MODEL",
    "ModelInfo",
    "ProviderConfigError",
    "adefault_model",
    "aget_provider",
    "alist_models",
    "default_model",
    "get_provider",
    "list_models",
    "model_info",
]
