"""The shell tool's sandbox: bubblewrap (`bwrap`), and whether it can run here.

A command runs as `bwrap ARGS -- bash -c COMMAND`. What the sandbox sees:

- a new read-only root holding only the system directories, read-only
  (SYSTEM_DIRS), the workspace read-write at its own path, a private /tmp,
  /var/tmp and /dev/shm of bounded size (TMPFS_SIZE), a minimal read-only /dev
  and a fresh /proc whose kernel settings are read-only (PROC_READ_ONLY);
- nothing else: not the data directory (database, secret key), not the server's
  home or code. A hidden path that would still show (under a system
  directory) gets an empty tmpfs laid over it; settings.py refuses a workspace
  that holds the data directory, so that never has to be covered;
- new PID, IPC, UTS, cgroup and user namespaces (no further user namespace
  inside), and a new network namespace (loopback only) when the network is
  off; no capabilities, even as root.

As root (the server's user is root) the command is still host uid 0 for every
file it touches: bwrap, not being setuid, can only map the caller's own uid.
That is why /proc's settings are read-only and nothing of the host but the
system (read-only) and the workspace is mounted. See the README (Security)
for what that leaves: setuid files in the workspace, the host's loopback.

Its PID 1 is bwrap's init. When PID 1 dies the kernel kills everything left in
the namespace, whatever session or process group it moved to, and PID 1 dies
when bwrap's outer process does (`--die-with-parent` chains the parent-death
signal: server, bwrap, PID 1). So killing bwrap's process group ends the whole
sandbox, and a sandbox never outlives the server.

Pure standard library, no Django: the caller builds a Policy from its settings.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# The program; found on PATH. Tests point Policy.bwrap elsewhere.
BWRAP = "bwrap"

# Read-only in every sandbox: programs, libraries and their configuration.
# Not /home, /root, /srv, /opt, /var, /run, /mnt: user and application data
# (and the data directory, wherever an operator put it) live there.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

# The name resolver's configuration, which may be a link out of /etc (into
# /run with systemd-resolved); with the network on, its target is bound too.
RESOLV_CONF = "/etc/resolv.conf"

# Scratch space in memory (each of /tmp, /var/tmp and /dev/shm is a tmpfs):
# without a size, each may take half the host's RAM. 256 MiB holds a build's
# or a test suite's temporary files; bigger data belongs in the workspace.
TMPFS_SIZE = 256 * 1024 * 1024
TMPFS_DIRS = ("/tmp", "/var/tmp")

# Writable, as root, in a fresh /proc, and acting on the host kernel: sysctls
# (kernel.core_pattern runs a program as host root outside every namespace),
# the magic SysRq key, MTRRs, pressure triggers, filesystem and bus knobs.
# bwrap covers some itself, but skips /proc/sys (its root directory answers
# "not writable" to bwrap's check while the files in it are). Bound read-only
# from the host's /proc, which shows the same kernel-wide values. /proc/sys
# exists on every Linux; the others may not (sysrq-trigger, mtrr).
PROC_READ_ONLY = "/proc/sys"
PROC_READ_ONLY_IF_PRESENT = (
    "/proc/sysrq-trigger",
    "/proc/mtrr",
    "/proc/pressure",
    "/proc/fs",
    "/proc/irq",
    "/proc/bus",
)

# The availability check runs `bwrap ... true`, which takes milliseconds; a
# bwrap that hangs (a stuck mount) must not stall a request for longer.
PROBE_TIMEOUT = 10.0

# Kept of bwrap's complaint for the message: its error is one line.
PROBE_STDERR_CAP = 500

OPT_OUT = "DISPATCH_SHELL_UNSANDBOXED"

# Shown by `serve` as it starts and in Settings when the server's user is root.
AS_ROOT = (
    "Dispatch runs as root: shell commands act as host root on every file they can reach, "
    "so a setuid program a command leaves in the workspace runs as root for any other user "
    "who can reach the workspace. Run Dispatch as an unprivileged user of its own, with the "
    "data directory and workspace closed to other users (see the README's Security section)."
)

_RISK = (
    f"or set {OPT_OUT}=1 to run commands without a sandbox (they can then read "
    "everything the server can, including its API keys, database and secret key)"
)


@dataclass(frozen=True, slots=True)
class Policy:
    """How shell commands are confined; built from the settings by the caller."""

    # Off: a network namespace of its own, with only a loopback interface.
    network: bool = True
    # The operator's explicit opt-out: commands run as plain child processes.
    unsandboxed: bool = False
    # Paths never visible inside (the data directory), even under a bind.
    hidden: tuple[Path, ...] = field(default=())
    bwrap: str = BWRAP


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether bwrap runs here; `problem` says why not and how to fix it."""

    available: bool
    problem: str = ""


@dataclass(frozen=True, slots=True)
class State:
    """The sandbox as the status line, Settings and dispatch_status show it."""

    # "sandboxed", "unsandboxed" (the opt-out) or "unavailable" (the shell refuses).
    state: str
    # A few words; "" when sandboxed (the status line shows nothing then).
    warning: str
    # One or two sentences: what runs how, and for a problem why and the fix.
    detail: str
    network: bool
    # AS_ROOT when the server runs as root, else "".
    as_root: str = ""


def root_warning() -> str:
    """AS_ROOT when this process runs as root, else ""."""
    return AS_ROOT if hasattr(os, "geteuid") and os.geteuid() == 0 else ""


def policy_from(conf: Any) -> Policy:
    """The Policy the settings object `conf` (django.conf.settings) describes."""
    return Policy(
        network=conf.DISPATCH_SHELL_NETWORK,
        unsandboxed=conf.DISPATCH_SHELL_UNSANDBOXED,
        hidden=(Path(conf.DATA_DIR),),
        bwrap=BWRAP,
    )


def _within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return Path(os.path.abspath(path))


def _system_mounts() -> tuple[list[str], list[Path]]:
    """bwrap arguments for SYSTEM_DIRS as they are on this machine, and the
    real directories they expose. A directory that is a link (merged /usr:
    /bin -> usr/bin) stays a link, so paths look the same inside."""
    args: list[str] = []
    exposed: list[Path] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
            exposed.append(_resolved(path))
    return args, exposed


def _base_args(policy: Policy) -> tuple[list[str], list[Path]]:
    """Everything but the workspace: namespaces, system, /proc, /dev, /tmp."""
    # No --new-session: the caller starts bwrap in a session of its own, so no
    # controlling terminal reaches the sandbox, and without it bwrap's PID 1
    # stays in the process group the caller kills.
    args = [
        "--unshare-all",
        # Implied, except for root, for whom --unshare-all makes none: without
        # one, --disable-userns cannot hold.
        "--unshare-user",
        # No user namespace inside: one gives back every capability over the
        # sandbox's mounts (the kernel's most-attacked surface) and lets a
        # command unmount what covers a path.
        "--disable-userns",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]
    if policy.network:
        args.append("--share-net")
    system, exposed = _system_mounts()
    args += system
    if policy.network:
        resolv = _resolved(Path(RESOLV_CONF))
        if resolv.is_file() and not any(_within(resolv, d) for d in exposed):
            args += ["--ro-bind", str(resolv), str(resolv)]
    args += ["--proc", "/proc", "--ro-bind", PROC_READ_ONLY, PROC_READ_ONLY]
    for path in PROC_READ_ONLY_IF_PRESENT:
        args += ["--ro-bind-try", path, path]
    # /dev read-only (its device nodes still work) but for a bounded /dev/shm
    # (POSIX shared memory, semaphores: Python's multiprocessing locks).
    args += ["--dev", "/dev", "--size", str(TMPFS_SIZE), "--tmpfs", "/dev/shm"]
    args += ["--remount-ro", "/dev"]
    # /var/tmp too: some tools keep their scratch files there, not in /tmp.
    for path in TMPFS_DIRS:
        args += ["--size", str(TMPFS_SIZE), "--tmpfs", path]
    return args, exposed


def command(policy: Policy, root: Path, argv: Sequence[str]) -> list[str]:
    """The bwrap command line that runs `argv` in workspace `root` (resolved)."""
    bwrap = shutil.which(policy.bwrap) or policy.bwrap
    args, exposed = _base_args(policy)
    covers: list[str] = []
    for hidden in map(_resolved, policy.hidden):
        # Only the workspace is bound, so a hidden path shows only where a
        # system directory holds it. (One inside the workspace cannot be
        # covered for good, since the command can move its parent:
        # settings.py refuses that layout.)
        if any(_within(hidden, d) for d in exposed):
            covers += ["--tmpfs", str(hidden)]
    return [
        bwrap,
        *args,
        *covers,
        "--bind",
        str(root),
        str(root),
        # Last: the new root, where bwrap made the mount points, takes no files.
        "--remount-ro",
        "/",
        "--chdir",
        str(root),
        "--",
        *argv,
    ]


def check(policy: Policy) -> Verdict:
    """Whether this policy's sandbox can run here (checked once per process)."""
    return _probe(policy.bwrap, policy.network)


@functools.cache
def _probe(bwrap: str, network: bool) -> Verdict:
    if not sys.platform.startswith("linux"):
        return Verdict(
            False,
            "The shell tool is unavailable: its sandbox, bubblewrap, needs Linux and this "
            f"server runs on {sys.platform}. Run Dispatch on Linux, {_RISK}.",
        )
    path = shutil.which(bwrap)
    if path is None:
        return Verdict(
            False,
            f"The shell tool is unavailable: bubblewrap ({bwrap!r}) is not installed. "
            "Install it (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install "
            f"bubblewrap) and restart Dispatch, {_RISK}.",
        )
    args, _ = _base_args(Policy(network=network, bwrap=bwrap))
    try:
        done = subprocess.run(
            [path, *args, "--", "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        )
    except subprocess.TimeoutExpired:
        why = f"it did not finish within {PROBE_TIMEOUT:g} s"
    except OSError as exc:
        why = f"it could not be started ({exc.strerror or exc})"
    else:
        if done.returncode == 0:
            return Verdict(True)
        said = done.stderr.decode("utf-8", "replace").strip()[:PROBE_STDERR_CAP]
        why = f"it said: {said}" if said else f"it exited with status {done.returncode}"
    logger.warning("the shell sandbox cannot run: %s", why)
    return Verdict(
        False,
        f"The shell tool is unavailable: its sandbox, bubblewrap ({path}), cannot run here; "
        f"{why}. It needs user namespaces: allow them (sysctl "
        "kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
        "kernel.apparmor_restrict_unprivileged_userns=0; in Docker, run the container with "
        "--security-opt seccomp=unconfined --security-opt apparmor=unconfined) and restart "
        f"Dispatch, {_RISK}.",
    )


def state(policy: Policy) -> State:
    """What the shell runs in, for people: the status line, Settings, dispatch_status."""
    network = "with network access" if policy.network else "without network access"
    if policy.unsandboxed:
        return State(
            "unsandboxed",
            "Shell unsandboxed",
            f"{OPT_OUT} is set: shell commands run without a sandbox, as the server's user, "
            "and can read its API keys, database and secret key.",
            policy.network,
            root_warning(),
        )
    verdict = check(policy)
    if not verdict.available:
        return State(
            "unavailable", "Shell unavailable", verdict.problem, policy.network, root_warning()
        )
    return State(
        "sandboxed",
        "",
        "Shell commands run in a bubblewrap sandbox: the workspace is the only writable "
        f"directory, the system is read-only, the data directory is not there; {network}.",
        policy.network,
        root_warning(),
    )
