"""Which models exist, how each is configured, and where its credentials come from.

Model ids are `provider/model`: `anthropic/claude-sonnet-4-5`, `openai/gpt-4.1`,
`deepseek/deepseek-chat`, `offline/demo`. Known models carry their options here
(thinking mode, budget, beta headers, limits, reasoning send-back); a model a
known provider serves but this table does not list works with that provider's
defaults, so a new model needs no code change.

Credentials: the environment first (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`,
`OPENAI_API_KEY`, `OPENAI_BASE_URL`, `DEEPSEEK_API_KEY`, `DEEPSEEK_BASE_URL`),
else the database (`ApiKey`, `ProviderEndpoint`). No base URL is sent from here:
an unset one means the SDK's own default (`default_url` only names it).

A stored key is bound to the endpoint it was saved for (`ApiKey.endpoint`, see
`key_endpoint`): it is sent nowhere else, wherever the URL now in effect came from
(a Settings endpoint or the environment). A key from the environment is the
operator's, and goes wherever the URL in effect points.

This module imports neither Django nor the SDKs at import time, so importing
`chat.providers` (as the pure `chat.history` does) stays cheap and pure. The
functions that read the database are sync and also work from async code (the
reads hop to a thread); the `a*` twins do it without holding the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypedDict
from urllib.parse import urlsplit

from chat.envcheck import API_CHAT, API_RESPONSES, API_STYLE_VARIABLE, api_style_problem
from chat.providers.base import ProviderError

OFFLINE_MODEL = "offline/demo"

THINKING_MODES = ("none", "manual", "adaptive")
INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
# The API refuses a smaller thinking budget.
MIN_THINKING_BUDGET = 1024
# Limits for a model the table does not know. The output limit is sent as
# max_tokens, so it has to be one every current model accepts: too high is a 400.
DEFAULT_CONTEXT_WINDOW = 200_000
DEFAULT_MAX_OUTPUT = 32_000
# The longest silence between two events of a stream before the turn runner
# gives the attempt up as stalled (and retries it). Anthropic pings idle
# streams, and thinking or a long tool call streams fragments the whole time,
# so a minute of nothing at all is a stalled server, not a slow model. Set per
# provider with <PROVIDER>_STREAM_IDLE_TIMEOUT (a slow local model may need more).
STREAM_IDLE_TIMEOUT = 60.0
# The most an override may ask for: the SDKs' own default timeout, beyond
# which a silent stream has long been dead.
MAX_STREAM_IDLE_TIMEOUT = 600.0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """One model and its options, as the adapters and the UI picker see it.

    `thinking`: "none" sends no thinking parameter, "manual" a fixed
    `thinking_budget` (with the `betas` the model needs for interleaved
    thinking), "adaptive" lets the model decide. `send_reasoning` makes the
    OpenAI-compatible adapter send reasoning back as `reasoning_content` on
    assistant messages with tool calls (DeepSeek's thinking mode requires it).
    `available` is whether a key is configured (set by `list_models`). `images` and
    `pdf` say what files the model takes (ARCHITECTURE.md, Attachments); a file it does
    not take is sent as a line of text saying where it is in the workspace (a PDF: with its text).
    """

    id: str
    label: str = ""
    thinking: str = "none"
    thinking_budget: int = 0
    betas: tuple[str, ...] = ()
    context_window: int = DEFAULT_CONTEXT_WINDOW
    max_output: int = DEFAULT_MAX_OUTPUT
    send_reasoning: bool = False
    images: bool = False
    pdf: bool = False
    known: bool = True
    available: bool = True

    def __post_init__(self) -> None:
        provider, _, name = self.id.partition("/")
        if not provider or not name:
            raise ValueError(f"model id {self.id!r} is not of the form provider/model")
        if self.thinking not in THINKING_MODES:
            raise ValueError(f"{self.id}: thinking must be one of {THINKING_MODES}")
        if self.thinking == "manual":
            if self.thinking_budget < MIN_THINKING_BUDGET:
                raise ValueError(f"{self.id}: thinking budget must be >= {MIN_THINKING_BUDGET}")
            # Interleaved thinking lets the budget span a whole turn; without it
            # the API wants the budget below max_tokens.
            interleaved = INTERLEAVED_THINKING_BETA in self.betas
            if not interleaved and self.thinking_budget >= self.max_output:
                raise ValueError(f"{self.id}: thinking budget must be below max_output")

    @property
    def provider(self) -> str:
        return self.id.partition("/")[0]

    @property
    def name(self) -> str:
        """The model name the provider's API knows."""
        return self.id.partition("/")[2]


class ModelOptions(TypedDict, total=False):
    """ModelInfo options shared by several models, passed as keywords."""

    images: bool
    pdf: bool


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    name: str
    label: str
    adapter: str  # "anthropic" | "openai" | "offline"
    default_model: str
    key_env: str = ""
    url_env: str = ""
    # Providers riding another SDK (DeepSeek on the OpenAI one) have no SDK
    # default URL of their own, and no URL is hard-coded here.
    needs_base_url: bool = False
    url_hint: str = ""
    # Where the SDK sends requests when no base URL is set: what a stored key saved
    # without one is bound to.
    default_url: str = ""
    # ModelInfo options of a model of this provider that MODELS does not list.
    defaults: ModelOptions = field(default_factory=ModelOptions)
    # The variable choosing the API of an OpenAI-adapter provider (see `api_style`).
    style_env: str = ""


# What a Claude model takes: images (image blocks) and PDFs (document blocks).
CLAUDE_FILES: ModelOptions = {"images": True, "pdf": True}

PROVIDERS: dict[str, ProviderSpec] = {
    spec.name: spec
    for spec in (
        ProviderSpec(
            "anthropic",
            "Anthropic",
            "anthropic",
            "anthropic/claude-sonnet-4-5",
            key_env="ANTHROPIC_API_KEY",
            url_env="ANTHROPIC_BASE_URL",
            default_url="https://api.anthropic.com",
            # Every current Claude model reads images and PDFs.
            defaults=CLAUDE_FILES.copy(),
        ),
        ProviderSpec(
            "openai",
            "OpenAI-compatible",
            "openai",
            "openai/gpt-4.1",
            key_env="OPENAI_API_KEY",
            url_env="OPENAI_BASE_URL",
            default_url="https://api.openai.com/v1",
            # OpenAI's own models see images since GPT-4o; a text-only model on another
            # server behind this URL is listed in MODELS with images=False.
            defaults={"images": True},
            style_env=API_STYLE_VARIABLE,
        ),
        ProviderSpec(
            "deepseek",
            "DeepSeek",
            "openai",
            "deepseek/deepseek-chat",
            key_env="DEEPSEEK_API_KEY",
            url_env="DEEPSEEK_BASE_URL",
            needs_base_url=True,
            url_hint="https://api.deepseek.com",
        ),
        ProviderSpec("offline", "Offline", "offline", OFFLINE_MODEL),
    )
}

# Budget of manual thinking: enough for real planning, well below the output limit.
MANUAL_BUDGET = 8_000

MODELS: dict[str, ModelInfo] = {
    m.id: m
    for m in (
        # Manual thinking; interleaving between tool calls needs the beta header.
        ModelInfo(
            "anthropic/claude-sonnet-4-5",
            "Claude Sonnet 4.5",
            thinking="manual",
            thinking_budget=MANUAL_BUDGET,
            betas=(INTERLEAVED_THINKING_BETA,),
            max_output=64_000,
            **CLAUDE_FILES,
        ),
        ModelInfo(
            "anthropic/claude-opus-4-1",
            "Claude Opus 4.1",
            thinking="manual",
            thinking_budget=MANUAL_BUDGET,
            betas=(INTERLEAVED_THINKING_BETA,),
            max_output=32_000,
            **CLAUDE_FILES,
        ),
        ModelInfo(
            "anthropic/claude-haiku-4-5",
            "Claude Haiku 4.5",
            thinking="manual",
            thinking_budget=MANUAL_BUDGET,
            max_output=64_000,
            **CLAUDE_FILES,
        ),
        # Adaptive thinking: the model decides, and interleaves on its own.
        ModelInfo(
            "anthropic/claude-sonnet-4-6", "Claude Sonnet 4.6", thinking="adaptive", **CLAUDE_FILES
        ),
        ModelInfo(
            "anthropic/claude-opus-4-6", "Claude Opus 4.6", thinking="adaptive", **CLAUDE_FILES
        ),
        ModelInfo(
            "anthropic/claude-opus-4-7", "Claude Opus 4.7", thinking="adaptive", **CLAUDE_FILES
        ),
        ModelInfo(
            "anthropic/claude-sonnet-5", "Claude Sonnet 5", thinking="adaptive", **CLAUDE_FILES
        ),
        ModelInfo("anthropic/claude-opus-5", "Claude Opus 5", thinking="adaptive", **CLAUDE_FILES),
        ModelInfo(
            "openai/gpt-4.1",
            "GPT-4.1",
            context_window=1_047_576,
            max_output=32_768,
            images=True,
        ),
        ModelInfo(
            "openai/gpt-4.1-mini",
            "GPT-4.1 mini",
            context_window=1_047_576,
            max_output=32_768,
            images=True,
        ),
        # OpenAI's reasoning models: "adaptive", they reason as they see fit. Through
        # the Responses API (providers.responses) their reasoning goes back each step.
        ModelInfo(
            "openai/gpt-5",
            "GPT-5",
            thinking="adaptive",
            context_window=400_000,
            max_output=128_000,
            images=True,
        ),
        ModelInfo(
            "openai/gpt-5-mini",
            "GPT-5 mini",
            thinking="adaptive",
            context_window=400_000,
            max_output=128_000,
            images=True,
        ),
        ModelInfo(
            "openai/o4-mini",
            "o4-mini",
            thinking="adaptive",
            context_window=200_000,
            max_output=100_000,
            images=True,
        ),
        ModelInfo(
            "deepseek/deepseek-chat", "DeepSeek Chat", context_window=128_000, max_output=8_000
        ),
        # Thinking mode: its reasoning must go back with the tool calls it led to.
        ModelInfo(
            "deepseek/deepseek-reasoner",
            "DeepSeek Reasoner",
            context_window=128_000,
            max_output=64_000,
            send_reasoning=True,
        ),
        ModelInfo(OFFLINE_MODEL, "Offline demo (no network)", max_output=1_000),
    )
}


def model_info(model_id: str) -> ModelInfo:
    """The options of `model_id`; a provider's defaults for a model it does not list.

    Raises ValueError for a malformed id or an unknown provider.
    """
    if not isinstance(model_id, str) or model_id.count("/") < 1:
        raise ValueError(
            f"model id {model_id!r} is not of the form provider/model "
            f"(for example {PROVIDERS['anthropic'].default_model} or {OFFLINE_MODEL})"
        )
    model_id = model_id.strip()
    provider, _, name = model_id.partition("/")
    if provider not in PROVIDERS:
        known = ", ".join(sorted(PROVIDERS))
        raise ValueError(f"unknown model provider {provider!r} in {model_id!r} (known: {known})")
    if not name:
        raise ValueError(f"model id {model_id!r} names no model after the provider")
    if model_id in MODELS:
        return MODELS[model_id]
    if provider == "offline":
        raise ValueError(f"the offline provider has one model, {OFFLINE_MODEL}, not {model_id!r}")
    return ModelInfo(model_id, name, known=False, **PROVIDERS[provider].defaults)


# --- Credentials -----------------------------------------------------------------


class ProviderConfigError(ProviderError, ValueError):
    """A provider that cannot be used as configured (no key, no endpoint).

    Both a ProviderError (not retryable) and a ValueError, so callers that
    catch either see it.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, error_type="configuration_error", retryable=False)


# The error_type of KeyBoundElsewhere, for the error chunk's words.
KEY_BOUND_ELSEWHERE = "key_bound_elsewhere"


class KeyBoundElsewhere(ProviderConfigError):
    """A stored key that a request would send to another endpoint than the one it
    was saved for. Not retryable: only entering the key again helps."""

    def __init__(self, spec: ProviderSpec, saved_for: str, now: str) -> None:
        super().__init__(
            f"The stored {spec.label} key was saved for {saved_for or 'no endpoint'} and must "
            f"be entered again for {now or 'no endpoint'}: a stored key is sent only to the "
            f"endpoint it was saved for. Enter it again in Settings → API keys (or set "
            f"{spec.key_env})."
        )
        self.error_type = KEY_BOUND_ELSEWHERE


@dataclass(frozen=True, slots=True)
class Credentials:
    api_key: str | None
    base_url: str | None
    # The API the Settings endpoint in effect asks for ("": choose by the URL).
    api_style: str = ""


# The port each scheme implies: written out or not, it is the same endpoint.
DEFAULT_PORTS = {"http": 80, "https": 443}


def key_endpoint(url: str | None) -> str:
    """`url` as a stored key's binding ("" for none): scheme and host in lower case, the
    scheme's default port, a user:password@, a fragment and a trailing slash dropped;
    the path and the query kept.

    The path counts: one host can serve many accounts by path (gateways such as
    Cloudflare's put the account in it), so a path is as much a destination as a host.
    Any other difference in spelling only costs entering the key again.
    """
    if not url:
        return ""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        # Not a port number: keep it as written, so it matches only itself.
        host = parts.netloc.rpartition("@")[2].lower()
        port = None
    if port is not None and port != DEFAULT_PORTS.get(scheme):
        host = f"{host}:{port}"
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{host}{parts.path.rstrip('/')}{query}"


def credentials(provider: str, stored: StoredReader | None = None) -> Credentials:
    """The key and base URL of `provider`: the environment wins over the database
    (`stored`: what Settings stored, read by `_stored` unless given).

    Raises KeyBoundElsewhere when the key is a stored one and the URL in effect is not
    the endpoint it was saved for.
    """
    spec = PROVIDERS[provider]
    if spec.adapter == "offline":
        return Credentials(None, None)
    key = from_env(spec.key_env)
    url = from_env(spec.url_env)
    style = ""
    if key is None or url is None:
        read = stored or _stored
        found = read(provider, want_key=key is None, want_url=url is None)
        if url is None and found.url is not None:
            url, style = found.url, found.api_style
        if key is None and found.key is not None:
            now = key_endpoint(url or spec.default_url)
            if found.endpoint != now:
                raise KeyBoundElsewhere(spec, found.endpoint, now)
            key = found.key
    return Credentials(key, url, style)


# The hosts that serve OpenAI's own API (the SDK's default base URL is the first).
OPENAI_HOSTS = frozenset({"api.openai.com", "us.api.openai.com", "eu.api.openai.com"})


def api_style(provider: str, base_url: str | None, stored: str = "") -> str:
    """The API an OpenAI-adapter provider speaks at `base_url` (None: the SDK's
    default): the provider's variable (OPENAI_API_STYLE) wins, then the Settings
    endpoint's choice (`stored`), else Responses at OpenAI's own endpoint and Chat
    Completions anywhere else (a compatible server may not have /responses at all).

    Raises ProviderConfigError naming the variable when its value is not a style.
    """
    spec = PROVIDERS[provider]
    raw = from_env(spec.style_env)
    if raw is not None:
        if problem := api_style_problem(raw):
            raise ProviderConfigError(problem)
        return raw.lower()
    if stored in (API_RESPONSES, API_CHAT):
        return stored
    if spec.name != "openai":
        return API_CHAT
    host = urlsplit(base_url).hostname if base_url else "api.openai.com"
    return API_RESPONSES if host in OPENAI_HOSTS else API_CHAT


def endpoint_now(provider: str) -> str:
    """Where a request of `provider` goes now, as `key_endpoint` writes it: the
    environment's URL, else the Settings endpoint, else the SDK's default ("" for none).
    A key saved now is bound to it. A provider this version does not know has none."""
    spec = PROVIDERS.get(provider)
    if spec is None:
        return ""
    return key_endpoint(base_url_now(provider) or spec.default_url)


def base_url_now(provider: str) -> str | None:
    """The base URL a request of `provider` goes to now: the environment's, else the
    Settings endpoint's; None for the SDK's default."""
    url = from_env(PROVIDERS[provider].url_env)
    if url is None:
        url = _stored(provider, want_key=False, want_url=True).url
    return url


def from_env(name: str) -> str | None:
    """A credential variable as `credentials` reads it (blank is unset): an error's
    hint names the variable only when the key or URL really came from it."""
    return (os.environ.get(name, "").strip() or None) if name else None


@dataclass(frozen=True, slots=True)
class _Stored:
    key: str | None
    # The endpoint the key was saved for.
    endpoint: str
    url: str | None
    # The stored endpoint's API style ("" for automatic).
    api_style: str = ""


class StoredReader(Protocol):
    """What Settings stored for a provider: its key and the endpoint it was saved for,
    its base URL and API style (each only when asked for)."""

    def __call__(self, provider: str, *, want_key: bool, want_url: bool) -> _Stored: ...


def _stored(provider: str, *, want_key: bool, want_url: bool) -> _Stored:
    return _on_db_thread(_read_stored, provider, want_key, want_url)


def _on_db_thread[T](read: Callable[..., T], *args: Any) -> T:
    """`read(*args)`, which uses the ORM, from sync or async code."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return read(*args)
    # Called from async code (the turn engine asks for a provider inside its
    # loop). Django forbids the ORM on a loop's thread, so the small reads
    # run on a thread of their own while the loop waits: milliseconds, once a
    # step. `aget_provider` avoids even that.
    future = _db_thread().submit(_read_and_close, read, *args)
    return future.result(timeout=DB_READ_TIMEOUT)


# How long a credentials read from async code may hold the event loop: far
# more than two indexed single-row reads take, far less than a hang.
DB_READ_TIMEOUT = 10.0


@functools.cache
def _db_thread() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="provider-credentials")


def _read_and_close[T](read: Callable[..., T], *args: Any) -> T:
    from django.db import connections

    try:
        return read(*args)
    finally:
        # This thread serves no requests, so nothing else closes its connections.
        connections.close_all()


def _read_stored(provider: str, want_key: bool, want_url: bool) -> _Stored:
    from chat.models import ApiKey, ProviderEndpoint

    row = ApiKey.objects.filter(provider=provider).first() if want_key else None
    where = None
    if want_url:
        where = (
            ProviderEndpoint.objects.filter(provider=provider)
            .values_list("base_url", "api_style")
            .first()
        )
    return _found(provider, row, where)


def _read_every_stored() -> StoredReader:
    """What Settings stored for every provider, in two statements (a page asks whether
    each provider has a key), as a `StoredReader` for `credentials`."""
    from chat.models import ApiKey, ProviderEndpoint

    keys = {row.provider: row for row in ApiKey.objects.all()}
    # Each provider's first, as _read_stored takes it.
    urls: dict[str, tuple[str, str]] = {}
    for provider, base_url, style in ProviderEndpoint.objects.order_by("pk").values_list(
        "provider", "base_url", "api_style"
    ):
        urls.setdefault(provider, (base_url, style))

    def stored(provider: str, *, want_key: bool, want_url: bool) -> _Stored:
        row = keys.get(provider) if want_key else None
        return _found(provider, row, urls.get(provider) if want_url else None)

    return stored


def _found(provider: str, row: Any, where: tuple[str, str] | None) -> _Stored:
    """A provider's stored key row (an ApiKey) and endpoint (base URL, API style), either
    None, as `credentials` takes them."""
    key = url = None
    endpoint = style = ""
    if row is not None:
        key, endpoint = row.get_key(), row.endpoint
        if key is None:
            raise ProviderConfigError(
                f"The stored {provider} API key cannot be decrypted (SECRET_KEY changed "
                f"since it was saved): enter it again in Settings, or set "
                f"{PROVIDERS[provider].key_env}."
            )
    if where is not None:
        url, style = where[0] or None, where[1]
    return _Stored(key, endpoint, url, style)


def idle_env(provider: str) -> str:
    """The environment variable overriding STREAM_IDLE_TIMEOUT for `provider`."""
    return f"{provider.upper()}_STREAM_IDLE_TIMEOUT"


def idle_timeout(provider: str) -> float:
    """Seconds of silence allowed in a stream of `provider`.

    Raises ProviderConfigError naming the variable when its value is not a
    number of seconds in (0, MAX_STREAM_IDLE_TIMEOUT].
    """
    name = idle_env(provider)
    raw = os.environ.get(name, "").strip()
    if not raw:
        return STREAM_IDLE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_STREAM_IDLE_TIMEOUT:
        raise ProviderConfigError(
            f"{name}={raw!r} is not a number of seconds between 0 and "
            f"{MAX_STREAM_IDLE_TIMEOUT:g}: fix it or unset it (default {STREAM_IDLE_TIMEOUT:g})."
        )
    return value


def has_key(provider: str, stored: StoredReader | None = None) -> bool:
    """Whether `provider` could be used now (offline always can)."""
    spec = PROVIDERS[provider]
    if spec.adapter == "offline":
        return True
    try:
        creds = credentials(provider, stored)
    except ProviderConfigError:
        return False
    return creds.api_key is not None and (creds.base_url is not None or not spec.needs_base_url)


# --- Public entry points --------------------------------------------------------


def default_model() -> str:
    """settings.DISPATCH_MODEL, else the default model of the first provider with a
    key (Anthropic, OpenAI, DeepSeek), else the offline demo."""
    from django.conf import settings

    configured = (getattr(settings, "DISPATCH_MODEL", "") or "").strip()
    if configured:
        return configured
    for spec in PROVIDERS.values():
        if spec.adapter != "offline" and has_key(spec.name):
            return spec.default_model
    return OFFLINE_MODEL


def list_models() -> list[ModelInfo]:
    """Every known model (plus DISPATCH_MODEL when the table lacks it), each
    marked available or not by whether its provider has a key."""
    from django.conf import settings

    stored = _on_db_thread(_read_every_stored)
    available = {name: has_key(name, stored) for name in PROVIDERS}
    models = list(MODELS.values())
    configured = (getattr(settings, "DISPATCH_MODEL", "") or "").strip()
    if configured and configured not in MODELS:
        # A bad DISPATCH_MODEL is reported when a turn uses it, not here.
        with contextlib.suppress(ValueError):
            models.append(model_info(configured))
    return [replace(m, available=available[m.provider]) for m in models]


# External agents (chat.acp): model ids `acp/<name>`, run by chat.turn.acp, not a provider.
AGENT_PROVIDER = "acp"


def agent_models(names: Iterable[str]) -> list[ModelInfo]:
    """The picker's entries for the configured external agents (chat.acp.config.agents,
    read by the picker's caller: this layer is below chat.acp). Always available: an agent
    is given its provider's key when it starts, or brings its own."""
    return [ModelInfo(f"{AGENT_PROVIDER}/{name}", f"{name} (agent)") for name in sorted(names)]


async def adefault_model() -> str:
    from asgiref.sync import sync_to_async

    return await sync_to_async(default_model)()


async def alist_models() -> list[ModelInfo]:
    from asgiref.sync import sync_to_async

    return await sync_to_async(list_models)()
