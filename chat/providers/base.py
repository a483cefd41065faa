"""Provider-neutral types: the events a provider streams and the request it is given.

Pure: no Django imports. stream.py consumes the events, history.py produces the
request messages, and each adapter in this package translates between these
types and one wire format.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# --- Events (provider -> reducer) -------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningEnd:
    """Closes a thinking block; the metadata must be replayed byte for byte.

    `reasoning_item`: an OpenAI Responses reasoning item (its id and encrypted content),
    as JSON text in the key order it came in: sent back as it is.
    """

    signature: str | None = None
    redacted_data: str | None = None
    reasoning_item: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    call_id: str
    name: str
    arguments: Mapping[str, Any]
    # An external agent's own words for the call (chat.acp.updates): shown, never sent.
    title: str = ""


@dataclass(frozen=True, slots=True)
class ShellOutput:
    """Live output of a running tool, streamed into its open tool_result chunk."""

    call_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ToolResultEvent:
    call_id: str
    name: str
    result: str
    is_error: bool = False
    truncated: bool = False
    # The tool's own record of its output (capped head and tail); when given it
    # replaces what streamed live, which stops at the cap.
    shell_output: str | None = None
    # What the tool's cap dropped from the output (ToolOutcome's), for the page to say.
    truncated_bytes: int = 0
    truncated_lines: int = 0
    # Images the tool read (chat.blobs.reference dicts with the workspace `path` they
    # were read from), stored as blobs by the runner.
    attachments: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    message: str
    status_code: int | None = None
    # What the page shows besides the message (errors.Explanation.data(): summary,
    # hint, base_url, retry_after, attempts), kept in the error chunk's data.
    details: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SystemEvent:
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class PlanEvent:
    """An external agent's plan, whole, as revised (chat.acp.updates): each entry's
    content, status and priority (chat.chunks.PlanEntry); `omitted` past the cap."""

    entries: tuple[Mapping[str, str], ...]
    omitted: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # Of output_tokens, those the model spent reasoning (where the provider says).
    reasoning_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.reasoning_tokens + other.reasoning_tokens,
        )


@dataclass(frozen=True, slots=True)
class Finish:
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = "end_turn"


Event = (
    TextDelta
    | ReasoningDelta
    | ReasoningEnd
    | ToolCallEvent
    | ShellOutput
    | ToolResultEvent
    | ErrorEvent
    | SystemEvent
    | PlanEvent
    | Finish
)


# --- Request (history -> provider) ------------------------------------------


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ThinkingPart:
    text: str
    signature: str | None = None
    redacted_data: str | None = None
    # A Responses reasoning item's JSON text (ReasoningEnd); other adapters ignore it.
    reasoning_item: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    call_id: str
    name: str
    arguments: Mapping[str, Any]


# Where a file sent in a message is put in the workspace (chat.blobs.place), so a model
# that cannot take the file itself is told where its tools find it.
UPLOADS_DIR = "uploads"


def upload_path(sha256: str, name: str) -> str:
    """The workspace path of an attachment: a directory per blob, the file's own name."""
    return f"{UPLOADS_DIR}/{sha256[:12]}/{name}"


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image (PNG or JPEG, normalised by chat.blobs): a reference; its bytes are read
    through the request's `blobs` when it is sent. `path`: where it is in the workspace."""

    sha256: str
    name: str
    mime: str
    width: int
    height: int
    path: str


@dataclass(frozen=True, slots=True)
class DocumentPart:
    """A PDF, as ImagePart is an image; `pages` is its page count."""

    sha256: str
    name: str
    mime: str
    size: int
    pages: int
    path: str


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    call_id: str
    name: str
    result: str
    is_error: bool = False
    # Images the tool read, shown to the model with the result.
    images: tuple[ImagePart, ...] = ()


Part = TextPart | ThinkingPart | ToolCallPart | ToolResultPart | ImagePart | DocumentPart


@dataclass(frozen=True, slots=True)
class Message:
    """One request message. Roles alternate user/assistant, starting with user.

    A user message holds the previous assistant message's tool results first,
    then any text: the Anthropic shape. Adapters for other wire formats split it.
    """

    role: str  # Role.USER or Role.ASSISTANT (chat.chunks)
    parts: tuple[Part, ...]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    input_schema: Mapping[str, Any]


class BlobReader(Protocol):
    """Attachments' bytes, for the adapters (chat.blobs.READER: files, no database).
    None for a blob whose bytes are gone."""

    def data(self, sha256: str) -> bytes | None: ...

    def text(self, sha256: str) -> str | None:
        """A PDF's text, for a model that cannot read PDFs."""
        ...


@dataclass(frozen=True, slots=True)
class Request:
    system: str
    tools: tuple[ToolSpec, ...]
    messages: Sequence[Message]
    # Where the bytes of the messages' images and documents are read (None: nowhere,
    # each is sent as a line saying it is not available).
    blobs: BlobReader | None = None
    # An output limit below the model's (None: the model's own).
    max_tokens: int | None = None
    # What the provider may group requests by for its prompt cache (the tab's id):
    # OpenAI's Responses adapter sends it as prompt_cache_key, the others ignore it.
    cache_key: str | None = None


# --- Errors ------------------------------------------------------------------


class ProviderError(Exception):
    """A classified failure of one provider call.

    `retryable` says whether the same request may succeed later (rate limits,
    overload, 5xx, a dropped connection); `retry_after` is the server's hint in
    seconds, when it gave one. `transport` names a failure below HTTP (see
    errors.TRANSPORT); `base_url` is the endpoint that was tried, its password
    masked (`default_url`: the SDK's own), set by the adapter (errors.located).
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        error_type: str | None = None,
        retry_after: float | None = None,
        retryable: bool = False,
        transport: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_type = error_type
        self.retry_after = retry_after
        self.retryable = retryable
        self.transport = transport
        self.base_url: str | None = None
        self.default_url = False

    def __repr__(self) -> str:
        return (
            f"ProviderError({self.message!r}, status_code={self.status_code}, "
            f"error_type={self.error_type!r}, retry_after={self.retry_after}, "
            f"retryable={self.retryable})"
        )


class Provider(Protocol):
    """Streams one model response. Closing the iterator early closes the connection.

    `idle_timeout`: the longest silence (seconds) the turn runner allows between
    two events of a stream before it gives the attempt up as stalled. HTTP
    adapters also keep `alive_at`, the loop time their last bytes arrived: a
    ping, or a tool call's arguments, is no event but is not silence either.
    """

    idle_timeout: float

    def stream(self, request: Request) -> AsyncIterator[Event]: ...
