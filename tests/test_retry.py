"""The retry policy: a pure function of the error, the attempt and the settings."""

from __future__ import annotations

import pytest

from chat.providers.base import ProviderError
from chat.retry import MAX_RETRY_AFTER, Fallback, GiveUp, Retry, decide

DELAYS = (1.0, 4.0, 15.0)


def error(*, retryable=True, retry_after=None):
    return ProviderError("boom", status_code=529, retryable=retryable, retry_after=retry_after)


@pytest.mark.parametrize(
    ("err", "attempt", "fallback", "switched", "rand", "expected"),
    [
        # Not retryable (a 400, a bad key): give up at once, fallback or not.
        (error(retryable=False), 0, "openai/b", False, 0.5, GiveUp()),
        # Retries with the delays in order; rand 0.5 is no jitter.
        (error(), 0, "", False, 0.5, Retry(1.0)),
        (error(), 1, "", False, 0.5, Retry(4.0)),
        (error(), 2, "", False, 0.5, Retry(15.0)),
        # Jitter: up to 20% either way.
        (error(), 1, "", False, 0.0, Retry(3.2)),
        (error(), 1, "", False, 1.0, Retry(4.8)),
        # Retries used up: the fallback model, once, and never the same model.
        (error(), 3, "openai/b", False, 0.5, Fallback("openai/b")),
        (error(), 3, "openai/b", True, 0.5, GiveUp()),
        (error(), 3, "anthropic/a", False, 0.5, GiveUp()),
        (error(), 3, "", False, 0.5, GiveUp()),
        # The server's retry-after is honoured (never earlier), up to the cap.
        (error(retry_after=7.0), 0, "", False, 0.0, Retry(7.0)),
        (error(retry_after=0.5), 1, "", False, 0.5, Retry(4.0)),
        (error(retry_after=3600.0), 0, "", False, 0.5, Retry(MAX_RETRY_AFTER)),
    ],
)
def test_decide(err, attempt, fallback, switched, rand, expected):
    decision = decide(
        err,
        attempt,
        model="anthropic/a",
        fallback=fallback,
        switched=switched,
        rand=rand,
        delays=DELAYS,
        jitter=0.2,
    )
    assert decision == expected


def test_jitter_spreads_tabs_that_fail_together():
    delays = {
        decide(error(), 0, model="m", fallback="", switched=False, rand=r / 10, delays=DELAYS).delay
        for r in range(11)
    }
    assert len(delays) == 11 and min(delays) >= 0.8 and max(delays) <= 1.2
