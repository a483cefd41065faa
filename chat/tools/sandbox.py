"""The shell tool's sandbox: bubblewrap (`bwrap`), and whether it can run here.

A command runs as `bwrap ARGS -- bash -c COMMAND`; a stdio MCP server (chat.tools.mcp)
runs in the same sandbox, its own home in the workspace's place. What the sandbox sees:

- a new read-only root holding only the system directories, read-only
  (SYSTEM_DIRS), the workspace read-write at its own path, a private /tmp,
  /var/tmp and /dev/shm of bounded size (TMPFS_SIZE), a minimal read-only /dev
  and a fresh /proc whose kernel settings are read-only (PROC_READ_ONLY);
- nothing else: not the data directory (database, secret key), not the server's
  home or code. A hidden path that would still show (under a system
  directory) gets an empty tmpfs laid over it; settings.py refuses a workspace
  that holds the data directory, so that never has to be covered;
- new PID, IPC, UTS, cgroup, user (no further one inside) and network
  namespaces; with the network on, slirp4netns relays its traffic through the
  host's sockets but never to the host's loopback (Network); off, there is a
  loopback only; no capabilities, even as root. Without slirp4netns
  installed, the network on is the host's own (the state says so).

As root (the server's user is root) the command is still host uid 0 for every
file it touches: bwrap, not being setuid, can only map the caller's own uid.
That is why /proc's settings are read-only, nothing of the host but the
system (read-only) and the workspace is mounted, and a seccomp filter
refuses setuid and setgid bits (setid_filter): such a file in the workspace
would run as root for any other user of the host.

Its PID 1 is bwrap's init. When PID 1 dies the kernel kills everything left in
the namespace, whatever session or process group it moved to, and PID 1 dies
when bwrap's outer process does (`--die-with-parent` chains the parent-death
signal: server, bwrap, PID 1). So killing bwrap's process group ends the whole
sandbox, and a sandbox never outlives the server.

Pure standard library, no Django: the caller builds a Policy from its settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
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

# User-mode networking for a sandbox with the network on: its own network
# namespace, whose traffic slirp4netns relays through sockets of the host. With
# --disable-host-loopback the host's 127.0.0.1 (a database or Redis without a
# password) is out of reach, and abstract unix sockets are per namespace. Found
# on PATH; without it the sandbox shares the host's network (the state says so).
SLIRP4NETNS = "slirp4netns"
# slirp4netns's fixed addresses: the interface it configures and its DNS relay
# (which asks the host's resolvers, loopback ones included).
NETWORK_DEVICE = "tap0"
NETWORK_DNS = "10.0.2.3"
# The MTU slirp4netns documents as fastest (bigger writes, fewer relays).
NETWORK_MTU = 65520
# bwrap reports its sandbox and slirp4netns configures it in milliseconds;
# this only bounds a stuck one, after which the call fails with the reason.
NETWORK_SETUP_TIMEOUT = 10.0
# How often the sandbox's setup is checked while slirp4netns waits for it; it
# takes a millisecond or two.
NETWORK_POLL_INTERVAL = 0.001
# bwrap's JSON report (--info-fd) is a few dozen bytes; a read takes it whole.
INFO_READ = 4096
# ioctl(2) request on a namespace file: the user namespace that owns it
# (<linux/nsfs.h>). slirp4netns must join the owner of the sandbox's network
# namespace, which is not the user namespace its PID 1 ends up in once
# --disable-userns has nested one more.
NS_GET_USERNS = 0xB701

# As root a command is host root for the files it makes: a setuid (or setgid)
# program left in the workspace would run as root for any other user who can
# reach it. A seccomp filter (built with libseccomp, which slirp4netns and
# systemd depend on) refuses every way to set those bits, with EPERM: the
# syscalls below with that bit in their mode argument (by its index).
SECCOMP_LIBRARY = "libseccomp.so.2"
SETID_MODE_ARGUMENT = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "creat": 1,
    "open": 2,
    "openat": 3,
    "mknod": 1,
    "mknodat": 2,
}
# These take the mode where a filter cannot read it (in a struct; in a ring):
# refused as missing (ENOSYS), so programs fall back to the calls above.
SETID_UNFILTERABLE = ("openat2", "io_uring_setup")
# libseccomp's constants (<seccomp.h>).
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_ACT_ERRNO = 0x00050000
SCMP_CMP_MASKED_EQ = 7
SCMP_ARCH_X86_64 = 0xC000003E
# The 32-bit ABIs an x86-64 kernel also runs; the filter covers them too.
SCMP_ARCH_X86 = 0x40000003
SCMP_ARCH_X32 = 0x4000003E

# Binds a folder by an open descriptor (bwrap 0.5 and later), not by a path that a link
# swapped in since could lead elsewhere; bwrap closes the descriptor once it is bound.
BIND_FD = "--bind-fd"

# The availability check runs `bwrap ... true`, which takes milliseconds; a
# bwrap that hangs (a stuck mount) must not stall a request for longer.
PROBE_TIMEOUT = 10.0

# Kept of bwrap's complaint for the message: its error is one line.
PROBE_STDERR_CAP = 500

OPT_OUT = "DISPATCH_SHELL_UNSANDBOXED"

# Shown by `serve` as it starts and in Settings when the server's user is root.
AS_ROOT = (
    "Dispatch runs as root: shell commands are host root for every file they reach (the "
    "workspace, and what the system lets root read, such as /etc/shadow), and a flaw in "
    "the sandbox would hand them the host. Run Dispatch as an unprivileged user of its own, "
    "with the data directory and workspace closed to other users (see the README's "
    "Security section)."
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
    slirp4netns: str = SLIRP4NETNS


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
        # Every user's workspace but the one bound (chat.tools.workdir.user_workspace).
        hidden=(Path(conf.DATA_DIR), Path(conf.DISPATCH_WORKSPACE)),
        bwrap=BWRAP,
        slirp4netns=SLIRP4NETNS,
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


class _ArgumentComparison(ctypes.Structure):
    # struct scmp_arg_cmp
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


@functools.cache
def setid_filter() -> bytes | None:
    """The seccomp program (BPF) refusing setuid and setgid bits; None without libseccomp."""
    try:
        lib = ctypes.CDLL(SECCOMP_LIBRARY, use_errno=True)
    except OSError as exc:
        logger.warning(
            "no %s (%s): shell commands can make setuid files in the workspace",
            SECCOMP_LIBRARY,
            exc,
        )
        return None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_arch_native.restype = ctypes.c_uint32
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgumentComparison),
    ]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    context = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not context:
        logger.warning("seccomp_init failed: shell commands can make setuid files")
        return None
    try:
        if lib.seccomp_arch_native() == SCMP_ARCH_X86_64:
            for arch in (SCMP_ARCH_X86, SCMP_ARCH_X32):
                if lib.seccomp_arch_add(context, arch) != 0:
                    raise OSError(f"cannot add architecture {arch:#x}")

        def rule(name: str, action: int, *compare: _ArgumentComparison) -> None:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number == -1:  # __NR_SCMP_ERROR: a name this libseccomp does not know
                raise OSError(f"libseccomp does not know {name}")
            array = (_ArgumentComparison * len(compare))(*compare) if compare else None
            if lib.seccomp_rule_add_array(context, action, number, len(compare), array) != 0:
                raise OSError(f"cannot add a rule for {name}")

        for name, index in SETID_MODE_ARGUMENT.items():
            for bit in (stat.S_ISUID, stat.S_ISGID):
                rule(
                    name,
                    SCMP_ACT_ERRNO | errno.EPERM,
                    _ArgumentComparison(index, SCMP_CMP_MASKED_EQ, bit, bit),
                )
        for name in SETID_UNFILTERABLE:
            rule(name, SCMP_ACT_ERRNO | errno.ENOSYS)
        with tempfile.TemporaryFile() as program:
            if lib.seccomp_export_bpf(context, program.fileno()) != 0:
                raise OSError("cannot export the program")
            program.seek(0)
            return program.read()
    except OSError as exc:
        logger.warning("no seccomp filter (%s): shell commands can make setuid files", exc)
        return None
    finally:
        lib.seccomp_release(context)


def program_fd(program: bytes) -> int:
    """A pipe's read end holding `program` whole, for bwrap's --seccomp."""
    read_fd, write_fd = os.pipe()
    try:
        # A few hundred bytes: far below a pipe's buffer, so this never blocks.
        os.write(write_fd, program)
    finally:
        os.close(write_fd)
    return read_fd


def private_network(policy: Policy) -> bool:
    """Whether the network is on through slirp4netns (else the host's own, or none).

    Needs bwrap's --disable-userns too (0.8, 2023): Network waits for the nested
    user namespace it makes before slirp4netns may configure the sandbox."""
    return (
        policy.network
        and _installed(policy.slirp4netns) is not None
        and disables_userns(policy.bwrap)
    )


@functools.cache
def _installed(program: str) -> str | None:
    """Where `program` is, looked up once per process like the sandbox itself (the
    status line asks on every update; a PATH walk each time is measurable)."""
    return shutil.which(program)


def disables_userns(bwrap: str) -> bool:
    """Whether this bwrap has --disable-userns (0.8 and later; Ubuntu 22.04 has 0.6)."""
    return "--disable-userns" in _options(bwrap)


def binds_fd(policy: Policy) -> bool:
    """Whether command() binds a root given by descriptor by it (this bwrap has --bind-fd)."""
    return not policy.unsandboxed and BIND_FD in _options(policy.bwrap)


@functools.cache
def _options(bwrap: str) -> frozenset[str]:
    """The options this bwrap lists in its --help (some are newer than others)."""
    path = shutil.which(bwrap)
    if path is None:
        return frozenset()
    try:
        done = subprocess.run(
            [path, "--help"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    text = (done.stdout + done.stderr).decode("utf-8", "replace")
    return frozenset(word for word in text.split() if word.startswith("--"))


class Network:
    """The private network of one sandbox: bwrap reports its PID 1 on a pipe and waits
    on another; slirp4netns then gives its network namespace a route out, and the
    command starts. Call child_fds() for the bwrap process, start() once it runs, and
    close() always."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._info_r, self._info_w = os.pipe()
        self._block_r, self._block_w = os.pipe()
        # The sandbox's resolv.conf: the DNS relay, since the host's resolver
        # (often on its loopback: systemd-resolved, Docker) is out of reach.
        self._resolv_r, resolv_w = os.pipe()
        os.write(resolv_w, f"nameserver {NETWORK_DNS}\n".encode())
        os.close(resolv_w)
        # slirp4netns exits when this closes: after the call, or with the server.
        self._exit_r, self._exit_w = os.pipe()
        self._slirp: subprocess.Popen[bytes] | None = None
        self._let_go = False

    def bwrap_args(self) -> list[str]:
        resolv = _resolved(Path(RESOLV_CONF))
        return [
            "--info-fd",
            str(self._info_w),
            "--block-fd",
            str(self._block_r),
            "--ro-bind-data",
            str(self._resolv_r),
            str(resolv),
        ]

    def child_fds(self) -> tuple[int, ...]:
        return (self._info_w, self._block_r, self._resolv_r)

    def started(self) -> None:
        """bwrap runs (or failed to start): this process lets go of its ends. Once: a
        descriptor's number is reused by the next open (another call's pipes), which a
        second close would close."""
        if self._let_go:
            return
        self._let_go = True
        for fd in self.child_fds():
            with contextlib.suppress(OSError):
                os.close(fd)

    async def start(self) -> str | None:
        """Connect the sandbox and let its command run; a problem's message, or None."""
        try:
            # Not to its end: the sandbox may hold the pipe's other end open.
            info = await _read_until(self._info_r, NETWORK_SETUP_TIMEOUT, b"}")
        except TimeoutError:
            return self._problem(f"bwrap did not report within {NETWORK_SETUP_TIMEOUT:g} s")
        if not info:
            # bwrap failed before its sandbox existed; its own error is the output.
            self._release()
            return None
        try:
            pid = int(json.loads(info)["child-pid"])
            netns = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            return self._problem(f"bwrap's report {info[:80]!r} was unusable ({exc})")
        try:
            # bwrap wrote its report before its sandbox set its loopback up, and
            # slirp4netns configuring at the same time makes that fail. The
            # sandbox enters its last, nested user namespace (--disable-userns)
            # once that is done.
            await _until_nested(pid, netns, NETWORK_SETUP_TIMEOUT)
        except TimeoutError:
            os.close(netns)
            return self._problem(f"bwrap did not set up within {NETWORK_SETUP_TIMEOUT:g} s")
        except OSError:
            # PID 1 is gone (bwrap failed): its own error is the output.
            os.close(netns)
            self._release()
            return None
        with tempfile.TemporaryFile() as log:
            problem = await self._connect(netns, log)
        if problem is None:
            self._release()
        return problem

    async def _connect(self, netns: int, log: Any) -> str | None:
        """Run slirp4netns on the namespace `netns` (closed here) until it is ready."""
        ready_r, ready_w = os.pipe()
        userns = -1
        try:
            userns = fcntl.ioctl(netns, NS_GET_USERNS)
            self._slirp = subprocess.Popen(
                [
                    _installed(self.policy.slirp4netns) or self.policy.slirp4netns,
                    "--configure",
                    f"--mtu={NETWORK_MTU}",
                    "--disable-host-loopback",
                    f"--ready-fd={ready_w}",
                    f"--exit-fd={self._exit_r}",
                    f"--userns-path=/proc/self/fd/{userns}",
                    "--netns-type=path",
                    f"/proc/self/fd/{netns}",
                    NETWORK_DEVICE,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                pass_fds=(ready_w, self._exit_r, userns, netns),
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            )
        except OSError as exc:
            os.close(ready_r)
            return self._problem(f"slirp4netns could not be started ({exc.strerror or exc})")
        finally:
            for fd in (ready_w, userns, netns):
                if fd >= 0:
                    os.close(fd)
        try:
            ready = await _read_until(ready_r, NETWORK_SETUP_TIMEOUT, b"1")
        except TimeoutError:
            return self._problem(f"slirp4netns was not ready within {NETWORK_SETUP_TIMEOUT:g} s")
        finally:
            os.close(ready_r)
        if ready == b"1":
            return None
        self._slirp.kill()
        await asyncio.to_thread(self._slirp.wait)
        log.seek(0)
        said = log.read(PROBE_STDERR_CAP).decode("utf-8", "replace").strip()
        return self._problem(
            f"slirp4netns failed: {said or f'exit status {self._slirp.returncode}'}"
        )

    def _release(self) -> None:
        # bwrap may be gone already (it failed): then nobody reads this.
        with contextlib.suppress(OSError):
            os.write(self._block_w, b"1")

    def _problem(self, why: str) -> str:
        logger.warning("the shell sandbox's network could not be set up: %s", why)
        return (
            f"The sandbox's network could not be set up: {why}. Turn the network off "
            "(DISPATCH_SHELL_NETWORK=0) or fix slirp4netns; the command did not run."
        )

    def close(self) -> None:
        for fd in (self._info_r, self._block_w, self._exit_w, self._exit_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.started()
        if self._slirp is not None and self._slirp.poll() is None:
            # The exit pipe is closed, so it is leaving; kill covers a stuck one.
            self._slirp.kill()
            self._slirp.wait()


async def _until_nested(pid: int, netns: int, timeout: float) -> None:
    """Wait until process `pid` is in a user namespace below the one owning `netns`."""
    owner = fcntl.ioctl(netns, NS_GET_USERNS)
    try:
        owner_id = os.fstat(owner).st_ino
    finally:
        os.close(owner)
    deadline = asyncio.get_running_loop().time() + timeout
    while os.stat(f"/proc/{pid}/ns/user").st_ino == owner_id:
        if asyncio.get_running_loop().time() >= deadline:
            raise TimeoutError
        await asyncio.sleep(NETWORK_POLL_INTERVAL)


async def _read_until(fd: int, timeout: float, end: bytes) -> bytes:
    """What `fd` gives until it ends with `end` (stripped) or end of file, within `timeout`."""
    loop = asyncio.get_running_loop()
    data = bytearray()
    done = loop.create_future()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            chunk = os.read(fd, INFO_READ)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        data.extend(chunk)
        if (not chunk or data.rstrip().endswith(end)) and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        loop.remove_reader(fd)
    return bytes(data)


def _base_args(policy: Policy, *, private: bool = False) -> tuple[list[str], list[Path]]:
    """Everything but the workspace: namespaces, system, /proc, /dev, /tmp."""
    # No --new-session: the caller starts bwrap in a session of its own, so no
    # controlling terminal reaches the sandbox, and without it bwrap's PID 1
    # stays in the process group the caller kills.
    args = [
        "--unshare-all",
        # Implied, except for root, for whom --unshare-all makes none: without
        # one, --disable-userns cannot hold.
        "--unshare-user",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]
    if disables_userns(policy.bwrap):
        # No user namespace inside: one gives back every capability over the
        # sandbox's mounts (the kernel's most-attacked surface) and lets a
        # command unmount what covers a path. An older bwrap cannot; the
        # README says so.
        args.append("--disable-userns")
    if policy.network and not private:
        args.append("--share-net")
    system, exposed = _system_mounts()
    args += system
    if policy.network and not private:
        resolv = _resolved(Path(RESOLV_CONF))
        if resolv.is_file() and not any(_within(resolv, d) for d in exposed):
            args += ["--ro-bind", str(resolv), str(resolv)]
    args += ["--proc", "/proc", "--ro-bind", PROC_READ_ONLY, PROC_READ_ONLY]
    for path in PROC_READ_ONLY_IF_PRESENT:
        args += ["--ro-bind-try", path, path]
    # /dev read-only (its device nodes still work) but for a bounded /dev/shm
    # (POSIX shared memory, semaphores: Python's multiprocessing locks).
    # --size is newer (0.7) than the rest: an older bwrap's are unbounded.
    size = ["--size", str(TMPFS_SIZE)] if "--size" in _options(policy.bwrap) else []
    args += ["--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    # /var/tmp too: some tools keep their scratch files there, not in /tmp.
    for path in TMPFS_DIRS:
        args += [*size, "--tmpfs", path]
    return args, exposed


def wrapped(
    policy: Policy, root: Path, argv: Sequence[str], **where: Any
) -> tuple[list[str], Network | None, int | None]:
    """`argv` made to run in the sandbox (command, `where` its keywords): the bwrap
    command line, the private network to start once bwrap runs (None: none), and the
    seccomp program's descriptor (None: no libseccomp). The caller passes both to the
    child, then closes them."""
    network = Network(policy) if private_network(policy) else None
    program = setid_filter()
    seccomp = program_fd(program) if program is not None else None
    return command(policy, root, argv, network, seccomp, **where), network, seccomp


def command(
    policy: Policy,
    root: Path,
    argv: Sequence[str],
    network: Network | None = None,
    seccomp: int | None = None,
    *,
    root_fd: int | None = None,
    workspace: Path | None = None,
    binds: Sequence[tuple[Path, Path]] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    """The bwrap command line that runs `argv` in workspace `root` (resolved), on the
    private `network` if given, under the seccomp program readable on fd `seccomp`;
    `binds` are more folders bound writable, each (folder, where it shows): an MCP
    server's workspace. `extra` are more bwrap options, after the binds (an external
    agent's read-only install directory, its endpoint's socket).

    `root` may be a tab's working directory, a folder of `workspace` checked by
    chat.tools.workdir.open_root, which opened it as `root_fd` (passed to bwrap). A
    link swapped in for it since (another tab's shell can) must not be followed: bwrap's
    --bind follows links. So the descriptor is bound (--bind-fd), the very folder that
    was checked, whatever its path leads to now. A bwrap without --bind-fd (older than
    0.5) binds the whole `workspace` instead and starts in `root` inside the sandbox,
    where a link can only lead to what the sandbox shows anyway."""
    bwrap = shutil.which(policy.bwrap) or policy.bwrap
    args, exposed = _base_args(policy, private=network is not None)
    if network is not None:
        args += network.bwrap_args()
    if seccomp is not None:
        args += ["--seccomp", str(seccomp)]
    covers: list[str] = []
    for hidden in map(_resolved, policy.hidden):
        # Only the tab owner's workspace is bound (over any cover), so a hidden
        # path shows only where a system directory holds it. (One inside the
        # workspace cannot be covered for good, since the command can move its
        # parent: settings.py refuses that layout.)
        if any(_within(hidden, d) for d in exposed):
            covers += ["--tmpfs", str(hidden)]
    if root_fd is not None and binds_fd(policy):
        bind = [BIND_FD, str(root_fd), str(root)]
    elif root_fd is not None and workspace is not None:
        bind = ["--bind", str(workspace), str(workspace)]
    else:
        bind = ["--bind", str(root), str(root)]
    return [
        bwrap,
        *args,
        *covers,
        *bind,
        *(arg for path, shown in binds for arg in ("--bind", str(path), str(shown))),
        *extra,
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
    if private_network(policy):
        network = (
            "with network access through a private network (slirp4netns), which keeps the "
            "services on this host's loopback (127.0.0.1) out of reach"
        )
    elif policy.network and not disables_userns(policy.bwrap):
        network = (
            "with this host's network, services on its loopback (127.0.0.1) included, since "
            "this bubblewrap is older than 0.8 (upgrade it to keep them out of reach, or set "
            "DISPATCH_SHELL_NETWORK=0)"
        )
    elif policy.network:
        network = (
            f"with this host's network, services on its loopback (127.0.0.1) included, since "
            f"{policy.slirp4netns} is not installed (install it to keep them out of reach, or "
            "set DISPATCH_SHELL_NETWORK=0)"
        )
    return State(
        "sandboxed",
        "",
        "Shell commands run in a bubblewrap sandbox: the workspace is the only writable "
        f"directory, the system is read-only, the data directory is not there; {network}.",
        policy.network,
        root_warning(),
    )


def setenv_fd(variables: Sequence[tuple[str, str]]) -> int:
    """A descriptor (a memfd, read from its start) holding bwrap's --setenv arguments for
    `variables` (name, value), NUL-separated as bwrap's --args reads them: set inside the
    sandbox, never in bwrap's own environment (where LD_PRELOAD, say, would run code on
    the host), and read from a descriptor, so no other user's `ps` shows them. ValueError
    for a name or value bwrap cannot pass."""
    words: list[str] = []
    for name, value in variables:
        if "\0" in name or "\0" in value or "=" in name or not name:
            raise ValueError(f"the variable {name!r} cannot be set: a NUL, '=' or no name")
        words += ["--setenv", name, value]
    return data_fd(b"".join(os.fsencode(word) + b"\0" for word in words), "bwrap-setenv")


def data_fd(data: bytes, name: str) -> int:
    """A memfd holding `data`, read from its start: for bwrap's --args or --ro-bind-data."""
    fd = os.memfd_create(name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
