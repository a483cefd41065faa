"""A key's test against its endpoint: one cheap call (the models list, which costs no
tokens) through the provider's official SDK, and what happened in words.

Settings runs it when a key is saved and from a key's Test button. It is not a turn: no
retries (a rejected key is rejected the first time, and a person is waiting), and a short
timeout, so a wrong URL answers in seconds instead of after the SDK's back-off.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import anthropic
import openai

from chat.providers.registry import PROVIDERS

# A models list answers in well under a second; an endpoint silent for this long would
# stall every turn too, and a person is waiting on the page.
KEY_TEST_TIMEOUT = 8.0
# An error body's message is the provider's own words; past this it is a page of HTML.
MESSAGE_MAX_CHARS = 300


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
    models = f"{count} model{'' if count == 1 else 's'} listed" if count else "it answered"
    return KeyCheck(Outcome.OK, f"The key works at {where} ({models}).")


def _list_models(adapter: str, key: str, base_url: str | None, timeout: float) -> int:
    if adapter == "anthropic":
        with anthropic.Anthropic(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=0
        ) as client:
            return len(client.models.list().data)
    if adapter == "openai":
        with openai.OpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=0
        ) as client:
            return len(client.models.list().data)
    raise ValueError(f"the {adapter} provider takes no key to test")


def _said(exc: anthropic.APIError | openai.APIError) -> str:
    """The provider's own message from an error body, else the SDK's."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return _short(inner["message"])
    return _short(exc.message)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_MAX_CHARS else text[: MESSAGE_MAX_CHARS - 1] + "…"
