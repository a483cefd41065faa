"""The workspace and the file tools: list_files, read_file, write_file.

Every path the model gives is relative to the workspace. Absolute paths and
`..` are refused outright. What is left is walked one component at a time
from a descriptor of the workspace directory: each directory is opened with
O_NOFOLLOW under the descriptor of its parent, and the file at the end is
opened the same way and checked with fstat on its descriptor. Nothing is
checked by path and then used by path again, so a process that swaps a
directory for a symlink mid-call (the shell tool can) makes the call fail;
it cannot lead it out of the workspace.

A tab's working directory is given as the descriptor its check opened
(chat.tools.workdir.open_root, `root_fd`), so the walk starts in that very
folder even if a link has replaced it (or a folder above it) since.

Symlinks are resolved by this walk, not by the kernel, with the rules of
Linux's RESOLVE_BENEATH: a relative link is followed when its target stays
inside the workspace; a `..` in a target that would climb above the
workspace is refused, and so is an absolute target unless it names a path
under the workspace's own (resolved) path. A chain of more than
MAX_SYMLINK_HOPS links is refused as a loop. Python has no binding for
openat2(2), and a portable walk would be needed beside it anyway, so there is
only the walk.

Two moves stay out of the walk's reach and are left to the shell's sandbox,
which mounts the workspace on its own: moving a directory the walk holds open
out of the workspace, and hard-linking a file from outside into it. rename(2)
and link(2) do not cross mounts, so neither can be done from inside.

Only regular files are opened for reading or writing: a FIFO, socket or
device is refused after an lstat, before any open; the open itself uses
O_NONBLOCK and the descriptor is checked again, so something swapped in
between can neither block the worker thread nor be read.

The functions here are blocking; the registry runs them in a worker thread.
"""

from __future__ import annotations

import errno
import heapq
import os
import re
import stat
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from chat.tools.base import ImageFile, ToolError, ToolOutcome, display_name

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

# How an image file starts (PNG, JPEG, GIF, WebP, HEIC): such a file is read whole and
# shown to the model as an image (chat.blobs checks it for real and normalises it).
IMAGE_SIGNATURES = (
    re.compile(rb"\x89PNG\r\n\x1a\n"),
    re.compile(rb"\xff\xd8\xff"),
    re.compile(rb"GIF8[79]a"),
    re.compile(rb"RIFF....WEBP", re.S),
    re.compile(rb"....ftyp(heic|heix|mif1|msf1)", re.S),
)
# The most of an image read_file reads: the most an attachment may be
# (chat.blobs.MAX_UPLOAD_BYTES, which refuses anything larger with a clear message).
READ_IMAGE_MAX_BYTES = 20 * 1024 * 1024

# Lines skipped before the offset are read in blocks of this size, so that one
# enormous line (minified JavaScript, a JSON dump) is never held in memory.
SKIP_BLOCK_BYTES = 64 * 1024

# Linux's PATH_MAX: the longest path the shell's own commands could use. The
# walk itself has no such limit, so without it one write_file could create a
# tree thousands of directories deep.
MAX_PATH_BYTES = 4096

# Linux's MAXSYMLINKS, the links the kernel follows in one lookup: more is a
# loop, not a layout.
MAX_SYMLINK_HOPS = 40

# Directories are walked without following the name if it is a link (the walk
# reads the link itself), and never leak into a shell command's process.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_private(path: Path) -> None:
    """Make the folder `path` and those missing on its way, each 0700 (a workspace holds
    a user's files, which no other account on the host has any business reading);
    OSError when one cannot be made."""
    missing = []
    while not path.is_dir() and path != path.parent:
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            if not folder.is_dir():  # made meanwhile is fine; a file there is not
                raise


def ensure_workspace(workspace: Path) -> Path:
    """Create the workspace if missing (make_private); return its resolved path."""
    try:
        make_private(workspace)
        root = workspace.resolve(strict=True)
    except OSError as exc:
        raise ToolError(f"the workspace cannot be created: {exc.strerror or exc}") from exc
    if not root.is_dir():
        raise ToolError("the workspace is not a directory")
    return root


# --- walking a path under the workspace ----------------------------------------


def _checked(raw: str) -> tuple[list[str], str]:
    """The components of `raw`, and `raw` as messages show it; or refuse it."""
    if raw == "":
        raise ToolError("the path is empty; use '.' for the workspace itself")
    if "\x00" in raw:
        raise ToolError("the path contains a NUL character")
    try:
        size = len(os.fsencode(raw))
    except UnicodeEncodeError as exc:
        # Not echoed: a lone surrogate cannot be stored or sent anywhere.
        raise ToolError(f"the path is not valid Unicode ({exc.reason})") from exc
    if size > MAX_PATH_BYTES:
        raise ToolError(f"the path is {size} bytes long; at most {MAX_PATH_BYTES} are allowed")
    shown = display_name(raw)
    relative = PurePosixPath(raw)
    if relative.is_absolute():
        raise ToolError(
            f"{shown}: absolute paths are not allowed; give a path relative to the workspace"
        )
    if ".." in relative.parts:
        raise ToolError(f"{shown}: '..' is not allowed in paths; paths stay inside the workspace")
    return list(relative.parts), shown


def _walk(
    stack: ExitStack,
    root: Path,
    parts: list[str],
    shown: str,
    *,
    missing: str | None,
    landed: list[str] | None = None,
    root_fd: int | None = None,
) -> tuple[int, str, os.stat_result | None]:
    """Follow `parts` from the workspace `root` down to their last component.

    Returns a descriptor of the directory holding that component (closed with
    `stack`), its name in it, and its lstat (None when it does not exist). A
    link at the end has been followed, so the name is not a link unless it was
    swapped in since; open it with O_NOFOLLOW. Directories missing on the way
    raise ToolError(`missing`), or are created when `missing` is None.

    With `landed` (a list, filled with the components of the path reached),
    nothing is created: what lies below a missing directory is read as written,
    as it would be once write_file had made it (a new directory holds no link).

    With `root_fd`, a descriptor of `root` (chat.tools.workdir.open_root), the walk starts
    there and `root` is never opened by its path.
    """
    try:
        root_fd = os.open(root, _DIR_FLAGS) if root_fd is None else os.dup(root_fd)
    except OSError as exc:
        raise ToolError(f"the workspace cannot be opened: {exc.strerror or exc}") from exc
    stack.callback(os.close, root_fd)
    walk = _Walk(root, root_fd, parts, shown, missing=missing, landing=landed is not None)
    try:
        name, info = walk.run()
    except BaseException:
        if walk.here != root_fd:
            os.close(walk.here)
        raise
    if walk.here != root_fd:
        stack.callback(os.close, walk.here)
    if landed is not None:
        landed[:] = [*walk.trail, name] if name != "." else walk.trail
    return walk.here, name, info


class _Walk:
    """One walk of _walk: where it is (`here`, `trail`) and what is left (`pending`)."""

    def __init__(
        self,
        root: Path,
        root_fd: int,
        parts: list[str],
        shown: str,
        *,
        missing: str | None,
        landing: bool,
    ) -> None:
        self.root = root
        self.root_fd = root_fd
        self.shown = shown
        self.missing = missing
        self.landing = landing
        self.here = root_fd
        # The names from the workspace down to `here`: a `..` in a link target
        # walks them again from the top rather than trusting the directory's `..`.
        self.trail: list[str] = []
        self.pending = parts[::-1]
        self.hops = 0
        # How many names at the end of `trail` were never made (only when landing).
        self.virtual = 0

    def run(self) -> tuple[str, os.stat_result | None]:
        """The last component's name in `here` and its lstat, once nothing is pending."""
        while self.pending:
            name = self.pending.pop()
            if name == "..":
                self._climb()
            elif self.virtual:
                if not self.pending:
                    # Below a directory that was never made, so nothing is there.
                    return name, None
                self.trail.append(name)
                self.virtual += 1
            else:
                info = _lstat(self.here, name, self.shown)
                if info is not None and stat.S_ISLNK(info.st_mode):
                    self._follow(name)
                elif not self.pending:
                    return name, info
                else:
                    self._descend(name, info)
        # Nothing left to follow: the path names the directory reached.
        return ".", _lstat(self.here, ".", self.shown)

    def _climb(self) -> None:
        """Take a `..` (from a link's target): up one name of `trail`, never above it."""
        if not self.trail:
            raise ToolError(
                f"{self.shown}: resolves outside the workspace through a symlink; refused"
            )
        self.trail.pop()
        if self.virtual:
            self.virtual -= 1
        else:
            opened = _open_trail(self.root_fd, self.trail, self.shown)
            self.here = _move(self.here, opened, self.root_fd)

    def _follow(self, name: str) -> None:
        """Put the target of the link `name` in `here` in front of what is pending."""
        self.hops += 1
        if self.hops > MAX_SYMLINK_HOPS:
            raise ToolError(
                f"{self.shown}: more than {MAX_SYMLINK_HOPS} symbolic links on the way "
                "(a loop?); refused"
            )
        target = _readlink(self.here, name, self.shown)
        target_parts = PurePosixPath(target).parts
        if target.startswith("/"):
            root_parts = self.root.parts
            if target_parts[: len(root_parts)] != root_parts:
                raise ToolError(
                    f"{self.shown}: resolves outside the workspace through a symlink; refused"
                )
            target_parts = target_parts[len(root_parts) :]
            self.trail = []
            self.here = _move(self.here, self.root_fd, self.root_fd)
        self.pending.extend(reversed(target_parts))

    def _descend(self, name: str, info: os.stat_result | None) -> None:
        """Step into the directory `name` in `here` (lstat `info`), made if missing."""
        if info is None:
            if self.missing is not None:
                raise ToolError(f"{self.shown}: {self.missing}")
            if self.landing:
                self.trail.append(name)
                self.virtual = 1
                return
            _mkdir(self.here, name, self.shown)
        elif not stat.S_ISDIR(info.st_mode):
            if self.missing is not None:
                raise ToolError(f"{self.shown}: {self.missing}")
            raise ToolError(
                f"{self.shown}: cannot create its parent directory: "
                f"{display_name(name)} is not a directory"
            )
        self.here = _move(self.here, _open_dir(self.here, name, self.shown), self.root_fd)
        self.trail.append(name)


def _move(old: int, new: int, root_fd: int) -> int:
    """Step from descriptor `old` to `new`, closing `old` unless it is the root's."""
    if old not in (root_fd, new):
        os.close(old)
    return new


def _open_trail(root_fd: int, trail: list[str], shown: str) -> int:
    here = root_fd
    try:
        for name in trail:
            here = _move(here, _open_dir(here, name, shown), root_fd)
    except BaseException:
        if here != root_fd:
            os.close(here)
        raise
    return here


def _changed(shown: str) -> ToolError:
    return ToolError(f"{shown}: changed while it was being opened; try again")


def _lstat(here: int, name: str, shown: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=here, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ToolError(f"{shown}: {exc.strerror or exc}") from exc


def _readlink(here: int, name: str, shown: str) -> str:
    try:
        return os.readlink(name, dir_fd=here)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise _changed(shown) from exc
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            # No longer a link.
            raise _changed(shown) from exc
        raise ToolError(f"{shown}: {exc.strerror or exc}") from exc


def _open_dir(here: int, name: str, shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=here)
    except (FileNotFoundError, NotADirectoryError) as exc:
        # It was a directory at the lstat: it has been removed or replaced (a
        # link gives ENOTDIR or ELOOP under O_NOFOLLOW).
        raise _changed(shown) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _changed(shown) from exc
        raise ToolError(f"{shown}: {exc.strerror or exc}") from exc


def _mkdir(here: int, name: str, shown: str) -> None:
    try:
        os.mkdir(name, dir_fd=here)
    except FileExistsError:
        # Made by someone else since the lstat; opening it checks what it is.
        pass
    except OSError as exc:
        raise ToolError(
            f"{shown}: cannot create its parent directory: {exc.strerror or exc}"
        ) from exc


def _open_file(here: int, name: str, shown: str, flags: int) -> int:
    """Open the last component (never through a link) without blocking on a FIFO."""
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        return os.open(name, flags, 0o666, dir_fd=here)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise _changed(shown) from exc
    except IsADirectoryError as exc:
        raise ToolError(f"{shown}: is a directory") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _changed(shown) from exc
        if exc.errno == errno.ENXIO:
            # A FIFO with no reader, opened for writing without blocking.
            raise ToolError(f"{shown}: not a regular file") from exc
        raise ToolError(f"{shown}: {exc.strerror or exc}") from exc


def resolve(root: Path, raw: str, *, root_fd: int | None = None) -> str:
    """The path, relative to `root`, that a file tool given `raw` would open: links
    followed as the tools follow them, nothing created (`.` for `root` itself).
    ToolError when the tools would refuse the path (it leaves `root`, a loop)."""
    parts, shown = _checked(raw)
    landed: list[str] = []
    with ExitStack() as stack:
        _walk(stack, root, parts, shown, missing=None, landed=landed, root_fd=root_fd)
    return "/".join(landed) or "."


# --- list_files ----------------------------------------------------------------


def list_files(root: Path, raw: str = ".", *, root_fd: int | None = None) -> ToolOutcome:
    parts, shown = _checked(raw)
    with ExitStack() as stack:
        here, name, info = _walk(
            stack, root, parts, shown, missing="no such directory", root_fd=root_fd
        )
        if info is None:
            raise ToolError(f"{shown}: no such directory")
        if not stat.S_ISDIR(info.st_mode):
            raise ToolError(f"{shown}: not a directory; use read_file to read a file")
        fd = _open_dir(here, name, shown)
        stack.callback(os.close, fd)
        total = 0

        def counted(entries):
            nonlocal total
            for entry in entries:
                total += 1
                yield entry

        try:
            # scandir works on a duplicate of `fd`; the stack closes the original.
            with os.scandir(fd) as entries:
                kept = heapq.nsmallest(MAX_LIST_ENTRIES, counted(entries), key=lambda e: e.name)
                lines = [_entry_line(entry) for entry in kept]
        except OSError as exc:
            raise ToolError(f"{shown}: {exc.strerror or exc}") from exc
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
    root: Path,
    raw: str,
    offset: int = 1,
    limit: int = READ_DEFAULT_LINES,
    *,
    root_fd: int | None = None,
) -> ToolOutcome:
    parts, shown = _checked(raw)
    with ExitStack() as stack:
        here, name, info = _walk(stack, root, parts, shown, missing="no such file", root_fd=root_fd)
        # Checked before opening, so that a device is never opened at all, and
        # again on the descriptor, which is what is read.
        _check_readable(info, shown)
        fd = _open_file(here, name, shown, os.O_RDONLY)
        f = stack.enter_context(os.fdopen(fd, "rb"))
        info = os.fstat(fd)
        _check_readable(info, shown)
        try:
            head = f.read(16)
            if any(sig.match(head) for sig in IMAGE_SIGNATURES):
                return _read_image(f, shown, info.st_size)
            f.seek(0)
            return _read_lines(f, shown, info.st_size, offset, limit)
        except OSError as exc:
            raise ToolError(f"{shown}: {exc.strerror or exc}") from exc


def _read_image(f: BinaryIO, shown: str, size: int) -> ToolOutcome:
    if size > READ_IMAGE_MAX_BYTES:
        raise ToolError(
            f"{shown}: an image of {size} bytes, more than the {READ_IMAGE_MAX_BYTES} an "
            "image may be to be shown; make a smaller copy with the shell tool"
        )
    f.seek(0)
    data = f.read(READ_IMAGE_MAX_BYTES + 1)
    return ToolOutcome(
        f"{shown}: an image ({len(data)} bytes), shown to you with this result.",
        is_error=False,
        images=(ImageFile(shown, data),),
    )


def _check_readable(info: os.stat_result | None, shown: str) -> None:
    if info is None:
        raise ToolError(f"{shown}: no such file")
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{shown}: is a directory; use list_files to see what it holds")
    if not stat.S_ISREG(info.st_mode):
        # Reading a FIFO or a device could block the worker thread forever.
        raise ToolError(f"{shown}: not a regular file")


def _read_lines(f: BinaryIO, shown: str, size: int, offset: int, limit: int) -> ToolOutcome:
    if b"\x00" in f.read(BINARY_SNIFF_BYTES):
        raise ToolError(
            f"{shown}: looks like a binary file ({size} bytes); inspect it with the shell tool"
        )
    f.seek(0)
    for skipped in range(offset - 1):
        if not _skip_line(f):
            raise ToolError(
                f"{shown}: offset {offset} is past the end of the file ({skipped} lines)"
            )
    pieces: list[bytes] = []
    used = 0
    lines = 0
    cut = False
    while lines < limit:
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
        lines += 1
    more = cut or bool(f.read(1))
    text = b"".join(pieces).decode("utf-8", errors="replace")
    if lines == 0 and not cut:
        return ToolOutcome("(empty file)", is_error=False)
    if not more:
        return ToolOutcome(text, is_error=False)
    last = offset + lines - 1
    if cut and lines == 0:
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


def _skip_line(f: BinaryIO) -> bool:
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


def write_file(root: Path, raw: str, content: str, *, root_fd: int | None = None) -> ToolOutcome:
    parts, shown = _checked(raw)
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolError(f"{shown}: the content is not valid Unicode ({exc.reason})") from exc
    with ExitStack() as stack:
        here, name, info = _walk(stack, root, parts, shown, missing=None, root_fd=root_fd)
        _check_writable(info, shown)
        fd = _open_file(here, name, shown, os.O_WRONLY | os.O_CREAT)
        stack.callback(os.close, fd)
        _check_writable(os.fstat(fd), shown)
        try:
            # Truncated in place, only now that the descriptor is known to be a
            # regular file: unlike a rename over it, this keeps the file's mode
            # (an executable script stays executable) and its hard links.
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            raise ToolError(f"{shown}: {exc.strerror or exc}") from exc
    verb = "Overwrote" if info is not None else "Created"
    return ToolOutcome(f"{verb} {shown} ({len(data)} bytes)", is_error=False)


def _check_writable(info: os.stat_result | None, shown: str) -> None:
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        raise ToolError(f"{shown}: is a directory")
    if not stat.S_ISREG(info.st_mode):
        raise ToolError(f"{shown}: not a regular file")
