"""Export a tab (JSONL, Markdown) and import a JSONL export as a new tab.

Exports are generators reading the log a page of seqs at a time, so a tab of
any length streams in constant memory, and they stop at the last seq the tab
had when the export began: a turn running meanwhile does not make the header's
chunk count wrong.

The JSONL format (version 1): a header line

    {"format": "dispatch-tab", "version": 1, "tab_id", "title", "model",
     "system_prompt", "created_at", "exported_at", "chunks": N}

then one line per chunk, `{"id", "seq", "turn_id", "step", "role", "type",
"data", "created_at"}`, with `data` exactly as stored (signatures, redacted
reasoning, call ids, everything the request builder reads).

An import is checked whole first (every line, spooled to a temporary file),
so a bad file writes nothing; then it is written a batch per transaction into
a tab that belongs to no one until the last batch is in: on SQLite one long
transaction would hold the database's write lock for seconds (13 s for 100,000
chunks) and stall every running turn. It creates a new tab with new chunk ids: a chunk id is a
primary key across all tabs, and importing a file next to the tab it came from
(the common case) must neither fail nor overwrite. Seqs, turn ids, steps,
roles, types and data are kept, so the next request is byte for byte the one
the original tab would send. Timestamps are the import's; the file keeps the
original ones.
"""

from __future__ import annotations

import base64
import binascii
import json
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import IO, Any, Protocol, cast

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone
from django.utils.text import slugify

from chat import blobs, history, log
from chat.chunks import (
    AssistantText,
    Compaction,
    Error,
    Kind,
    Plan,
    Role,
    ShapeError,
    SystemNotice,
    Thinking,
    ToolCall,
    ToolResult,
    UserText,
    check_data,
    check_kind,
    json_kind,
    must_be,
)
from chat.models import Chunk, Tab
from chat.stream import Block

FORMAT = "dispatch-tab"
VERSION = 1
# Chunks read per query. Big enough that the query count stays small (a
# 100,000-chunk tab is 200 queries), small enough that a page of large tool
# results stays a few MB.
PAGE = 500
# Chunks written per insert on import: the same trade-off as PAGE; and at most this many
# bytes of lines per insert, so a batch of large chunks stays a few MB too.
WRITE_BATCH = 1000
WRITE_BATCH_BYTES = 4 * 1024 * 1024
# The largest import accepted. A 100,000-chunk tab of ordinary turns exports to
# about 30 MB; much more than this is a mistake (or an attack), and the file is
# refused before it is read into memory.
IMPORT_MAX_BYTES = 64 * 1024 * 1024
# The longest line (one chunk) accepted. The largest chunks the app writes are a message
# of forms.MAX_MESSAGE_CHARS (at most ~400 KB as UTF-8) and a model's longest output
# (tool arguments, thinking: well under 1 MB); a tool result is capped at 64 KB. Parsing a
# line costs several times its size in memory (15x for one of many small values), so
# this bound, not the file's, is what keeps an import's memory within twice the file's.
MAX_LINE_BYTES = 4 * 1024 * 1024
# A tool call's arguments or a result in the Markdown export: people read the
# start, and the JSONL export keeps everything.
MARKDOWN_TOOL_CHARS = 4000
# A multipart upload carries the file and a few small fields and boundaries.
MULTIPART_SLACK = 64 * 1024
# The slug of a title in an export's file name: enough to recognise the tab.
FILENAME_TITLE_CHARS = 60
# Tab.title's and Tab.model's max_length.
TITLE_MAX = 200
MODEL_MAX = 200
# Chunk.step is a PositiveIntegerField: PostgreSQL's integer.
STEP_MAX = 2**31 - 1

HEADER_FIELDS = {
    "format",
    "version",
    "tab_id",
    "title",
    "model",
    "system_prompt",
    "created_at",
    "exported_at",
    "chunks",
}
CHUNK_FIELDS = ("id", "seq", "turn_id", "step", "role", "type", "data", "created_at")


class ImportRefused(ValueError):
    """A file that cannot become a tab. `line` is 1-based (0: the file as a whole)."""

    def __init__(self, line: int, problem: str) -> None:
        self.line = line
        self.problem = problem
        super().__init__(f"line {line}: {problem}" if line else problem)


class ImportTooLarge(ImportRefused):
    def __init__(self, limit: int) -> None:
        super().__init__(
            0, f"the file is larger than the import limit of {limit // (1024 * 1024)} MB"
        )
        self.limit = limit


# --- Export --------------------------------------------------------------------------


def _pages(tab: Tab, end: int) -> Iterator[list[Chunk]]:
    """The log up to seq `end`, a page at a time."""
    after = 0
    while after < end:
        chunks = [c for c in log.tail(tab.pk, after=after, limit=PAGE) if c.seq <= end]
        if not chunks:
            return
        yield chunks
        after = chunks[-1].seq


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _line(value: Any) -> str:
    # ensure_ascii=False: the file is UTF-8 and people open it; lone surrogates
    # cannot be in a stored string, so this always encodes.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n"


def header(tab: Tab, end: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "tab_id": str(tab.pk),
        "title": tab.title,
        "model": tab.model,
        "system_prompt": tab.system_prompt,
        "created_at": _iso(tab.created_at),
        "exported_at": timezone.now().isoformat(),
        "chunks": end,
    }


def export_jsonl(tab: Tab) -> Iterator[str]:
    """The tab as JSONL: the header line, then one line per chunk in seq order."""
    end = log.last_seq(tab.pk)
    yield _line(header(tab, end))
    for chunks in _pages(tab, end):
        yield "".join(_line(log.as_json(c)) for c in chunks)


def export_markdown(tab: Tab) -> Iterator[str]:
    """The tab for people: messages as Markdown, tool calls and results fenced."""
    end = log.last_seq(tab.pk)
    yield _markdown_head(tab)
    section: str | None = None
    for chunks in _pages(tab, end):
        parts = []
        for chunk in chunks:
            wanted: str | None
            if chunk.role == Role.USER:
                wanted = "User"
            elif chunk.role == Role.SYSTEM:
                wanted = section  # a notice belongs to whoever spoke around it
            else:
                wanted = "Assistant"
            if wanted is not None and wanted != section:
                parts.append(f"## {wanted}\n\n")
                section = wanted
            parts.append(markdown_chunk(chunk))
        yield "".join(parts)


def _markdown_head(tab: Tab) -> str:
    lines = [f"# {_one_line(str(tab))}\n\n"]
    lines.append(f"- Model: {_code(tab.model)}\n" if tab.model else "")
    lines.append(f"- Created: {_iso(tab.created_at)}\n")
    lines.append(f"- Exported: {timezone.now().isoformat()}\n\n")
    if tab.system_prompt:
        lines.append("<details><summary>System prompt</summary>\n\n")
        lines.append(fenced(tab.system_prompt, "text"))
        lines.append("\n</details>\n\n")
    return "".join(lines)


def markdown_chunk(chunk: Any) -> str:
    """One chunk as Markdown, ending with a blank line."""
    data = chunk.data
    match chunk.type:
        case Kind.TEXT:
            text = cast(UserText | AssistantText, data).get("text", "")
            return (f"{text.rstrip()}\n\n" if text.strip() else "") + _attachment_list(data)
        case Kind.THINKING:
            text = cast(Thinking, data).get("text", "")
            if not text.strip():
                return "*Reasoning not shown by the provider.*\n\n"
            return f"<details><summary>Thinking</summary>\n\n{text.rstrip()}\n\n</details>\n\n"
        case Kind.TOOL_CALL:
            call = cast(ToolCall, data)
            arguments = json.dumps(call.get("arguments") or {}, ensure_ascii=False, indent=2)
            return (
                f"**Tool call** {_code(str(call.get('name', '')))}\n\n"
                + fenced(arguments, "json", limit=MARKDOWN_TOOL_CHARS)
                + "\n"
            )
        case Kind.TOOL_RESULT:
            result = cast(ToolResult, data)
            name = _code(str(result.get("name", "")))
            if "result" in result:
                label = "Error from" if result.get("is_error") else "Result of"
                body = str(result["result"])
            else:
                label, body = "Output so far (no result) of", result.get("shell_output", "")
            return f"**{label}** {name}\n\n" + fenced(body, "", limit=MARKDOWN_TOOL_CHARS) + "\n"
        case Kind.ERROR:
            error = cast(Error, data)
            status = error.get("status_code")
            prefix = f"Error {status}" if status else "Error"
            return f"*{prefix}: {_italic(str(error.get('message', '')))}*\n\n"
        case Kind.SYSTEM:
            notice = cast(SystemNotice, data)
            kind = str(notice.get("kind", "")).replace("-", " ").capitalize() or "Notice"
            return f"*{_italic(kind)}: {_italic(str(notice.get('text', '')))}*\n\n"
        case Kind.COMPACTION:
            return _compaction(data)
        case Kind.PLAN:
            return _plan(data)
    return f"*A chunk of unknown type {_italic(chunk.type)}.*\n\n"


def _plan(data: Plan) -> str:
    """An agent's plan at one revision, as a task list."""
    lines = ["**Plan**\n\n"]
    for entry in data.get("entries") or []:
        done = "x" if entry.get("status") == "completed" else " "
        now = " *(in progress)*" if entry.get("status") == "in_progress" else ""
        lines.append(f"- [{done}] {_italic(str(entry.get('content', '')))}{now}\n")
    return "".join(lines) + "\n"


def _compaction(data: Compaction) -> str:
    """A compaction as a notice, its summary (the model's Markdown) folded under it."""
    what = [f"through #{data.get('through_seq')}"]
    if data.get("trigger"):
        what.append(str(data["trigger"]))
    if isinstance(data.get("tokens_before"), int):
        what.append(f"{data['tokens_before']:,} tokens summarised")
    if data.get("model"):
        what.append(f"by {data['model']}")
    if data.get("instructions"):
        what.append(f"focus: {data['instructions']}")
    summary = str(data.get("summary", "")).rstrip()
    return (
        f"*Conversation compacted ({_italic('; '.join(what))}).*\n\n"
        f"<details><summary>Summary</summary>\n\n{summary}\n\n</details>\n\n"
    )


def _attachment_list(data: dict[str, Any]) -> str:
    """A message's files by name: the export carries references, never the bytes."""
    files = data.get("attachments")
    if not isinstance(files, list):
        return ""
    names = [str(f.get("name") or "attachment") for f in files if isinstance(f, dict)]
    if not names:
        return ""
    return "".join(f"- Attached: {_code(name)}\n" for name in names) + "\n"


def fenced(text: str, info: str, *, limit: int | None = None) -> str:
    """`text` in a code fence longer than any backtick run inside it, cut to `limit`."""
    note = ""
    if limit is not None and len(text) > limit:
        note = (
            f"\n*… {len(text) - limit:,} more characters not shown "
            "(the JSONL export has everything).*\n"
        )
        text = text[:limit]
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"{fence}{info}\n{body}{fence}\n{note}"


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    return longest


def _code(text: str) -> str:
    """Inline code that holds any backticks in `text`."""
    text = _one_line(text)
    ticks = "`" * (_longest_backtick_run(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _italic(text: str) -> str:
    # Escaped so that a star or underscore in a notice cannot end the italics.
    out = _one_line(text)
    for ch in "\\*_`[]<>":
        out = out.replace(ch, "\\" + ch)
    return out


def _one_line(text: str) -> str:
    return " ".join(text.split())


# format -> (writer, content type, file extension)
FORMATS = {
    "jsonl": (export_jsonl, "application/x-ndjson; charset=utf-8", "jsonl"),
    "markdown": (export_markdown, "text/markdown; charset=utf-8", "md"),
}


async def _async(parts: Iterator[str]) -> AsyncIterator[str]:
    """A sync generator that reads the database, served a part at a time under ASGI.

    Django serves a sync iterator under ASGI by reading it into a list first,
    which would hold the whole export in memory.
    """
    step = sync_to_async(_next_part, thread_sensitive=True)
    while (part := await step(parts)) is not None:
        yield part


def _next_part(parts: Iterator[str]) -> str | None:
    return next(parts, None)


def export_response(tab: Tab, fmt: str) -> StreamingHttpResponse:
    """The export as a download; `fmt` is a key of FORMATS."""
    writer, content_type, extension = FORMATS[fmt]
    name = slugify(str(tab))[:FILENAME_TITLE_CHARS].strip("-") or "tab"
    day = timezone.localdate().isoformat()
    response = StreamingHttpResponse(_async(writer(tab)), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{name}-{day}.{extension}"'
    return response


def declared_too_large(request: HttpRequest, *, multipart: bool) -> bool:
    """The request says (Content-Length) that its body is past the import limit.

    Checked before the body is parsed: such a file is refused unread.
    """
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False  # the server refuses such a request before it gets here
    return length > IMPORT_MAX_BYTES + (MULTIPART_SLACK if multipart else 0)


# --- Import --------------------------------------------------------------------------


class LineSource(Protocol):
    """What an import reads its file from: an upload, a file, or a request's body."""

    def readline(self, size: int, /) -> bytes: ...


def _lines(stream: LineSource, max_bytes: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line; refuses the file once it passes `max_bytes`,
    and a line once it passes MAX_LINE_BYTES.

    readline with a bound: one enormous line is not read past either limit.
    """
    read = 0
    number = 0
    while True:
        raw = stream.readline(min(max_bytes - read, MAX_LINE_BYTES + 1) + 1)
        if not raw:
            return
        read += len(raw)
        if read > max_bytes:
            raise ImportTooLarge(max_bytes)
        number += 1
        if len(raw.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            raise ImportRefused(
                number,
                f"the line is longer than {MAX_LINE_BYTES // (1024 * 1024)} MB, the most one "
                "chunk of an export may be",
            )
        if raw.endswith(b"\n"):
            raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ImportRefused(
                number,
                f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
            ) from None
        del raw  # not kept alive beside its text while the caller parses it
        yield number, text


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json(number: int, text: str) -> Any:
    if not text.strip():
        raise ImportRefused(number, "an empty line; every line must be one JSON object")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ImportRefused(number, f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except ValueError as exc:  # from the hooks above
        raise ImportRefused(number, f"not valid JSON: {exc}") from None


def _object(number: int, value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ImportRefused(number, f"{what} must be a JSON object, not {json_kind(value)}")
    return value


def _typed(number: int, value: Any, expected: type, where: str) -> None:
    try:
        must_be(value, expected, where)
    except ShapeError as exc:
        raise ImportRefused(number, str(exc)) from None


def _check_keys(number: int, value: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ImportRefused(number, f"unknown field(s) in {where}: {', '.join(unknown)}")


def _check_header(number: int, value: Any) -> dict[str, Any]:
    head = _object(number, value, "the header")
    if "seq" in head and "format" not in head:
        raise ImportRefused(
            number,
            f'no header: this line is a chunk, and an export starts with a "{FORMAT}" header',
        )
    if head.get("format") != FORMAT:
        raise ImportRefused(
            number,
            f'the first line must be the header {{"format": "{FORMAT}", ...}}; '
            f"this file's first line has format {json.dumps(head.get('format'))}",
        )
    version = head.get("version")
    if version != VERSION or isinstance(version, bool):
        raise ImportRefused(
            number,
            f"version {json.dumps(version)} of the format is not known here "
            f"(this version of Dispatch reads version {VERSION})",
        )
    _check_keys(number, head, HEADER_FIELDS, "the header")
    for key in ("title", "model", "system_prompt", "chunks"):
        if key not in head:
            raise ImportRefused(number, f"the header has no {key!r}")
    for key in ("title", "model", "system_prompt"):
        _typed(number, head[key], str, f"the header's {key!r}")
    _typed(number, head["chunks"], int, "the header's 'chunks'")
    if len(head["title"]) > TITLE_MAX:
        raise ImportRefused(number, f"the title is longer than {TITLE_MAX} characters")
    if len(head["model"]) > MODEL_MAX:
        raise ImportRefused(number, f"the model name is longer than {MODEL_MAX} characters")
    return head


def _uuid(number: int, value: Any, where: str) -> uuid.UUID:
    _typed(number, value, str, where)
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ImportRefused(number, f"{where} is not a UUID: {value[:60]!r}") from None


def _base64(number: int, value: str, where: str) -> None:
    """Signatures and redacted reasoning are base64: a cut one usually is not.

    A cut at a multiple of four characters still decodes; only the provider can
    tell (it refuses the request), since the signature is its own secret.
    """
    try:
        ok = bool(value) and base64.b64decode(value, validate=True) is not None
    except (binascii.Error, ValueError):
        ok = False
    if not ok:
        raise ImportRefused(
            number,
            f"{where} is not valid base64 (a truncated or edited signature?); "
            "the provider would refuse every later request of this tab",
        )


def _check_data(number: int, role: str, kind: str, data: dict[str, Any]) -> None:
    """`data` has its chunk type's shape (chat.chunks), and what a request sends is sound."""
    try:
        check_data(role, kind, data)
    except ShapeError as exc:
        raise ImportRefused(number, str(exc)) from None
    if kind == Kind.THINKING:
        for key in ("signature", "redacted_data"):
            if key in data:
                _base64(number, data[key], f"the thinking {key}")
    if kind == Kind.TOOL_CALL and not data["name"]:
        raise ImportRefused(number, "a tool call without a tool name")
    if kind == Kind.COMPACTION and not data["summary"].strip():
        raise ImportRefused(number, "a compaction with an empty summary")
    for key in ("duration_ms", "tokens_before"):
        if key in data and data[key] < 0:
            raise ImportRefused(number, f"{key} is negative")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _check_chunk(number: int, value: Any, seq: int, text: str) -> Block:
    """The chunk on line `number`, expected to have seq `seq`, as a Block with a new id."""
    fields = _object(number, value, "a chunk line")
    if fields.get("format") == FORMAT:
        raise ImportRefused(number, "a second header: a file holds one tab")
    _check_keys(number, fields, set(CHUNK_FIELDS), "a chunk line")
    for key in CHUNK_FIELDS:
        if key not in fields:
            raise ImportRefused(number, f"the chunk has no {key!r}")
    _typed(number, fields["seq"], int, "seq")
    if fields["seq"] != seq:
        raise ImportRefused(
            number,
            f"seq {fields['seq']} where {seq} was expected: seqs must run 1, 2, 3, … "
            "with no gap or repeat",
        )
    _uuid(number, fields["id"], "id")
    turn_id = None
    if fields["turn_id"] is not None:
        turn_id = _uuid(number, fields["turn_id"], "turn_id")
    _typed(number, fields["step"], int, "step")
    if not 0 <= fields["step"] <= STEP_MAX:
        raise ImportRefused(number, f"step {fields['step']} is out of range")
    role, kind = fields["role"], fields["type"]
    try:
        check_kind(role, kind)
    except ShapeError as exc:
        raise ImportRefused(number, str(exc)) from None
    if fields["created_at"] is not None:
        _typed(number, fields["created_at"], str, "created_at")
        try:
            datetime.fromisoformat(fields["created_at"])
        except ValueError:
            raise ImportRefused(number, "created_at is not an ISO 8601 date and time") from None
    data = _object(number, fields["data"], "data")
    _check_data(number, role, kind, data)
    if kind == Kind.COMPACTION and not 0 <= data["through_seq"] < seq:
        raise ImportRefused(
            number, f"a compaction at seq {seq} cannot summarise through seq {data['through_seq']}"
        )
    # PostgreSQL's jsonb cannot hold U+0000; the raw line shows whether to look.
    if "\\u0000" in text and connection.vendor == "postgresql" and _has_nul(data):
        raise ImportRefused(number, "the data holds a NUL character (\\u0000)")
    return Block(uuid.uuid4(), turn_id, fields["step"], role, kind, data, seq=seq)


def import_jsonl(
    owner: Any,
    stream: LineSource,
    *,
    max_bytes: int | None = None,
) -> Tab:
    """A new tab of `owner` holding the exported tab in `stream` (binary, JSONL).

    Raises ImportRefused (with the line number) for anything that is not a
    whole, valid export; nothing is written then.
    """
    limit = IMPORT_MAX_BYTES if max_bytes is None else max_bytes
    lines = _lines(stream, limit)
    first = next(lines, None)
    if first is None:
        raise ImportRefused(1, f'the file is empty; an export starts with a "{FORMAT}" header')
    # A byte order mark, as some Windows editors write, is not part of the JSON.
    head = _check_header(first[0], _json(first[0], first[1].removeprefix("\ufeff")))
    # Checked lines wait on disk, not in memory: an export may be 64 MB.
    # newline="\n": a carriage return within a line (JSON whitespace) stays in it.
    with tempfile.TemporaryFile("w+", encoding="utf-8", newline="\n") as checked:
        _check_lines(head, first[0], lines, checked)
        checked.seek(0)
        return _write(owner, head, checked)


def _check_lines(
    head: dict[str, Any], number: int, lines: Iterator[tuple[int, str]], checked: IO[str]
) -> None:
    """Check every chunk line (through the request builder, as a turn would read them)
    and copy it to `checked`. Its own function so that the builder, which holds the
    whole history, is gone before the chunks are written."""
    builder = history.History()
    seq = 0
    for number, text in lines:
        seq += 1
        block = _check_chunk(number, _json(number, text), seq, text)
        try:
            builder.add(block)
        except ValueError as exc:
            raise ImportRefused(number, f"the request builder refuses this chunk: {exc}") from None
        checked.write(text + "\n")
    if head["chunks"] != seq:
        raise ImportRefused(
            number,
            f"the header says {head['chunks']} chunks and the file holds {seq}: "
            "is the file cut short?",
        )


def _owned_files_only(owner_id: Any, data: dict[str, Any]) -> dict[str, Any]:
    """A chunk's `data` whose file references name only blobs the importer has (a hash
    in a file is no proof of having had the file, and the runner would send what a
    reference names): any other keeps its name but loses its sha256, so nothing reads
    it, and the chunk says the file is not available, as a request says of a file that
    is gone."""
    refs = data["attachments"]
    named = [r["sha256"] for r in refs if isinstance(r, dict) and isinstance(r.get("sha256"), str)]
    owned = blobs.owned_of(owner_id, named)
    kept, lines = [], []
    for ref in refs:
        # str(): an edited file may hold anything there.
        if isinstance(ref, dict) and "sha256" in ref and str(ref["sha256"]) not in owned:
            ref = {key: value for key, value in ref.items() if key != "sha256"}
            lines.append(
                f"[{_file_label(ref)}: not available (the tab was imported without it), "
                "so it cannot be shown]"
            )
        kept.append(ref)
    if not lines:
        return data
    # Where the model reads it: a message's text (its files come first), a tool's result.
    key = "result" if "call_id" in data else "text"
    said = str(data.get(key) or "")
    return {**data, "attachments": kept, key: "\n".join(lines) + ("\n\n" + said if said else "")}


def _file_label(ref: dict[str, Any]) -> str:
    name = str(ref.get("name") or "attachment")
    mime = str(ref.get("mime") or "")
    kind = "image" if mime.startswith("image/") else "document" if mime == blobs.PDF else "file"
    return f"{kind} {name}"


def _write(owner: Any, head: dict[str, Any], checked: IO[str]) -> Tab:
    """Write checked chunk lines as a new tab of `owner`: a batch per transaction, the
    tab owned by no one (so shown to no one) until the last batch is in; removed if
    any batch fails."""
    tab = Tab.objects.create(
        owner=None, title=head["title"], model=head["model"], system_prompt=head["system_prompt"]
    )
    try:
        batch: list[Block] = []
        size = 0
        files: list[Any] = []
        for seq, text in enumerate(checked, start=1):
            fields = json.loads(text)
            if fields["data"].get("attachments"):
                fields["data"] = _owned_files_only(getattr(owner, "pk", None), fields["data"])
                files += fields["data"]["attachments"]
            turn_id = uuid.UUID(fields["turn_id"]) if fields["turn_id"] is not None else None
            batch.append(
                Block(
                    uuid.uuid4(),
                    turn_id,
                    fields["step"],
                    fields["role"],
                    fields["type"],
                    fields["data"],
                    seq=seq,
                )
            )
            size += len(text)
            if len(batch) >= WRITE_BATCH or size >= WRITE_BATCH_BYTES:
                log.append(tab.pk, batch)
                batch, size = [], 0
        log.append(tab.pk, batch)
        blobs.adopt(tab.pk, getattr(owner, "pk", None), files)
        Tab.objects.filter(pk=tab.pk).update(owner=owner)
    except BaseException:
        tab.delete()
        raise
    tab.refresh_from_db()
    return tab
