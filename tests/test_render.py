"""chat.render: the exact structure of every live fragment, markdown, and grouping."""

from __future__ import annotations

import uuid

import pytest

from chat import render
from chat.render import (
    approve_key,
    fragment_chunks,
    fragment_delta,
    fragment_open,
    fragment_queued,
    fragment_seal,
    fragment_status,
    fragment_taken,
    group,
    markdown,
    slot_key,
    stream_text,
)
from tests.ui_helpers import block, parse, top

TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")


def only_child(node):
    assert len(node.children) == 1, [c.tag for c in node.children]
    return node.children[0]


# --- open / delta / seal ----------------------------------------------------------------


def test_it_opens_a_text_chunk_at_the_end_of_the_log():
    """An open text chunk is one element appended to #log, with no seq and an empty body."""
    b = block("text", {"text": ""}, turn_id=TURN)
    [wrapper] = top(fragment_open(b))
    assert wrapper.get("hx-swap-oob") == "beforeend:#log"
    assert wrapper.get("data-fallback") is None
    chunk = only_child(wrapper)
    assert chunk.get("id") == f"chunk-{b.id}"
    assert chunk.get("data-seq") == ""
    assert chunk.get("data-turn") == str(TURN)
    assert {"chunk", "a", "open", "t-text"} <= chunk.classes
    body = only_child(chunk)
    assert body.get("id") == f"body-{b.id}"
    assert body.text == ""


def test_it_opens_a_snapshot_with_the_text_so_far_escaped():
    """A plain body's snapshot (thinking, tool output; text is live Markdown) holds its
    text, escaped so the DOM keeps every code point."""
    b = block("thinking", {"text": "a<b>&\r\n\x00z"}, turn_id=TURN)
    html = fragment_open(b)
    assert f'<div class="body plain" id="body-{b.id}">a&lt;b&gt;&amp;&#13;\n&#xFFFD;z</div>' in html
    assert "<b>" not in html


def test_it_opens_thinking_as_a_details_element_with_a_body():
    """Open thinking is a closed <details> (the page applies the reader's setting) with a body."""
    b = block("thinking", {"text": "hmm"}, turn_id=TURN)
    [wrapper] = top(fragment_open(b))
    chunk = only_child(wrapper)
    assert chunk.tag == "details"
    assert "open" not in chunk.attrs and "data-seen" not in chunk.attrs
    assert {"open", "t-thinking"} <= chunk.classes
    assert chunk.by_id(f"body-{b.id}").text == "hmm"


def test_it_opens_a_tool_result_in_its_call_card():
    """Live shell output goes into the result slot of its call's card, else into the log."""
    call = block(
        "tool_call",
        {"call_id": "c/1", "name": "shell", "arguments": {"command": "ls"}},
        turn_id=TURN,
        seq=4,
    )
    out = block(
        "tool_result",
        {"call_id": "c/1", "name": "shell", "shell_output": "a\n"},
        role="tool",
        turn_id=TURN,
    )
    [card_wrapper] = top(fragment_seal(call))
    slot = next(n for n in card_wrapper.iter() if n.get("data-slot"))
    key = slot.get("data-slot")
    assert key == slot_key(TURN, 1, "c/1")

    [wrapper] = top(fragment_open(out))
    assert wrapper.get("hx-swap-oob") == f'beforeend:[data-slot="{key}"]'
    assert wrapper.get("data-fallback") == "#log"
    chunk = only_child(wrapper)
    assert chunk.get("id") == f"chunk-{out.id}"
    assert chunk.get("data-for") == key
    assert "has-result" not in chunk.classes
    term = chunk.by_id(f"body-{out.id}")
    assert term.text == "a\n" and "term" in term.classes


def test_it_appends_a_delta_as_escaped_text_to_the_body():
    """A delta is exactly one wrapper whose content is the escaped text, nothing around it."""
    chunk_id = uuid.uuid4()
    html = fragment_delta(chunk_id, 'x < y & "z"\n')
    assert html == (
        f'<div hx-swap-oob="beforeend:#body-{chunk_id}">x &lt; y &amp; &quot;z&quot;\n</div>'
    )


def test_it_seals_text_as_markdown_with_its_seq():
    """A sealed chunk has its seq, no open body id, and markdown in place of plain text."""
    b = block("text", {"text": "Hello **world**"}, turn_id=TURN, seq=7)
    [wrapper] = top(fragment_seal(b))
    assert wrapper.get("hx-swap-oob") == "beforeend:#log"
    chunk = only_child(wrapper)
    assert chunk.get("id") == f"chunk-{b.id}"
    assert chunk.get("data-seq") == "7"
    assert "open" not in chunk.classes
    assert chunk.by_id(f"body-{b.id}") is None
    md = chunk.children[0]  # then its source (for Copy) and its actions
    assert "md" in md.classes
    assert [n.text for n in md.find_all(lambda n: n.tag == "strong")] == ["world"]


def test_it_seals_thinking_with_its_duration():
    """Sealed thinking shows how long it took, and its text as markdown."""
    b = block("thinking", {"text": "step *one*", "duration_ms": 2500}, turn_id=TURN, seq=3)
    [wrapper] = top(fragment_seal(b))
    chunk = only_child(wrapper)
    assert chunk.tag == "details" and chunk.get("data-seq") == "3"
    summary = chunk.children[0]
    assert summary.tag == "summary" and "2.5 s" in summary.text
    assert chunk.find_all(lambda n: n.tag == "em")[0].text == "one"


def test_it_says_when_thinking_was_redacted():
    """Thinking with only redacted data says so instead of showing an empty box."""
    b = block("thinking", {"text": "", "redacted_data": "xyz"}, turn_id=TURN, seq=3)
    html = fragment_seal(b)
    assert "encrypted" in html and "xyz" not in html


def test_it_seals_a_tool_result_into_its_slot_with_output_and_result():
    """A sealed shell result keeps its terminal output, the result sent to the model, and flags."""
    b = block(
        "tool_result",
        {
            "call_id": "c1",
            "name": "shell",
            "result": "exit 1",
            "is_error": True,
            "shell_output": "boom\n",
            "truncated": True,
        },
        role="tool",
        turn_id=TURN,
        seq=9,
    )
    [wrapper] = top(fragment_seal(b))
    assert wrapper.get("hx-swap-oob") == f'beforeend:[data-slot="{slot_key(TURN, 1, "c1")}"]'
    chunk = only_child(wrapper)
    assert {"has-result", "is-error"} <= chunk.classes
    assert chunk.by_id(f"body-{b.id}") is None
    term = chunk.find_all(lambda n: "term" in n.classes)[0]
    assert term.text == "boom\n"
    assert "exit 1" in chunk.find_all(lambda n: "result" in n.classes)[0].text
    assert "cut to fit" in chunk.text


def test_it_shows_a_plain_error_result_in_error_style():
    """A failed non-shell result is shown with an error label."""
    b = block(
        "tool_result",
        {"call_id": "c1", "name": "read_file", "result": "No such file", "is_error": True},
        role="tool",
        turn_id=TURN,
        seq=9,
    )
    chunk = only_child(top(fragment_seal(b))[0])
    result = chunk.find_all(lambda n: "result" in n.classes)[0]
    assert "Error" in result.text and "No such file" in result.text


def test_it_renders_a_tool_call_card_with_name_and_arguments():
    """A call card shows the tool's name, a shell command as a terminal line, other args as JSON."""
    shell = block(
        "tool_call",
        {"call_id": "c1", "name": "shell", "arguments": {"command": "rm -rf <x>"}},
        turn_id=TURN,
        seq=2,
    )
    card = only_child(top(fragment_seal(shell))[0])
    assert card.get("data-call") == slot_key(TURN, 1, "c1")
    assert card.find_all(lambda n: "tool-name" in n.classes)[0].text == "shell"
    assert card.find_all(lambda n: "cmd" in n.classes)[0].text == "$ rm -rf <x>"
    assert not card.find_all(lambda n: "args" in n.classes)
    approve = card.find_all(lambda n: n.get("data-approve"))[0]
    assert approve.get("data-approve") == approve_key("c1") and approve.children == []

    write = block(
        "tool_call",
        {"call_id": "c2", "name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}},
        turn_id=TURN,
        seq=3,
    )
    card = only_child(top(fragment_seal(write))[0])
    assert card.find_all(lambda n: "args-summary" in n.classes)[0].text == "a.txt"
    args = [
        (a.children[0].text, a.children[1].text)
        for a in card.find_all(lambda n: "arg" in n.classes)
    ]
    assert args == [("path", "a.txt"), ("content", "hi")]


def test_it_shows_multiline_arguments_as_written():
    """A file's content is shown with its line breaks, not as an escaped JSON string."""
    content = "line 1\nline 2 <b>\n"
    call = block(
        "tool_call",
        {
            "call_id": "c2",
            "name": "write_file",
            "arguments": {"path": "a", "content": content, "mode": {"x": 1}},
        },
        turn_id=TURN,
        seq=3,
    )
    card = only_child(top(fragment_seal(call))[0])
    pres = card.find_all(lambda n: n.tag == "pre")
    assert [p.text for p in pres] == [content, '{\n  "x": 1\n}']


def test_it_hides_arguments_the_header_already_shows():
    """A call with one short argument shows it in the header only."""
    call = block(
        "tool_call",
        {"call_id": "c", "name": "list_files", "arguments": {"path": "src"}},
        turn_id=TURN,
        seq=1,
    )
    card = only_child(top(fragment_seal(call))[0])
    assert card.find_all(lambda n: "args-summary" in n.classes)[0].text == "src"
    assert not card.find_all(lambda n: "args" in n.classes)


def test_it_renders_an_error_as_a_card_with_its_status_code():
    """An error chunk is an alert card with the message and the HTTP status."""
    b = block(
        "error", {"message": "Rate limited <slow down>", "status_code": 429}, turn_id=TURN, seq=5
    )
    chunk = only_child(top(fragment_seal(b))[0])
    assert chunk.get("role") == "alert" and "t-error" in chunk.classes
    assert "429" in chunk.text and "Rate limited <slow down>" in chunk.text


def test_it_renders_system_chunks_in_a_turn_and_alone_differently():
    """A system chunk of a turn is a separator in its bubble; one without a turn stands alone."""
    inside = block(
        "system", {"kind": "cancelled", "text": "Stopped."}, role="system", turn_id=TURN, seq=5
    )
    alone = block(
        "system", {"kind": "config-reload", "text": "Reloaded."}, role="system", turn_id=None, seq=6
    )
    a = only_child(top(fragment_seal(inside))[0])
    b = only_child(top(fragment_seal(alone))[0])
    assert {"a", "t-system", "kind-cancelled"} <= a.classes and "alone" not in a.classes
    assert {"alone", "t-system"} <= b.classes and "a" not in b.classes
    assert "Stopped" in a.text and "Settings reloaded" in b.text


def test_it_renders_a_user_message_as_its_own_bubble():
    """The user's text is a 'user' chunk, never part of the assistant bubble."""
    b = block("text", {"text": "hi"}, role="user", turn_id=TURN, step=0, seq=1)
    chunk = only_child(top(fragment_seal(b))[0])
    assert "user" in chunk.classes and "a" not in chunk.classes


# --- batches -----------------------------------------------------------------------------


def test_it_nests_results_of_a_batch_in_the_cards_of_the_same_batch():
    """Catch-up: a call and its result arrive as one card; the rest follow in seq order."""
    call = block("tool_call", {"call_id": "c1", "name": "ls", "arguments": {}}, turn_id=TURN, seq=1)
    result = block(
        "tool_result",
        {"call_id": "c1", "name": "ls", "result": "a", "is_error": False},
        role="tool",
        turn_id=TURN,
        seq=2,
    )
    text = block("text", {"text": "done"}, turn_id=TURN, seq=3)
    [wrapper] = top(fragment_chunks([call, result, text]))
    assert wrapper.get("hx-swap-oob") == "beforeend:#log"
    assert [c.get("id") for c in wrapper.children] == [f"chunk-{call.id}", f"chunk-{text.id}"]
    slot = next(n for n in wrapper.children[0].iter() if n.get("data-slot"))
    assert [c.get("id") for c in slot.children] == [f"chunk-{result.id}"]


def test_it_sends_a_result_whose_call_is_not_in_the_batch_to_its_slot_in_order():
    """A result of an earlier call gets its own frame, between the chunks around it."""
    before = block("text", {"text": "a"}, turn_id=TURN, seq=4)
    result = block(
        "tool_result",
        {"call_id": "c1", "name": "ls", "result": "x", "is_error": False},
        role="tool",
        turn_id=TURN,
        seq=5,
    )
    after = block("text", {"text": "b"}, turn_id=TURN, seq=6)
    wrappers = top(fragment_chunks([before, result, after]))
    assert [w.get("hx-swap-oob") for w in wrappers] == [
        "beforeend:#log",
        f'beforeend:[data-slot="{slot_key(TURN, 1, "c1")}"]',
        "beforeend:#log",
    ]
    assert [only_child(w).get("data-seq") for w in wrappers] == ["4", "5", "6"]


def test_it_renders_an_empty_batch_as_nothing():
    """No chunks, no frame."""
    assert fragment_chunks([]) == ""


# --- grouping -----------------------------------------------------------------------------


def test_it_pairs_repeated_call_ids_with_the_first_unanswered_call():
    """Servers that repeat call ids: each result goes to the first call still without one."""
    calls = [
        block("tool_call", {"call_id": "", "name": n, "arguments": {}}, turn_id=TURN, seq=i)
        for i, n in ((1, "one"), (2, "two"))
    ]
    live = block(
        "tool_result",
        {"call_id": "", "name": "one", "shell_output": "..."},
        role="tool",
        turn_id=TURN,
        seq=3,
    )
    results = [
        block(
            "tool_result",
            {"call_id": "", "name": n, "result": n, "is_error": False},
            role="tool",
            turn_id=TURN,
            seq=i,
        )
        for i, n in ((4, "one"), (5, "two"))
    ]
    items = group([*calls, live, *results])
    assert [i.name for i in items] == ["one", "two"]
    assert [r.seq for r in items[0].results] == [3, 4]
    assert [r.seq for r in items[1].results] == [5]


def test_it_keeps_calls_of_different_steps_apart():
    """The same call id in two steps names two calls."""
    a = block(
        "tool_call", {"call_id": "c", "name": "ls", "arguments": {}}, turn_id=TURN, step=1, seq=1
    )
    ra = block(
        "tool_result",
        {"call_id": "c", "name": "ls", "result": "1", "is_error": False},
        role="tool",
        turn_id=TURN,
        step=1,
        seq=2,
    )
    b = block(
        "tool_call", {"call_id": "c", "name": "ls", "arguments": {}}, turn_id=TURN, step=2, seq=3
    )
    rb = block(
        "tool_result",
        {"call_id": "c", "name": "ls", "result": "2", "is_error": False},
        role="tool",
        turn_id=TURN,
        step=2,
        seq=4,
    )
    items = group([a, ra, b, rb])
    assert [[r.result for r in i.results] for i in items] == [["1"], ["2"]]


def test_it_marks_turn_starts_where_it_sees_the_chunk_before():
    """A chunk whose predecessor is of another turn starts a bubble; a page that begins
    mid-turn does not start its first one (app.css draws it partial); a page that begins
    the log does."""
    other = uuid.uuid4()
    chunks = [
        block("text", {"text": "a"}, turn_id=TURN, seq=1),
        block("text", {"text": "b"}, turn_id=TURN, seq=2),
        block("text", {"text": "c"}, turn_id=other, seq=3),
    ]
    assert [i.turn_start for i in group(chunks, continues=True)] == [False, False, True]
    assert [i.turn_start for i in group(chunks)] == [True, False, True]
    assert all("partial" not in i.css for i in group(chunks, continues=True))


def test_live_chunks_join_what_the_page_shows_before_them():
    """A live fragment carries its chunk's final classes: an assistant chunk continues the
    bubble before it (a turn opens with the user's message), so no page script has to
    regroup; inside a catch-up batch a new turn still starts a bubble."""
    text = block("text", {"text": "so far"}, turn_id=TURN)
    for frame in (fragment_open(text), fragment_seal(text)):
        chunk = only_child(top(frame)[0])
        assert "a" in chunk.classes and "turn-start" not in chunk.classes
    other = uuid.uuid4()
    batch = [
        block("text", {"text": "end of a turn"}, turn_id=TURN, seq=7),
        block("text", {"text": "next"}, role="user", turn_id=other, seq=8),
        block("text", {"text": "answer"}, turn_id=other, seq=9),
    ]
    [frame] = render.catch_up_frames(batch, 10_000)
    shown = [only_child(wrapper) for wrapper in top(frame)]
    assert ["turn-start" in c.classes for c in shown] == [False, True, False]
    shown = [c for wrapper in top(fragment_chunks(batch)) for c in wrapper.children]
    assert ["turn-start" in c.classes for c in shown] == [False, True, False]


def test_it_marks_the_running_calls_card_for_approval_on_a_page():
    """A page rendered while the turn waits shows the buttons on the unanswered call."""
    call = block(
        "tool_call",
        {"call_id": "c9", "name": "shell", "arguments": {"command": "ls"}},
        turn_id=TURN,
        seq=1,
    )
    items, status = render.page_items(
        [call], {"state": "waiting", "turn_id": str(TURN), "queued": []}
    )
    assert items[0].pending_approval is True
    assert status["approval"]["call_id"] == "c9"
    assert status["approval"]["summary"] == "ls"


# --- status and queue ------------------------------------------------------------------------


def test_it_renders_an_idle_status_without_touching_the_queue_when_it_has_none():
    """Status, composer actions and approval bar are replaced by id; no queue list unless given."""
    nodes = top(fragment_status({"state": "idle"}))
    assert [(n.get("id"), n.get("hx-swap-oob")) for n in nodes] == [
        ("status", "true"),
        ("composer-actions", "true"),
        ("approval", "true"),
    ]
    status, actions, approval = nodes
    assert status.get("data-state") == "idle" and "Idle" in status.text
    assert actions.children == []
    assert "hidden" in approval.attrs


def test_it_renders_a_running_status_with_step_usage_stop_and_queue():
    """A running turn: step, elapsed, tokens incl. cache reads, a Stop button, the queued list."""
    html = fragment_status(
        {
            "state": "running",
            "turn_id": str(TURN),
            "step": 3,
            "started_at": 1_700_000_000.0,
            "usage": {"input": 12_345, "output": 678, "cache_read": 10_000, "cache_write": 0},
            "model": "offline/demo",
            "queued": [{"id": 5, "text": "and <then>?"}],
        }
    )
    status, actions, approval, queued = top(html)
    assert status.get("data-turn") == str(TURN)
    assert "step 3" in status.text
    assert "in 12.3k · out 678 · cache read 10k" in status.text
    assert "cache write" not in status.text
    assert status.find_all(lambda n: n.get("data-since") == "1700000000000")
    [stop] = actions.children
    assert stop.get("form") == "stop-form" and "data-stop" in stop.attrs
    assert queued.get("id") == "queued" and queued.get("hx-swap-oob") == "true"
    [item] = queued.children
    assert item.get("id") == "queued-5" and "and <then>?" in item.text


def test_it_accepts_the_database_status_with_an_iso_start_time():
    """chat.turn.lease.status gives started_at as ISO text; it is shown the same way."""
    html = fragment_status(
        {
            "state": "running",
            "started_at": "2023-11-14T22:13:20+00:00",
            "step": 1,
            "usage": {},
            "queued": [],
            "stale": True,
        }
    )
    status = top(html)[0]
    assert status.find_all(lambda n: n.get("data-since") == "1700000000000")
    assert "Not responding" in status.text


def test_it_renders_a_pending_approval_in_the_bar_and_the_card():
    """Waiting: Approve/Deny (and "always allow" the call's rule) name the call in the bar
    and fill the card's approval slot."""
    html = fragment_status(
        {
            "state": "waiting",
            "turn_id": str(TURN),
            "step": 1,
            "usage": {},
            "approval": {"call_id": "c7", "name": "shell", "arguments": {"command": "make test"}},
        }
    )
    nodes = top(html)
    assert [n.get("hx-swap-oob") for n in nodes] == [
        "true",
        "true",
        "true",
        f'innerHTML:[data-approve="{approve_key("c7")}"]',
    ]
    approval, card_buttons = nodes[2], nodes[3]
    assert "hidden" not in approval.attrs and "make test" in approval.text
    for holder in (approval, card_buttons):
        buttons = holder.find_all(lambda n: n.tag == "button")
        assert [(b.get("name"), b.get("value"), b.get("form")) for b in buttons] == [
            ("approve", "c7", "approve-form"),
            ("deny", "c7", "approve-form"),
            ("always_tab", "c7", "approve-form"),
            ("always_user", "c7", "approve-form"),
        ]
        assert "Always allow shell(make test) in" in holder.text


def test_it_renders_a_stopping_status_with_a_disabled_button():
    """While stopping there is nothing to press."""
    actions = top(fragment_status({"state": "stopping"}))[1]
    [button] = actions.children
    assert "disabled" in button.attrs and button.get("form") is None


def test_it_appends_a_queued_message_and_removes_taken_ones_by_id():
    """Queued: one <li> into #queued, text escaped. Taken: one delete per id."""
    [wrapper] = top(fragment_queued(12, "<script>x</script>"))
    assert wrapper.get("hx-swap-oob") == "beforeend:#queued"
    [item] = wrapper.children
    assert item.get("id") == "queued-12" and "<script>x</script>" in item.text
    assert "<script>" not in fragment_queued(12, "<script>x</script>")

    nodes = top(fragment_taken([12, 13]))
    assert [(n.get("id"), n.get("hx-swap-oob"), n.children) for n in nodes] == [
        ("queued-12", "delete", []),
        ("queued-13", "delete", []),
    ]


# --- markdown and escaping ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "<script>alert(1)</script>",
        '<img src=x onerror="alert(1)">',
        "[click](javascript:alert(1))",
        '<a href="javascript:alert(1)">x</a>',
        "![x](javascript:alert(1))",
        '<div onclick="alert(1)">x</div>',
    ],
)
def test_it_renders_hostile_markdown_inert(source):
    """No script element, no event handler, no javascript: URL survives markdown."""
    html = str(markdown(source))
    tree = parse(html)
    assert not tree.find_all(lambda n: n.tag in ("script", "img", "div", "iframe"))
    for node in tree.iter():
        for name, value in node.attrs.items():
            assert not name.startswith("on")
            assert "javascript:" not in (value or "").lower()


def test_it_opens_links_in_a_new_tab_without_an_opener():
    """Links carry rel=noopener and target=_blank."""
    tree = parse(str(markdown("[docs](https://example.com/a?b=1)")))
    [a] = tree.find_all(lambda n: n.tag == "a")
    assert a.get("href") == "https://example.com/a?b=1"
    assert "noopener" in a.get("rel").split() and a.get("target") == "_blank"


def test_it_shows_images_as_links():
    """A remote image would load by itself (and could leak the chat): it becomes a link."""
    tree = parse(str(markdown("![chart](https://example.com/c.png)")))
    assert not tree.find_all(lambda n: n.tag == "img")
    [a] = tree.find_all(lambda n: n.tag == "a")
    assert a.get("href") == "https://example.com/c.png" and "chart" in a.text


def test_it_highlights_fenced_code_and_renders_tables():
    """Fenced code with a language gets Pygments spans; GFM tables render."""
    html = str(
        markdown("```python\ndef f():\n    return 1\n```\n\n| a | b |\n|---|--:|\n| 1 | 2 |\n")
    )
    tree = parse(html)
    code = tree.find_all(lambda n: n.tag == "code")[0]
    assert code.get("class") == "language-python"
    assert any("k" in n.classes for n in code.iter())
    assert code.text == "def f():\n    return 1\n"
    assert tree.find_all(lambda n: n.tag == "table")
    assert tree.find_all(lambda n: n.tag == "td" and n.get("class") == "align-right")


def test_it_shows_code_in_an_unknown_language_plain():
    """An unknown language is escaped code, not an error."""
    html = str(markdown("```nosuchlang\n<b>\n```"))
    assert "&lt;b&gt;" in html


def test_it_keeps_raw_html_in_messages_as_text():
    """Raw HTML a model writes is shown as the characters it wrote."""
    assert "&lt;br&gt;" in str(markdown("use <br> here"))


def test_it_escapes_streamed_text_preserving_length():
    """CR and NUL become character references (the parser would drop or fold them)."""
    assert stream_text("a\r\nb\x00<") == "a&#13;\nb&#xFFFD;&lt;"
