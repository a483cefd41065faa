"""Where tokens and cost show: each finished turn's line (the same on a page and live),
the tab's totals in its header, Settings' and the admin's usage per user and model, and
the API's tab detail."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chat import log, render, usage
from chat.models import RunningTurn, Tab
from chat.providers.registry import OFFLINE_MODEL
from chat.usage import Tokens, Totals
from tests.api_helpers import ApiClient
from tests.test_usage import DEEPSEEK, EVENING, NOON, SONNET, User, record
from tests.ui_helpers import block, parse

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery", is_staff=True)


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


@pytest.fixture
def tab(alice):
    return Tab.objects.create(owner=alice, model=SONNET, title="costs")


@pytest.mark.parametrize(
    ("totals", "line"),
    [
        (
            Totals(Tokens(240, 340, 960, 0), Decimal("0.0123"), (), (SONNET,), 1),
            "1.2k in · 340 out · 80% cached · $0.0123",
        ),
        (
            Totals(Tokens(100, 5), Decimal(0), ("openai/local",), ("openai/local",), 1),
            "100 in · 5 out · 0% cached · price unknown",
        ),
        (
            Totals(Tokens(100, 5), Decimal("0.5"), ("openai/local",), ("openai/local", SONNET), 2),
            "100 in · 5 out · 0% cached · $0.50 + price unknown",
        ),
        (
            Totals(Tokens(100, 5), Decimal(0), (), (OFFLINE_MODEL,), 1),
            "100 in · 5 out · 0% cached · free",
        ),
        (Totals(Tokens(0, 7), Decimal("0.0001"), (), (SONNET,), 1), "0 in · 7 out · $0.0001"),
    ],
)
def test_a_turns_line_says_tokens_cache_and_cost(totals, line):
    turn = uuid.uuid4()
    html = render_to("turn_usage", {"u": render.usage_line(totals, turn)})
    details = parse(html).by_id(f"usage-{turn}")
    summary = details.children[0]
    assert summary.text == line
    if totals.unknown:
        assert f"no price for {', '.join(totals.unknown)}" in details.text


def render_to(partial: str, context: dict) -> str:
    from django.template.loader import render_to_string

    return render_to_string(f"chat/tab.html#{partial}", context)


# --- The tab page: each turn's line, the tab's totals -----------------------------------


@pytest.fixture
def client_alice(alice):
    client = Client()
    client.force_login(alice)
    return client


def turn_of(tab: Tab, text: str, *, answer: str = "Done.", turn_id=None) -> uuid.UUID:
    """A finished turn in the log: the question and the answer."""
    turn = turn_id or uuid.uuid4()
    log.append(
        tab.id,
        [
            block("text", {"text": text}, role="user", turn_id=turn, step=0),
            block("thinking", {"text": "hm", "signature": "s"}, turn_id=turn),
            block("text", {"text": answer}, turn_id=turn),
        ],
    )
    return turn


def lines(html: str) -> dict[str, tuple[str, str]]:
    """Each turn's usage line on a page: (the id of the chunk it is in, its text)."""
    tree = parse(html)
    found = {}
    for chunk in tree.find_all(lambda n: "chunk" in n.classes):
        for details in chunk.children:
            if "turn-usage" in details.classes:
                found[details.get("id")] = (chunk.get("id"), details.children[0].text)
    return found


def test_the_page_shows_each_finished_turns_line_on_its_last_answer(client_alice, tab):
    first = turn_of(tab, "one")
    second = turn_of(tab, "two")
    record(tab, first, SONNET, NOON, Tokens(240, 340, 960, 0))
    record(tab, second, SONNET, NOON, Tokens(1_000, 10))
    record(tab, second, "openai/unpriced", NOON, Tokens(1_000, 10), step=2)
    html = client_alice.get(reverse("tab", args=[tab.id])).content.decode()
    rows = log.tail(tab.id)
    shown = lines(html)
    assert shown == {
        f"usage-{first}": (f"chunk-{rows[2].id}", "1.2k in · 340 out · 80% cached · $0.00611"),
        f"usage-{second}": (
            f"chunk-{rows[5].id}",
            "2k in · 20 out · 0% cached · $0.00315 + price unknown",
        ),
    }
    header = parse(html).by_id("tab-usage")
    assert header.text == "3.2k in · 360 out · 30% cached · $0.00926 + price unknown"
    assert "no price for openai/unpriced" in header.get("title")


def test_the_running_turn_has_no_line_yet(client_alice, tab):
    done = turn_of(tab, "one")
    running = turn_of(tab, "two")
    record(tab, done, SONNET, NOON, Tokens(10, 10))
    record(tab, running, SONNET, NOON, Tokens(10, 10))
    RunningTurn.objects.create(tab=tab, turn_id=running, worker="w", heartbeat_at=timezone.now())
    shown = lines(client_alice.get(reverse("tab", args=[tab.id])).content.decode())
    assert set(shown) == {f"usage-{done}"}


def test_an_empty_tab_shows_no_totals(client_alice, tab):
    header = parse(client_alice.get(reverse("tab", args=[tab.id])).content.decode()).by_id(
        "tab-usage"
    )
    assert header.text == "" and header.get("title") is None


def test_the_page_reads_usage_in_one_query_however_many_turns(client_alice, tab, settings):
    """One query for the turns shown and one for the tab's totals, not one per turn."""

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client_alice.get(reverse("tab", args=[tab.id])).status_code == 200
        return len(queries)

    turn = turn_of(tab, "q0")
    record(tab, turn, SONNET, NOON, Tokens(10, 10))
    one = count()
    for n in range(1, 8):
        turn = turn_of(tab, f"q{n}")
        record(tab, turn, SONNET, NOON, Tokens(10, 10))
        record(tab, turn, DEEPSEEK, EVENING, Tokens(10, 10), step=2)
    assert count() == one
    assert len(lines(client_alice.get(reverse("tab", args=[tab.id])).content.decode())) == 8


def test_an_older_page_shows_the_lines_of_the_turns_that_end_on_it(client_alice, tab):
    """The last turn of an older page continues on the page below: its line is there."""
    turns_ = [turn_of(tab, f"q{n}") for n in range(3)]
    for turn in turns_:
        record(tab, turn, SONNET, NOON, Tokens(10, 10))
    rows = log.tail(tab.id)
    # The page before seq 6 (the end of the second turn): seqs 1-5; its last turn ends at 6.
    html = client_alice.get(
        reverse("tab_older", args=[tab.id]) + "?before=6", headers={"HX-Request": "true"}
    ).content.decode()
    assert set(lines(html)) == {f"usage-{turns_[0]}"}
    html = client_alice.get(
        reverse("tab_older", args=[tab.id]) + "?before=7", headers={"HX-Request": "true"}
    ).content.decode()
    assert lines(html)[f"usage-{turns_[1]}"][0] == f"chunk-{rows[5].id}"


def test_the_live_line_is_the_one_a_reload_shows(client_alice, tab):
    """The idle status the runner publishes at a turn's end (chat.usage.turn_end) brings
    the same line, byte for byte, into the same chunk a page render puts it in; and the
    tab's new totals into the header."""
    turn = turn_of(tab, "q")
    record(tab, turn, SONNET, NOON, Tokens(240, 340, 960, 0))
    record(tab, turn, SONNET, NOON, Tokens(2, 20, 1_100, 100), step=2)
    status = {"state": "idle", "turn_end": usage.turn_end(tab.id, turn)}
    frame = render.fragment_status(status)
    page = client_alice.get(reverse("tab", args=[tab.id])).content.decode()
    page_line = parse(page).by_id(f"usage-{turn}")
    oob = next(
        n for n in parse(frame).children if (n.get("hx-swap-oob") or "").startswith("beforeend:")
    )
    live_line = oob.children[0]
    assert live_line.get("id") == page_line.get("id")
    assert (live_line.text, live_line.attrs) == (page_line.text, page_line.attrs)
    assert oob.get("hx-swap-oob") == "beforeend:" + render.usage_target(str(turn))
    header = next(n for n in parse(frame).children if n.get("id") == "tab-usage")
    assert header.text == parse(page).by_id("tab-usage").text
    assert header.get("hx-swap-oob") == "true"


def test_a_status_without_a_turns_end_adds_nothing():
    assert "usage-" not in render.fragment_status({"state": "idle"})
    running = {"state": "running", "turn_end": {"turn_id": str(uuid.uuid4()), "turn": {}}}
    assert "tab-usage" not in render.fragment_status(running)


def test_the_line_goes_where_a_page_puts_it():
    """The last top-level chunk of the turn that is not thinking nor a card; an error's
    line goes in its card."""
    turn = uuid.uuid4()
    chunks = [
        block("text", {"text": "q"}, role="user", turn_id=turn, seq=1),
        block("text", {"text": "a"}, turn_id=turn, seq=2),
        block("error", {"message": "boom"}, turn_id=turn, seq=3),
        block("thinking", {"text": "t", "signature": "s"}, turn_id=turn, seq=4),
    ]
    items = render.group(chunks)
    render.mark_usage(items, {turn: Totals(Tokens(1, 1), models=(SONNET,), steps=1)})
    assert [bool(i.usage) for i in items] == [False, False, True, False]
    target = render.usage_target(str(turn))
    assert f'#log > .chunk[data-turn="{turn}"]' in target and ".t-error > .card" in target


# --- Settings, the admin and the API -----------------------------------------------------


def test_settings_show_usage_per_user_and_model_over_a_period(client_alice, tab, bob):
    turn = uuid.uuid4()
    now = timezone.now()
    record(tab, turn, SONNET, now - timedelta(hours=1), Tokens(1_000, 100, 3_000))
    record(tab, turn, DEEPSEEK, now - timedelta(days=3), Tokens(9_000, 900), user=bob)
    html = client_alice.get(reverse("settings_section", args=["models"])).content.decode()
    section = parse(html).by_id("usage")
    table = section.find_all(lambda n: n.tag == "table")[0]
    body = [[td.text for td in tr.children] for tr in table.find_all(lambda n: n.tag == "tr")]
    # The most expensive first.
    assert body[1][0] == f"alice {SONNET}" and body[2][0] == f"bob {DEEPSEEK}"
    assert body[1][1:] == ["$0.0054", "75%", "1", "1k", "3k", "0", "100"]
    assert body[-1][0] == "Total"
    # Counts at a glance, exact in their titles.
    cells = table.find_all(lambda n: n.tag == "td")
    assert [td.get("title") for td in cells[3:8]] == ["1", "1,000", "3,000", "0", "100"]
    current = section.find_all(lambda n: "current" in n.classes)[0]
    assert current.text == "Last 7 days"
    day = parse(
        client_alice.get(
            reverse("settings_section", args=["models"]) + "?usage=24h"
        ).content.decode()
    )
    rows = day.by_id("usage").find_all(lambda n: n.tag == "tr")
    assert [tr.children[0].text for tr in rows] == ["User · model", f"alice {SONNET}", "Total"]


def test_settings_refuse_an_unknown_period(client_alice):
    response = client_alice.get(reverse("settings_section", args=["models"]) + "?usage=1y")
    assert response.status_code == 400
    assert "?usage= must be one of 24h, 7d, 30d, not '1y'." in response.content.decode()


def test_settings_say_when_there_is_no_usage(client_alice):
    html = client_alice.get(reverse("settings_section", args=["models"])).content.decode()
    assert "No requests to a model in this period." in parse(html).by_id("usage").text


def test_only_staff_see_usage(bob):
    client = Client()
    client.force_login(bob)
    assert client.get(reverse("settings_section", args=["models"])).status_code == 403


def test_the_admin_lists_usage_per_user_and_model_with_each_steps_cost(tab, alice):
    alice.is_superuser = True
    alice.save()
    client = Client()
    client.force_login(alice)
    now = timezone.now()
    record(tab, uuid.uuid4(), SONNET, now - timedelta(hours=1), Tokens(100_000, 0))
    record(tab, uuid.uuid4(), "openai/unpriced", now - timedelta(days=3), Tokens(10, 1))
    url = reverse("admin:chat_usagerecord_changelist")
    html = client.get(url).content.decode()
    assert "Tokens and cost of the steps listed, by user and model" in html
    assert "$0.30" in html and "price unknown" in html and "$0.3</td>" in html
    day = client.get(url + "?period=24h").content.decode()
    assert "<code>openai/unpriced</code>" not in day and "$0.30" in day


def test_the_api_gives_a_tabs_usage_and_cost(tab, alice):
    api = ApiClient(user=alice)
    empty = api.get(f"/api/v1/tabs/{tab.id}").json()["usage"]
    assert empty == {
        "input": 0,
        "output": 0,
        "cache_read": 0,
        "cache_write": 0,
        "requests": 0,
        "cache_hit_share": None,
        "cost_usd": "0",
        "unpriced_models": [],
        "models": [],
    }
    turn = uuid.uuid4()
    record(tab, turn, SONNET, NOON, Tokens(100_000, 0, 300_000, 100_000))
    got = api.get(f"/api/v1/tabs/{tab.id}").json()["usage"]
    assert got["cache_hit_share"] == 0.6
    # 400k input: past the 200k tier ($6 in, $0.60 read, $7.50 write per million).
    assert got["cost_usd"] == "1.53"
    record(tab, turn, "openai/unpriced", NOON, Tokens(5, 5))
    got = api.get(f"/api/v1/tabs/{tab.id}").json()["usage"]
    assert got["cost_usd"] == "1.53" and got["unpriced_models"] == ["openai/unpriced"]


def test_the_api_never_makes_up_a_zero(tab, alice):
    record(tab, uuid.uuid4(), "openai/unpriced", NOON, Tokens(5, 5))
    got = ApiClient(user=alice).get(f"/api/v1/tabs/{tab.id}").json()["usage"]
    assert got["cost_usd"] is None and got["requests"] == 1
