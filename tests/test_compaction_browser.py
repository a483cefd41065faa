"""Context management in Chromium (issue 16): a tab that was compacted shows the context
meter beside its status line (used / window, the bar with its compaction tick, the
cached share; on a phone the short form) and the compaction as a thin notice that opens
to its summary, rendered as Markdown with the model's hostile HTML inert.

No model runs: the tab's log and its last request's size are written before the page
loads. Screenshots at 1280 and 375 px, light and dark, go to test-artifacts/context-*.png.
"""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async

from chat import context, log
from chat.models import Tab
from chat.stream import Block, Kind, Role
from harness.login import session_for
from tests.live import make_tab, make_user, open_page, shots, synced

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]

SUMMARY = (
    "## Where things stand\n\n- The user is tidying `src/`.\n- Three files were renamed; "
    '**tests pass**.\n\n<img src=x onerror="window.__pwned = 1"> '
    "<script>window.__pwned = 2</script>\n"
)
# The tab's last request: 45,123 tokens in and out, 41,600 of the 44,223 in (94%) read from
# the cache.
SIZE = context.Size(input=1_200, cache_read=41_600, cache_write=1_423, output=900)

# What the reader sees of the meter and of the notice.
READ = """
() => {
  const meter = document.getElementById('context-meter');
  const shown = (el) => !!el && el.checkVisibility();
  const notice = document.querySelector('#log > .t-compaction');
  const body = notice.querySelector('.md');
  const row = document.querySelector('.composer-row');
  return {
    meter: meter.innerText.replace(/\\s+/g, ' ').trim(),
    label: shown(meter.querySelector('.ctx-label')),
    bar: meter.querySelector('.ctx-bar').getBoundingClientRect().width,
    fill: meter.querySelector('.ctx-fill').getBoundingClientRect().width,
    tick: meter.querySelector('.ctx-tick').getBoundingClientRect().left
      - meter.querySelector('.ctx-bar').getBoundingClientRect().left,
    title: meter.title,
    line: notice.querySelector('summary').innerText,
    open: notice.querySelector('details').open,
    body: shown(body),
    heading: body.querySelector('h2') ? body.querySelector('h2').textContent : null,
    bubble: notice.classList.contains('a'),
    overflow: row.scrollWidth > row.clientWidth + 1 || document.body.scrollWidth > innerWidth,
    pwned: window.__pwned || 0,
    compact: [...document.querySelectorAll('.act-compact')].filter(shown).map((b) => b.value),
  };
}
"""


def seed(tab: Tab) -> None:
    turn, then = uuid.uuid4(), uuid.uuid4()
    log.append(
        tab.pk,
        [
            Block(uuid.uuid4(), turn, 0, Role.USER, Kind.TEXT, {"text": "Tidy up src/, please."}),
            Block(uuid.uuid4(), turn, 1, Role.ASSISTANT, Kind.TEXT, {"text": "Renamed 3 files."}),
            Block(uuid.uuid4(), then, 0, Role.SYSTEM, Kind.COMPACTION,
                  {"summary": SUMMARY, "through_seq": 2, "model": tab.model, "trigger": "auto",
                   "tokens_before": 151_000}),
            Block(uuid.uuid4(), then, 0, Role.USER, Kind.TEXT, {"text": "Now the README."}),
            Block(uuid.uuid4(), then, 1, Role.ASSISTANT, Kind.TEXT, {"text": "Updated it."}),
        ],
    )  # fmt: skip
    Tab.objects.filter(pk=tab.pk).update(context=SIZE.as_dict())


async def test_a_compacted_tab_shows_its_meter_and_its_summary_on_demand(browser, serve):
    server = await serve()
    user = await sync_to_async(make_user)()
    tab = await sync_to_async(make_tab)(user, "offline/demo", "Tidy up")
    await sync_to_async(seed)(tab)
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{tab.id}/", session=session, width=1280)
    phone = await open_page(
        browser, server, f"/t/{tab.id}/", session=session, width=375, mobile=True
    )
    page = live.page
    await synced(page)
    await synced(phone.page)

    wide = await page.evaluate(READ)
    assert wide["meter"] == "Context 45.1k / 200k 94% cached"
    assert wide["title"].startswith("Context: 45,123 of 200,000 tokens (23%)")
    # The bar: filled to 23%, its tick at 75% (compaction at 150k of 200k).
    assert wide["bar"] > 40
    assert wide["fill"] == pytest.approx(wide["bar"] * 0.2256, abs=1)
    assert wide["tick"] == pytest.approx(wide["bar"] * 0.75, abs=1.5)
    assert wide["line"] == "Conversation compacted · auto · 151k tokens summarised · up to #2"
    assert (wide["open"], wide["body"], wide["bubble"]) == (False, False, False)
    assert not wide["overflow"]
    # "Summarise up to here" on the answer after the compaction, not on the one it summarised.
    assert wide["compact"] == ["5"]

    narrow = await phone.page.evaluate(READ)
    assert narrow["meter"] == "45.1k / 200k"
    assert not narrow["label"] and narrow["bar"] > 20
    assert not narrow["overflow"], "the meter fits the phone's composer row"
    await shots(page, phone.page, "context-folded")

    for target in (page, phone.page):
        await target.locator("#log > .t-compaction summary").click()
    opened = await page.evaluate(READ)
    assert (opened["open"], opened["body"], opened["heading"]) == (
        True,
        True,
        "Where things stand",
    )
    assert opened["pwned"] == 0, "the summary's HTML is text, never run"
    assert await page.locator("#log > .t-compaction .md").inner_text() != ""
    assert "<script>" in await page.locator("#log > .t-compaction .md").inner_text()
    await phone.page.locator("#log > .t-compaction").scroll_into_view_if_needed()
    await page.locator("#log > .t-compaction").scroll_into_view_if_needed()
    await shots(page, phone.page, "context-opened")
    live.assert_clean()
    phone.assert_clean()
