"""Context management on the page (issue 16): the context meter beside the status line,
the compaction notice with its summary, the elide and failure notices, "Summarise up to
here" on a live answer, a queued compaction. chat.render only; the views are in
tests/test_compaction_views.py, Chromium in tests/test_compaction_browser.py."""

from __future__ import annotations

import uuid

import pytest

from chat import render
from chat.render import context_meter, fragment_queued, fragment_seal, fragment_status, fragments
from tests.ui_helpers import block, parse, top

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")
# chat.context.Meter.as_dict() of a Claude tab after a request of 45,123 tokens.
METER = {
    "used": 45_123,
    "window": 200_000,
    "window_known": True,
    "cached": 0.9234,
    "compact_at": 150_000,
    "estimated": False,
    "share": 0.2256,
}
HOSTILE = (
    "## State\n\n<script>alert(1)</script> <img src=x onerror=alert(2)>\n\n"
    "[link](javascript:alert(3)) **kept**\n\n```python\nprint('hi')\n```\n"
)


def meter_node(frame: str):
    return parse(frame).by_id("context-meter")


def by_class(node, name: str):
    return [n for n in node.iter() if name in n.classes]


def text_of(node, name: str) -> str:
    found = by_class(node, name)
    return found[0].text if found else ""


# --- The meter -------------------------------------------------------------------------------


def test_the_meter_shows_used_over_window_the_cached_share_and_the_compaction_tick():
    """45,123 of 200,000 with 92% of the input cached: "Context 45.1k/200k", a bar filled to
    22.56 of 100 with its tick at 75 (compaction at 150k), exact figures in the title."""
    node = meter_node(fragment_status({"state": "idle", "context": METER}))
    assert node.get("hx-swap-oob") == "true"
    assert "hidden" not in node.attrs
    assert node.classes == {"ctx"}
    assert text_of(node, "ctx-label") == "Context"
    assert (text_of(node, "ctx-used"), text_of(node, "ctx-window")) == ("45.1k", "200k")
    assert text_of(node, "ctx-cached") == "92% cached"
    assert not by_class(node, "ctx-note") and not by_class(node, "ctx-q")
    [fill] = by_class(node, "ctx-fill")
    [tick] = by_class(node, "ctx-tick")
    assert fill.get("width") == "22.56"
    assert tick.get("x1") == tick.get("x2") == "75.0"
    assert node.get("title") == (
        "Context: 45,123 of 200,000 tokens (23%); the last request read 92% of its input "
        "from the prompt cache. The conversation is compacted when a turn would start "
        "above 150,000 tokens (75%)."
    )


def test_an_estimate_says_so_and_has_no_cached_share():
    """After a compaction the size is an estimate until the next request: "≈", no cached
    share (an estimate read nothing from a cache), a fainter bar."""
    meter = {**METER, "used": 12_000, "cached": 0.0, "estimated": True}
    node = meter_node(fragment_status({"state": "running", "context": meter}))
    assert text_of(node, "ctx-used") == "≈12k"
    assert not by_class(node, "ctx-cached")
    assert "estimated" in node.classes
    assert "about 12,000 of 200,000 tokens (6%), estimated since the compaction" in node.get(
        "title"
    )


def test_an_unknown_window_is_said_in_words_and_in_a_short_form():
    """A model the registry does not know: the assumed window, "window unknown: assuming
    128k" (app.css hides it on a phone, which shows the "?" after the window instead)."""
    meter = {**METER, "window": 128_000, "window_known": False, "compact_at": 96_000}
    node = meter_node(fragment_status({"state": "idle", "context": meter}))
    assert text_of(node, "ctx-window") == "128k"
    assert text_of(node, "ctx-q") == "?"
    assert text_of(node, "ctx-note") == "window unknown: assuming 128k"
    assert node.get("title").endswith(
        "This model's context window is unknown: assuming 128,000 tokens."
    )


def test_past_the_compaction_point_the_meter_is_marked_near():
    node = meter_node(fragment_status({"state": "idle", "context": {**METER, "used": 150_000}}))
    assert "near" in node.classes
    [fill] = by_class(node, "ctx-fill")
    assert fill.get("width") == "75.0"


def test_a_tab_with_nothing_sent_yet_shows_its_window():
    node = meter_node(fragment_status({"state": "idle", "context": {**METER, "used": 0}}))
    assert (text_of(node, "ctx-used"), text_of(node, "ctx-window")) == ("0", "200k")
    assert not by_class(node, "ctx-cached")
    assert node.get("title").startswith("Context: nothing sent yet; the window is 200,000")


def test_a_status_without_a_meter_leaves_the_one_on_the_page():
    """The runner's first status of a turn, or a tab whose model id is unusable: the frame
    carries no meter element, so the page keeps the last one it was sent."""
    for status in ({"state": "running"}, {"state": "idle", "context": None}):
        assert meter_node(fragment_status(status)) is None


def test_a_page_without_a_meter_has_a_hidden_place_for_one():
    """The page render always has #context-meter, where a later frame's goes."""
    html = fragments.render_partial("meter", {"s": render.status_context({"state": "idle"})})
    [node] = top(html)
    assert node.get("id") == "context-meter"
    assert "hidden" in node.attrs and node.get("hx-swap-oob") is None
    assert node.text == ""


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "45k",
        [],
        {},
        {**METER, "window": 0},
        {**METER, "window": True},
        {**METER, "window": "200000"},
        {**METER, "window": -5},
    ],
)
def test_a_meter_without_a_usable_window_is_no_meter(raw):
    assert context_meter(raw) is None


def test_bad_figures_in_a_meter_are_read_safely():
    """Negative or non-numeric counts are 0, a share outside 0..1 is no share, a compaction
    point past the window is the window's end, and the bar never overflows."""
    meter = context_meter(
        {**METER, "used": 900_000, "cached": 7, "compact_at": 10**9, "estimated": "yes"}
    )
    assert meter["fill"] == 100 and meter["tick"] == 100
    assert meter["cached"] == 0 and meter["estimated"] is False
    meter = context_meter({"window": 1000, "used": -3, "cached": True, "window_known": None})
    assert (meter["used"], meter["cached"], meter["window_known"]) == ("0", None, True)


# --- The status while compacting -------------------------------------------------------------


def test_compacting_has_its_label_and_a_stop_button():
    frame = parse(fragment_status({"state": "compacting", "turn_id": str(TURN)}))
    status = frame.by_id("status")
    assert status.get("data-state") == "compacting"
    assert "Compacting the conversation…" in status.text
    [stop] = frame.by_id("composer-actions").children
    assert (stop.get("form"), stop.get("value")) == ("stop-form", str(TURN))


# --- The compaction notice -------------------------------------------------------------------


def compaction(**data):
    fields = {
        "summary": "The user wants **tests**.",
        "through_seq": 42,
        "model": "anthropic/claude-sonnet-4-5",
        "trigger": "auto",
        "tokens_before": 150_123,
        **data,
    }
    return block("compaction", {k: v for k, v in fields.items() if v is not None},
                 role="system", turn_id=TURN, seq=43)  # fmt: skip


def notice(frame: str):
    [wrapper] = top(frame)
    assert wrapper.get("hx-swap-oob") == "beforeend:#log"
    [chunk] = wrapper.children
    return chunk


def test_a_compaction_is_a_thin_notice_that_opens_to_its_summary():
    b = compaction(instructions="the  failing\ntests")
    chunk = notice(fragment_seal(b))
    assert chunk.get("id") == f"chunk-{b.id}" and chunk.get("data-seq") == "43"
    # Never part of a bubble: a compaction inside a turn splits it.
    assert {"chunk", "t-compaction", "alone"} <= chunk.classes and "a" not in chunk.classes
    [details] = [n for n in chunk.children if n.tag == "details"]
    assert "open" not in details.attrs
    summary = details.children[0]
    assert summary.tag == "summary"
    assert summary.text == "Conversation compacted · auto · 150.1k tokens summarised · up to #42"
    body = next(n for n in details.children if "md" in n.classes)
    assert [n.tag for n in body.iter()][1:] == ["p", "strong"]
    note = text_of(details, "meta")
    assert "Written by anthropic/claude-sonnet-4-5." in note
    assert note.endswith("Focus: the failing tests")
    # Copy summary copies its Markdown (app.js: the chunk's template.src).
    assert [n.get("data-copy") for n in by_class(details, "act-copy")] == ["md"]
    [src] = [n for n in chunk.children if n.tag == "template"]
    assert src.text == "The user wants **tests**."


def test_a_manual_compaction_without_counts_says_what_it_knows():
    chunk = notice(fragment_seal(compaction(trigger="manual", tokens_before=None)))
    assert text_of(chunk, "sys-text") == "manual · up to #42"


def test_odd_compaction_data_is_left_out_of_its_line():
    chunk = notice(
        fragment_seal(compaction(trigger="<b>x</b>", tokens_before=True, through_seq="42"))
    )
    [summary] = [n for n in chunk.iter() if n.tag == "summary"]
    assert summary.text == "Conversation compacted"


def test_a_hostile_summary_is_sanitised_as_an_answer_is():
    """The summary is model output: raw HTML is text, no script, no handler, no
    javascript: link, and its code block is highlighted as an answer's."""
    frame = fragment_seal(compaction(summary=HOSTILE))
    assert "<script" not in frame and "<img" not in frame
    body = next(n for n in notice(frame).iter() if "md" in n.classes)
    assert not any(n.tag in ("script", "img", "iframe") for n in body.iter())
    assert not any(name.startswith("on") for n in body.iter() for name in n.attrs)
    assert not any("javascript:" in (n.get("href") or "") for n in body.iter())
    assert "<script>alert(1)</script>" in body.text
    assert [n.tag for n in body.children] == ["h2", "p", "p", "div"]
    assert any(n.tag == "span" and n.classes == {"nb"} for n in body.iter())  # print()


def test_a_compaction_turns_usage_line_is_outside_the_fold():
    """A compaction asked for is a turn of its own: its usage line (the summary request's
    tokens) goes at the end of the notice, where chat.render.usage_target puts it live."""
    items = render.group([compaction()])
    render.mark_usage(items, {TURN: render.Totals.from_dict({"steps": 1, "input": 10})})
    chunk = notice(fragments.insert(items))
    assert chunk.children[-1].get("id") == f"usage-{TURN}"
    assert chunk.children[-1].tag == "details" and "turn-usage" in chunk.children[-1].classes


# --- Other context notices -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "label"),
    [("elide", "Context trimmed"), ("compaction-failed", "Compaction failed")],
)
def test_context_notices_have_their_labels_and_text(kind, label):
    text = "Removed 3 old tool outputs (48,213 characters) <b>from</b> what the model is sent."
    b = block("system", {"kind": kind, "text": text, "seqs": [4, 9], "chars": 48_213},
              role="system", turn_id=TURN, seq=50)  # fmt: skip
    chunk = notice(fragment_seal(b))
    assert {"t-system", "a", f"kind-{kind}"} <= chunk.classes
    assert text_of(chunk, "sys-kind") == label
    assert text_of(chunk, "sys-text") == text  # escaped: no <b> element
    assert not any(n.tag == "b" for n in chunk.iter())


# --- "Summarise up to here" and the queue ----------------------------------------------------


def compact_buttons(node):
    return [n for n in node.iter() if n.tag == "button" and n.get("form") == "compact-form"]


def test_a_live_answer_offers_summarise_up_to_here_where_it_ends_its_turn():
    """A live fragment does not know whether its answer ends the turn: the button is
    marked if-end, which app.css shows where the next chunk starts a turn or the tab is
    idle (as "Branch from here")."""
    answer = block("text", {"text": "Done."}, turn_id=TURN, seq=7)
    [button] = compact_buttons(notice(fragment_seal(answer)))
    assert (button.get("name"), button.get("value")) == ("seq", "7")
    assert button.get("type") == "submit"
    assert {"act", "act-compact", "if-end"} <= button.classes
    assert button.text == "Summarise up to here"


@pytest.mark.parametrize(
    ("type", "role", "data"),
    [
        ("text", "user", {"text": "hi"}),
        ("thinking", "assistant", {"text": "hmm"}),
        ("tool_call", "assistant", {"call_id": "c", "name": "shell", "arguments": {}}),
        ("error", "assistant", {"message": "Overloaded"}),
    ],
)
def test_summarise_up_to_here_is_only_on_answers(type, role, data):
    b = block(type, data, role=role, turn_id=TURN, seq=3)
    assert compact_buttons(parse(fragment_seal(b))) == []


def test_an_open_or_unsequenced_answer_offers_no_compaction():
    assert compact_buttons(parse(render.fragment_open(block("text", {"text": "Do"})))) == []


def test_a_queued_compaction_says_it_waits_for_the_turn():
    [wrapper] = top(fragment_queued(5, "Compact the conversation (everything)", compact=True))
    [item] = wrapper.children
    assert item.get("id") == "queued-5" and "compact" in item.classes
    assert text_of(item, "meta") == "Queued · runs once no turn is running"
    [wrapper] = top(fragment_queued(6, "a message"))
    assert text_of(wrapper.children[0], "meta") == "Queued · the agent reads it at its next step"
    assert "compact" not in wrapper.children[0].classes


def test_the_status_queue_marks_compactions():
    status = {
        "state": "idle",
        "queued": [
            {"id": 1, "text": "Compact the conversation (everything)", "compact": True},
            {"id": 2, "text": "and then this"},
        ],
    }
    queue = parse(fragment_status(status)).by_id("queued")
    assert [("compact" in li.classes, text_of(li, "meta")) for li in queue.children] == [
        (True, "Queued · runs once no turn is running"),
        (False, "Queued · the agent reads it at its next step"),
    ]
