"""A provider for a model id: the registry's options and credentials, given to the
adapter that speaks the provider's wire format.

Apart from the registry, which the adapters read (a model's options, the idle
timeout) and which therefore cannot build them. The adapters are imported when
first asked for, so that importing `chat.providers` loads no SDK.
"""

from __future__ import annotations

from chat.envcheck import API_RESPONSES
from chat.providers.base import Provider
from chat.providers.registry import (
    PROVIDERS,
    ProviderConfigError,
    api_style,
    credentials,
    idle_timeout,
    model_info,
)


def get_provider(model_id: str) -> Provider:
    """A provider streaming `model_id`.

    Raises ValueError for a malformed id or an unknown provider, and
    ProviderConfigError (a ProviderError and a ValueError) when the provider's
    key or required base URL is missing, naming the environment variable to set.
    Reads the database when the environment has no key: call `aget_provider`
    from async code.
    """
    info = model_info(model_id)
    spec = PROVIDERS[info.provider]
    idle = idle_timeout(spec.name)
    if spec.adapter == "offline":
        from chat.providers.offline import OfflineProvider

        return OfflineProvider(model=info, idle_timeout=idle)
    creds = credentials(spec.name)
    if creds.api_key is None:
        raise ProviderConfigError(
            f"No API key for {spec.label} ({model_id}): set {spec.key_env} in the "
            f"environment or add a {spec.name} key in Settings."
        )
    if creds.base_url is None and spec.needs_base_url:
        raise ProviderConfigError(
            f"No endpoint for {spec.label} ({model_id}): set {spec.url_env} in the "
            f"environment (for example {spec.url_hint}) or add a {spec.name} endpoint "
            f"in Settings."
        )
    if creds.base_url is not None and not creds.base_url.startswith(("http://", "https://")):
        raise ProviderConfigError(
            f"The {spec.label} endpoint {creds.base_url!r} is not an http:// or https:// URL: "
            f"fix {spec.url_env} or the {spec.name} endpoint in Settings."
        )
    if spec.adapter == "anthropic":
        from chat.providers.anthropic import AnthropicProvider

        return AnthropicProvider(
            info, api_key=creds.api_key, base_url=creds.base_url, idle_timeout=idle
        )
    if api_style(spec.name, creds.base_url, creds.api_style) == API_RESPONSES:
        from chat.providers.responses import ResponsesProvider

        return ResponsesProvider(
            info, api_key=creds.api_key, base_url=creds.base_url, idle_timeout=idle
        )
    from chat.providers.openai import OpenAIProvider

    return OpenAIProvider(info, api_key=creds.api_key, base_url=creds.base_url, idle_timeout=idle)


async def aget_provider(model_id: str) -> Provider:
    from asgiref.sync import sync_to_async

    return await sync_to_async(get_provider)(model_id)
