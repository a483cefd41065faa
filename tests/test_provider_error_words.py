"""providers.errors.explain: each provider error in words (the card's summary) and what to
do about it (its hint), naming the key's real source, the base URL tried and the wait;
and errors.located: the endpoint recorded, no secret left in the message."""

from __future__ import annotations

import socket

import httpx2
import pytest

from chat.providers import errors
from chat.providers.base import ProviderError
from chat.providers.registry import PROVIDERS, ProviderConfigError

ANTHROPIC = "anthropic/claude-sonnet-4-5"
OPENAI = "openai/gpt-4.1"
LOCAL = "http://127.0.0.1:8099/v1"
ANTHROPIC_DEFAULT = "https://api.anthropic.com"


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    """Each case sets the variables it is about; the machine's own are not seen."""
    for spec in PROVIDERS.values():
        for name in (spec.key_env, spec.url_env, f"{spec.name.upper()}_STREAM_IDLE_TIMEOUT"):
            if name:
                monkeypatch.delenv(name, raising=False)


def error(
    message: str = "the server's words",
    *,
    status: int | None = None,
    kind: str | None = None,
    retry_after: float | None = None,
    transport: str | None = None,
    base_url: str | None = ANTHROPIC_DEFAULT,
    default_url: bool = True,
) -> ProviderError:
    made = ProviderError(
        message,
        status_code=status,
        error_type=kind,
        retry_after=retry_after,
        transport=transport,
        retryable=True,
    )
    made.base_url = base_url
    made.default_url = default_url
    return made


KEY_ENV = {"ANTHROPIC_API_KEY": "sk-ant-env"}
OPENAI_ENV = {"OPENAI_API_KEY": "sk-env", "OPENAI_BASE_URL": LOCAL}
AT_LOCAL = {"base_url": LOCAL, "default_url": False}

# name: (error, model, environment, summary, hint contains, hint must not contain)
CASES = {
    "401, key from the environment": (
        error(status=401, kind="authentication_error"),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic did not accept the API key",
        ["`ANTHROPIC_API_KEY`", "server's environment", "restart the server", "Retry"],
        ["Settings"],
    ),
    "401, key saved in Settings": (
        error(status=401, kind="authentication_error"),
        ANTHROPIC,
        {},
        "Anthropic did not accept the API key",
        ["Anthropic key saved in Settings → API keys", "save a valid one there", "Retry"],
        ["ANTHROPIC_API_KEY", "restart"],
    ),
    "401 of an OpenAI-compatible server, key from the environment": (
        error(status=401, kind="invalid_request_error", **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "The OpenAI-compatible server did not accept the API key",
        ["`OPENAI_API_KEY`"],
        ["ANTHROPIC", "Settings"],
    ),
    "401 of DeepSeek names its own variable": (
        error(status=401, **AT_LOCAL),
        "deepseek/deepseek-chat",
        {"DEEPSEEK_API_KEY": "sk-ds"},
        "DeepSeek did not accept the API key",
        ["`DEEPSEEK_API_KEY`"],
        ["OPENAI_API_KEY"],
    ),
    "403": (
        error(status=403, kind="permission_error"),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic refused this key access",
        ["The key in `ANTHROPIC_API_KEY` is not allowed to use claude-sonnet-4-5"],
        ["Settings"],
    ),
    "403, stored key": (
        error(status=403, kind="permission_error"),
        ANTHROPIC,
        {},
        "Anthropic refused this key access",
        ["The Anthropic key saved in Settings → API keys is not allowed"],
        ["ANTHROPIC_API_KEY"],
    ),
    "404 of an unknown model (Anthropic)": (
        error("model: claude-nope", status=404, kind="not_found_error"),
        "anthropic/claude-nope",
        KEY_ENV,
        "Anthropic does not know the model “claude-nope”",
        ["Pick another model", "“claude-nope” was sent to `https://api.anthropic.com`"],
        [],
    ),
    "404 of an unknown model (OpenAI's words)": (
        error(
            "The model `gpt-9` does not exist or you do not have access to it.",
            status=404,
            kind="invalid_request_error",
            **AT_LOCAL,
        ),
        "openai/gpt-9",
        OPENAI_ENV,
        "The OpenAI-compatible server does not know the model “gpt-9”",
        ["“gpt-9” was sent to `http://127.0.0.1:8099/v1`"],
        [],
    ),
    "404 of a wrong base URL": (
        error("Not Found", status=404, base_url="http://127.0.0.1:8099", default_url=False),
        OPENAI,
        {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://127.0.0.1:8099"},
        "127.0.0.1:8099 has nothing at this address",
        ["`http://127.0.0.1:8099`", "set by `OPENAI_BASE_URL`", "end in /v1"],
        [],
    ),
    "404 of a base URL from Settings": (
        error("Not Found", status=404, **AT_LOCAL),
        OPENAI,
        {"OPENAI_API_KEY": "k"},
        "127.0.0.1:8099 has nothing at this address",
        ["the OpenAI-compatible endpoint in Settings → Provider endpoints"],
        ["OPENAI_BASE_URL"],
    ),
    "429 with retry-after": (
        error(status=429, kind="rate_limit_error", retry_after=7.0),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic is rate-limiting this key",
        ["Retry in 7 s: the server asked to wait that long.", "`ANTHROPIC_API_KEY`"],
        ["a minute"],
    ),
    "429 with a fractional retry-after rounds up": (
        error(status=429, retry_after=0.2),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic is rate-limiting this key",
        ["Retry in 1 s"],
        [],
    ),
    "429 without retry-after": (
        error(status=429, kind="rate_limit_error"),
        ANTHROPIC,
        {},
        "Anthropic is rate-limiting this key",
        ["Wait a minute, then Retry.", "Anthropic key saved in Settings"],
        ["ANTHROPIC_API_KEY"],
    ),
    "429 insufficient_quota": (
        error(status=429, kind="insufficient_quota", **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "The account of this API key has no quota or credit left",
        ["Add credit", "`OPENAI_API_KEY`"],
        ["Wait a minute"],
    ),
    "500": (
        error(status=500, kind="api_error"),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic had an internal error",
        ["Usually temporary", "status page"],
        [],
    ),
    "502": (
        error("Bad Gateway", status=502, **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "A gateway got no valid answer from 127.0.0.1:8099",
        ["The server behind `http://127.0.0.1:8099/v1` may be down or restarting"],
        [],
    ),
    "503 with retry-after": (
        error(status=503, retry_after=30),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic is unavailable for now",
        ["Retry in 30 s"],
        [],
    ),
    "529 overloaded with retry-after": (
        error(status=529, kind="overloaded_error", retry_after=30),
        ANTHROPIC,
        KEY_ENV,
        "The model is overloaded",
        ["Retry in 30 s: the server asked to wait that long."],
        [],
    ),
    "overloaded inside a stream (no status)": (
        error(kind="overloaded_error"),
        ANTHROPIC,
        KEY_ENV,
        "The model is overloaded",
        ["Retry in a minute, or pick another model."],
        [],
    ),
    "connection refused, URL from the environment": (
        error(transport=errors.REFUSED, **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "Could not connect to 127.0.0.1:8099",
        ["Nothing answers at `http://127.0.0.1:8099/v1`", "is the server running?"],
        [],
    ),
    "connection refused, URL from Settings": (
        error(transport=errors.REFUSED, **AT_LOCAL),
        OPENAI,
        {"OPENAI_API_KEY": "k"},
        "Could not connect to 127.0.0.1:8099",
        ["the OpenAI-compatible endpoint in Settings → Provider endpoints"],
        ["OPENAI_BASE_URL"],
    ),
    "connection refused at the SDK's default": (
        error(transport=errors.REFUSED),
        ANTHROPIC,
        KEY_ENV,
        "Could not connect to api.anthropic.com",
        ["the SDK's default"],
        ["ANTHROPIC_BASE_URL", "Settings"],
    ),
    "host name that does not resolve": (
        error(transport=errors.DNS, base_url="http://nowhere.invalid/v1", default_url=False),
        OPENAI,
        {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "http://nowhere.invalid/v1"},
        "Could not find the host nowhere.invalid",
        ["Check the host name in `http://nowhere.invalid/v1`", "`OPENAI_BASE_URL`", "DNS"],
        [],
    ),
    "TLS handshake": (
        error(transport=errors.TLS, **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "The secure connection to 127.0.0.1:8099 failed",
        ["plain http server"],
        [],
    ),
    "connect timeout": (
        error(transport=errors.CONNECT_TIMEOUT, **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "Connecting to 127.0.0.1:8099 timed out",
        ["reachable from this server", "`OPENAI_BASE_URL`"],
        [],
    ),
    "read timeout": (
        error(transport=errors.READ_TIMEOUT, **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "127.0.0.1:8099 stopped answering",
        ["Retry."],
        [],
    ),
    "connection cut mid-answer": (
        error(transport=errors.CUT),
        ANTHROPIC,
        KEY_ENV,
        "The connection to api.anthropic.com broke during the answer",
        ["Retry."],
        [],
    ),
    "stream ended early": (
        error(transport=errors.INCOMPLETE),
        ANTHROPIC,
        KEY_ENV,
        "The answer from api.anthropic.com ended early",
        ["Retry."],
        [],
    ),
    "a connection error of no known transport": (
        error(kind="connection_error"),
        ANTHROPIC,
        KEY_ENV,
        "The connection to api.anthropic.com failed",
        ["Retry."],
        [],
    ),
    "a timeout of no known transport": (
        error(kind="timeout", base_url=None),
        ANTHROPIC,
        KEY_ENV,
        "The server stopped answering",
        ["Retry."],
        [],
    ),
    "stalled (the runner's idle watchdog)": (
        error(kind=errors.STREAM_IDLE, base_url=None),
        OPENAI,
        {"OPENAI_STREAM_IDLE_TIMEOUT": "90"},
        "The model stopped sending",
        ["`OPENAI_STREAM_IDLE_TIMEOUT` (now 90 s, at most 600)"],
        [],
    ),
    "a 200 that could not be read": (
        error(kind="invalid_response", **AT_LOCAL),
        OPENAI,
        OPENAI_ENV,
        "The OpenAI-compatible server sent a response that could not be read",
        ["speaks the OpenAI-compatible API"],
        [],
    ),
    "a shape the adapter does not know": (
        error(kind="unexpected_response"),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic sent a response this version of Dispatch cannot read",
        ["pick another model"],
        [],
    ),
    "400": (
        error(status=400, kind="invalid_request_error"),
        ANTHROPIC,
        KEY_ENV,
        "Anthropic refused the request",
        ["Its reason is above"],
        [],
    ),
    "413": (
        error(status=413, kind="request_too_large"),
        ANTHROPIC,
        KEY_ENV,
        "The request is too large for the model",
        ["new tab"],
        [],
    ),
    "a provider the registry does not list": (
        error(status=401, base_url=None),
        "scripted/test",
        {},
        "The scripted provider did not accept the API key",
        ["Check the provider's API key"],
        ["_API_KEY"],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_error_has_words_and_a_way_out(monkeypatch, case):
    failure, model, env, summary, says, never = CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    explained = errors.explain(failure, model=model)
    assert explained.summary == summary
    assert explained.hint, "every error says what to do"
    for part in says:
        assert part in explained.hint
    for part in never:
        assert part not in explained.hint


def test_a_configuration_error_keeps_its_own_instructions():
    """A missing key's message already names the variable: no second hint."""
    missing = ProviderConfigError("No API key for Anthropic: set ANTHROPIC_API_KEY ...")
    explained = errors.explain(missing, model=ANTHROPIC)
    assert explained.summary == "Anthropic is not set up for this model"
    assert explained.data() == {"summary": explained.summary, "fix": "connections"}


def test_retries_are_counted_in_the_summary_and_the_data(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    failure = error(status=529, kind="overloaded_error", retry_after=30)
    explained = errors.explain(failure, model=ANTHROPIC, attempts=4)
    assert explained.summary == "The model is overloaded (after 4 attempts)"
    assert explained.data() == {
        "summary": "The model is overloaded (after 4 attempts)",
        "hint": "Retry in 30 s: the server asked to wait that long.",
        "base_url": ANTHROPIC_DEFAULT,
        "retry_after": 30,
        "attempts": 4,
    }
    once = errors.explain(failure, model=ANTHROPIC, attempts=1)
    assert "attempts" not in once.data() and "after" not in once.summary


# --- located: the endpoint, and no secrets ---------------------------------------------


def test_located_records_the_configured_url_with_its_password_masked():
    failure = errors.located(
        ProviderError("boom"),
        configured="https://user:hunter22@gw.example/v1?api-key=s3cr3t",
        effective="https://user:hunter22@gw.example/v1/",
        secrets=("sk-live-123",),
    )
    assert failure.base_url == "https://***@gw.example/v1?…"
    assert failure.default_url is False


def test_a_token_as_the_urls_user_or_in_its_query_is_never_shown():
    """Gateways take their token as https://TOKEN@host/ or ?api-key=…; a server's error
    may quote the URL it was sent. Neither reaches the card, the chunk or an export."""
    failure = errors.located(
        ProviderError("Cannot POST /v1/messages?api-key=q-secret-9 for tok-abcdef123"),
        configured="https://tok-abcdef123@gw.example/v1?api-key=q-secret-9",
        effective="https://gw.example/v1/",
    )
    assert failure.base_url == "https://***@gw.example/v1?…"
    assert "tok-abcdef123" not in failure.message and "q-secret-9" not in failure.message
    # With no URL at all, the key is still taken out of the message.
    bare = errors.located(
        ProviderError("bad key sk-live-123456"),
        configured=None,
        effective="",
        secrets=["sk-live-123456"],
    )
    assert "sk-live-123456" not in bare.message


def test_located_records_the_sdk_default_when_nothing_is_configured():
    failure = errors.located(ProviderError("boom"), configured=None, effective=ANTHROPIC_DEFAULT)
    assert (failure.base_url, failure.default_url) == (ANTHROPIC_DEFAULT, True)


def test_located_removes_the_key_and_the_url_password_from_the_message():
    """A server may quote the key it refused; the page and the log never show it."""
    failure = errors.located(
        ProviderError("Incorrect API key provided: sk-live-123; proxy said hunter22"),
        configured="https://user:hunter22@gw.example/v1",
        effective="https://user:hunter22@gw.example/v1/",
        secrets=("sk-live-123",),
    )
    assert failure.message == "Incorrect API key provided: ***; proxy said ***"
    assert str(failure) == failure.message


def test_located_leaves_a_message_alone_for_a_key_too_short_to_search():
    failure = errors.located(
        ProviderError("a bad key"), configured=None, effective=ANTHROPIC_DEFAULT, secrets=("k",)
    )
    assert failure.message == "a bad key"


def test_located_keeps_the_first_endpoint():
    failure = errors.located(ProviderError("x"), configured=LOCAL, effective=LOCAL)
    again = errors.located(failure, configured="http://other", effective="http://other")
    assert again.base_url == LOCAL


# --- transport: which failure, naming the host -------------------------------------------


def failed_connect(cause: BaseException) -> BaseException:
    """httpx's ConnectError raised from `cause`, as the HTTP client raises it."""
    request = httpx2.Request("POST", "http://user:pw@nowhere.invalid:8443/v1/chat/completions")
    try:
        try:
            raise cause
        except BaseException as inner:
            raise httpx2.ConnectError(str(inner), request=request) from inner
    except httpx2.ConnectError as outer:
        return outer


@pytest.mark.parametrize(
    ("cause", "transport", "message"),
    [
        (
            ConnectionRefusedError(111, "Connect call failed"),
            errors.REFUSED,
            "P: could not connect to nowhere.invalid:8443: connection refused",
        ),
        (
            socket.gaierror(-2, "Name or service not known"),
            errors.DNS,
            "P: could not connect to nowhere.invalid:8443: its host name does not resolve "
            "(ConnectError: [Errno -2] Name or service not known)",
        ),
        (
            OSError("No route to host"),
            errors.CONNECT_FAILED,
            "P: could not connect to nowhere.invalid:8443 (ConnectError: No route to host)",
        ),
    ],
    ids=["refused", "dns", "other"],
)
def test_transport_names_the_failure_and_the_host_but_no_password(cause, transport, message):
    failure = errors.transport("P", failed_connect(cause))
    assert (failure.transport, failure.error_type, failure.retryable) == (
        transport,
        "connection_error",
        True,
    )
    assert failure.message == message
    assert "pw" not in failure.message
