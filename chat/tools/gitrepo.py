"""What git, run by the shell tool in a folder of the workspace, reads that may name a
command: the keys of its repository's settings and of HOME's (the shell's HOME is its
root, chat.tools.shell), the repository's hooks, and where its pushes may go. chat.rules
judges them (decide's `repository`): an alias, a pager, a hook (a pushed-to folder's too)
runs what no rule reads.

The repository is found as git finds it: from the folder up to the workspace, the first
`.git` (a folder, or a file naming one) or bare repository. The settings are listed by
git itself (`git config --list --includes` of each file, with no system or global
settings of the server's), so they are read as the git in the sandbox reads them.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from chat.tools import files

# `git config --list` of one small file takes milliseconds; this bounds a stuck disk.
GIT_TIMEOUT = 10
# A repository's config is a few KB; the listing of one past this is not a config.
MAX_LISTING_BYTES = 1024 * 1024
# Settings whose value says where a push goes (a remote's URL, or a name git takes for a
# URL when no remote has it): a push to a folder runs that repository's hooks.
PUSH_TARGETS = re.compile(
    r"remote\..*\.(url|pushurl)|remote\.pushdefault|branch\..*\.(remote|pushremote)", re.I
)


def read(
    workspace: Path, root: Path, folder: str
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(setting keys, hook files, push targets) git would read when run in `folder`
    (relative to the shell's `root`, a folder of `workspace`); push targets are the
    values of PUSH_TARGETS. Raises (ToolError, OSError, ValueError)
    when they cannot be read, or when `folder` does not exist: rules then treat the
    command as unprovable. A folder the command itself makes (`git clone SRC x && git -C
    x/b status`) may hold a repository by the time git runs there, with settings of its
    own: the folder above it would be the wrong one to read."""
    top = workspace.resolve()
    here = (root / files.resolve(root, folder)).resolve()
    if not here.is_dir():
        raise ValueError(f"{folder} does not exist yet: what git finds there is not known")
    configs = [root / ".gitconfig", root / ".config" / "git" / "config"]
    hooks: tuple[str, ...] = ()
    if (gitdir := _find(here, top)) is not None:
        common = _common(gitdir, top)
        configs += [gitdir / "config", gitdir / "config.worktree", common / "config"]
        hooks = _hooks(common / "hooks", top)
    entries = [entry for config in dict.fromkeys(configs) for entry in _entries(config)]
    settings = tuple(dict.fromkeys(key for key, _ in entries))
    targets = tuple(dict.fromkeys(value for key, value in entries if PUSH_TARGETS.fullmatch(key)))
    return settings, hooks, targets


def _find(here: Path, top: Path) -> Path | None:
    """The git directory of the repository git finds from `here`, or None below `top`."""
    while True:
        dotgit = here / ".git"
        if dotgit.is_file():
            text = dotgit.read_text(errors="replace").strip()
            if not text.startswith("gitdir:"):
                raise ValueError(f"{dotgit} is not a .git file git reads")
            return _inside(here / text.removeprefix("gitdir:").strip(), top)
        if dotgit.is_dir():
            return _inside(dotgit, top)
        if (here / "HEAD").is_file() and (
            (here / "objects").is_dir() or (here / "commondir").is_file()
        ):
            return here  # a bare repository
        if here == top or here.parent == here:
            return None
        here = here.parent


def _common(gitdir: Path, top: Path) -> Path:
    """The folder a linked worktree's git directory shares its settings and hooks with."""
    pointer = gitdir / "commondir"
    if not pointer.is_file():
        return gitdir
    return _inside(gitdir / pointer.read_text(errors="replace").strip(), top)


def _inside(path: Path, top: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_relative_to(top):
        raise ValueError(f"the repository at {path} is outside the workspace")
    return resolved


def _hooks(folder: Path, top: Path) -> tuple[str, ...]:
    if not folder.is_dir():
        return ()
    return tuple(
        str(entry.relative_to(top))
        for entry in sorted(folder.iterdir())
        if not entry.name.endswith(".sample")
    )


def _entries(config: Path) -> list[tuple[str, str]]:
    """The (key, value) pairs git reads from `config` (and the files it includes); none
    when it does not exist. ValueError when git refuses it (then the git in the sandbox would
    too, or read it otherwise)."""
    if not config.exists():
        return []
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
    }
    done = subprocess.run(
        ["git", "config", "--file", str(config), "--list", "--includes", "-z"],
        cwd="/",
        env=env,
        capture_output=True,
        timeout=GIT_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0 or len(done.stdout) > MAX_LISTING_BYTES:
        problem = done.stderr.decode(errors="replace").strip() or "too large"
        raise ValueError(f"git cannot read {config.name}: {problem.splitlines()[0]}")
    entries = done.stdout.decode(errors="replace").split("\0")
    return [(entry.partition("\n")[0], entry.partition("\n")[2]) for entry in entries if entry]
