"""Each kind of provider error card in Chromium (issue 15.3): 401, 403, an unknown model,
429, 5xx, a refused connection and a timeout, as errors.explain words them, at 1280 and
375 px in light and dark. The cards arrive as the runner's seal frames would (the live
path, tests/test_render_browser.py's socket); the 401 also runs end to end, with Retry,
in tests/test_error_cards_browser.py (a live refused connection would wait out the real
retry delays)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async

from chat import render
from chat.providers import errors
from tests.live import screenshot
from tests.test_provider_error_words import CASES
from tests.test_render_browser import _make_tab, open_tab
from tests.ui_helpers import block

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

SHOWN = [
    "401, key saved in Settings",
    "403",
    "404 of an unknown model (Anthropic)",
    "429 with retry-after",
    "500",
    "529 overloaded with retry-after",
    "connection refused, URL from the environment",
    "connect timeout",
]


def card_data(name: str, monkeypatch) -> dict:
    """The error chunk's data for a case, as the runner writes it when it gives up."""
    failure, model, env, *_ = CASES[name]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    data = {"message": failure.message, **errors.explain(failure, model=model).data()}
    if failure.status_code is not None:
        data["status_code"] = failure.status_code
    return data


async def test_every_kind_of_error_card_says_what_happened_and_what_to_do(
    browser, live_server, monkeypatch
):
    tab, turn, _, session = await sync_to_async(_make_tab)(0)
    page, socket, errors_seen = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    cards = []
    for seq, name in enumerate(SHOWN, start=1):
        data = card_data(name, monkeypatch)
        card = block("error", data, turn_id=turn, seq=seq)
        cards.append((card, data))
        socket.send(render.fragment_seal(card))
    for card, data in cards:
        selector = f"#chunk-{card.id}"
        await page.wait_for_selector(selector)
        assert await page.text_content(f"{selector} .err-summary") == data["summary"]
        hint = await page.text_content(f"{selector} .err-hint")
        assert hint == data["hint"].replace("`", "")
        assert await page.is_visible(f"{selector} .act-retry")
    for width in (1280, 375):
        await page.set_viewport_size({"width": width, "height": 900})
        for scheme in ("light", "dark"):
            await page.emulate_media(color_scheme=scheme)
            # No card wider than the page: a long URL or hint wraps.
            assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            await screenshot(page, f"error-cards-{width}-{scheme}", full_page=True)
    assert errors_seen == []
