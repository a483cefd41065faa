"""Tokens and what they cost: the price table, the cost math, and the usage queries.

Prices come from genai-prices (pinned in requirements.txt), a maintained table of
every provider's prices, read from the copy the package ships: nothing here goes
to the network. A model the table does not know has no price, and says so: its
cost is never taken as 0. The offline demo model runs here and costs nothing.

Usage is kept per step (`UsageRecord`: one request to the model). `input_tokens`
there is what the request paid full price for; cache reads and writes are
counted apart, as Anthropic counts them (the OpenAI adapter subtracts cached
tokens from its prompt count to match). genai-prices counts input the other way
(cached tokens are part of it), which `_probe` converts.

A price can depend on the request itself: on its size (a higher rate for every
token of a request past 200k input tokens), the day (a price change) and the time
of day (off-peak rates). So costs are summed per request, never computed from
summed tokens. The queries group steps by what decides their price (model, UTC
day, time-of-day segment, size tier; the boundaries are every boundary the table
has), sum the tokens of each group in the database, and price each group at the
rates of one request inside it: exact, since the price is linear in the tokens
within a group. The rates of a group come from the package's own calculation
(`_rates`), so no price rule is written here.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, cast

import genai_prices
from django.db import connection
from django.db.models import (
    Case,
    Count,
    DateField,
    F,
    Field,
    Func,
    IntegerField,
    Max,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import RawSQL
from django.db.models.functions import ExtractHour, ExtractMinute, ExtractSecond, TruncDate
from django.db.models.lookups import GreaterThan, GreaterThanOrEqual
from genai_prices import data_snapshot
from genai_prices import types as price_types

from chat.chunks import Kind, OriginKind, Role
from chat.models import Chunk, Tab, UsageRecord, agent_children
from chat.providers.registry import PROVIDERS

logger = logging.getLogger(__name__)

# The table's provider id for each provider of ours that bills by the token. A
# provider missing here (a new one, before someone checks the table names it the
# same way) has no prices: its models show "price unknown".
PRICE_PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "deepseek": "deepseek"}
# Distinct (model, day, segment, tier) price lookups kept: each costs a few package
# calls (~0.1 ms each); a busy month of several models is a few hundred.
RATES_CACHE_SIZE = 4096
# Tabs whose totals each process keeps (`tab_totals`): the tabs being read and written
# now; a Totals is a few hundred bytes.
TAB_TOTALS_CACHE_SIZE = 1024
# The usage periods Settings and the admin offer, by the name in their URLs.
PERIODS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "30d": timedelta(days=30)}
PERIOD_LABELS = {"24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days"}
DEFAULT_PERIOD = "7d"
# Which table the prices come from, for the pages that show them.
PRICES_VERSION = f"genai-prices {genai_prices.__version__}"
# Below this a cost reads "<$0.0001": more digits would say nothing to anyone.
SMALLEST_SHOWN_USD = Decimal("0.0001")


def free(model: str) -> bool:
    """A model that runs here (the offline demo): its tokens cost nothing."""
    spec = PROVIDERS.get(model.partition("/")[0])
    return spec is not None and spec.adapter == "offline"


def price_ref(model: str) -> tuple[str, str] | None:
    """(the table's provider id, the model's name there) for a model id of ours, or None
    when its provider has no prices (or the id is not provider/model)."""
    provider, _, name = model.strip().partition("/")
    if provider not in PRICE_PROVIDERS or not name:
        return None
    return PRICE_PROVIDERS[provider], name


def price_model(model: str) -> price_types.ModelInfo | None:
    """The table's entry for a model id of ours (None: the table does not know it)."""
    ref = price_ref(model)
    if ref is None:
        return None
    provider, name = ref
    try:
        return data_snapshot.get_snapshot().find_provider_model(name, None, provider, None)[1]
    except LookupError:
        return None


# --- Tokens and totals ------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    """Token counts; `input` excludes the cache reads and writes."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    # Of `output`, what the model spent reasoning (where the provider says): shown apart,
    # priced as the output it is part of.
    reasoning: int = 0

    def __add__(self, other: Tokens) -> Tokens:
        return Tokens(
            self.input + other.input,
            self.output + other.output,
            self.cache_read + other.cache_read,
            self.cache_write + other.cache_write,
            self.reasoning + other.reasoning,
        )

    @property
    def prompt(self) -> int:
        """Every input token, cached or not."""
        return self.input + self.cache_read + self.cache_write

    @property
    def cache_share(self) -> float | None:
        """The part of the input read from the cache (None without input)."""
        return self.cache_read / self.prompt if self.prompt else None


@dataclass(frozen=True)
class Totals:
    """Tokens of some steps and what they cost.

    `usd` is the cost of the steps whose model has a price; `unknown` names the
    models without one (then `usd` is only part of the cost). `models`: every model
    the steps used, sorted.
    """

    tokens: Tokens = field(default_factory=Tokens)
    usd: Decimal = Decimal(0)
    unknown: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    steps: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.tokens + other.tokens,
            self.usd + other.usd,
            tuple(sorted(set(self.unknown) | set(other.unknown))),
            tuple(sorted(set(self.models) | set(other.models))),
            self.steps + other.steps,
        )

    @property
    def priced(self) -> bool:
        """Every step's model has a price: `usd` is the whole cost."""
        return not self.unknown

    @property
    def free(self) -> bool:
        """Only models that cost nothing (the offline demo)."""
        return bool(self.models) and all(free(m) for m in self.models)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON (the channel layer carries it): the cost as a decimal string."""
        data: dict[str, Any] = {
            "input": self.tokens.input,
            "output": self.tokens.output,
            "cache_read": self.tokens.cache_read,
            "cache_write": self.tokens.cache_write,
            "usd": usd_text(self.usd),
            "unknown": list(self.unknown),
            "models": list(self.models),
            "steps": self.steps,
        }
        if self.tokens.reasoning:
            data["reasoning"] = self.tokens.reasoning
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Totals:
        return cls(
            Tokens(
                int(data.get("input") or 0),
                int(data.get("output") or 0),
                int(data.get("cache_read") or 0),
                int(data.get("cache_write") or 0),
                int(data.get("reasoning") or 0),
            ),
            Decimal(str(data.get("usd") or 0)),
            tuple(data.get("unknown") or ()),
            tuple(data.get("models") or ()),
            int(data.get("steps") or 0),
        )


def usd_text(usd: Decimal) -> str:
    """A cost as a plain decimal string, exact and without an exponent: "0.008625", "0"."""
    return "0" if usd == 0 else format(usd.normalize(), "f")


def format_usd(usd: Decimal) -> str:
    """A cost for a glance: $0.0123, $0.50, $12.35; three significant digits below $1."""
    if usd == 0:
        return "$0.00"
    if usd < SMALLEST_SHOWN_USD:
        return f"<${SMALLEST_SHOWN_USD}"
    if usd >= 1:
        return f"${usd.quantize(Decimal('0.01'), ROUND_HALF_UP):,}"
    places = max(2, 2 - usd.adjusted())
    text = f"{usd.quantize(Decimal(1).scaleb(-places), ROUND_HALF_UP):f}".rstrip("0")
    whole, _, decimals = text.partition(".")
    return f"${whole}.{decimals.ljust(2, '0')}"


# --- Rates: the package's prices for one request ------------------------------------------


@dataclass(frozen=True)
class Rates:
    """USD per token of each kind, and per request, for the requests of one group."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    request: Decimal = Decimal(0)

    def cost(self, tokens: Tokens, requests: int) -> Decimal:
        return (
            self.input * tokens.input
            + self.output * tokens.output
            + self.cache_read * tokens.cache_read
            + self.cache_write * tokens.cache_write
            + self.request * requests
        )


FREE_RATES = Rates(Decimal(0), Decimal(0), Decimal(0), Decimal(0))


def _probe(model: price_types.ModelInfo, provider: Any, at: datetime, **tokens: int) -> Decimal:
    """The package's price of one request of these tokens (ours: input without the cache)."""
    usage = genai_prices.Usage(
        input_tokens=tokens.get("input", 0)
        + tokens.get("cache_read", 0)
        + tokens.get("cache_write", 0),
        output_tokens=tokens.get("output", 0),
        cache_read_tokens=tokens.get("cache_read", 0),
        cache_write_tokens=tokens.get("cache_write", 0),
    )
    return model.calc_price(usage, provider, genai_request_timestamp=at).total_price


@functools.lru_cache(maxsize=RATES_CACHE_SIZE)
def _rates(model_id: str, at: datetime, prompt: int) -> Rates | None:
    """The rates of a request at time `at` with `prompt` input tokens (which picks the
    size tier), or None when the table has no price for the model.

    Each rate is the package's price of a probe request, less the per-request part,
    divided by the tokens probed. Prices are exact decimals, and the quotient of a
    price per million by a token count that divides it back is exact too.
    """
    if free(model_id):
        return FREE_RATES
    ref = price_ref(model_id)
    if ref is None:
        return None
    try:
        provider, model = data_snapshot.get_snapshot().find_provider_model(
            ref[1], None, ref[0], None
        )
        request = _probe(model, provider, at)
        if prompt == 0:
            # Only output can be counted in a request without input.
            output = _probe(model, provider, at, output=1) - request
            return Rates(Decimal(0), output, Decimal(0), Decimal(0), request)
        base = _probe(model, provider, at, input=prompt) - request
        return Rates(
            input=base / prompt,
            output=(_probe(model, provider, at, input=prompt, output=prompt) - request - base)
            / prompt,
            cache_read=(_probe(model, provider, at, cache_read=prompt) - request) / prompt,
            cache_write=(_probe(model, provider, at, cache_write=prompt) - request) / prompt,
            request=request,
        )
    except LookupError:
        return None
    except (ValueError, ArithmeticError):
        # A price the package cannot apply to text tokens: unknown, not guessed.
        logger.warning("genai-prices could not price %s", model_id, exc_info=True)
        return None


def step_cost(model: str, tokens: Tokens, at: datetime) -> Decimal | None:
    """What one request cost (None: no price for the model)."""
    rates = _rates(model, *_group_point(at, tokens.prompt))
    return None if rates is None else rates.cost(tokens, 1)


# --- Where prices change ----------------------------------------------------------------


@functools.cache
def _boundaries() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Every size-tier start (input tokens) and every time-of-day price boundary
    (seconds after midnight, UTC) in the whole table, ascending.

    The queries split steps at all of them: a group then never straddles a point
    where any model's price changes (dates need no list: steps are grouped by day).
    """
    tiers: set[int] = set()
    seconds: set[int] = set()

    def scan(prices: Any) -> None:
        for value in vars(prices).values():
            if isinstance(value, price_types.TieredPrices):
                tiers.update(tier.start for tier in value.tiers)

    for provider in data_snapshot.get_snapshot().providers:
        for model in provider.models:
            if not isinstance(model.prices, list):
                scan(model.prices)
            for price in model.prices if isinstance(model.prices, list) else ():
                scan(price.prices)
                if isinstance(price.constraint, price_types.TimeOfDateConstraint):
                    for moment in (price.constraint.start_time, price.constraint.end_time):
                        seconds.add(_utc_seconds(moment))
            for variant in model.price_variants or ():
                scan(variant.prices)
    seconds.discard(0)
    return tuple(sorted(tiers)), tuple(sorted(seconds))


def _utc_seconds(moment: time) -> int:
    if moment.tzinfo is not None:
        moment = datetime.combine(date(2000, 1, 1), moment).astimezone(UTC).time()
    return moment.hour * 3600 + moment.minute * 60 + moment.second


def _tier(prompt: int) -> int:
    """How many tier starts a request of `prompt` input tokens is above."""
    return sum(1 for start in _boundaries()[0] if prompt > start)


def _segment(seconds: int) -> int:
    return sum(1 for boundary in _boundaries()[1] if seconds >= boundary)


def _representative(day: date, segment: int, tier: int) -> tuple[datetime, int]:
    """A moment and a request size inside the group (the same price as every step in it)."""
    tiers, seconds = _boundaries()
    start = seconds[segment - 1] if segment else 0
    at = datetime.combine(day, time(), tzinfo=UTC) + timedelta(seconds=start)
    return at, (tiers[tier - 1] + 1 if tier else (tiers[0] if tiers else 1))


def _group_point(at: datetime, prompt: int) -> tuple[datetime, int]:
    """The representative of the group a request at `at` of `prompt` tokens falls in."""
    at = at.astimezone(UTC)
    seconds = at.hour * 3600 + at.minute * 60 + at.second
    return _representative(at.date(), _segment(seconds), _tier(prompt))


# --- Queries -------------------------------------------------------------------------------


def _priced_groups(records: QuerySet, *keys: str) -> Iterator[tuple[tuple[Any, ...], Totals]]:
    """(the values of `keys`, totals) per price group: one query."""
    day, segment, tier = _price_columns(connection.vendor, connection.timezone_name)
    rows = (
        records.order_by()
        .annotate(price_day=day, price_segment=segment, price_tier=tier)
        .values(*keys, "model", "price_day", "price_segment", "price_tier")
        .annotate(
            sum_input=Sum("input_tokens"),
            sum_output=Sum("output_tokens"),
            sum_cache_read=Sum("cache_read_tokens"),
            sum_cache_write=Sum("cache_write_tokens"),
            sum_reasoning=Sum("reasoning_tokens"),
            requests=Count("id"),
        )
    )
    for row in rows:
        tokens = Tokens(
            row["sum_input"] or 0,
            row["sum_output"] or 0,
            row["sum_cache_read"] or 0,
            row["sum_cache_write"] or 0,
            row["sum_reasoning"] or 0,
        )
        model = row["model"]
        price_day = row["price_day"]
        if isinstance(price_day, datetime):
            price_day = price_day.date()
        rates = _rates(model, *_representative(price_day, row["price_segment"], row["price_tier"]))
        yield (
            tuple(row[key] for key in keys),
            Totals(
                tokens=tokens,
                usd=Decimal(0) if rates is None else rates.cost(tokens, row["requests"]),
                unknown=() if rates is not None else (model,),
                models=(model,),
                steps=row["requests"],
            ),
        )


def _price_expressions() -> tuple[Any, Any, Any]:
    """What puts a step in its price group: its UTC day, its time-of-day segment and its
    size tier (the table's boundaries, `_boundaries`)."""
    tiers, seconds = _boundaries()
    prompt = F("input_tokens") + F("cache_read_tokens") + F("cache_write_tokens")
    tier = Case(
        *(
            When(GreaterThan(prompt, start), then=Value(n))
            for n, start in reversed(list(enumerate(tiers, 1)))
        ),
        default=Value(0),
        output_field=IntegerField(),
    )
    day, second = _utc_day_and_second()
    segment = Case(
        *(
            When(GreaterThanOrEqual(second, boundary), then=Value(n))
            for n, boundary in reversed(list(enumerate(seconds, 1)))
        ),
        default=Value(0),
        output_field=IntegerField(),
    )
    return day, segment, tier


@functools.cache
def _price_columns(vendor: str, time_zone: str | None) -> tuple[RawSQL, ...]:
    """The price group's columns as the SQL Django writes for them (`_price_expressions`),
    written once per kind of database: compiling their dozens of CASE branches cost
    more than running the query, on every page."""
    names = ("day", "segment", "tier")
    query = (
        UsageRecord.objects.annotate(**dict(zip(names, _price_expressions(), strict=True)))
        .values(*names)
        .query
    )
    compiler = query.get_compiler(connection=connection)
    outputs: tuple[Field[Any, Any], ...] = (DateField(), IntegerField(), IntegerField())
    columns = []
    for name, output in zip(names, outputs, strict=True):
        sql, params = compiler.compile(query.annotations[name])
        columns.append(RawSQL(sql, params, output_field=output))
    return tuple(columns)


def _utc_day_and_second() -> tuple[Any, Any]:
    """Expressions of a step's UTC day and second of the day.

    Django computes both on SQLite with a Python function per row, which made a long
    tab's totals cost a fifth of a second; SQLite keeps a datetime as UTC text
    ("YYYY-MM-DD HH:MM:SS.ffffff", when the connection's time zone is UTC, the
    default), which SQL reads for a hundredth of that. Elsewhere the database's own
    functions are as cheap."""
    if connection.vendor == "sqlite" and connection.timezone_name == "UTC":
        text = "%(expressions)s"
        day = Func(F("created_at"), template=f"substr({text}, 1, 10)", output_field=DateField())
        second = Func(
            F("created_at"),
            template=(
                f"(CAST(substr({text}, 12, 2) AS INTEGER) * 3600"
                f" + CAST(substr({text}, 15, 2) AS INTEGER) * 60"
                f" + CAST(substr({text}, 18, 2) AS INTEGER))"
            ),
            output_field=IntegerField(),
        )
        return day, second
    utc_second = (
        ExtractHour("created_at", tzinfo=UTC) * 3600
        + ExtractMinute("created_at", tzinfo=UTC) * 60
        + ExtractSecond("created_at", tzinfo=UTC)
    )
    return TruncDate("created_at", tzinfo=UTC), utc_second


def _sum_by(groups: Iterable[tuple[tuple[Any, ...], Totals]]) -> dict[tuple[Any, ...], Totals]:
    sums: dict[tuple[Any, ...], Totals] = {}
    for key, totals in groups:
        sums[key] = sums[key] + totals if key in sums else totals
    return sums


def turn_totals(
    tab_id: uuid.UUID,
    turn_ids: Iterable[uuid.UUID],
    *,
    tree: tuple[uuid.UUID, ...] | None = None,
) -> dict[uuid.UUID, Totals]:
    """The totals of each of these turns in this tab (one query), with the turns of the
    sub-agents their `agent` calls started (their children's first turns). A turn a branch
    copied from its parent was paid for there: its steps belong to the parent's tab.
    `tree`: the tab's `_tree` when the caller has it (a tab alone in it has no child turns
    to look for)."""
    turn_ids = set(turn_ids)
    if not turn_ids:
        return {}
    # A child's turn (its tab, its turn) -> the parent's turn whose call started it.
    owned = {(tab_id, turn): turn for turn in turn_ids}
    if tree is None or len(tree) > 1:
        owned |= _child_turns(tab_id, turn_ids)
    # By turn only, grouped by tab too: filtered on both, SQLite walks the whole tab's
    # records by their tab index instead of the few turns' by theirs.
    records = UsageRecord.objects.filter(turn_id__in={turn for _, turn in owned})
    totals: dict[uuid.UUID, Totals] = {}
    for key, sums in _sum_by(_priced_groups(records, "tab_id", "turn_id")).items():
        if (turn := owned.get(key)) is not None:
            totals[turn] = totals[turn] + sums if turn in totals else sums
    return totals


def _child_turns(
    tab_id: uuid.UUID, turn_ids: set[uuid.UUID]
) -> dict[tuple[uuid.UUID, uuid.UUID], uuid.UUID]:
    """{(descendant tab, its turn): the turn of this tab} for the children these turns'
    `agent` calls made (chat.turn.agents), their children's, and so on down the tree: the turn
    of each child's prompt is its call's work, and a grandchild's is its parent's."""
    owned: dict[tuple[uuid.UUID, uuid.UUID], uuid.UUID] = {}
    # The level's turns (any tab's: turn ids are unique) -> the turn of tab_id they count for.
    level = {turn: turn for turn in turn_ids}
    while level:
        calls = Chunk.objects.filter(
            turn_id__in=level, type=Kind.TOOL_CALL, data__name="agent"
        ).values_list("tab_id", "data__call_id", "seq", "turn_id")
        by_tab: dict[uuid.UUID, list[tuple[str, int, uuid.UUID]]] = {}
        for tab, call_id, seq, turn in calls:
            # Filtered on turn_id__in: never a turn-less chunk.
            by_tab.setdefault(tab, []).append((call_id, seq, cast(uuid.UUID, turn)))
        kids = {}
        for tab, rows in by_tab.items():
            made = agent_children(tab, [(call_id, seq) for call_id, seq, _ in rows])
            for call_id, seq, turn in rows:
                if (child := made.get((call_id, seq))) is not None:
                    kids[child] = level[turn]
        if not kids:
            break
        starts = Chunk.objects.filter(
            tab_id__in=kids, role=Role.USER, data__origin__kind=OriginKind.AGENT
        ).values_list("tab_id", "turn_id")
        level = {}
        for child, turn in starts:
            if turn is not None and (child, turn) not in owned:
                owned[child, turn] = level[turn] = kids[child]
    return owned


def _tree(tab_id: uuid.UUID) -> tuple[uuid.UUID, ...]:
    """The tab and its sub-agents' tabs, theirs, and so on down (chat.turn.agents)."""
    tabs, level = [tab_id], [tab_id]
    while level:
        level = [
            pk
            for pk in Tab.objects.filter(parent_tab_id__in=level).values_list("pk", flat=True)
            if pk not in tabs
        ]
        tabs.extend(level)
    return tuple(tabs)


def tab_totals(tab_id: uuid.UUID, *, tree: tuple[uuid.UUID, ...] | None = None) -> Totals:
    """Everything the tab's own turns used, and its sub-agents' tabs (chat.turn.agents), theirs
    and so on down.

    Every page of the tab shows them, and a tab of ten thousand turns has as many
    records to sum (tens of milliseconds): the sum is kept per process until the
    tab's records change, which one cheap query on their index tells (their count
    and last id; records are only ever added or deleted, never changed). `tree`: the tab's
    `_tree`, when the caller has it."""
    tabs = tree or _tree(tab_id)
    version = UsageRecord.objects.filter(tab_id__in=tabs).aggregate(n=Count("id"), last=Max("id"))
    if not version["n"]:
        return Totals()
    return _tab_totals_at(tabs, version["n"], version["last"])


@functools.lru_cache(maxsize=TAB_TOTALS_CACHE_SIZE)
def _tab_totals_at(tabs: tuple[uuid.UUID, ...], count: int, last_id: int) -> Totals:
    records = UsageRecord.objects.filter(tab_id__in=tabs, id__lte=last_id)
    return _sum_by(_priced_groups(records)).get((), Totals())


def turn_end(tab_id: uuid.UUID, turn_id: uuid.UUID) -> dict[str, Any]:
    """What a turn's end tells the page: the turn's totals and the tab's (JSON)."""
    turn_id = uuid.UUID(str(turn_id))
    # Read once for both: a tab without sub-agents (nearly all) then has no child turns to
    # look for.
    tree = _tree(tab_id)
    turn = turn_totals(tab_id, [turn_id], tree=tree).get(turn_id, Totals())
    tab = tab_totals(tab_id, tree=tree)
    return {"turn_id": str(turn_id), "turn": turn.as_dict(), "tab": tab.as_dict()}


@dataclass(frozen=True)
class UserModelRow:
    user: str
    model: str
    totals: Totals


def by_user_and_model(records: QuerySet) -> tuple[list[UserModelRow], Totals]:
    """These steps' totals per user and model (one query), most expensive first, and
    the sum of all of them. A deleted user's steps are under "(deleted user)"."""
    sums = _sum_by(_priced_groups(records, "user__username", "model"))
    rows = [
        UserModelRow(user or "(deleted user)", model, totals)
        for (user, model), totals in sums.items()
    ]
    rows.sort(key=lambda r: (-r.totals.usd, r.totals.priced, -r.totals.tokens.prompt, r.user))
    total = sum((row.totals for row in rows), Totals())
    return rows, total
