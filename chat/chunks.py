"""What a chunk is: who it is from (Role), what it is (Kind), the kinds of system
notices (SystemKind), and the shape of each chunk type's `data`.

Pure: no Django, no database; the bottom layer of chat/, so every module may use it.
The only definitions of these names: chat.models derives the columns' choices from
them, and chat.stream re-exports Role and Kind for the modules that import them there.

Why TypedDicts, not dataclasses or msgspec Structs: a chunk's `data` is a dict from
end to end (the JSONField reads and writes it, the reducer builds it, ops and
checkpoints carry it, history and the pages read it), and the log, the requests and
the pages must stay byte for byte what they are. A TypedDict is that dict, only
described: nothing is converted at any boundary, no key is renamed or reordered, and
a type checker still checks every key against its shape: a writer builds the data
with the shape's constructor (`ToolCall(call_id=..., ...)`, a plain dict with the keys
in the order given) and stores `untyped(data)`; a reader `cast`s the row's `data` to
the shape its role and kind name. A class would have to be built from the
dict and turned back into one wherever the data crosses a boundary, and would drop or
reorder keys it does not know (system and error chunks carry open sets of them).
The shapes are also the import's schema: `check_data` derives each key's JSON type and
whether it is required from the TypedDict's own annotations, so no second table
describes them (msgspec.convert would do the same, at the cost of a dependency, and
its messages name paths, not chunks).

The constants are plain `str` (not enum members): the values written stay exact
strings wherever they go (JSON, msgpack on the channel layer, templates, reprs in
messages), and a type checker reads each `Final` one as its literal.
"""

import typing
from collections.abc import Mapping
from typing import Any, Final, NotRequired, TypedDict


class Role:
    """Who a chunk is from (Chunk.role)."""

    USER: Final = "user"
    ASSISTANT: Final = "assistant"
    TOOL: Final = "tool"
    SYSTEM: Final = "system"

    ALL: Final = (USER, ASSISTANT, TOOL, SYSTEM)


class Kind:
    """What a chunk is (Chunk.type)."""

    TEXT: Final = "text"
    THINKING: Final = "thinking"
    TOOL_CALL: Final = "tool_call"
    TOOL_RESULT: Final = "tool_result"
    # The UI's: never sent to a model.
    ERROR: Final = "error"
    SYSTEM: Final = "system"
    # The summary the request builder starts from (chat.context).
    COMPACTION: Final = "compaction"
    # An external agent's plan (chat.acp.updates): each revision a chunk of its own, the
    # page showing a turn's latest in place of the ones before. Never sent.
    PLAN: Final = "plan"

    ALL: Final = (TEXT, THINKING, TOOL_CALL, TOOL_RESULT, ERROR, SYSTEM, COMPACTION, PLAN)


class ErrorFix:
    """An error chunk's `fix`: where a configuration error is mended (no retry can):
    the keys and endpoints (Settings → Connections), or another model for the tab."""

    CONNECTIONS: Final = "connections"
    MODEL: Final = "model"


class SystemKind:
    """The `kind` of a system chunk's data: what the notice is about."""

    # A response cut off by a retryable error (marked `retry`: history drops the attempt).
    NOTICE: Final = "notice"
    # The tab's model changed: by the user on an idle tab, or to the fallback (`retry`).
    MODEL_CHANGED: Final = "model-changed"
    # The settings a running turn reads changed; it says what it now uses.
    CONFIG_RELOAD: Final = "config-reload"
    # Tools or MCP servers that could not be offered.
    TOOL_PROBLEM: Final = "tool-problem"
    # A permission rule decided a call, was added from an approval, or could not be read.
    RULE: Final = "rule"
    # Old tool results sent as one-line sentinels from here on (chat.context).
    ELIDE: Final = "elide"
    # The first chunk of a branch: where it came from.
    FORKED: Final = "forked"
    COMPACTION_FAILED: Final = "compaction-failed"
    # How a turn was cut short (chat.resume says each to the model on Continue).
    CANCELLED: Final = "cancelled"
    INTERRUPTED: Final = "interrupted"
    OUTPUT_LIMIT: Final = "output-limit"
    CONTEXT_LIMIT: Final = "context-limit"
    STEP_LIMIT: Final = "step-limit"
    # The doom-loop guard: the same call three times in a row; the user is asked.
    REPEATED_CALL: Final = "repeated-call"

    ALL: Final = (
        NOTICE,
        MODEL_CHANGED,
        CONFIG_RELOAD,
        TOOL_PROBLEM,
        RULE,
        ELIDE,
        FORKED,
        COMPACTION_FAILED,
        CANCELLED,
        INTERRUPTED,
        OUTPUT_LIMIT,
        CONTEXT_LIMIT,
        STEP_LIMIT,
        REPEATED_CALL,
    )
    # The notices that end a turn cut short: the turn's last chunk when it has one.
    ENDINGS: Final = frozenset({CANCELLED, INTERRUPTED, OUTPUT_LIMIT, CONTEXT_LIMIT, STEP_LIMIT})


class OriginKind:
    """Who sent a message other than its user at the composer (UserText's `origin`)."""

    WAKE: Final = "wake"
    # A parent tab's `agent` call: the message is its sub-agent's prompt.
    AGENT: Final = "agent"

    ALL: Final = (WAKE, AGENT)


# --- The shapes of `data` -------------------------------------------------------------
# Key order in each class is the order the import checks them in. A key's annotation
# is its JSON type: str, bool, int, float (any JSON number), list[...] (an array),
# dict[...] or a TypedDict (an object). What is inside an array or object is its
# reader's to check.


class FileRef(TypedDict, total=False):
    """A file a message or a tool result carries: a reference to a blob
    (chat.blobs.reference), never its bytes."""

    sha256: str
    name: str
    mime: str
    size: int
    width: int
    height: int
    pages: int
    # A tool's image: the workspace path it was read from.
    path: str


class Origin(TypedDict, total=False):
    """Who sent a message (QueuedMessage.origin, kept in its user chunk)."""

    kind: str  # an OriginKind
    # A wake's: which wake and time (recovery's dedup key), and what the page shows.
    wake_id: int
    scheduled_for: str
    name: str
    timezone: str
    # A sub-agent's prompt: the parent tab and its `agent` call.
    parent_tab: str
    call_id: str
    # A Wake.Approval: "deny" answers every call needing approval without asking.
    approval: str


class UserText(TypedDict):
    text: str
    interrupted: NotRequired[bool]
    # Before the text in the request (chat.history).
    attachments: NotRequired[list[FileRef]]
    # Absent when the user sent it from the composer.
    origin: NotRequired[Origin]


class AssistantText(TypedDict):
    text: str
    # Cut short (a Stop, a crash): sent as the user saw it.
    interrupted: NotRequired[bool]


class Thinking(TypedDict):
    text: str
    # Replayed byte for byte: the provider's own, base64.
    signature: NotRequired[str]
    redacted_data: NotRequired[str]
    # An OpenAI Responses reasoning item, its JSON text as it came (id, encrypted
    # content): replayed byte for byte, a string so no database re-orders its keys.
    reasoning_item: NotRequired[str]
    duration_ms: NotRequired[int]
    interrupted: NotRequired[bool]


class ToolCall(TypedDict):
    call_id: str
    name: str
    arguments: dict[str, Any]
    interrupted: NotRequired[bool]
    # An external agent's own words for the call ("Read README.md"): the page's, never sent.
    title: NotRequired[str]


class ToolResult(TypedDict):
    call_id: str
    name: str
    # Absent while the tool runs (the block holds only its live output).
    result: NotRequired[str]
    is_error: NotRequired[bool]
    truncated: NotRequired[bool]
    # What the tool's cap dropped, for the page (never sent).
    truncated_bytes: NotRequired[int]
    truncated_lines: NotRequired[int]
    shell_output: NotRequired[str]
    interrupted: NotRequired[bool]
    attachments: NotRequired[list[FileRef]]
    # An `agent` call's result: the sub-agent's tab (chat.turn.agents; its card links it).
    child_tab: NotRequired[str]


class Error(TypedDict):
    """Open: more keys may come (errors.Explanation.data() grows)."""

    message: str
    status_code: NotRequired[int]
    # errors.Explanation.data(): what the page shows beside the message.
    summary: NotRequired[str]
    hint: NotRequired[str]
    base_url: NotRequired[str]
    retry_after: NotRequired[float]
    attempts: NotRequired[int]
    # Where a configuration error is fixed: an ErrorFix.
    fix: NotRequired[str]


class SystemNotice(TypedDict):
    """Open: a notice of a kind may carry keys of its own."""

    kind: str  # a SystemKind
    text: str
    retry: NotRequired[bool]
    # output-limit, context-limit: the provider's stop reason.
    stop_reason: NotRequired[str]
    # rule: the call it decided, and the rule.
    call_id: NotRequired[str]
    action: NotRequired[str]
    pattern: NotRequired[str]
    source: NotRequired[str]
    added: NotRequired[bool]
    # elide: the results sent as sentinels, and their size.
    seqs: NotRequired[list[int]]
    chars: NotRequired[int]
    # forked: the tab and seq the branch came from, how (`action`), and whether it ran.
    from_tab: NotRequired[str]
    at_seq: NotRequired[int]
    run: NotRequired[bool]


class Compaction(TypedDict):
    """Sent: its summary replaces every chunk through `through_seq` (chat.context)."""

    summary: str
    through_seq: int
    model: NotRequired[str]
    trigger: NotRequired[str]
    instructions: NotRequired[str]
    tokens_before: NotRequired[int]


class PlanEntry(TypedDict):
    """One step of an agent's plan, as ACP's PlanEntry has it."""

    content: str
    # ACP's: "pending", "in_progress" or "completed"; "high", "medium" or "low".
    status: str
    priority: NotRequired[str]


class Plan(TypedDict):
    """An external agent's plan as it stood at one revision (the whole plan: ACP sends
    every entry each time). What the page shows; never sent to a model."""

    entries: list[PlanEntry]
    # Entries past the cap (chat.acp.updates.PLAN_MAX_ENTRIES), left out.
    omitted: NotRequired[int]


ChunkData = (
    UserText
    | AssistantText
    | Thinking
    | ToolCall
    | ToolResult
    | Error
    | SystemNotice
    | Compaction
    | Plan
)

# The (role, kind) pairs the app writes, and the shape of each one's data.
SHAPES: Final[Mapping[tuple[str, str], type[Any]]] = {
    (Role.USER, Kind.TEXT): UserText,
    (Role.ASSISTANT, Kind.TEXT): AssistantText,
    (Role.ASSISTANT, Kind.THINKING): Thinking,
    (Role.ASSISTANT, Kind.TOOL_CALL): ToolCall,
    (Role.TOOL, Kind.TOOL_RESULT): ToolResult,
    (Role.ASSISTANT, Kind.ERROR): Error,
    (Role.SYSTEM, Kind.SYSTEM): SystemNotice,
    (Role.SYSTEM, Kind.COMPACTION): Compaction,
    (Role.ASSISTANT, Kind.PLAN): Plan,
}
# Shapes whose data may carry keys they do not name. Only the UI reads them (never
# sent), and the runner adds keys to them; a sendable chunk with a key its shape does
# not name is from a writer this version does not know: what it carries would be lost
# on the way to the provider.
OPEN_SHAPES: Final = frozenset({(Role.ASSISTANT, Kind.ERROR), (Role.SYSTEM, Kind.SYSTEM)})


def untyped(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` (a TypedDict of this module) itself, no copy, as the dict a Block or a
    Chunk row holds: a type checker takes a TypedDict for a read-only Mapping only."""
    return typing.cast(dict[str, Any], data)


def body_key(kind: str) -> str:
    """The key of the body a block of `kind` streams into: text, thinking, live output."""
    return "shell_output" if kind == Kind.TOOL_RESULT else "text"


# --- Checking data against its shape ----------------------------------------------------


class ShapeError(ValueError):
    """A role, kind or data that is not one the app writes; the message says what."""


# A JSON type: the Python type json.loads makes, and its name in messages.
_JSON_NAMES: Final[Mapping[type, str]] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
}


def _json_type(annotation: Any) -> type:
    """The JSON type an annotation of a shape stands for (list[X] -> list, a TypedDict
    -> dict)."""
    outer = dict if typing.is_typeddict(annotation) else typing.get_origin(annotation)
    outer = outer or annotation
    if outer not in _JSON_NAMES:
        raise TypeError(f"{annotation!r} is not a JSON type a shape may use")
    return typing.cast(type, outer)


def _fields(shape: type[Any]) -> tuple[tuple[str, type, bool], ...]:
    """(key, JSON type, required) of each key of a TypedDict, in declaration order."""
    hints = typing.get_type_hints(shape)
    required = shape.__required_keys__
    return tuple((key, _json_type(hint), key in required) for key, hint in hints.items())


_FIELDS: Final = {pair: _fields(shape) for pair, shape in SHAPES.items()}
_KEYS: Final = {pair: frozenset(key for key, _, _ in fields) for pair, fields in _FIELDS.items()}


def json_kind(value: Any) -> str:
    """What a JSON value is, as a message says it ("a string", "null", ...)."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
    return type(value).__name__


def is_json(value: Any, expected: type) -> bool:
    """`value` is of the JSON type `expected`; bool is no number, as in JSON."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, int | float)
    return isinstance(value, expected)


def must_be(value: Any, expected: type, where: str) -> None:
    """Raise ShapeError unless `value` is of the JSON type `expected`."""
    if not is_json(value, expected):
        raise ShapeError(f"{where} must be {_JSON_NAMES[expected]}, not {json_kind(value)}")


def check_kind(role: Any, kind: Any) -> None:
    """Raise ShapeError unless (`role`, `kind`) is a pair the app writes."""
    must_be(role, str, "role")
    must_be(kind, str, "type")
    if role not in Role.ALL:
        raise ShapeError(f"unknown role {role!r} (known: {', '.join(sorted(Role.ALL))})")
    if kind not in Kind.ALL:
        raise ShapeError(f"unknown type {kind!r} (known: {', '.join(sorted(Kind.ALL))})")
    if (role, kind) not in SHAPES:
        raise ShapeError(f"a {role} chunk cannot be of type {kind!r}")


def check_data(role: str, kind: str, data: Mapping[str, Any]) -> None:
    """Raise ShapeError unless `data` has the shape of a (`role`, `kind`) chunk:
    no key its shape does not name (unless the shape is open), every required key,
    each key of its JSON type. The pair must be one of SHAPES (check_kind)."""
    pair = (role, kind)
    where = f"the data of this {kind} chunk ({role})"
    if pair not in OPEN_SHAPES:
        unknown = sorted(set(data) - _KEYS[pair])
        if unknown:
            raise ShapeError(f"unknown field(s) in {where}: {', '.join(unknown)}")
    for key, expected, required in _FIELDS[pair]:
        if key not in data:
            if required:
                raise ShapeError(f"{where} has no {key!r}")
            continue
        must_be(data[key], expected, f"{where}: {key!r}")
