"""An external agent's plan in a real Chromium: a turn's revisions stay in the log, and the
page shows only the latest one in place of the first, live and after a reload (app.css,
"Plans")."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async

from chat import log, render
from tests.test_render_browser import _make_tab, open_tab
from tests.ui_helpers import block

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


def plan(turn: uuid.UUID, seq: int | None, *statuses: str):
    entries = [{"content": f"step {n}", "status": s} for n, s in enumerate(statuses)]
    return block("plan", {"entries": entries}, turn_id=turn, seq=seq)


async def shown(page, *chunks) -> list[bool]:
    """Whether each chunk's plan card is drawn."""
    return [
        await page.eval_on_selector(
            f"#chunk-{c.id} > .card.plan", "el => el.getBoundingClientRect().height > 0"
        )
        for c in chunks
    ]


async def test_only_a_turns_latest_plan_shows_live_and_after_a_reload(browser, live_server):
    tab, turn, _, session = await sync_to_async(_make_tab)(0)
    page, socket, errors = await open_tab(browser, live_server, session, tab)
    await socket.hello()
    first = plan(turn, 1, "in_progress", "pending")
    text = block("text", {"text": "working"}, turn_id=turn, seq=2)
    second = plan(turn, 3, "completed", "in_progress")
    third = plan(turn, 4, "completed", "completed")
    other_turn = uuid.uuid4()
    later = plan(other_turn, 5, "pending")
    sent = [first, text, second, third, later]
    socket.send(*(render.fragment_seal(b) for b in sent))
    await page.wait_for_selector(f"#chunk-{later.id}")
    assert await shown(page, first, second, third, later) == [False, False, True, True]
    # The revisions are in the first plan's slot; the other turn's plan stands alone.
    slot = f"#chunk-{first.id} > .plan-slot > .chunk"
    ids = await page.eval_on_selector_all(slot, "els => els.map(e => e.id)")
    assert ids == [f"chunk-{second.id}", f"chunk-{third.id}"]
    assert await page.eval_on_selector(f"#log > #chunk-{later.id}", "el => !!el")

    for b in sent:
        b.seq = None
    await sync_to_async(log.append)(tab.id, sent)
    await page.reload()
    await page.wait_for_selector(f"#chunk-{later.id}")
    assert await shown(page, first, second, third, later) == [False, False, True, True]
    done = await page.inner_text(f"#chunk-{third.id} .card-head")
    assert "2 of 2 done" in done
    assert errors == []
