"""A key's test (chat.providers.check): one models-list call through the official SDK
against a fake provider server speaking each wire format, and each outcome in words."""

from __future__ import annotations

import socket
import time

import pytest

from chat.providers.check import Outcome, check_key
from harness.fakeprovider import Reply

ADAPTERS = [
    # provider, the base URL's attribute on the fake server, the header carrying the key
    ("anthropic", "url", "authorization"),
    ("openai", "openai_url", "authorization"),
    ("deepseek", "openai_url", "authorization"),
]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("provider", "url_attr", "header"), ADAPTERS)
def test_a_working_key_is_ok_after_one_models_request(fake_server, provider, url_attr, header):
    base = getattr(fake_server, url_attr)
    result = check_key(provider, "sk-good-key-1234", base)
    assert result.outcome == Outcome.OK, result.message
    assert result.message == f"The key works at {base} (1 model listed)."
    [request] = fake_server.requests
    assert request.method == "GET"
    assert request.path.split("?")[0].endswith("/models")
    assert "sk-good-key-1234" in request.headers[header]


CASES = [
    # scripted reply, outcome, words the message must hold
    (
        Reply.error(401, "authentication_error", "invalid x-api-key"),
        Outcome.REJECTED,
        "rejected the key: invalid x-api-key",
    ),
    (
        Reply.error(403, "permission_error", "key disabled"),
        Outcome.REJECTED,
        "refused the key (no permission): key disabled",
    ),
    (
        Reply.error(404, "not_found_error", "no such path"),
        Outcome.FAILED,
        "has no models list (HTTP 404): is the base URL right?",
    ),
    (Reply.error(500, "api_error", "boom"), Outcome.FAILED, "answered HTTP 500: boom"),
    (
        Reply.error(529, "overloaded_error", "Overloaded"),
        Outcome.FAILED,
        "answered HTTP 529: Overloaded",
    ),
]


@pytest.mark.parametrize(("provider", "url_attr", "header"), ADAPTERS)
@pytest.mark.parametrize(("reply", "outcome", "words"), CASES)
def test_each_refusal_is_said_once_without_retries(
    fake_server, provider, url_attr, header, reply, outcome, words
):
    fake_server.add_models(reply)
    base = getattr(fake_server, url_attr)
    result = check_key(provider, "sk-some-key-1234", base)
    assert (result.outcome, result.ok) == (outcome, False)
    assert result.message.startswith(base), result.message
    assert words in result.message
    assert len(fake_server.requests) == 1  # no retry


@pytest.mark.parametrize(("provider", "url_attr", "header"), ADAPTERS)
def test_a_silent_endpoint_times_out_once(fake_server, provider, url_attr, header):
    fake_server.add_models(Reply(body={"data": []}, delay=5.0))
    base = getattr(fake_server, url_attr)
    result = check_key(provider, "sk-some-key-1234", base, timeout=0.2)
    assert result.outcome == Outcome.TIMEOUT
    assert result.message == f"{base} did not answer within 0.2 seconds."
    assert len(fake_server.requests) == 1


@pytest.mark.parametrize("provider", ["anthropic", "openai", "deepseek"])
def test_an_endpoint_nobody_listens_on_is_unreachable(provider):
    base = f"http://127.0.0.1:{_closed_port()}/v1"
    result = check_key(provider, "sk-some-key-1234", base)
    assert result.outcome == Outcome.UNREACHABLE
    assert result.message.startswith(f"{base} cannot be reached: ")
    assert "refused" in result.message.lower()


def test_a_provider_without_its_base_url_is_not_tried():
    result = check_key("deepseek", "sk-some-key-1234", None)
    assert result.outcome == Outcome.FAILED
    assert result.message == "DeepSeek needs a base URL before a key can be tested."


def test_the_offline_provider_takes_no_key():
    with pytest.raises(ValueError, match="takes no key"):
        check_key("offline", "sk-some-key-1234", None)


@pytest.mark.parametrize(("provider", "url_attr", "header"), ADAPTERS)
@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("<html><body>Sign in to the proxy</body></html>", "<html><body>Sign in"),
        ({"foo": 1}, "JSON without a list of models in `data`"),
        ({"data": None}, "JSON without a list of models in `data`"),
        ([], "JSON without a list of models in `data`"),
        ("{not json", "{not json"),
        ({"data": ["m" * 1024] * 3000}, "more than 2 MB"),
    ],
)
def test_a_200_that_is_no_models_list_says_so(fake_server, provider, url_attr, header, body, words):
    """A wrong base URL answering 200 (a proxy's page, other JSON, far too much) is a
    failed test that says what came back, not a crash."""
    fake_server.add_models(Reply(body=body))
    base = getattr(fake_server, url_attr)
    result = check_key(provider, "sk-some-key-1234", base)
    assert result.outcome == Outcome.FAILED, result.message
    assert result.message.startswith(f"{base} answered, but not with a models list (")
    assert words in result.message
    assert "is the base URL right?" in result.message


@pytest.mark.parametrize(("provider", "url_attr", "header"), ADAPTERS)
def test_an_answer_dripping_in_is_cut_at_the_timeout(fake_server, provider, url_attr, header):
    """Each read comes within the SDK's timeout, the whole answer does not: the deadline
    is the test's, not a read's."""
    fake_server.add_models(Reply(events=[{"id": f"m{i}"} for i in range(40)], delay=0.1))
    base = getattr(fake_server, url_attr)
    started = time.monotonic()
    result = check_key(provider, "sk-some-key-1234", base, timeout=0.5)
    assert result.outcome == Outcome.TIMEOUT, result.message
    assert result.message == f"{base} did not answer within 0.5 seconds."
    assert time.monotonic() - started < 3.0
