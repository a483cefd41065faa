"""chat/context.py: sizes, the meter, the triggers, where a compaction cuts, the
summary's question, elision. Pure: table-driven, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from chat import context
from chat.providers.base import DocumentPart, ImagePart, ProviderError, TextPart, ToolSpec
from chat.providers.base import Message as Msg
from chat.stream import Block

T1, T2, T3, T4 = (uuid.UUID(int=n) for n in range(1, 5))


def chunk(seq, turn, role, type, **data):
    return Block(uuid.uuid4(), turn, 1, role, type, data, seq)


def user(seq, turn, text="q"):
    return chunk(seq, turn, "user", "text", text=text)


def answer(seq, turn, text="a"):
    return chunk(seq, turn, "assistant", "text", text=text)


def call(seq, turn, call_id="c1", name="shell"):
    return chunk(seq, turn, "assistant", "tool_call", call_id=call_id, name=name, arguments={})


def result(seq, turn, text="ok", call_id="c1", name="shell"):
    return chunk(seq, turn, "tool", "tool_result", call_id=call_id, name=name, result=text)


def notice(seq, turn, kind="notice"):
    return chunk(seq, turn, "system", "system", kind=kind, text="n")


# --- Size ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, context.Size()),
        ("50k", context.Size()),
        ({}, context.Size()),
        (
            {"input": 10, "cache_read": 90, "cache_write": 5, "output": 7, "at": "x"},
            context.Size(10, 90, 5, 7, "x"),
        ),
        # Hostile or broken values are "unknown", never a crash or a negative size.
        ({"input": -5, "cache_read": "9", "output": True, "at": 3}, context.Size()),
        ({"input": 1.5, "estimated": "yes"}, context.Size()),
        ({"input": 100, "estimated": True}, context.Size(100, estimated=True)),
    ],
)
def test_size_from_stored_json(raw, expected):
    assert context.Size.from_dict(raw) == expected


def test_size_round_trips_and_adds_up():
    size = context.Size(10, 90, 5, 7, "2026-01-01T00:00:00+00:00")
    assert context.Size.from_dict(size.as_dict()) == size
    assert (size.prompt, size.next, size.known) == (105, 112, True)
    assert not context.Size().known


# --- Windows and the meter -------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "window", "known"),
    [
        ("anthropic/claude-sonnet-4-5", 200_000, True),
        ("openai/gpt-4.1", 1_047_576, True),
        ("deepseek/deepseek-chat", 128_000, True),
        # Not in the registry: a conservative default per provider, marked unknown.
        ("anthropic/claude-next-9", 200_000, False),
        ("openai/some-local-model", context.UNKNOWN_WINDOW, False),
        ("deepseek/deepseek-future", context.UNKNOWN_WINDOW, False),
        # No provider serves it: its requests fail; the meter still has a window.
        ("scripted/test", context.UNKNOWN_WINDOW, False),
        ("nonsense", context.UNKNOWN_WINDOW, False),
    ],
)
def test_window(model, window, known):
    assert context.window(model) == (window, known)


def test_meter_reports_used_cached_share_and_the_compaction_point():
    meter = context.meter(context.Size(1_000, 90_000, 9_000, 2_000), "anthropic/x")
    assert meter.used == 102_000
    assert meter.window == 200_000 and not meter.window_known
    assert meter.cached == 0.9
    assert meter.compact_at == 150_000
    assert meter.as_dict()["share"] == 0.51
    assert not meter.estimated


def test_meter_of_nothing_and_of_an_overfull_context():
    empty = context.meter(context.Size(), "deepseek/deepseek-chat")
    assert (empty.used, empty.cached, empty.share) == (0, 0.0, 0.0)
    full = context.meter(context.Size(500_000), "deepseek/deepseek-chat")
    assert full.share == 1.0 and full.used == 500_000


# --- Triggers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "at_start", "mid_turn"),
    [
        (0, False, False),
        (74_999, False, False),
        (75_000, True, False),
        (89_999, True, False),
        (90_000, True, True),
        (150_000, True, True),
    ],
)
def test_thresholds(tokens, at_start, mid_turn):
    size = context.Size(input=tokens)
    assert context.due_at_turn_start(size, 100_000) is at_start
    assert context.overflowing(size, 100_000) is mid_turn


def test_output_of_the_last_request_counts_towards_the_next():
    size = context.Size(input=70_000, output=5_000)
    assert context.due_at_turn_start(size, 100_000)


NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("at", "cold"),
    [
        ("", True),
        ("not a time", True),
        ((NOW - timedelta(seconds=10)).isoformat(), False),
        ((NOW - timedelta(seconds=context.CACHE_LIFETIME)).isoformat(), False),
        ((NOW - timedelta(seconds=context.CACHE_LIFETIME + 1)).isoformat(), True),
    ],
)
def test_cache_cold(at, cold):
    assert context.cache_cold(context.Size(100, at=at), NOW) is cold


@pytest.mark.parametrize(
    ("status", "error_type", "message", "overflow"),
    [
        (400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000", True),
        (400, "context_length_exceeded", "This model's maximum context length is 128000", True),
        (400, None, "Please reduce the length: maximum context length is 8192 tokens", True),
        (413, None, "request exceeds the context window", True),
        (
            400,
            "invalid_request_error",
            "input length and `max_tokens` exceed context limit: 170000 + 32000 > 200000",
            True,
        ),
        (400, "invalid_request_error", "messages: roles must alternate", False),
        (429, "rate_limit_error", "too many tokens per minute", False),
        (500, None, "prompt is too long", False),
        (None, None, "context window", False),
    ],
)
def test_is_overflow(status, error_type, message, overflow):
    error = ProviderError(message, status_code=status, error_type=error_type)
    assert context.is_overflow(error) is overflow


# --- Where a compaction cuts -----------------------------------------------------------


def log_of_turns(sizes):
    """One turn per size: a question, an answer of `size` characters."""
    chunks, seq = [], 0
    for n, size in enumerate(sizes):
        turn = uuid.UUID(int=n + 1)
        chunks += [user(seq + 1, turn), answer(seq + 2, turn, "x" * size)]
        seq += 2
    return chunks


@pytest.mark.parametrize(
    ("sizes", "window", "through"),
    [
        # Budget: (0.25 - 0.05) * 1000 tokens * 4 chars = 800 characters kept.
        ([100, 100, 100, 100], 1000, 2),  # keeps the last three (~300 chars each side)
        ([900, 100, 100], 1000, 2),  # keeps the two small ones
        ([100, 100, 900], 1000, 6),  # the last turn alone is too big: summarise all
        ([100], 1000, 2),  # one turn: summarised whole
        ([100, 100], 1_000_000, 2),  # all would fit, but at least one turn is summarised
    ],
)
def test_plan_through_keeps_recent_whole_turns_within_the_target(sizes, window, through):
    assert context.plan_through(log_of_turns(sizes), window) == through


def test_plan_through_keeping_the_current_turn():
    chunks = log_of_turns([100, 100, 100])
    assert context.plan_through(chunks, 1000, keep_current=True) == 4
    assert context.plan_through(chunks[-2:], 1000, keep_current=True) is None


def test_plan_through_ignores_turns_of_notices_only_and_needs_something_sent():
    assert context.plan_through([], 1000) is None
    assert context.plan_through([notice(1, T1), notice(2, T2)], 1000) is None
    chunks = [user(1, T1), answer(2, T1), notice(3, T2), user(4, T3), answer(5, T3)]
    # The notice-only turn is neither kept nor a cut point of its own.
    assert context.plan_through(chunks, 1000, keep_current=True) == 2


def test_turn_end_and_last_sendable():
    chunks = [user(5, T1), call(6, T1), result(7, T1), answer(8, T1), user(9, T2), answer(10, T2)]
    assert context.turn_end(chunks, 6) == 8
    assert context.turn_end(chunks, 5) == 8
    assert context.turn_end(chunks, 10) == 10
    assert context.turn_end(chunks, 4) is None  # before the view: already summarised
    assert context.turn_end(chunks, 11) is None
    assert context.turn_end([notice(3, T1)], 3) is None
    assert context.last_sendable(chunks) == 10
    assert context.last_sendable([notice(3, T1)]) is None


# --- The question ------------------------------------------------------------------


def test_ask_names_what_stays_and_the_focus():
    plain = context.ask()
    assert plain == context.ASK and "Do not call any tools" in plain
    long = "Fix the   parser\nplease " + "x" * 300
    asked = context.ask("  the parser bug ", long)
    assert 'begins "Fix the parser please xxx' in asked
    assert "…" in asked and len(asked) < len(plain) + 400
    assert asked.endswith("Focus the summary on: the parser bug")


def test_kept_from_is_the_first_message_after_the_cut():
    chunks = [user(1, T1, "one"), answer(2, T1), notice(3, T2), user(4, T2, "two"), answer(5, T2)]
    assert context.kept_from(chunks, 2) == "two"
    assert context.kept_from(chunks, 5) is None
    # A turn without a message of its own (a rerun) does not start with the user's words.
    assert context.kept_from([user(1, T1), answer(2, T1), answer(3, T2)], 2) is None


# --- Elision ---------------------------------------------------------------------------


def test_plan_elision_takes_bulky_results_outside_the_last_turns():
    big, small = "y" * context.ELIDE_MIN_CHARS, "y" * (context.ELIDE_MIN_CHARS - 1)
    chunks = [
        user(1, T1),
        call(2, T1),
        result(3, T1, big),
        call(4, T1, "c2"),
        result(5, T1, small, "c2"),
        user(6, T2),
        call(7, T2),
        result(8, T2, big),
        user(9, T3),
        call(10, T3),
        result(11, T3, big),
        user(12, T4),
        answer(13, T4),
    ]
    assert context.plan_elision(chunks) == [3, 8]
    assert context.plan_elision(chunks, elided=[3]) == [8]
    assert context.elided_chars(chunks, [3, 8]) == 2 * len(big)
    # Live output sealed before its result (no "result") is never a candidate.
    live = chunk(3, T1, "tool", "tool_result", call_id="c1", name="shell", shell_output=big)
    assert context.plan_elision([user(1, T1), call(2, T1), live, *chunks[5:]]) == [8]


def test_sentinel_says_what_was_removed():
    assert context.sentinel("shell", 48213) == (
        "[output of shell, 48,213 chars, removed to save context; re-run if needed]"
    )


def test_estimate_counts_every_part_of_the_request():
    tools = (ToolSpec("shell", "Run a command", {"type": "object"}),)
    messages = [Msg("user", (TextPart("x" * 400),))]
    bare = context.estimate("", (), messages)
    assert bare == 100
    assert context.estimate("s" * 40, tools, messages) > bare + 10


def test_attachments_weigh_in_the_estimates():
    photo = {
        "sha256": "a" * 64,
        "name": "p.png",
        "mime": "image/png",
        "width": 1500,
        "height": 1000,
    }
    pdf = {"sha256": "b" * 64, "name": "d.pdf", "mime": "application/pdf", "pages": 10}
    message = chunk(1, T1, "user", "text", text="look", attachments=[photo, pdf, "junk", {}])
    # 1500 x 1000 / 750 = 2000 tokens; 10 pages x 2000 tokens; 4 characters a token.
    assert context.chunk_chars(message) == 4 + (2_000 + 20_000) * 4 + 2_000 * 4
    image = ImagePart("a" * 64, "p.png", "image/png", 1500, 1000, "uploads/p.png")
    document = DocumentPart("b" * 64, "d.pdf", "application/pdf", 10, 10, "uploads/d.pdf")
    messages = [Msg("user", (image, document))]
    assert context.estimate("", (), messages) == 22_000
