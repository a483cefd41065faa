"""A key's test against its endpoint: one cheap call (the models list, which costs no
tokens) through the provider's official SDK, and what happened in words.

Settings runs it when a key is saved and from a key's Test button. It is not a turn: no
retries (a rejected key is rejected the first time, and a person is waiting), and a short
timeout for the whole call, so a wrong URL answers in seconds instead of after the SDK's
back-off. The endpoint is whatever the base URL says (a proxy's login page, a server
dripping bytes): its answer is read up to a size and a deadline, and anything that is not
a models list is said to be so.
"""

from __future__ import annotations

import concurrent.futures
import enum
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from chat.providers.registry import PROVIDERS

# A models list answers in well under a second; an endpoint silent for this long would
# stall every turn too, and a person is waiting on the page.
KEY_TEST_TIMEOUT = 8.0
# An error body's message is the provider's own words; past this it is a page of HTML.
MESSAGE_MAX_CHARS = 300
# A models list is kilobytes (OpenAI's: ~100 models, 10 KB); past this it is not one.
MODELS_MAX_BYTES = 2 * 1024 * 1024


class NotAModelsList(Exception):
    """The endpoint answered 200 with something else (HTML, other JSON, too much)."""


class _TooSlow(Exception):
    """The whole answer took longer than the test's timeout (a read at a time did not)."""


class Outcome(enum.StrEnum):
    OK = "ok"
    REJECTED = "rejected"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class KeyCheck:
    outcome: Outcome
    message: str

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK


def check_key(
    provider: str, key: str, base_url: str | None, *, timeout: float | None = None
) -> KeyCheck:
    """Ask `provider`'s endpoint (`base_url`, None: the SDK's default) for its models with
    `key`, waiting at most `timeout` seconds (KEY_TEST_TIMEOUT). ValueError for a provider
    that takes no key."""
    # Imported here, as chat.providers.factory imports the adapters: Settings' module is
    # loaded with the URLs by every process, and the SDKs cost a second of CPU to import.
    import anthropic
    import openai

    timeout = KEY_TEST_TIMEOUT if timeout is None else timeout
    spec = PROVIDERS[provider]
    if spec.needs_base_url and not base_url:
        return KeyCheck(
            Outcome.FAILED, f"{spec.label} needs a base URL before a key can be tested."
        )
    where = base_url or spec.default_url or "the SDK's default endpoint"
    try:
        count = _list_models(spec.adapter, key, base_url, timeout)
    except (anthropic.AuthenticationError, openai.AuthenticationError) as exc:
        return KeyCheck(Outcome.REJECTED, f"{where} rejected the key: {_said(exc)}")
    except (anthropic.PermissionDeniedError, openai.PermissionDeniedError) as exc:
        return KeyCheck(Outcome.REJECTED, f"{where} refused the key (no permission): {_said(exc)}")
    # Timeouts are connection errors in both SDKs: caught first.
    except (anthropic.APITimeoutError, openai.APITimeoutError):
        return KeyCheck(Outcome.TIMEOUT, f"{where} did not answer within {timeout:g} seconds.")
    except (anthropic.APIConnectionError, openai.APIConnectionError) as exc:
        cause = exc.__cause__ or exc
        return KeyCheck(
            Outcome.UNREACHABLE, f"{where} cannot be reached: {_short(str(cause)) or exc}."
        )
    except (anthropic.NotFoundError, openai.NotFoundError):
        return KeyCheck(
            Outcome.FAILED,
            f"{where} has no models list (HTTP 404): is the base URL right? An "
            "OpenAI-compatible one usually ends in /v1.",
        )
    except (anthropic.APIStatusError, openai.APIStatusError) as exc:
        return KeyCheck(Outcome.FAILED, f"{where} answered HTTP {exc.status_code}: {_said(exc)}")
    except (anthropic.APIError, openai.APIError) as exc:
        return KeyCheck(Outcome.FAILED, f"{where} answered something unexpected: {_said(exc)}")
    except _TooSlow:
        return KeyCheck(Outcome.TIMEOUT, f"{where} did not answer within {timeout:g} seconds.")
    except NotAModelsList as exc:
        return KeyCheck(
            Outcome.FAILED,
            f"{where} answered, but not with a models list ({exc}): is the base URL right?",
        )
    models = f"{count} model{'' if count == 1 else 's'} listed" if count else "it answered"
    return KeyCheck(Outcome.OK, f"The key works at {where} ({models}).")


def _list_models(adapter: str, key: str, base_url: str | None, timeout: float) -> int:
    """The number of models `adapter`'s endpoint lists, within `timeout` seconds in all:
    the SDK's timeout bounds each read, a slow drip of bytes is cut by the deadline."""
    import anthropic  # lazily: see check_key
    import openai

    client: Any
    if adapter == "anthropic":
        client = anthropic.Anthropic(api_key=key, base_url=base_url, timeout=timeout, max_retries=0)
    elif adapter == "openai":
        client = openai.OpenAI(api_key=key, base_url=base_url, timeout=timeout, max_retries=0)
    else:
        raise ValueError(f"the {adapter} provider takes no key to test")
    deadline = time.monotonic() + timeout
    answer: concurrent.futures.Future[int] = concurrent.futures.Future()

    def ask() -> None:
        try:
            answer.set_result(_count_models(client, deadline))
        except BaseException as exc:  # handed to the caller
            answer.set_exception(exc)

    # A thread of its own, left behind if the endpoint stalls mid-headers past the
    # deadline (its socket is closed, and its next read ends it).
    threading.Thread(target=ask, name="key-test", daemon=True).start()
    try:
        return answer.result(timeout=timeout + 0.5)
    except concurrent.futures.TimeoutError:
        raise _TooSlow from None
    finally:
        client.close()


def _count_models(client: Any, deadline: float) -> int:
    with client.models.with_streaming_response.list() as response:
        body = bytearray()
        for piece in response.iter_bytes():
            body += piece
            if len(body) > MODELS_MAX_BYTES:
                raise NotAModelsList(f"more than {MODELS_MAX_BYTES // (1024 * 1024)} MB")
            if time.monotonic() > deadline:
                raise _TooSlow
    try:
        listed = json.loads(body)
    except ValueError:
        raise NotAModelsList(_short(body[:80].decode("utf-8", "replace")) or "nothing") from None
    models = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(models, list):
        raise NotAModelsList("JSON without a list of models in `data`")
    return len(models)


def _said(exc: Any) -> str:
    """The provider's own message from an SDK's APIError's body, else the SDK's."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return _short(inner["message"])
    return _short(exc.message)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_MAX_CHARS else text[: MESSAGE_MAX_CHARS - 1] + "…"
