"""The fake server's simulated Anthropic prompt cache (harness.fakeprovider.SimulatedCache):
a request reads the longest prefix an earlier one wrote at a breakpoint, found at most
20 blocks back from one of its own; a changed block misses everything after it; usage
comes back in the stream as the API sends it (through the official SDK)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from harness.fakeprovider import (
    CACHE_LIFETIME,
    CACHE_LOOKBACK_BLOCKS,
    CACHE_MIN_TOKENS,
    CHARS_PER_TOKEN,
    CacheUsage,
    FakeProviderServer,
    Reply,
    SimulatedCache,
)

MARK = {"type": "ephemeral"}
# A system prompt long enough to be cached on its own (CACHE_MIN_TOKENS).
SYSTEM = "You are a careful assistant. " * 200
TOOL = {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}


def text(body: str) -> dict[str, Any]:
    return {"type": "text", "text": body}


def tokens(*blocks: dict[str, Any]) -> int:
    """The tokens of these blocks as the simulation counts them: their JSON's characters
    (sorted keys, no spaces, no cache_control) / CHARS_PER_TOKEN."""
    chars = sum(
        len(
            json.dumps(
                {k: v for k, v in b.items() if k != "cache_control"},
                sort_keys=True,
                separators=(",", ":"),
            )
        )
        for b in blocks
    )
    return chars // CHARS_PER_TOKEN


def request(blocks: list[dict[str, Any]], *, system: str = SYSTEM) -> dict[str, Any]:
    """A body as the adapter sends it: breakpoints on the last tool, the system prompt and
    the last block; messages alternate user/assistant, one block each."""
    body: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 1000}
    body["system"] = [{**text(system), "cache_control": MARK}]
    body["tools"] = [{**TOOL, "cache_control": MARK}]
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [dict(block)]}
        for i, block in enumerate(blocks)
    ]
    messages[-1]["content"][-1]["cache_control"] = MARK
    body["messages"] = messages
    return body


def conversation(n: int) -> list[dict[str, Any]]:
    return [text(f"message {i}: " + "words " * 50) for i in range(n)]


def head() -> int:
    """Tools and system prompt: the prefix every request shares."""
    return tokens(TOOL, text(SYSTEM))


def total(usage: CacheUsage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_a_request_reads_the_prefix_the_previous_one_wrote():
    cache = SimulatedCache()
    first = cache.usage(request(conversation(3)))
    assert first == CacheUsage(0, 0, tokens(TOOL, text(SYSTEM), *conversation(3)), 5, 0)
    second = cache.usage(request(conversation(5)))
    assert second.cache_read_input_tokens == total(first)
    assert second.read_blocks == first.blocks == 5
    assert second.cache_creation_input_tokens == total(second) - total(first)
    assert second.input_tokens == 0
    # The same request again: all of it read.
    again = cache.usage(request(conversation(5)))
    assert (again.cache_read_input_tokens, again.cache_creation_input_tokens) == (total(second), 0)


def test_what_follows_the_last_breakpoint_is_uncached_input():
    cache = SimulatedCache()
    body = request(conversation(3))
    del body["messages"][-1]["content"][-1]["cache_control"]
    usage = cache.usage(body)
    assert usage.cache_creation_input_tokens == head()
    assert usage.input_tokens == total(usage) - head() > 0


def test_a_changed_early_block_misses_everything_after_it():
    cache = SimulatedCache()
    cache.usage(request(conversation(6)))
    changed = conversation(8)
    changed[1] = text("an answer that was edited in place")
    usage = cache.usage(request(changed))
    # Only the tools and system prompt (their own breakpoint) are read.
    assert usage.read_blocks == 2
    assert usage.cache_read_input_tokens == head()
    assert usage.cache_creation_input_tokens == total(usage) - head()


def _drop_system(body):
    del body["system"]


@pytest.mark.parametrize(
    ("edit", "read"),
    [
        (_drop_system, "tools"),  # the tools come first: their breakpoint still matches
        (lambda body: body.update(tools=[]), "nothing"),
        (lambda body: body.update(model="claude-opus-4-1"), "nothing"),
        (lambda body: body.update(thinking={"type": "enabled", "budget_tokens": 2000}), "head"),
        (lambda body: body.update(tool_choice={"type": "none"}), "head"),
    ],
    ids=["no-system", "no-tools", "model", "thinking", "tool-choice"],
)
def test_what_a_changed_setting_invalidates(edit, read):
    cache = SimulatedCache(min_tokens=0)
    cache.usage(request(conversation(6)))
    body = request(conversation(7))
    edit(body)
    usage = cache.usage(body)
    expected = {"nothing": 0, "tools": tokens(TOOL), "head": head()}[read]
    assert usage.cache_read_input_tokens == expected


def test_a_read_looks_back_at_most_20_blocks_from_a_breakpoint():
    def second_read(added: int) -> int:
        cache = SimulatedCache()
        cache.usage(request(conversation(4)))
        return cache.usage(request(conversation(4 + added))).read_blocks

    assert CACHE_LOOKBACK_BLOCKS == 20
    # Tools and system are 2 blocks: the first request wrote a prefix of 6.
    assert second_read(20) == 6
    # One block more and the first request's prefix is out of reach: only the
    # system breakpoint's own prefix is found.
    assert second_read(21) == 2


def test_a_prefix_shorter_than_the_minimum_is_not_cached():
    cache = SimulatedCache()
    small = request([text("hi")], system="Be brief.")
    assert tokens(TOOL, text("Be brief."), text("hi")) < CACHE_MIN_TOKENS
    cache.usage(small)
    again = cache.usage(small)
    assert again.input_tokens == total(again) > 0


def test_an_entry_expires_its_lifetime_after_its_last_use():
    now = [0.0]
    cache = SimulatedCache(clock=lambda: now[0])
    cache.usage(request(conversation(3)))
    now[0] = CACHE_LIFETIME - 1
    # Read (the longer request looks back to it), which renews it.
    assert cache.usage(request(conversation(4))).read_blocks == 5
    # Past its first lifetime: found because that read renewed it.
    now[0] = 2 * CACHE_LIFETIME - 2
    assert cache.usage(request(conversation(3))).read_blocks == 5
    now[0] += CACHE_LIFETIME + 1
    assert cache.usage(request(conversation(3))).read_blocks == 0


def test_the_server_streams_the_usage_it_computed_through_the_sdk():
    """Scripted usage is replaced; `respond` answers what nothing was scripted for."""
    answers: list[str] = []

    def respond(recorded) -> Reply:
        answers.append(recorded.json["messages"][-1]["content"][-1]["text"])
        return Reply(events=_reply("four words of answer", scripted_usage={"input_tokens": 7}))

    server = FakeProviderServer(cache=SimulatedCache(), respond=respond).start()
    try:
        client = anthropic.Anthropic(api_key="test-key", base_url=server.url)
        usages = []
        for n in (3, 5):
            body = request(conversation(n))
            params = {k: body[k] for k in ("model", "max_tokens", "system", "tools", "messages")}
            with client.messages.stream(**params) as stream:
                usages.append(stream.get_final_message().usage)
        records = [r.usage for r in server.requests]
    finally:
        server.stop()
    assert answers == [conversation(3)[-1]["text"], conversation(5)[-1]["text"]]
    first, second = usages
    assert (first.input_tokens, first.cache_read_input_tokens) == (0, 0)
    assert first.cache_creation_input_tokens == records[0].cache_creation_input_tokens
    assert second.cache_read_input_tokens == total(records[0])
    assert second.cache_creation_input_tokens == records[1].cache_creation_input_tokens > 0
    # "four words of answer" is 20 characters.
    assert first.output_tokens == second.output_tokens == 20 // CHARS_PER_TOKEN


def _reply(answer: str, scripted_usage: dict[str, int]) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {**scripted_usage, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": answer},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 999},
        },
        {"type": "message_stop"},
    ]
