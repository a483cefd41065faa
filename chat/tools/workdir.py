"""A tab's working directory: a plain subfolder of the workspace its tools run in.

Parallel tabs on one workspace trample each other's files; a tab made with a
working directory gets that folder as its tools' root (files and shell alike),
so the shell's sandbox makes only it writable. The name is checked as text
(relative, no `..`, nothing odd), then each component is made or opened with
O_NOFOLLOW under its parent's descriptor: a link anywhere on the way is
refused, so the folder is never somewhere outside the workspace. The runner
checks again at every call (the shell may have swapped a link in since) and
gives the tool the descriptor it opened (open_root), never the path: a link
swapped in between the check and the use would otherwise lead the shell's bind
mount or the file tools' walk out of the workspace.

Also here: reading a workspace file the app itself uses (AGENTS.md), with the
same no-link rule, so a link planted in the workspace cannot pull another file
(the data dir's, say) into a system prompt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

from chat.tools.base import ToolError
from chat.tools.files import ensure_workspace, make_private

# The Tab.workdir column's length.
MAX_WORKDIR_CHARS = 200
# Deep enough for any project layout; deeper is a mistake.
MAX_WORKDIR_DEPTH = 8

# Where the users' workspaces are, in DISPATCH_WORKSPACE: one folder per user id.
USERS = "users"
# The workspace of tabs without an owner, in USERS (no user id is a word).
UNOWNED = "unowned"
# In USERS from the moment it is made: a `users` folder without it is not one of ours
# but a file of the one workspace every user shared before (adopt_shared moves it).
MARKER = ".dispatch-workspaces"
MARKER_TEXT = "The workspaces of Dispatch's users, one folder per user id.\n"
# Left at the top of DISPATCH_WORKSPACE by adopt_shared: a filesystem's own folder, and
# a USERS being made (_make_users).
NOT_ADOPTED = ("lost+found",)
STAGING_PREFIX = ".dispatch-users-"
ASIDE_PREFIX = ".dispatch-shared-users-"

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# What a new workspace starts with (seed_sample): a README, a notes file and a script, so
# that each of the offline demo model's suggestions (chat.providers.offline) works on a
# first run.
SAMPLE = Path(__file__).with_name("sample_project")


def user_workspace(owner_id: int | None) -> Path:
    """The workspace of the user with this id: every tab of theirs works in it (or in a
    folder of it), and no other user's tools ever see it. Made (0700, as is `users/`)
    the first time it is asked for; when it cannot be, the tools' ensure_workspace says
    why. `None`: the workspace of tabs without an owner (`send --new` before any
    superuser exists), which is no user's."""
    return user_workspace_under(Path(settings.DISPATCH_WORKSPACE), owner_id)


def user_workspace_under(top: Path, owner_id: int | None, *, sample: bool = True) -> Path:
    """user_workspace() of the DISPATCH_WORKSPACE `top` (a test's server has its own).
    A workspace this call makes starts with the sample project (seed_sample) when
    DISPATCH_SAMPLE_PROJECT is on, `sample` is, and nothing at the top of `top` waits
    to be adopted (adopt_shared would find the sample's names taken)."""
    users = top / USERS
    path = users / (str(int(owner_id)) if owner_id is not None else UNOWNED)
    # Dispatch never makes a link here: one was planted (in the shared workspace before
    # the upgrade, or by hand), and would lead a user's tools wherever it points.
    _set_link_aside(users)
    _set_link_aside(path)
    if not path.is_dir():
        made = False
        with contextlib.suppress(OSError):
            _make_users(users)
            # Made here, not found: another process's new workspace is its to fill.
            path.mkdir(mode=0o700)
            made = True
        if made and sample and settings.DISPATCH_SAMPLE_PROJECT and not shared_entries(top):
            seed_sample(path)
    return path


def seed_sample(path: Path) -> list[str]:
    """Copy the sample project's files (SAMPLE) into the folder `path`, each only where
    no file of that name is (O_EXCL, never through a link): a user's file is never
    overwritten. The names written."""
    written = []
    try:
        folder = os.open(path, _DIR_FLAGS)
    except OSError:
        return []
    try:
        for source in sorted(SAMPLE.iterdir()):
            if not source.is_file():
                continue
            try:
                fd = os.open(source.name, _NEW_FILE_FLAGS, 0o644, dir_fd=folder)
            except FileExistsError:
                continue
            except OSError as exc:
                logger.warning(
                    "the sample file %s was not written in %s: %s", source.name, path, exc
                )
                continue
            with os.fdopen(fd, "wb") as f:
                f.write(source.read_bytes())
            written.append(source.name)
    finally:
        os.close(folder)
    return written


def _set_link_aside(path: Path) -> None:
    """Rename a symbolic link at `path` out of the way (kept beside it, never followed),
    so a real folder can be made in its place."""
    if not path.is_symlink():
        return
    aside = path.with_name(f"{ASIDE_PREFIX}link-{path.name}-{os.urandom(4).hex()}")
    with contextlib.suppress(FileNotFoundError):
        path.rename(aside)
        logger.warning("%s was a symbolic link, not a workspace: renamed to %s", path, aside)


def _make_users(users: Path) -> None:
    """`users/` with its MARKER, made whole under a temporary name then renamed into
    place, so a `users/` without the marker is never one of ours (see adopt_shared)."""
    if users.is_dir():
        return
    make_private(users.parent)
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=users.parent))
    (staging / MARKER).write_text(MARKER_TEXT)
    try:
        staging.rename(users)
    except OSError:
        # Another process made it first (or a file has the name: the caller fails).
        shutil.rmtree(staging, ignore_errors=True)


def first_owner(user_model: Any) -> Any:
    """Who receives the shared workspace (adopt_shared): the earliest-joined active
    superuser, else the earliest-joined user; None without users."""
    users = user_model.objects.order_by("date_joined", "pk")
    return users.filter(is_superuser=True, is_active=True).first() or users.first()


class AdoptionClash(Exception):
    """What adopt_shared would move is already in the owner's workspace: nothing moved."""


def shared_entries(top: Path, *, trust_marker: bool = True) -> list[str]:
    """The names at the top of DISPATCH_WORKSPACE `top` that are in no user's workspace:
    the one workspace every user shared before each had their own (a legacy `users`
    folder, one without MARKER, among them). `trust_marker=False` (the upgrade's
    migration): any `users` folder is legacy, MARKER or not, since every user's tools
    could write one, marker included, into the shared workspace."""
    try:
        names = sorted(os.listdir(top))
    except FileNotFoundError:
        return []
    ours = trust_marker and (top / USERS / MARKER).is_file() and not (top / USERS).is_symlink()
    return [
        name
        for name in names
        if name not in NOT_ADOPTED
        and not name.startswith(STAGING_PREFIX)
        and not (name == USERS and ours)
    ]


def adopt_shared(owner_id: int | None, *, trust_marker: bool = True) -> list[str]:
    """Move what shared_entries names into the workspace of the user `owner_id`, by
    rename (the same filesystem: nothing copied, links and modes kept), and log each.
    Never overwrites: when a name is taken there, AdoptionClash names them all and
    nothing is moved. Done again it finds nothing to move. The names moved.
    `owner_id` None (no user yet): only a legacy `users` folder is set aside, so that no
    folder planted before the upgrade is ever taken for a user's workspace; the rest
    waits for the first user (chat.startup)."""
    top = Path(settings.DISPATCH_WORKSPACE)
    names = shared_entries(top, trust_marker=trust_marker)
    if not names:
        return []
    moves = {name: top / name for name in names}
    if USERS in names:
        # A legacy `users` folder: set aside (under a name a later run would move too,
        # should this one stop half-way), so that ours can be made in its place.
        aside = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=top))
        moves[USERS] = (top / USERS).rename(aside / USERS)
        if owner_id is None:
            logger.info("set the shared workspace's users folder aside in %s", aside)
            return [USERS]
    if owner_id is None:
        return []
    target = user_workspace_under(top, owner_id, sample=False)
    make_private(target)
    taken = [name for name in names if os.path.lexists(target / name)]
    if taken:
        raise AdoptionClash(
            f"Cannot move {', '.join(taken)} from {top} into {target}: the same names are "
            "there already. Rename or remove one of each pair, then run this again; "
            "nothing was moved."
        )
    for name, source in moves.items():
        source.rename(target / name)
        logger.info("moved %s from the shared workspace into %s", name, target)
    if USERS in names:
        aside.rmdir()
    return names


class BadWorkdir(ValueError):
    """A working directory that is not a plain subfolder of the workspace; the message says why."""


def check(value: str) -> str:
    """`value` as stored ("" for the workspace itself; no trailing or doubled slash),
    or BadWorkdir."""
    value = value.strip()
    if not value or value in (".", "./"):
        return ""
    if len(value) > MAX_WORKDIR_CHARS:
        raise BadWorkdir(f"A working directory has at most {MAX_WORKDIR_CHARS} characters.")
    if "\x00" in value or "\\" in value or any(not c.isprintable() for c in value):
        raise BadWorkdir("A working directory is a plain folder name: no control characters.")
    if value.startswith(("/", "~")):
        raise BadWorkdir(
            f"“{value}” is not relative: a working directory is a folder inside the "
            "workspace, such as projects/site."
        )
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadWorkdir(f"“{value}” leaves the workspace (..): name a folder inside it.")
    if len(parts) > MAX_WORKDIR_DEPTH:
        raise BadWorkdir(f"A working directory is at most {MAX_WORKDIR_DEPTH} folders deep.")
    return "/".join(parts)


def ensure(workspace: Path, workdir: str) -> Path:
    """The tools' root for a tab: the workspace, or its subfolder `workdir` (made if
    missing); ToolError when the folder cannot be made or is (or passes through) a link
    or anything but a directory."""
    root, fd = open_root(workspace, workdir)
    os.close(fd)
    return root


def open_root(workspace: Path, workdir: str) -> tuple[Path, int]:
    """As ensure(), and a descriptor of the folder (the caller closes it), opened from
    the workspace's one component at a time with O_NOFOLLOW. The tools use it and never
    the path again: a link swapped in for the folder (or a folder on its way) after this
    check, by another tab's shell, say, would lead a path anywhere."""
    root = ensure_workspace(Path(workspace))
    try:
        parts = check(workdir).split("/") if workdir else []
    except BadWorkdir as exc:
        raise ToolError(str(exc)) from exc
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise ToolError(
                    f"the working directory {workdir} cannot be created: {exc.strerror or exc}"
                ) from exc
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                raise ToolError(
                    f"the working directory {workdir} is not a folder of the workspace "
                    f"({part} is a link or a file)"
                ) from exc
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return root.joinpath(*parts), fd


def read_text(root: Path, name: str, limit: int) -> tuple[str, int] | None:
    """The first `limit` characters of the regular file `name` in the folder `root`
    (UTF-8, undecodable bytes replaced) and the file's size in bytes; None when there
    is no such file, or it is a link or not a regular file, or `root` is not a folder."""
    try:
        folder = os.open(root, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
    except OSError:
        return None
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        # UTF-8 takes at most 4 bytes a character.
        data = f.read(limit * 4)
    return data.decode("utf-8", "replace")[:limit], info.st_size
