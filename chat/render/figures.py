"""Sizes and counts as the page words them: bytes, lines, tokens."""

from __future__ import annotations

from typing import Any

# Up to this size an output's size is given in bytes, exactly; past it in KiB or MiB.
EXACT_BYTES_BELOW = 100_000


def count(value: Any) -> int | None:
    """A positive integer from chunk data, else None (bool is an int to Python)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def output_text(data: dict[str, Any]) -> str:
    """A tool result's output as its card shows it: the command's output, else the result."""
    return str(data.get("shell_output") or data.get("result") or "")


def counts(text: str) -> str:
    """Lines and bytes (UTF-8) of a tool's output, for a glance: "400 lines · 3,600 bytes".

    A last line without a line end counts; an empty output is "empty".
    """
    if not text:
        return "empty"
    lines = line_count(text)
    return f"{lines:,} line{'s' if lines != 1 else ''} · {size(len(utf8(text)))}"


def line_count(text: str) -> int:
    """Lines as a reader counts them: a last line without a line end counts too."""
    return text.count("\n") + (bool(text) and not text.endswith("\n"))


def utf8(text: str) -> bytes:
    # A lone surrogate (an imported log may hold one) is counted, not an error.
    return text.encode("utf-8", "surrogatepass")


def size(n: int) -> str:
    """A size in bytes: exact while it is short enough to read, then KiB or MiB."""
    if n < EXACT_BYTES_BELOW:
        return f"{n:,} byte{'s' if n != 1 else ''}"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1024 * 1024):.1f} MiB"


def tokens(n: Any) -> str:
    """A token count for a glance: 950, 12.3k, 1.2M."""
    n = int(n or 0)
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k".replace(".0k", "k")
    return f"{n / 1_000_000:.1f}M".replace(".0M", "M")
