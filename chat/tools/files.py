"""The workspace and the file tools: list_files, read_file, write_file.

Every path the model gives is relative to the workspace. Absolute paths and
`..` are refused outright; what is left is resolved (following symlinks) and
refused unless it stays inside the workspace, so a symlink cannot lead out.

The checks run before the file is opened, so a process that swaps a directory
for a symlink in between could still win the race. The only such process is a
command of the shell tool, which already runs unconfined with the user's
approval, so the race gives nothing the shell does not.

The functions here are blocking; the registry runs them in a worker thread.
"""

from __future__ import annotations

import heapq
import os
import stat
from pathlib import Path, PurePosixPath

from chat.tools.base import ToolError, ToolOutcome, display_name

# A listing is for finding one's way, not for dumping a tree: 500 names is
# about 4k tokens, and a bigger directory is better searched with the shell.
MAX_LIST_ENTRIES = 500

# Lines read when the call gives no limit: a whole source file in nearly every
# case, while a log file still comes in slices.
READ_DEFAULT_LINES = 2000

# The most bytes one read_file returns, about 32k tokens: a large slice of a
# model's context, but not all of it.
READ_MAX_BYTES = 128 * 1024

# A NUL byte in the first 8 KiB is how git and grep tell binary files apart.
BINARY_SNIFF_BYTES = 8 * 1024

# Lines skipped before the offset are read in blocks of this size, so that one
# enormous line (minified JavaScript, a JSON dump) is never held in memory.
SKIP_BLOCK_BYTES = 64 * 1024


def ensure_workspace(workspace: Path) -> Path:
    """Create the workspace if missing; return its resolved path."""
    try:
        workspace.mkdir(parents=True, exist_ok=True)
        root = workspace.resolve(strict=True)
    except OSError as exc:
        raise ToolError(f"the workspace cannot be created: {exc.strerror or exc}") from exc
    if not root.is_dir():
        raise ToolError("the workspace is not a directory")
    return root


def resolve_inside(root: Path, raw: str) -> Path:
    """Resolve `raw` (relative to the resolved workspace `root`) or refuse it."""
    if raw == "":
        raise ToolError("the path is empty; use '.' for the workspace itself")
    if "\x00" in raw:
        raise ToolError("the path contains a NUL character")
    relative = PurePosixPath(raw)
    if relative.is_absolute():
        raise ToolError(
            f"{raw}: absolute paths are not allowed; give a path relative to the workspace"
        )
    if ".." in relative.parts:
        raise ToolError(f"{raw}: '..' is not allowed in paths; paths stay inside the workspace")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ToolError(f"{raw}: resolves outside the workspace through a symlink; refused")
    return target


def _stat(target: Path, raw: str) -> os.stat_result | None:
    try:
        return target.stat()
    except (FileNotFoundError, NotADirectoryError):
        # A path through a file does not exist either.
        return None
    except OSError as exc:
        raise ToolError(f"{raw}: {exc.strerror or exc}") from exc


# --- list_files ----------------------------------------------------------------


def list_files(root: Path, raw: str = ".") -> ToolOutcome:
    target = resolve_inside(root, raw)
    info = _stat(target, raw)
    if info is None:
        raise ToolError(f"{raw}: no such directory")
    if not stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{raw}: not a directory; use read_file to read a file")
    total = 0

    def counted(entries):
        nonlocal total
        for entry in entries:
            total += 1
            yield entry

    try:
        with os.scandir(target) as entries:
            kept = heapq.nsmallest(MAX_LIST_ENTRIES, counted(entries), key=lambda e: e.name)
            lines = [_entry_line(entry) for entry in kept]
    except OSError as exc:
        raise ToolError(f"{raw}: {exc.strerror or exc}") from exc
    if not lines:
        return ToolOutcome("(empty directory)", is_error=False)
    truncated = total > len(kept)
    if truncated:
        lines.append(
            f"[truncated: showed the first {len(kept)} of {total} entries by name; "
            "list a subdirectory or search with the shell tool]"
        )
    return ToolOutcome("\n".join(lines), is_error=False, truncated=truncated)


def _entry_line(entry: os.DirEntry) -> str:
    name = display_name(entry.name)
    size = "-"
    try:
        if entry.is_symlink():
            kind = "link"
        elif entry.is_dir(follow_symlinks=False):
            kind, name = "dir", name + "/"
        elif entry.is_file(follow_symlinks=False):
            kind, size = "file", str(entry.stat(follow_symlinks=False).st_size)
        else:
            kind = "other"
    except OSError:
        # Removed or unreadable between the scan and the stat: still worth naming.
        kind = "?"
    return f"{kind:<5} {size:>10}  {name}"


# --- read_file -----------------------------------------------------------------


def read_file(
    root: Path, raw: str, offset: int = 1, limit: int = READ_DEFAULT_LINES
) -> ToolOutcome:
    target = resolve_inside(root, raw)
    info = _stat(target, raw)
    if info is None:
        raise ToolError(f"{raw}: no such file")
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{raw}: is a directory; use list_files to see what it holds")
    if not stat.S_ISREG(info.st_mode):
        # Opening a FIFO or a device could block the worker thread forever.
        raise ToolError(f"{raw}: not a regular file")
    try:
        with open(target, "rb") as f:
            return _read_lines(f, raw, info.st_size, offset, limit)
    except OSError as exc:
        raise ToolError(f"{raw}: {exc.strerror or exc}") from exc


def _read_lines(f, raw: str, size: int, offset: int, limit: int) -> ToolOutcome:
    if b"\x00" in f.read(BINARY_SNIFF_BYTES):
        raise ToolError(
            f"{raw}: looks like a binary file ({size} bytes); inspect it with the shell tool"
        )
    f.seek(0)
    for skipped in range(offset - 1):
        if not _skip_line(f):
            raise ToolError(f"{raw}: offset {offset} is past the end of the file ({skipped} lines)")
    pieces: list[bytes] = []
    used = 0
    shown = 0
    cut = False
    while shown < limit:
        budget = READ_MAX_BYTES - used
        if budget == 0:
            break
        line = f.readline(budget + 1)
        if not line:
            break
        if len(line) > budget:
            pieces.append(line[:budget])
            cut = True
            break
        pieces.append(line)
        used += len(line)
        shown += 1
    more = cut or bool(f.read(1))
    text = b"".join(pieces).decode("utf-8", errors="replace")
    if shown == 0 and not cut:
        return ToolOutcome("(empty file)", is_error=False)
    if not more:
        return ToolOutcome(text, is_error=False)
    last = offset + shown - 1
    if cut and shown == 0:
        note = (
            f"[truncated: line {offset} alone is longer than {READ_MAX_BYTES // 1024} KiB; "
            "read it in pieces with the shell tool (e.g. head -c, cut -c)]"
        )
    elif cut:
        note = (
            f"[truncated at {READ_MAX_BYTES // 1024} KiB: showed lines {offset}-{last} "
            f"and part of line {last + 1}; continue with offset={last + 1}]"
        )
    else:
        note = f"[truncated: showed lines {offset}-{last}; continue with offset={last + 1}]"
    separator = "" if text.endswith("\n") else "\n"
    return ToolOutcome(text + separator + note, is_error=False, truncated=True)


def _skip_line(f) -> bool:
    """Read past one line; False when the file had already ended."""
    started = False
    while True:
        piece = f.readline(SKIP_BLOCK_BYTES)
        if not piece:
            return started
        started = True
        if piece.endswith(b"\n") or len(piece) < SKIP_BLOCK_BYTES:
            return True


# --- write_file ----------------------------------------------------------------


def write_file(root: Path, raw: str, content: str) -> ToolOutcome:
    target = resolve_inside(root, raw)
    info = _stat(target, raw)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{raw}: is a directory")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{raw}: not a regular file")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(f"{raw}: the content is not valid Unicode ({exc.reason})") from exc
    try:
        # `target` is resolved and inside the workspace, so are all its parents.
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(
            f"{raw}: cannot create its parent directory: {exc.strerror or exc}"
        ) from exc
    try:
        target.write_bytes(data)
    except OSError as exc:
        raise ToolError(f"{raw}: {exc.strerror or exc}") from exc
    verb = "Overwrote" if info is not None else "Created"
    return ToolOutcome(f"{verb} {raw} ({len(data)} bytes)", is_error=False)
