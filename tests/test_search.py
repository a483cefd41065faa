"""chat.search: what is indexed, by whom it is found, user input that is never query syntax.

DB-agnostic: CI runs it again against PostgreSQL (.ci/run).
"""

from __future__ import annotations

import io
import uuid

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from chat import log, search
from chat.models import Chunk, Tab
from chat.stream import Block

pytestmark = pytest.mark.django_db(transaction=True)


def block(role: str, type_: str, data: dict) -> Block:
    return Block(uuid.uuid4(), uuid.uuid4(), 0, role, type_, data)


def text(t: str, role: str = "user") -> Block:
    return block(role, "text", {"text": t})


@pytest.fixture(autouse=True)
def _empty_index():
    """Django's flush between transactional tests empties model tables only; the index is
    plain tables, and the chunks of earlier tests (of any module) would still be in it."""
    with connection.cursor() as cursor:
        search.clear(cursor)


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice")


@pytest.fixture
def bob() -> User:
    return User.objects.create_user("bob")


@pytest.fixture
def tab(alice) -> Tab:
    return Tab.objects.create(owner=alice, title="Alice's tab")


def found(user, q, **filters) -> list[tuple[str, int]]:
    return [(h.type, h.seq) for h in search.search(user, q, **filters)]


# --- What goes into the index -----------------------------------------------------------

DOCUMENTS = [
    ("text", {"text": "hello world"}, "hello world"),
    ("thinking", {"text": "pondering", "signature": "c2ln"}, "pondering"),
    ("thinking", {"text": "", "signature": "c2ln"}, ""),
    ("thinking", {"text": "", "redacted_data": "opaque"}, ""),
    (
        "tool_call",
        {
            "call_id": "c1",
            "name": "write_file",
            "arguments": {"path": "a.py", "n": [1, {"k": "v"}]},
        },
        "write_file\na.py\n1\nv",
    ),
    (
        "tool_result",
        {"call_id": "c1", "name": "shell", "result": "exit 0", "shell_output": "built"},
        "shell\nexit 0\nbuilt",
    ),
    ("tool_result", {"call_id": "c1", "name": "shell", "shell_output": ""}, "shell"),
    ("error", {"message": "overloaded", "status_code": 529}, "overloaded"),
    ("system", {"kind": "model-changed", "text": "Model changed"}, ""),
    ("text", {"text": "a\x00b\x02c\x03d"}, "a b c d"),
]


@pytest.mark.parametrize(("type_", "data", "expected"), DOCUMENTS)
def test_document_is_the_searchable_text_of_each_chunk_type(type_, data, expected):
    assert search.document(type_, data) == expected


def test_document_caps_tool_results_and_arguments():
    result = search.document("tool_result", {"name": "shell", "result": "x" * 100_000})
    call = search.document("tool_call", {"name": "write_file", "arguments": {"c": "y" * 100_000}})
    assert len(result) == search.RESULT_CHARS
    assert len(call) == search.ARGUMENT_CHARS


def test_appended_chunks_are_found_and_system_notices_are_not(tab, alice):
    log.append(
        tab.pk,
        [
            text("deploy the frontend"),
            block("assistant", "thinking", {"text": "the deploy needs a key"}),
            block(
                "assistant",
                "tool_call",
                {"call_id": "c", "name": "shell", "arguments": {"command": "make deploy"}},
            ),
            block("tool", "tool_result", {"call_id": "c", "name": "shell", "result": "deploy ok"}),
            block("assistant", "error", {"message": "deploy overloaded"}),
            block("system", "system", {"kind": "notice", "text": "deploy notice"}),
        ],
    )

    assert found(alice, "deploy") == [
        ("error", 5),
        ("tool_result", 4),
        ("tool_call", 3),
        ("thinking", 2),
        ("text", 1),
    ]
    assert search.count() == 5


def test_the_index_is_written_in_the_appends_transaction(tab, alice):
    """Rolled back with the chunks: the index never holds a chunk the log does not."""
    with pytest.raises(RuntimeError), transaction.atomic():
        log.append(tab.pk, [text("ephemeral words")])
        raise RuntimeError("the caller's transaction fails")

    assert not Chunk.objects.exists()
    assert search.count() == 0
    assert found(alice, "ephemeral") == []


def test_output_past_the_cap_is_not_indexed(tab, alice):
    head = "x " * (search.RESULT_CHARS // 2)
    log.append(tab.pk, [block("tool", "tool_result", {"name": "shell", "result": head + "tail"})])
    assert found(alice, "tail") == []
    assert found(alice, "shell") == [("tool_result", 1)]


# --- Who finds what ------------------------------------------------------------------------


def test_a_user_finds_only_their_own_tabs(tab, alice, bob):
    theirs = Tab.objects.create(owner=bob, title="Bob's")
    log.append(tab.pk, [text("shared word")])
    log.append(theirs.pk, [text("shared word")])

    assert [h.tab_id for h in search.search(alice, "shared")] == [tab.pk]
    assert [h.tab_id for h in search.search(bob, "shared")] == [theirs.pk]
    assert search.search(bob, "shared", tab=tab.pk) == []


def test_filters_by_tab_role_and_type(tab, alice):
    other = Tab.objects.create(owner=alice)
    log.append(tab.pk, [text("needle"), text("needle", role="assistant")])
    log.append(other.pk, [block("assistant", "thinking", {"text": "needle"})])

    assert found(alice, "needle", tab=tab.pk) == [("text", 2), ("text", 1)]
    assert found(alice, "needle", role="user") == [("text", 1)]
    assert found(alice, "needle", type="thinking") == [("thinking", 1)]
    hit = search.search(alice, "needle", type="thinking")[0]
    assert hit.tab_id == other.pk and hit.title == "New tab"


def test_hits_come_newest_first_up_to_the_limit(tab, alice):
    log.append(tab.pk, [text(f"item {i}") for i in range(5)])
    assert [h.seq for h in search.search(alice, "item", limit=2)] == [5, 4]


def test_a_hit_carries_the_chunk_and_its_tab(tab, alice):
    [chunk] = log.append(tab.pk, [text("find me")])
    [hit] = search.search(alice, "find")
    assert hit == search.Hit(
        tab_id=tab.pk,
        title="Alice's tab",
        chunk_id=chunk.id,
        seq=1,
        role="user",
        type="text",
        snippet="<mark>find</mark> me",
    )


def test_the_snippet_is_escaped_and_highlighted(tab, alice):
    log.append(tab.pk, [text('<script>alert("x")</script> & needle <b>')])
    [hit] = search.search(alice, "needle")
    # PostgreSQL's headline leaves markup-looking words out; SQLite's snippet escapes them.
    assert "<mark>needle</mark>" in hit.snippet
    assert "<" not in hit.snippet.replace("<mark>", "").replace("</mark>", "")
    assert "alert(&quot;x&quot;)" in hit.snippet and "&amp;" in hit.snippet


def test_all_words_must_match(tab, alice):
    log.append(tab.pk, [text("red apple"), text("green apple"), text("red car")])
    assert found(alice, "red apple") == [("text", 1)]
    assert found(alice, "apple") == [("text", 2), ("text", 1)]


# --- User input is never query syntax ------------------------------------------------------

SYNTAX = [
    ('"', None),
    ('"unbalanced', "unbalanced"),
    ("*", None),
    ("quo*", "quo"),
    ("NEAR(", "near"),
    ("NEAR(a b)", "near a b"),
    ("(((", None),
    ("(paren", "paren"),
    ("paren)", "paren"),
    ("-minus", "minus"),
    ("a:b", "a:b"),
    ("col:umn", "col:umn"),
    ("AND", "and"),
    ("OR NOT", "or not"),
    ("read_file", "read_file"),
    ("^start", "start"),
    ("{x}", "x"),
    ("café", "cafe"),
    ("CAFE", "café"),
    ("日本語", "日本語"),
    ("naïve résumé", "naive resume"),
]


@pytest.mark.parametrize(("q", "word"), SYNTAX)
def test_query_syntax_characters_are_plain_text(tab, alice, q, word):
    """Each gives results or a SearchError with a message: never a database error."""
    log.append(tab.pk, [text(f"unrelated {word}" if word else "unrelated")])
    try:
        hits = search.search(alice, q)
    except search.SearchError as exc:
        assert word is None
        assert str(exc) == "The search has no letters or digits to look for."
        return
    assert [h.seq for h in hits] == [1], q


def test_a_phrase_word_matches_the_words_in_order(tab, alice):
    log.append(tab.pk, [text("call read_file now"), text("file read")])
    assert found(alice, "read_file") == [("text", 1)]


@pytest.mark.parametrize(
    ("q", "message"),
    [
        ("", "Type a word to search for."),
        ("   ", "Type a word to search for."),
        ("*** ((( ---", "The search has no letters or digits to look for."),
        ("x" * (search.MAX_QUERY_CHARS + 1), "A search can be at most 200 characters."),
        (" ".join(["w"] * (search.MAX_WORDS + 1)), "A search can have at most 12 words."),
    ],
)
def test_a_query_with_nothing_to_search_for_says_why(alice, q, message):
    with pytest.raises(search.SearchError) as refused:
        search.search(alice, q)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        ({"role": "system"}, "role must be one of: user, assistant, tool (got 'system')."),
        (
            {"type": "image"},
            "type must be one of: text, thinking, tool_call, tool_result, error (got 'image').",
        ),
        ({"limit": 0}, "limit must be between 1 and 100."),
        ({"limit": 101}, "limit must be between 1 and 100."),
    ],
)
def test_bad_filters_say_what_is_allowed(alice, filters, message):
    with pytest.raises(search.SearchError) as refused:
        search.search(alice, "word", **filters)
    assert str(refused.value) == message


# --- Rows go with their tab -----------------------------------------------------------------


def test_deleting_a_tab_removes_its_rows(tab, alice):
    other = Tab.objects.create(owner=alice)
    log.append(tab.pk, [text("gone soon"), text("gone too")])
    log.append(other.pk, [text("gone? no, kept")])

    tab.delete()

    assert search.count() == 1
    assert [h.tab_id for h in search.search(alice, "gone")] == [other.pk]
    # The FTS index forgot them too: a new row gets no stale words.
    log.append(other.pk, [text("fresh")])
    assert found(alice, "soon") == []


def test_deleting_tabs_in_bulk_and_with_their_owner_removes_their_rows(alice, bob):
    for owner in (alice, alice, bob):
        log.append(Tab.objects.create(owner=owner).pk, [text("word")])

    Tab.objects.filter(owner=alice).delete()
    assert search.count() == 1
    bob.delete()
    assert search.count() == 0


def test_the_wipe_clears_the_index_and_its_dry_run_counts_it(tab, alice):
    log.append(tab.pk, [text("one"), text("two"), block("system", "system", {"text": "x"})])

    dry = io.StringIO()
    call_command("wipe_history", dry_run=True, stdout=dry)
    assert "chat_searchentry (search index): 2 rows" in dry.getvalue()
    assert search.count() == 2

    out = io.StringIO()
    call_command("wipe_history", yes=True, stdout=out)
    assert "; search index: 2 rows" in out.getvalue()
    assert search.count() == 0
    # The FTS index is empty too: new chunks index and find cleanly.
    again = Tab.objects.create(owner=alice)
    log.append(again.pk, [text("one")])
    assert [h.tab_id for h in search.search(alice, "one")] == [again.pk]


def test_the_migration_indexes_the_chunks_a_log_already_has(tab, alice):
    """An install upgrading to the index finds its old chunks, oldest first in rowid order."""
    executor = MigrationExecutor(connection)
    executor.migrate([("chat", "0003_apitoken")])
    Chunk.objects.create(tab=tab, seq=1, role="user", type="text", data={"text": "old words"})
    Chunk.objects.create(tab=tab, seq=2, role="system", type="system", data={"text": "old"})
    Chunk.objects.create(tab=tab, seq=3, role="assistant", type="text", data={"text": "old too"})

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    assert found(alice, "old") == [("text", 3), ("text", 1)]
