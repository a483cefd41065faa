"""Tokens and cost (chat/usage.py): the price table's mapping for every model, the cost
math against the package's own, and the aggregation queries (where they show:
test_usage_views.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import genai_prices
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models.functions import ExtractHour, ExtractMinute, ExtractSecond, TruncDate
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat import usage
from chat.models import Tab, UsageRecord
from chat.providers.registry import MODELS, OFFLINE_MODEL
from chat.usage import Tokens, Totals

User = get_user_model()

SONNET = "anthropic/claude-sonnet-4-5"
DEEPSEEK = "deepseek/deepseek-chat"
# Registry models the price table does not know (each shows "price unknown"). Adding a
# model to the registry that lands here is a decision: say it here.
UNPRICED: set[str] = set()
NOON = datetime(2026, 5, 4, 12, 0, tzinfo=UTC)
# DeepSeek's off-peak hours (16:30-00:30 UTC) halve its prices.
EVENING = datetime(2026, 5, 4, 20, 0, tzinfo=UTC)
# Sonnet 4.6's table changes on 2026-03-13 (its >200k tier goes).
BEFORE_CHANGE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

# --- The mapping and the math (no database) ----------------------------------------------


def package_price(model: str, tokens: Tokens, at: datetime) -> Decimal:
    """genai-prices' own price of one request (its input counts the cache too)."""
    provider, name = usage.price_ref(model)
    calc = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=tokens.prompt,
            output_tokens=tokens.output,
            cache_read_tokens=tokens.cache_read,
            cache_write_tokens=tokens.cache_write,
        ),
        name,
        provider_id=provider,
        genai_request_timestamp=at,
    )
    return calc.total_price


REQUESTS = [
    Tokens(1_000, 200),
    Tokens(40, 300, cache_read=9_000, cache_write=1_200),
    Tokens(0, 50, cache_write=5_000),
    # Past the 200k tier of the models that have one (every token at the higher rate).
    Tokens(150_000, 900, cache_read=60_000, cache_write=1_000),
    Tokens(0, 1_000),
]


@pytest.mark.parametrize("model", sorted(m for m in MODELS if m != OFFLINE_MODEL))
def test_every_registry_model_has_its_own_price(model):
    """Each model id maps to the table's entry of the same name (not a near match), and
    one request costs exactly what the package says, cache, tiers and time of day included."""
    found = usage.price_model(model)
    if model in UNPRICED:
        assert found is None
        assert usage.step_cost(model, Tokens(1, 1), NOON) is None
        return
    assert found is not None, f"{model}: not in the price table; add it to UNPRICED"
    assert found.id == model.partition("/")[2]
    for at in (NOON, EVENING, BEFORE_CHANGE):
        for tokens in REQUESTS:
            assert usage.step_cost(model, tokens, at) == package_price(model, tokens, at), (
                model,
                at,
                tokens,
            )


@pytest.mark.parametrize(
    ("model", "tokens", "at", "usd"),
    [
        # Sonnet 4.5 per million: $3 in, $15 out, $0.30 cache read, $3.75 cache write.
        (SONNET, Tokens(100_000, 0), NOON, "0.3"),
        (SONNET, Tokens(0, 100_000), NOON, "1.5"),
        (SONNET, Tokens(0, 0, cache_read=100_000), NOON, "0.03"),
        (SONNET, Tokens(0, 0, cache_write=100_000), NOON, "0.375"),
        # A request past 200k input tokens: every token at $6 in, $22.50 out.
        (SONNET, Tokens(250_000, 100_000), NOON, "3.75"),
        # No cache write price in the table: written tokens cost what input costs.
        (DEEPSEEK, Tokens(0, 0, cache_write=100_000), NOON, "0.027"),
        (DEEPSEEK, Tokens(0, 0, cache_read=100_000), NOON, "0.007"),
        ("openai/gpt-4.1", Tokens(0, 0, cache_write=100_000), NOON, "0.2"),
        ("openai/gpt-4.1", Tokens(0, 0, cache_read=100_000), NOON, "0.05"),
        # DeepSeek off-peak: half price.
        (DEEPSEEK, Tokens(100_000, 0), NOON, "0.027"),
        (DEEPSEEK, Tokens(100_000, 0), EVENING, "0.0135"),
        (OFFLINE_MODEL, Tokens(100_000, 100_000), NOON, "0"),
    ],
)
def test_a_request_costs_its_tokens_at_their_own_prices(model, tokens, at, usd):
    assert usage.step_cost(model, tokens, at) == Decimal(usd)


@pytest.mark.parametrize(
    "model", ["openai/llama-3.1-local", "nosuch/model", "anthropic/claude-imaginary-9", "no-slash"]
)
def test_a_model_the_table_does_not_know_has_no_price(model):
    """Never a made-up 0: no price at all."""
    assert usage.step_cost(model, Tokens(1_000, 100), NOON) is None
    assert usage.price_model(model) is None


def test_the_mapping_names_the_tables_provider():
    assert usage.price_ref("anthropic/claude-sonnet-4-5") == ("anthropic", "claude-sonnet-4-5")
    assert usage.price_ref("deepseek/deepseek-reasoner") == ("deepseek", "deepseek-reasoner")
    assert usage.price_ref("offline/demo") is None
    assert usage.price_ref("anthropic/") is None
    assert usage.free(OFFLINE_MODEL) and not usage.free(SONNET)


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        ("0", "$0.00"),
        ("0.00004", "<$0.0001"),
        ("0.000123", "$0.000123"),
        ("0.0123", "$0.0123"),
        ("0.01234", "$0.0123"),
        ("0.5", "$0.50"),
        ("0.12345", "$0.123"),
        ("0.99996", "$1.00"),
        ("12.345", "$12.35"),
        ("1234.5", "$1,234.50"),
    ],
)
def test_a_cost_reads_at_a_glance(usd, text):
    assert usage.format_usd(Decimal(usd)) == text


def test_totals_survive_the_channel_layer_exactly():
    totals = Totals(Tokens(1, 2, 3, 4), Decimal("0.008625000"), (DEEPSEEK,), (DEEPSEEK, SONNET), 5)
    data = totals.as_dict()
    assert data["usd"] == "0.008625"
    assert Totals.from_dict(data) == Totals(
        Tokens(1, 2, 3, 4), Decimal("0.008625"), (DEEPSEEK,), (DEEPSEEK, SONNET), 5
    )
    assert usage.usd_text(Decimal("0E-8")) == "0"
    assert usage.usd_text(Decimal("1.5E+2")) == "150"


def test_the_cache_share_is_of_all_input():
    assert Tokens(200, 50, cache_read=600, cache_write=200).cache_share == 0.6
    assert Tokens(0, 50).cache_share is None


# --- The queries ------------------------------------------------------------------------------


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery", is_staff=True)


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="another horse battery")


@pytest.fixture
def tab(alice):
    return Tab.objects.create(owner=alice, model=SONNET, title="costs")


def record(
    tab: Tab, turn_id: uuid.UUID, model: str, at: datetime, tokens: Tokens, *, user=None, step=1
) -> UsageRecord:
    row = UsageRecord.objects.create(
        user=user if user is not None else tab.owner,
        tab_id=tab.id,
        turn_id=turn_id,
        step=step,
        model=model,
        input_tokens=tokens.input,
        output_tokens=tokens.output,
        cache_read_tokens=tokens.cache_read,
        cache_write_tokens=tokens.cache_write,
    )
    # created_at is auto_now_add: the time of day and the date decide the price.
    UsageRecord.objects.filter(pk=row.pk).update(created_at=at)
    row.created_at = at
    return row


def by_hand(rows: list[UsageRecord]) -> Decimal:
    """The sum of each request's own price, as the package computes it."""
    return sum(
        (
            package_price(
                r.model,
                Tokens(r.input_tokens, r.output_tokens, r.cache_read_tokens, r.cache_write_tokens),
                r.created_at,
            )
            for r in rows
        ),
        Decimal(0),
    )


def test_a_turns_cost_is_the_sum_of_its_requests_in_one_query(tab):
    """Summed in the database, priced per group: exactly the per-request sum, although
    three 150k requests sum past the 200k tier, and requests straddle DeepSeek's off-peak
    boundary and a day."""
    turn, other = uuid.uuid4(), uuid.uuid4()
    rows = [
        record(tab, turn, SONNET, NOON, Tokens(100_000, 500, 50_000, 0), step=1),
        record(tab, turn, SONNET, NOON + timedelta(minutes=1), Tokens(1_000, 800, 149_000, 500)),
        record(tab, turn, SONNET, NOON + timedelta(minutes=2), Tokens(240_000, 900)),
        record(tab, turn, DEEPSEEK, NOON.replace(hour=16, minute=29), Tokens(5_000, 100)),
        record(tab, turn, DEEPSEEK, NOON.replace(hour=16, minute=30), Tokens(5_000, 100)),
        record(tab, turn, DEEPSEEK, NOON + timedelta(days=1), Tokens(5_000, 100, 2_000)),
    ]
    record(tab, other, SONNET, NOON, Tokens(7, 7))
    with CaptureQueriesContext(connection) as queries:
        totals = usage.turn_totals(tab.id, [turn, other])
    # The records, and the turns' `agent` calls (none here) whose children's turns count.
    assert len(queries) == 2
    assert totals[turn].usd == by_hand(rows)
    assert totals[turn].tokens == sum(
        (
            Tokens(r.input_tokens, r.output_tokens, r.cache_read_tokens, r.cache_write_tokens)
            for r in rows
        ),
        Tokens(),
    )
    assert totals[turn].steps == 6 and totals[turn].models == (SONNET, DEEPSEEK)
    assert totals[turn].priced
    # Priced on summed tokens, the three Sonnet requests would cross the 200k tier.
    naive = usage.step_cost(SONNET, Tokens(341_000, 2_200, 199_000, 500), NOON)
    assert naive > by_hand(rows[:3])
    assert set(totals) == {turn, other}


def test_a_turns_end_without_sub_agents_looks_for_no_child_turns(tab):
    """The idle status of every turn carries its totals: the tab's tree is read once, and
    a tab alone in it has no child turns to look for."""
    turn = uuid.uuid4()
    rows = [
        record(tab, turn, SONNET, NOON, Tokens(10, 10)),
        record(tab, turn, SONNET, NOON, Tokens(5, 5)),
    ]
    record(tab, uuid.uuid4(), SONNET, NOON, Tokens(7, 7))
    with CaptureQueriesContext(connection) as queries:
        ended = usage.turn_end(tab.id, turn)
    # The tree, the turn's records, the tab's version and its sum.
    assert len(queries) == 4
    assert ended["turn"]["input"] == 15 and Decimal(ended["turn"]["usd"]) == by_hand(rows)
    assert ended["tab"]["input"] == 22


def test_a_branch_does_not_count_the_turns_it_copied(tab, alice):
    """Usage belongs to the tab a turn ran in: a branch's copy of the turn shows none."""
    turn = uuid.uuid4()
    record(tab, turn, SONNET, NOON, Tokens(10, 10))
    branch = Tab.objects.create(owner=alice, model=SONNET, parent=tab, fork_seq=2)
    assert usage.turn_totals(branch.id, [turn]) == {}
    assert usage.tab_totals(branch.id) == Totals()
    assert usage.turn_totals(tab.id, []) == {}


def test_the_tab_totals_name_the_models_without_a_price(tab):
    turn = uuid.uuid4()
    priced = record(tab, turn, SONNET, NOON, Tokens(1_000, 100))
    record(tab, turn, "openai/my-local-llama", NOON, Tokens(5_000, 500))
    totals = usage.tab_totals(tab.id)
    assert totals.unknown == ("openai/my-local-llama",)
    assert totals.usd == by_hand([priced])
    assert totals.tokens == Tokens(6_000, 600)
    assert not totals.priced


def test_usage_per_user_and_model_over_a_period(tab, alice, bob):
    turn = uuid.uuid4()
    now = timezone.now()
    a1 = record(tab, turn, SONNET, now - timedelta(hours=1), Tokens(1_000, 100))
    a2 = record(tab, turn, SONNET, now - timedelta(hours=2), Tokens(2_000, 100, 500))
    b1 = record(tab, turn, DEEPSEEK, now - timedelta(hours=3), Tokens(9_000, 900), user=bob)
    record(tab, turn, SONNET, now - timedelta(days=3), Tokens(50_000, 100))
    gone = User.objects.create_user("carol", password="x" * 12)
    c1 = record(tab, turn, "openai/unpriced", now - timedelta(hours=4), Tokens(10, 1), user=gone)
    gone.delete()
    day = UsageRecord.objects.filter(created_at__gte=now - usage.PERIODS["24h"])
    with CaptureQueriesContext(connection) as queries:
        rows, total = usage.by_user_and_model(day)
    assert len(queries) == 1
    assert [(r.user, r.model) for r in rows] == [
        ("alice", SONNET),
        ("bob", DEEPSEEK),
        ("(deleted user)", "openai/unpriced"),
    ]
    assert rows[0].totals.usd == by_hand([a1, a2]) and rows[0].totals.steps == 2
    assert rows[1].totals.usd == by_hand([b1])
    assert rows[2].totals.unknown == ("openai/unpriced",)
    assert total.usd == by_hand([a1, a2, b1]) and total.steps == 4
    assert total.tokens.prompt == 1_000 + 2_500 + 9_000 + 10
    week = UsageRecord.objects.filter(created_at__gte=now - usage.PERIODS["7d"])
    assert usage.by_user_and_model(week)[1].steps == 5
    assert c1.pk


def test_the_tab_totals_follow_added_and_deleted_records(tab):
    """Kept per process until the tab's records change (count and last id)."""
    turn = uuid.uuid4()
    first = record(tab, turn, SONNET, NOON, Tokens(100, 10))
    assert usage.tab_totals(tab.id).steps == 1
    second = record(tab, turn, SONNET, NOON, Tokens(7, 1))
    assert usage.tab_totals(tab.id).tokens == Tokens(107, 11)
    first.delete()
    assert usage.tab_totals(tab.id).tokens == Tokens(7, 1)
    second.delete()
    assert usage.tab_totals(tab.id) == Totals()


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 5, 4, 0, 0, 0, tzinfo=UTC),
        datetime(2026, 5, 4, 16, 29, 59, 999_999, tzinfo=UTC),
        datetime(2026, 5, 4, 16, 30, 0, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC),
    ],
)
def test_a_steps_day_and_time_are_read_as_django_reads_them(tab, at):
    """The cheap reading of the stored UTC text (SQLite) says what TruncDate and Extract do."""
    record(tab, uuid.uuid4(), SONNET, at, Tokens(1, 1))
    day, second = usage._utc_day_and_second()
    got = UsageRecord.objects.annotate(day=day, second=second).values("day", "second").get()
    django = (
        UsageRecord.objects.annotate(
            day=TruncDate("created_at", tzinfo=UTC),
            second=ExtractHour("created_at", tzinfo=UTC) * 3600
            + ExtractMinute("created_at", tzinfo=UTC) * 60
            + ExtractSecond("created_at", tzinfo=UTC),
        )
        .values("day", "second")
        .get()
    )
    assert got["day"] == django["day"] == at.date()
    assert (
        int(got["second"]) == int(django["second"]) == at.hour * 3600 + at.minute * 60 + at.second
    )
