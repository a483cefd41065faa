"""What a turn does after a provider error: retry, switch to the fallback model, or give up.

A pure function of the error, the attempt and the settings; `rand` (0..1) makes
the jitter, so that tabs failing together do not all come back in the same
instant (the caller passes random.random(); tests pass fixed values).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chat.providers.base import ProviderError

# Retries of a retryable error before the fallback model or giving up. A
# provider that stalls on every attempt is given up after each attempt's idle
# timeout (registry.STREAM_IDLE_TIMEOUT, 60 s unless the endpoint overrides
# it), so it holds a turn for at most (len(RETRY_DELAYS) + 1) * 60 +
# sum(RETRY_DELAYS) = 4 * 60 + 20 = 260 s per model (+ jitter), twice that when
# a fallback model takes over and stalls too.
RETRY_DELAYS = (1.0, 4.0, 15.0)
# Each delay is stretched or shrunk by up to this share, at random.
JITTER = 0.2
# A server's retry-after beyond this is not worth holding a turn for.
MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True)
class Retry:
    delay: float


@dataclass(frozen=True)
class Fallback:
    model: str


@dataclass(frozen=True)
class GiveUp:
    pass


Decision = Retry | Fallback | GiveUp


def decide(
    error: ProviderError,
    attempt: int,
    *,
    model: str,
    fallback: str,
    switched: bool,
    rand: float,
    delays: Sequence[float] | None = None,
    jitter: float | None = None,
) -> Decision:
    """After `attempt` retries of `model` (0 for the first failure) failed with `error`.

    `switched`: the turn already moved to the fallback model once (it never
    switches back and forth). A server's retry-after is honoured up to
    MAX_RETRY_AFTER: never retried earlier than it asks.
    """
    delays = RETRY_DELAYS if delays is None else delays
    jitter = JITTER if jitter is None else jitter
    if not error.retryable:
        return GiveUp()
    if attempt < len(delays):
        delay = delays[attempt] * (1 + jitter * (2 * rand - 1))
        if error.retry_after is not None:
            delay = max(delay, error.retry_after)
        return Retry(round(min(delay, MAX_RETRY_AFTER), 3))
    if fallback and not switched and fallback != model:
        return Fallback(fallback)
    return GiveUp()
