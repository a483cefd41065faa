"""What every tool returns, and the error a tool raises to refuse a call."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The result of one tool call, as the model and the log see it.

    `result` is the text sent back to the model. `truncated` says that a bound
    cut something out of it (the text itself says what and how to get the rest).
    `shell_output` is set by the shell tool only: the command's kept output
    (stdout and stderr merged, capped) without the exit status line, for the UI.
    `truncated_bytes` and `truncated_lines` (the shell tool only) count what its
    cap dropped from the middle of the output: the bytes, and the line ends among
    them, so the UI can say how much was cut without parsing the result.
    """

    result: str
    is_error: bool
    truncated: bool = False
    shell_output: str | None = None
    truncated_bytes: int = 0
    truncated_lines: int = 0
    # Images the tool read (read_file's one, an MCP tool's content): the runner stores
    # each as an attachment (chat.blobs) and the model sees them with the result; one
    # refused there is left out, and the result says which and why.
    images: tuple[ImageFile, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageFile:
    """An image file of the workspace as read: its path there and its bytes; or an
    image in no file (an MCP tool's): no path, and a name to store it under."""

    path: str
    data: bytes
    name: str = ""


# The most images one result may carry, as many as a message may (chat.blobs.MAX_FILES):
# each is sent again with every later request of the tab.
MAX_RESULT_IMAGES = 10


class ToolError(Exception):
    """A refused or failed call; the message is shown to the model as an error result."""


def clean_text(text: str) -> str:
    """Make tool output storable anywhere the log goes.

    PostgreSQL's jsonb and text types reject NUL characters, and a command's
    output may contain them; U+FFFD marks where they were.
    """
    return text.replace("\x00", "\ufffd")


def display_name(name: str) -> str:
    """A file name the model can read: undecodable bytes become U+FFFD.

    os.scandir returns such names with surrogate escapes, which cannot be
    encoded as UTF-8 later (JSON, the database).
    """
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
