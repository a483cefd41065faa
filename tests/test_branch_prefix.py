"""A branch's first request shares its parent's bytes up to the cut (ARCHITECTURE.md,
Branches and continue): the real turn runner and the official Anthropic SDK against the fake
server, whose raw request bodies are compared. That shared prefix is what makes the
provider's prompt cache hit for a branch, an edit, a regenerate and a retry.

Cache markers (`cache_control`) are removed from both bodies before a prefix is
compared, and only them: the adapter puts the moving one on each request's last
block, so a branch that adds a message has it on another block than the parent had.
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from chat import turns
from chat.models import Tab
from harness.fakeprovider import Reply
from tests.anthropic_wire import (
    MODEL,
    Body,
    assert_same_prefix,
    reply,
    settled,
    stream_error,
    text,
    thinking,
    tool_use,
    use_anthropic,
)
from tests.engine import Watcher, chunks, kinds, make_tab, owner_workspace, running_worker, submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

QUESTION = "What does notes.txt say?"
FOLLOW_UP = "And the other files?"
# The parent's log, by seq: two turns, the first of three steps with signed thinking
# and two tool calls, so that cuts fall after tool results and after a whole turn.
PARENT_LOG = [
    "user/text",  # 1 QUESTION
    "assistant/thinking",  # 2 signed
    "assistant/text",  # 3
    "assistant/tool_call",  # 4 read_file
    "tool/tool_result",  # 5  end of step 1
    "assistant/thinking",  # 6 signed
    "assistant/tool_call",  # 7 list_files
    "tool/tool_result",  # 8  end of step 2
    "assistant/text",  # 9  end of turn 1
    "user/text",  # 10 FOLLOW_UP
    "assistant/text",  # 11 end of turn 2
]


@pytest.fixture
def workspace(tmp_path, settings):
    workspace = owner_workspace(settings, tmp_path)
    (workspace / "notes.txt").write_text("hello from notes\n")
    return workspace


async def run_one(tab: Tab, message: str) -> None:
    async with Watcher(tab.pk) as watcher:
        await submit(tab, message)
        await watcher.until_idle()
    # Idle goes out just before the lease is released, and a cut in the running
    # turn is refused.
    await settled(tab.pk)


async def parent_tab(fake_server) -> Tab:
    """PARENT_LOG, through four requests: three steps of turn 1, then turn 2."""
    fake_server.add(
        reply(
            thinking("Read the file first.", "sig-step-1"),
            text("Let me look."),
            tool_use("toolu_read", "read_file", path="notes.txt"),
            stop="tool_use",
        ),
        reply(
            thinking("Now the directory ✓.", "sig-step-2"),
            tool_use("toolu_list", "list_files", path="."),
            stop="tool_use",
        ),
        reply(text("notes.txt says hello.")),
        reply(text("There is only notes.txt.")),
    )
    tab = await make_tab(MODEL)
    await run_one(tab, QUESTION)
    await run_one(tab, FOLLOW_UP)
    assert kinds(await chunks(tab.pk)) == PARENT_LOG
    assert len(fake_server.requests) == 4
    return tab


def request(fake_server, index: int) -> bytes:
    return fake_server.requests[index].body


@pytest.mark.parametrize(
    ("cut", "parent_request", "shared_blocks"),
    [
        # After step 1's tool result: the parent's step-2 request is all shared.
        (5, 1, 5),
        # After turn 1: the parent's turn-2 request up to its user message.
        (9, 3, 9),
    ],
)
async def test_a_branch_sends_the_parents_bytes_up_to_the_cut(
    fake_server, monkeypatch, workspace, cut, parent_request, shared_blocks
):
    """A branch at a valid cut, then a message of its own: its first request is the
    parent's request at that point, byte for byte through the cut's last block (signed
    thinking, tool calls and results included), with the same system prompt, model,
    thinking and tools; then the branch's message."""
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        parent = await parent_tab(fake_server)
        branched = await database_sync_to_async(turns.branch)(parent, cut)
        assert branched.created and branched.tab.fork_seq == cut
        fake_server.add(reply(text("Summary.")))
        await run_one(branched.tab, "Summarise it instead.")
    assert len(fake_server.requests) == 5
    p, b = assert_same_prefix(
        request(fake_server, parent_request), request(fake_server, 4), blocks=shared_blocks
    )
    assert "sig-step-1" in b.text[: p.block_ends[shared_blocks - 1]]
    assert b.blocks[shared_blocks:] == [{"type": "text", "text": "Summarise it instead."}]
    # The parent's next block, where there is one, is its own message: the prefix is
    # exactly the cut, not less.
    assert p.blocks[shared_blocks:] in ([], [{"type": "text", "text": FOLLOW_UP}])


async def test_an_edit_sends_the_parents_bytes_up_to_the_edited_message(
    fake_server, monkeypatch, workspace
):
    """Edit = a branch right before the message, its text in the composer; the edited
    text sent from there shares the parent's request up to that message."""
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        parent = await parent_tab(fake_server)
        edited = await database_sync_to_async(turns.edit)(parent, 10)
        assert edited.tab.fork_seq == 9 and edited.tab.draft == FOLLOW_UP
        fake_server.add(reply(text("No hidden files.")))
        await run_one(edited.tab, "And the hidden files?")
    await edited.tab.arefresh_from_db()
    assert edited.tab.draft == ""
    p, b = assert_same_prefix(request(fake_server, 3), request(fake_server, 4), blocks=9)
    assert p.blocks[9:] == [{"type": "text", "text": FOLLOW_UP}]
    assert b.blocks[9:] == [{"type": "text", "text": "And the hidden files?"}]


@pytest.mark.parametrize(
    ("seq", "parent_request"),
    [
        (11, 3),  # the last answer: its turn's question is asked again
        (7, 0),  # any chunk of turn 1: the first request of turn 1
    ],
)
async def test_regenerate_sends_exactly_the_parents_first_request_of_that_turn(
    fake_server, monkeypatch, workspace, seq, parent_request
):
    """Regenerate runs by itself, and its first request is the very request the parent
    sent for that turn's first step: equal bytes, cache markers included (the last
    block is the same user message)."""
    use_anthropic(monkeypatch, fake_server)
    async with running_worker():
        parent = await parent_tab(fake_server)
        before = await chunks(parent.pk)
        fake_server.add(reply(text("Another answer.")))
        again = await database_sync_to_async(turns.regenerate)(parent, seq)
        await settled(again.tab.pk)
    assert len(fake_server.requests) == 5
    assert request(fake_server, 4) == request(fake_server, parent_request)
    rows = await chunks(again.tab.pk)
    assert rows[-1].data["text"] == "Another answer."
    assert rows[-2].data["kind"] == "forked" and rows[-2].data["action"] == "regenerate"
    # The parent is left as it was.
    assert [(c.seq, c.data) for c in await chunks(parent.pk)] == [(c.seq, c.data) for c in before]


@pytest.mark.parametrize(
    "failure",
    [
        Reply.error(400, "invalid_request_error", "prompt is too long"),
        reply(
            text("Half an ans", stop=False),
            stop=None,
            then=[stream_error("invalid_request_error", "output blocked")],
        ),
    ],
    ids=["http-400", "error-in-stream"],
)
async def test_retry_sends_exactly_the_request_that_failed(
    fake_server, monkeypatch, workspace, failure
):
    """Step 3 fails (an HTTP error, or an error event after some text): retry branches
    after step 2's tool results, runs by itself, and sends the failed request again,
    byte for byte; the tools of steps 1 and 2 are not run again."""
    use_anthropic(monkeypatch, fake_server)
    fake_server.add(
        reply(
            thinking("Read it.", "sig-r1"),
            tool_use("toolu_read", "read_file", path="notes.txt"),
            stop="tool_use",
        ),
        reply(tool_use("toolu_list", "list_files", path="."), stop="tool_use"),
        failure,
    )
    async with running_worker():
        parent = await make_tab(MODEL)
        await run_one(parent, QUESTION)
        rows = await chunks(parent.pk)
        assert kinds(rows)[:6] == [
            "user/text",
            "assistant/thinking",
            "assistant/tool_call",
            "tool/tool_result",
            "assistant/tool_call",
            "tool/tool_result",  # 6: the end of step 2
        ]
        assert rows[-1].type == "error" and rows[-1].step == 3
        assert len(fake_server.requests) == 3
        fake_server.add(reply(text("notes.txt says hello.")))
        retried = await database_sync_to_async(turns.retry)(parent, rows[-1].seq)
        await settled(retried.tab.pk)
    assert retried.tab.fork_seq == 6
    assert len(fake_server.requests) == 4
    assert request(fake_server, 3) == request(fake_server, 2)
    failed = Body.of(request(fake_server, 2))
    assert [b["type"] for b in failed.blocks] == [
        "text",
        "thinking",
        "tool_use",
        "tool_result",
        "tool_use",
        "tool_result",
    ]
    branch_rows = await chunks(retried.tab.pk)
    assert kinds(branch_rows)[-1] == "assistant/text"
    assert sum(r.type == "tool_result" for r in branch_rows) == 2
