"""Full-text search over a user's tabs: the index and its queries.

The index is written by `chat.log.append` in the transaction that appends the
chunks (`index`), so it is insert-only and never drifts from the log: no
trigger, no sync job, no re-index. Rows go with their tab (`forget`, on the
tab's pre_delete signal, which also fires for tabs deleted with their owner)
and with the whole history (`clear`, from `wipe_history`).

What is indexed: text and thinking, a tool call's name and argument values, a
tool result's name and output (capped: past its head, tool output is mostly
noise), and errors (a provider's "overloaded" or a failed call is something
people look for). Not system notices: "model changed" on every tab is noise.

Storage (chat/migrations/0004_search_index.py):

- SQLite: `chat_searchentry` (a plain table: the chunk's tab, seq, role, type
  and the indexed body) and `chat_searchentry_fts`, an FTS5 table over its
  body (external content, so the body is stored once; tokenizer unicode61
  without diacritics: words of any script).
- PostgreSQL: `chat_searchentry` with a `tsvector` column under a GIN index
  (the `simple` configuration: no stemming, the log has every language in it).
  Its words are folded without diacritics here (`fold`), as unicode61 does.

Hits come newest first: an index scan in rowid order that stops at `limit`,
instead of ranking every match (a common word matches a fifth of a large log).

User input is never query syntax: it is split into words, each word searched
for as a quoted phrase (so `read_file` finds "read_file", `"`, `*`, `NEAR(`,
`-` and `:` are plain characters), and all words must match.
"""

from __future__ import annotations

import json
import re
import unicodedata
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from django.db import connection
from django.db.models.signals import pre_delete
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from chat.chunks import (
    AssistantText,
    Error,
    Kind,
    Role,
    Thinking,
    ToolCall,
    ToolResult,
    UserText,
)
from chat.models import UNTITLED, Tab

TABLE = "chat_searchentry"
FTS_TABLE = "chat_searchentry_fts"
# What `index` writes per indexed chunk on SQLite (an entry and its FTS row).
SQLITE_STATEMENTS_PER_ROW = 2
# PostgreSQL's text search configuration: words as written, in any language.
PG_CONFIG = "simple"

# A tool result's output past this many characters is not indexed: a few KB
# hold the command's answer; a megabyte of build log would bloat the index.
RESULT_CHARS = 4_000
# A call's arguments can hold a whole file (write_file): the head says what it is.
ARGUMENT_CHARS = 4_000
# Text and thinking are what people search for; this bounds one seal's index
# write (a long answer is some 20,000 characters).
TEXT_CHARS = 50_000
# Longer than any search a person types; a bound on the query's cost.
MAX_QUERY_CHARS = 200
# Each word is one phrase lookup and one more condition on every hit.
MAX_WORDS = 12
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
# Words of context around the first match in a snippet.
SNIPPET_WORDS = 24

SEARCHABLE_ROLES = (Role.USER, Role.ASSISTANT, Role.TOOL)
SEARCHABLE_TYPES = (
    Kind.TEXT,
    Kind.THINKING,
    Kind.TOOL_CALL,
    Kind.TOOL_RESULT,
    Kind.ERROR,
)

# Snippet markers: control characters that never reach the index (`_clean`
# drops them), so the escaped snippet is highlighted by replacing them.
_START, _STOP = "\x02", "\x03"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A searchable word has a letter or digit: what both tokenizers keep.
_WORD = re.compile(r"[^\W_]")
_MARKED = re.compile(f"{_START}(.*?){_STOP}", re.S)


class SearchError(ValueError):
    """A search the user asked for that cannot run; the message says why, for them."""


@dataclass(frozen=True, slots=True)
class Hit:
    tab_id: uuid.UUID
    title: str
    chunk_id: uuid.UUID
    seq: int
    role: str
    type: str
    # Escaped text with the matched words in <mark>: safe to put into HTML.
    snippet: SafeString
    # The snippet as a reader sees the message: its Markdown's marks and escaped newlines
    # taken out (the page's results; the API keeps `snippet` as it was).
    plain: SafeString = field(default=SafeString(""), compare=False)
    # When the log took the chunk.
    created_at: datetime | None = field(default=None, compare=False)


# --- What goes into the index --------------------------------------------------------


def _clean(text: str, cap: int) -> str:
    return _CONTROL.sub(" ", text[:cap])


def _argument_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "\n".join(_argument_text(v) for v in value.values())
    if isinstance(value, list):
        return "\n".join(_argument_text(v) for v in value)
    return json.dumps(value)


def document(type: str, data: dict[str, Any]) -> str:
    """The indexed text of a chunk: "" for a chunk not indexed."""
    if type in (Kind.TEXT, Kind.THINKING):
        text = cast(UserText | AssistantText | Thinking, data).get("text")
        return _clean(str(text or ""), TEXT_CHARS).strip()
    if type == Kind.TOOL_CALL:
        call = cast(ToolCall, data)
        args = _argument_text(call.get("arguments") or {})
        return _clean(f"{call.get('name') or ''}\n{args}", ARGUMENT_CHARS).strip()
    if type == Kind.TOOL_RESULT:
        result = cast(ToolResult, data)
        output = [str(result.get("result") or ""), str(result.get("shell_output") or "")]
        body = "\n".join([str(result.get("name") or ""), *(o for o in output if o)])
        return _clean(body, RESULT_CHARS).strip()
    if type == Kind.ERROR:
        return _clean(str(cast(Error, data).get("message") or ""), TEXT_CHARS).strip()
    return ""


def fold(text: str) -> str:
    """Without diacritics ("café" -> "cafe"): what PostgreSQL indexes and looks for."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def db_uuid(value: uuid.UUID | str) -> Any:
    # As Django's UUIDField keeps them: 32 hex characters on SQLite, uuid on PostgreSQL.
    value = value if isinstance(value, uuid.UUID) else uuid.UUID(value)
    return value if connection.vendor == "postgresql" else value.hex


def index(tab_id: uuid.UUID, chunks: Iterable[Any]) -> int:
    """Index sealed chunks; the caller's transaction is the chunks' own. Rows indexed."""
    rows = [
        (db_uuid(c.id), db_uuid(tab_id), c.seq, c.role, c.type, body)
        for c in chunks
        if (body := document(c.type, c.data or {}))
    ]
    if not rows:
        return 0
    columns = "chunk_id, tab_id, seq, role, type, body"
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {TABLE} ({columns}, document) "
                f"VALUES (%s, %s, %s, %s, %s, %s, to_tsvector('{PG_CONFIG}', %s))",
                [(*row, fold(row[-1])) for row in rows],
            )
        return len(rows)
    # SQLite: on the driver's own connection (the same one, so the same
    # transaction), past Django's cursor wrapper: its per-statement work was a
    # third of what the index added to each seal (bench search, "write").
    # SQLITE_STATEMENTS_PER_ROW tells the writes bench what it cannot see.
    raw = connection.connection
    for row in rows:
        entry = raw.execute(f"INSERT INTO {TABLE} ({columns}) VALUES (?, ?, ?, ?, ?, ?)", row)
        raw.execute(
            f"INSERT INTO {FTS_TABLE} (rowid, body) VALUES (?, ?)", (entry.lastrowid, row[-1])
        )
    return len(rows)


def copy(source: uuid.UUID, target: uuid.UUID, *, through: int) -> None:
    """Index `target`'s copies of `source`'s chunks with seq <= `through` (chat.log.copy
    made them, in this transaction): the entries copied, each naming its copy."""
    fields = "e.seq, e.role, e.type, e.body"
    extra = ", document" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (chunk_id, tab_id, seq, role, type, body{extra}) "
            f"SELECT c.id, c.tab_id, {fields}{extra.replace(', ', ', e.')} FROM {TABLE} e "
            "JOIN chat_chunk c ON c.tab_id = %s AND c.seq = e.seq "
            "WHERE e.tab_id = %s AND e.seq <= %s ORDER BY e.id",
            [db_uuid(target), db_uuid(source), through],
        )
        if connection.vendor == "sqlite":
            cursor.execute(
                f"INSERT INTO {FTS_TABLE} (rowid, body) SELECT id, body FROM {TABLE} "
                "WHERE tab_id = %s ORDER BY id",
                [db_uuid(target)],
            )


def forget(tab_ids: Sequence[uuid.UUID]) -> None:
    """Remove the tabs' rows from the index."""
    if not tab_ids:
        return
    marks = ", ".join(["%s"] * len(tab_ids))
    ids = [db_uuid(t) for t in tab_ids]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            # An external-content FTS5 table forgets a row by being told its old text.
            cursor.execute(
                f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}, rowid, body) "
                f"SELECT 'delete', id, body FROM {TABLE} WHERE tab_id IN ({marks})",
                ids,
            )
        cursor.execute(f"DELETE FROM {TABLE} WHERE tab_id IN ({marks})", ids)


def clear(cursor: Any) -> int:
    """Empty the index on `cursor`'s connection (the wipe's transaction); rows deleted."""
    if cursor.db.vendor == "sqlite":
        cursor.execute(f"INSERT INTO {FTS_TABLE} ({FTS_TABLE}) VALUES ('delete-all')")
    cursor.execute(f"DELETE FROM {TABLE}")
    return cursor.rowcount


def _forget_tab(sender: type[Tab], instance: Tab, **kwargs: Any) -> None:
    forget([instance.pk])


def connect_signals() -> None:
    """Called once from the app's ready(): a deleted tab (alone, in a queryset, with its
    owner) takes its index rows with it, in the deletion's transaction."""
    pre_delete.connect(_forget_tab, sender=Tab, dispatch_uid="chat.search.forget_tab")


# --- Queries --------------------------------------------------------------------------


def words(q: str) -> list[str]:
    """The words of a query, or SearchError saying why there is nothing to search for."""
    q = q.strip()
    if not q:
        raise SearchError("Type a word to search for.")
    if len(q) > MAX_QUERY_CHARS:
        raise SearchError(f"A search can be at most {MAX_QUERY_CHARS} characters.")
    found = [w for w in q.split() if _WORD.search(w)]
    if not found:
        raise SearchError("The search has no letters or digits to look for.")
    if len(found) > MAX_WORDS:
        raise SearchError(f"A search can have at most {MAX_WORDS} words.")
    return found


def fts_query(found: Sequence[str]) -> str:
    """An FTS5 query that means exactly these words: each a quoted phrase, all required."""
    return " ".join('"' + w.replace('"', '""') + '"' for w in found)


def _choice(name: str, value: str | None, allowed: Sequence[str]) -> str | None:
    if value in (None, ""):
        return None
    if value not in allowed:
        raise SearchError(f"{name} must be one of: {', '.join(allowed)} (got {value!r}).")
    return value


# Markdown's marks, taken out of a snippet for reading (plain_text): a fence's line, a
# heading's, list's or quote's mark at a line's start, emphasis and code marks, a link's
# or image's brackets and address; and newlines a JSON text shows escaped.
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})[^\n]*$", re.M)
_LINE_MARK = re.compile(r"^\s{0,3}(?:#{1,6}\s+|>\s?|[-*+]\s+|\d{1,3}[.)]\s+)", re.M)
_LINK = re.compile(r"!?\[([^\]\n]*)\]\((?:[^()\n]|\([^()\n]*\))*\)")
_EMPHASIS = re.compile(r"\*\*|__|~~|`+|(?<![\w*])\*(?=\S)|(?<=\S)\*(?![\w*])")
_ESCAPED_NEWLINE = re.compile(r"\\[nrt]")
_SPACE = re.compile(r"\s+")


def plain_text(raw: str) -> str:
    """A snippet's text without Markdown's marks or escaped newlines, on one line."""
    text = _ESCAPED_NEWLINE.sub("\n", raw)
    text = _FENCE.sub(" ", text)
    text = _LINE_MARK.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _EMPHASIS.sub("", text)
    return _SPACE.sub(" ", text).strip()


def _highlight(raw: str) -> SafeString:
    marked = _MARKED.sub(r"<mark>\1</mark>", str(escape(raw or "")))
    return mark_safe(marked.replace(_START, "").replace(_STOP, ""))


def search(
    user: Any,
    q: str,
    *,
    tab: uuid.UUID | None = None,
    role: str | None = None,
    type: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> list[Hit]:
    """The user's chunks matching every word of `q`, newest first.

    SearchError (a message for the user) for a query with nothing to search
    for, an unknown role or type, or a limit out of range.
    """
    found = words(q)
    role = _choice("role", role, SEARCHABLE_ROLES)
    type = _choice("type", type, SEARCHABLE_TYPES)
    if not 1 <= limit <= MAX_LIMIT:
        raise SearchError(f"limit must be between 1 and {MAX_LIMIT}.")
    filters = ["t.owner_id = %s"]
    params: list[Any] = [user.pk]
    if tab is not None:
        filters.append("e.tab_id = %s")
        params.append(db_uuid(tab))
    if role is not None:
        filters.append("e.role = %s")
        params.append(role)
    if type is not None:
        filters.append("e.type = %s")
        params.append(type)
    where = " AND ".join(filters)
    columns = "e.chunk_id, e.tab_id, e.seq, e.role, e.type, t.title, c.created_at"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            query = " && ".join([f"phraseto_tsquery('{PG_CONFIG}', %s)"] * len(found))
            options = (
                f"StartSel={_START}, StopSel={_STOP}, "
                f"MaxWords={SNIPPET_WORDS}, MinWords={SNIPPET_WORDS // 2}"
            )
            cursor.execute(
                f"WITH q AS (SELECT {query} AS query) "
                f"SELECT {columns}, ts_headline('{PG_CONFIG}', e.body, q.query, %s) "
                f"FROM (SELECT e.* FROM {TABLE} e JOIN chat_tab t ON t.id = e.tab_id, q "
                f"WHERE e.document @@ q.query AND {where} ORDER BY e.id DESC LIMIT %s) e "
                "JOIN chat_tab t ON t.id = e.tab_id "
                "LEFT JOIN chat_chunk c ON c.id = e.chunk_id, q ORDER BY e.id DESC",
                [*map(fold, found), options, *params, limit],
            )
        else:
            cursor.execute(
                f"SELECT {columns}, "
                f"snippet({FTS_TABLE}, 0, char(2), char(3), '…', {SNIPPET_WORDS}) "
                f"FROM {FTS_TABLE} f JOIN {TABLE} e ON e.id = f.rowid "
                "JOIN chat_tab t ON t.id = e.tab_id "
                "LEFT JOIN chat_chunk c ON c.id = e.chunk_id "
                f"WHERE {FTS_TABLE} MATCH %s AND {where} ORDER BY f.rowid DESC LIMIT %s",
                [fts_query(found), *params, limit],
            )
        rows = cursor.fetchall()
    return [
        Hit(
            tab_id=uuid.UUID(str(tab_id)),
            title=title or UNTITLED,
            chunk_id=uuid.UUID(str(chunk_id)),
            seq=seq,
            role=role,
            type=type,
            snippet=_highlight(snippet),
            plain=_highlight(plain_text(snippet)),
            created_at=_datetime(created_at),
        )
        for chunk_id, tab_id, seq, role, type, title, created_at, snippet in rows
    ]


def _datetime(value: Any) -> datetime | None:
    """A timestamp column read by a raw cursor (SQLite gives text; PostgreSQL a datetime)."""
    if value is None:
        return None
    try:
        parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        return None
    # Stored in UTC (USE_TZ); SQLite's column comes back without the zone.
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def count() -> int:
    """Rows in the index (the wipe's dry run shows it)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {TABLE}")
        return cursor.fetchone()[0]
