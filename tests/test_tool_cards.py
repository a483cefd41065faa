"""Tool cards (issue 15.5): what the shell's cap records about a cut, how a card counts and
shows its output, the running call's indicator markup, and the owner-checked plain-text
view of an output. The page's behaviour (spinner, clock, full height) is in Chromium:
tests/test_tool_cards_browser.py."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urljoin

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat import log, render, transfer
from chat.models import Tab
from chat.providers.base import Finish, ToolCallEvent, ToolResultEvent, ToolResultPart
from chat.providers.replay import ScriptedProvider
from chat.render import counts, fragment_open, fragment_seal, fragments, size
from chat.stream import Block, Kind, Reducer, Role
from chat.tools import run_tool
from chat.tools.shell import OUTPUT_CAP, OUTPUT_HEAD, OUTPUT_TAIL
from chat.turn import step
from chat.views import files
from tests.engine import Watcher, chunks, make_tab, owner_workspace, running_worker, submit
from tests.test_transfer import export_bytes, request_json
from tests.ui_helpers import block, parse, top

User = get_user_model()
TURN = uuid.UUID("11111111-2222-3333-4444-555555555555")
FOUR_HUNDRED = "".join(f"line {n:03d}\n" for n in range(1, 401))

# A command whose output is past the cap, and that output as the test computes it.
BIG_COMMAND = "yes 'é-line' | head -n 50000"
BIG_OUTPUT = "é-line\n" * 50000


def expected_cut(output: str) -> tuple[int, int]:
    """(bytes, line ends) the cap drops: all but the first and last halves of the cap,
    a character cut at either edge dropped whole (computed here without the tool's code)."""
    data = output.encode()
    head = data[:OUTPUT_HEAD].decode("utf-8", "ignore")
    tail = data[-OUTPUT_TAIL:].decode("utf-8", "ignore")
    cut = len(data) - len(head.encode()) - len(tail.encode())
    return cut, output.count("\n") - head.count("\n") - tail.count("\n")


# --- The shell's cap records what it cut ---------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


async def test_a_capped_shell_output_records_the_bytes_and_lines_it_cut(ws):
    """Past the cap, the outcome counts the dropped bytes (the number its marker gives the
    model) and the line ends among them; multi-byte characters cut at an edge count whole."""
    assert len(BIG_OUTPUT.encode()) > OUTPUT_CAP
    outcome = await run_tool("shell", {"command": BIG_COMMAND}, ws, timeout=20)
    assert outcome.truncated and not outcome.is_error
    cut, lines = expected_cut(BIG_OUTPUT)
    assert (outcome.truncated_bytes, outcome.truncated_lines) == (cut, lines)
    assert f"\n[... {cut} bytes of output dropped ...]\n" in outcome.result
    assert 40000 < lines < 50000


async def test_an_output_within_the_cap_records_nothing_cut(ws):
    outcome = await run_tool("shell", {"command": "seq 1 400"}, ws, timeout=20)
    assert not outcome.truncated
    assert (outcome.truncated_bytes, outcome.truncated_lines) == (0, 0)


def test_the_reducer_keeps_the_cut_in_the_result_only_when_there_is_one():
    """A result with a cut carries truncated_bytes and truncated_lines; one without has the
    shape results always had (no new keys in old-style data)."""
    reducer = Reducer(TURN, 1)
    reducer.feed(ToolCallEvent("c1", "shell", {"command": "x"}))
    [seal] = reducer.feed(ToolResultEvent("c1", "shell", "r", False, True, None, 1234, 56))
    assert seal.block.data == {
        "call_id": "c1",
        "name": "shell",
        "result": "r",
        "is_error": False,
        "truncated": True,
        "truncated_bytes": 1234,
        "truncated_lines": 56,
    }
    reducer.feed(ToolCallEvent("c2", "shell", {"command": "y"}))
    [seal] = reducer.feed(ToolResultEvent("c2", "shell", "r", False))
    assert set(seal.block.data) == {"call_id", "name", "result", "is_error"}


@pytest.fixture
def workspace(tmp_path, settings):
    return owner_workspace(settings, tmp_path)


@pytest.mark.django_db(transaction=True)
async def test_the_runner_records_the_cut_and_sends_the_model_the_result_alone(
    workspace, monkeypatch
):
    """Through the real runner and shell: the sealed result holds the cut, and the next
    request's tool result is the result text, byte for byte (the counts are the page's)."""
    provider = ScriptedProvider(
        [
            [
                ToolCallEvent("s1", "shell", {"command": BIG_COMMAND}),
                Finish(stop_reason="tool_use"),
            ],
            [Finish(stop_reason="end_turn")],
        ]
    )

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "print a lot")
            await watcher.until_idle()
    result = next(c for c in await chunks(tab.pk) if c.type == Kind.TOOL_RESULT)
    assert result.data["truncated"] is True
    assert (result.data["truncated_bytes"], result.data["truncated_lines"]) == expected_cut(
        BIG_OUTPUT
    )
    [sent] = [
        part
        for message in provider.requests[1].messages
        for part in message.parts
        if isinstance(part, ToolResultPart)
    ]
    assert sent.result == result.data["result"]
    assert "truncated_bytes" not in repr(provider.requests[1])


@pytest.mark.django_db
def test_the_cut_survives_export_and_import_and_changes_no_request_byte():
    """An export holding the new keys imports (transfer checks every key of a result), and
    the request built from such a log is the one built without them."""
    owner = User.objects.create_user("alice")
    data = {"call_id": "c1", "name": "shell", "result": "out\n[exit code 0]", "is_error": False}
    cut = {**data, "truncated": True, "truncated_bytes": 99, "truncated_lines": 3}

    def tab_with(result: dict) -> Tab:
        tab = Tab.objects.create(owner=owner, model="offline/demo")
        log.append(
            tab.pk,
            [
                Block(uuid.uuid4(), TURN, 0, Role.USER, Kind.TEXT, {"text": "go"}),
                Block(uuid.uuid4(), TURN, 1, Role.ASSISTANT, Kind.TOOL_CALL,
                      {"call_id": "c1", "name": "shell", "arguments": {"command": "x"}}),
                Block(uuid.uuid4(), TURN, 1, Role.TOOL, Kind.TOOL_RESULT, result),
            ],
        )  # fmt: skip
        return tab

    tab = tab_with(cut)
    copy = transfer.import_jsonl(owner, io.BytesIO(export_bytes(tab)))
    assert log.tail(copy.pk)[-1].data == cut
    assert request_json(tab) == request_json(tab_with({**data, "truncated": True}))


# --- Counting an output ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("", "empty"),
        ("x", "1 line · 1 byte"),
        ("ok\n", "1 line · 3 bytes"),
        ("a\nb", "2 lines · 3 bytes"),
        ("\n\n", "2 lines · 2 bytes"),
        (FOUR_HUNDRED, "400 lines · 3,600 bytes"),
        ("é\n", "1 line · 3 bytes"),
        ("日本語\n🙂\n", "2 lines · 15 bytes"),
        ("x" * 99_999, "1 line · 99,999 bytes"),
        ("x" * 100_000, "1 line · 97.7 KiB"),
        ("\n" * (3 * 1024 * 1024), "3,145,728 lines · 3.0 MiB"),
    ],
)
def test_an_output_is_counted_in_lines_and_utf8_bytes(text, shown):
    assert counts(text) == shown


def test_a_lone_surrogate_is_counted_not_an_error():
    assert counts("a\ud800") == "1 line · 4 bytes"


@pytest.mark.parametrize(
    ("n", "shown"), [(0, "0 bytes"), (1, "1 byte"), (65_536, "65,536 bytes"), (2**21, "2.0 MiB")]
)
def test_a_size_is_exact_while_short(n, shown):
    assert size(n) == shown


# --- The card's markup ---------------------------------------------------------------------


def sealed_result(data: dict, seq: int = 9) -> Block:
    return block("tool_result", {"call_id": "c1", "name": "shell", **data}, role="tool",
                 turn_id=TURN, seq=seq)  # fmt: skip


def chunk_of(html: str):
    [wrapper] = top(html)
    [chunk] = wrapper.children
    return chunk


def classed(node, name: str):
    return node.find_all(lambda n: name in n.classes)


def test_a_short_output_says_its_size_and_offers_nothing_more():
    chunk = chunk_of(fragment_seal(sealed_result({"result": "ok\n[exit code 0]",
                                                 "shell_output": "ok\n"})))  # fmt: skip
    [bar] = classed(chunk, "out-bar")
    assert classed(bar, "out-count")[0].text == "1 line · 3 bytes"
    assert not classed(bar, "out-expand") and not classed(bar, "out-full")
    # The bar comes first; the box stays a direct child (copy and the e2e reader use it).
    assert chunk.children[0] is bar and "term" in chunk.children[1].classes


def test_a_long_output_offers_full_height_and_its_plain_text_view():
    """400 lines: the count, a full-height checkbox, and a link to the plain-text view that,
    relative to the tab's page, is the view's URL."""
    tab_id = uuid.uuid4()
    chunk = chunk_of(fragment_seal(sealed_result({"result": "r", "shell_output": FOUR_HUNDRED})))
    [bar] = classed(chunk, "out-bar")
    assert classed(bar, "out-count")[0].text == "400 lines · 3,600 bytes"
    [toggle] = classed(bar, "out-expand")
    [box] = toggle.find_all(lambda n: n.tag == "input")
    assert box.get("type") == "checkbox" and "Full height" in toggle.text
    [link] = classed(bar, "out-full")
    assert (link.get("target"), link.get("rel")) == ("_blank", "noopener")
    page = reverse("tab", args=[tab_id])
    assert urljoin(page, link.get("href")) == reverse("tab_chunk_output", args=[tab_id, 9])


@pytest.mark.parametrize(
    ("text", "long"),
    [
        ("x\n" * render.OUTPUT_BOX_LINES, False),
        ("x\n" * (render.OUTPUT_BOX_LINES + 1), True),
        ("x" * render.OUTPUT_BOX_CHARS, False),
        ("x" * (render.OUTPUT_BOX_CHARS + 1), True),
    ],
)
def test_full_height_is_offered_past_what_the_box_shows(text, long):
    chunk = chunk_of(fragment_seal(sealed_result({"result": "r", "shell_output": text})))
    assert bool(classed(chunk, "out-expand")) is long


def test_a_result_without_output_is_counted_and_a_bare_error_is_not():
    """A file tool's result is its output; "Denied by the user." is a message, not output."""
    read = sealed_result({"name": "read_file", "result": "a\nb\n", "is_error": False})
    assert classed(chunk_of(fragment_seal(read)), "out-count")[0].text == "2 lines · 4 bytes"
    denied = sealed_result({"result": "Denied by the user.", "is_error": True})
    assert not classed(chunk_of(fragment_seal(denied)), "out-bar")
    failed = sealed_result({"result": "boom\n[exit code 1]", "is_error": True,
                            "shell_output": "boom\n"})  # fmt: skip
    assert classed(chunk_of(fragment_seal(failed)), "out-count")[0].text == "1 line · 5 bytes"


def test_streaming_output_has_no_counts_until_it_is_sealed():
    live = block("tool_result", {"call_id": "c1", "name": "shell", "shell_output": "a\n"},
                 role="tool", turn_id=TURN)  # fmt: skip
    assert "out-bar" not in fragment_open(live)


def test_a_cut_output_says_how_much_was_cut():
    chunk = chunk_of(
        fragment_seal(
            sealed_result(
                {"result": "r", "shell_output": "x", "truncated": True,
                 "truncated_bytes": 1_234_567, "truncated_lines": 20_345}
            )
        )
    )  # fmt: skip
    [note] = classed(chunk, "cut-note")
    assert note.text == (
        f"1.2 MiB (20,345 lines) cut from the middle of the output: the model got its first "
        f"and last {OUTPUT_HEAD // 1024} KiB."
    )


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"truncated_bytes": 5, "truncated_lines": 1}, "5 bytes (1 line) cut from the middle"),
        ({"truncated_bytes": 70_000, "truncated_lines": 0}, "70,000 bytes cut from the middle"),
        # Logged before the cut was recorded, or cut by a file tool: what the log knows.
        ({}, "The output was cut to fit; the model was told how to get the rest."),
        ({"truncated_bytes": "9"}, "The output was cut to fit"),
    ],
)
def test_the_cut_note_says_what_the_log_knows(extra, said):
    chunk = chunk_of(fragment_seal(sealed_result({"result": "r", "truncated": True, **extra})))
    assert classed(chunk, "cut-note")[0].text.startswith(said)


def test_an_output_not_cut_has_no_note():
    chunk = chunk_of(fragment_seal(sealed_result({"result": "r", "shell_output": "x"})))
    assert not classed(chunk, "cut-note")


def test_a_call_card_carries_its_running_indicator_and_when_it_was_made():
    """Hidden until app.js marks the card running: a spinner and a clock starting when the
    call was logged (a Chunk row's created_at), or now for a call sealed just now."""
    call = {"call_id": "c1", "name": "shell", "arguments": {"command": "sleep 9"}}
    made = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    row = render.ToolCall(uuid.uuid4(), 3, TURN, 1, Role.ASSISTANT, Kind.TOOL_CALL, call,
                          created_at=made)  # fmt: skip
    tree = parse(fragments.insert([row]))
    [run] = classed(tree, "tool-run")
    assert classed(run, "spinner")[0].get("aria-hidden") == "true"
    [clock] = classed(run, "tool-clock")
    assert clock.get("data-since") == str(int(made.timestamp() * 1000))
    assert "elapsed" not in clock.classes  # the page's clock ticks the running one only

    before = int(datetime.now(UTC).timestamp() * 1000)
    live = parse(fragment_seal(block("tool_call", call, turn_id=TURN, seq=3)))
    after = int(datetime.now(UTC).timestamp() * 1000)
    assert before <= int(classed(live, "tool-clock")[0].get("data-since")) <= after


# --- The plain-text view ----------------------------------------------------------------------


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="correct horse battery")


@pytest.fixture
def web(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def logged(owner, *data: tuple[str, str, dict]) -> Tab:
    """A tab whose log is these (role, type, data) chunks, seqs from 1."""
    tab = Tab.objects.create(owner=owner, model="offline/demo")
    log.append(
        tab.pk, [Block(uuid.uuid4(), TURN, 1, role, kind, dict(d)) for role, kind, d in data]
    )
    return tab


def result(**data) -> tuple[str, str, dict]:
    return (Role.TOOL, Kind.TOOL_RESULT, {"call_id": "c1", "name": "shell", **data})


def output_url(tab: Tab, seq: int) -> str:
    return reverse("tab_chunk_output", args=[tab.pk, seq])


def body(response) -> bytes:
    """A streamed body, read as daphne reads it: asynchronously."""
    assert response.streaming and response.is_async

    async def collect() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(collect)()


def test_the_owner_gets_the_output_as_plain_text_never_sniffed(web, alice):
    output = "naïve <b>html</b>\n日本 🙂\n" + FOUR_HUNDRED
    tab = logged(alice, result(result="r", shell_output=output))
    response = web.get(output_url(tab, 1))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Content-Disposition"] == 'inline; filename="tool-output-1.txt"'
    assert body(response) == output.encode()


def test_a_result_without_output_is_served_as_its_result(web, alice):
    tab = logged(alice, result(name="read_file", result="line\n", is_error=False))
    assert body(web.get(output_url(tab, 1))) == b"line\n"


def test_another_users_tab_a_chunk_not_a_result_and_a_missing_seq_are_404(web, alice):
    bob = User.objects.create_user("bob")
    theirs = logged(bob, result(result="secret", shell_output="secret\n"))
    assert web.get(output_url(theirs, 1)).status_code == 404
    mine = logged(
        alice,
        (Role.USER, Kind.TEXT, {"text": "hi"}),
        (Role.ASSISTANT, Kind.TOOL_CALL, {"call_id": "c1", "name": "shell",
                                          "arguments": {"command": "x"}}),
        result(result="ok", shell_output="ok\n"),
    )  # fmt: skip
    assert [web.get(output_url(mine, seq)).status_code for seq in (1, 2, 3, 4)] == [
        404,
        404,
        200,
        404,
    ]
    assert web.get(f"/t/{uuid.uuid4()}/chunk/1/output/").status_code == 404


def test_it_needs_a_login_and_a_get(web, alice):
    tab = logged(alice, result(result="ok"))
    assert web.post(output_url(tab, 1)).status_code == 405
    anonymous = Client().get(output_url(tab, 1))
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")


def test_a_huge_output_goes_out_in_bounded_pieces(web, alice, monkeypatch):
    """Never encoded whole at once: pieces of OUTPUT_PIECE_CHARS characters, all there."""
    monkeypatch.setattr(files, "OUTPUT_PIECE_CHARS", 1000)
    output = "é" * 4500 + "\n"
    tab = logged(alice, result(result="r", shell_output=output))
    response = web.get(output_url(tab, 1))

    async def pieces() -> list[bytes]:
        return [part async for part in response.streaming_content]

    parts = async_to_sync(pieces)()
    assert [len(p) for p in parts] == [2000, 2000, 2000, 2000, 1001]
    assert b"".join(parts).decode() == output
