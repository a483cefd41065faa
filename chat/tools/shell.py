"""The shell tool: one command, in the workspace, bounded in time, output and reach.

The command runs as `bash -c COMMAND` (or `/bin/sh -c` without bash) inside a
bubblewrap sandbox (chat/tools/sandbox.py): the workspace is the only writable
directory, the data directory and the server's processes are not there, and
the environment is an allowlist. Where the sandbox cannot run, the call is
refused with the reason and the fix, unless the operator opted out
(Policy.unsandboxed), in which case the command runs as a plain child.

bwrap (or the command, unsandboxed) starts in a new session, so it leads its
own process group, which holds the sandbox's PID 1. When the command ends,
times out or the call is cancelled, the whole group gets SIGKILL, and PID 1's
death ends everything in the sandbox, even what left the group (setsid, a
daemon). The call returns once the group is gone.

Killed processes must also be reaped, or they stay in the process table as
zombies (and the group stays visible). bwrap's PID 1 outlives bwrap by a
moment and is then orphaned; containers often run a PID 1 that reaps late or
never, so this process makes itself a child subreaper (Linux): the orphans
become its own children, and it reaps them by group. PID 1 reaped means its
namespace is empty.

stdout and stderr share one pipe, so their interleaving is kept. Output is
streamed live to `on_output` and kept for the result, both up to a cap.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ctypes
import functools
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from chat.tools import sandbox
from chat.tools.base import ToolOutcome, clean_text

logger = logging.getLogger(__name__)

# Long enough for a test suite or a build, short enough that a hung command
# (waiting on stdin, a server started in the foreground) does not stall a turn.
SHELL_TIMEOUT = 120.0

# Output kept for the model and shown live: 64 KiB is about 16k tokens. The
# start (the command's first errors) and the end (the summary, the exit
# reason) matter most, so past the cap the result keeps half of each.
OUTPUT_CAP = 64 * 1024
OUTPUT_HEAD = OUTPUT_CAP // 2
OUTPUT_TAIL = OUTPUT_CAP - OUTPUT_HEAD

# One read of the pipe: the size of a Linux pipe buffer.
READ_CHUNK = 64 * 1024

# After the group is killed its members exit at once; this bounds the wait for
# a process stuck in uninterruptible sleep (a dead NFS mount), after which the
# call returns anyway and the leftover is logged.
GROUP_EXIT_GRACE = 5.0
GROUP_POLL_INTERVAL = 0.01

# Unsandboxed, a process that left the group (setsid, a daemon) survives the
# kill and may still hold the pipe open; the output is read for this long after
# the group is gone, then dropped. (In the sandbox nothing survives the group.)
DRAIN_GRACE = 1.0

# Used when this process has no PATH of its own.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

# The only variables passed through from this process's environment. Everything
# else (API keys, SECRET_KEY, DATABASE_URL, REDIS_URL, tokens) stays out.
ENV_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")

# Variables set for every command: no colour codes or pagers in output meant
# for a model, and Python flushing as it prints so output streams live.
ENV_FIXED = {
    "TERM": "dumb",
    "NO_COLOR": "1",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "PYTHONUNBUFFERED": "1",
}

# Belt and braces: a pass-through name containing one of these is dropped even
# if someone adds it to ENV_PASSTHROUGH.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "_URL")

LIVE_STOP_MARKER = (
    "\n[live output stopped after {cap} KiB; the result keeps the first and last {half} KiB]\n"
)
DROP_MARKER = "\n[... {dropped} bytes of output dropped ...]\n"

# Exit codes 129..192 mean "killed by signal code - 128" (bwrap, shells); 64
# covers the real-time signals too.
SIGNAL_EXIT_BASE = 128
SIGNAL_EXIT_END = SIGNAL_EXIT_BASE + 65

# prctl(2) option number, from <linux/prctl.h>.
PR_SET_CHILD_SUBREAPER = 36


def shell_path() -> str:
    return shutil.which("bash") or "/bin/sh"


def shell_env(
    root: Path, source: Mapping[str, str] | None = None, *, sandboxed: bool = True
) -> dict[str, str]:
    """The environment of a command: an allowlist, never a blocklist.

    bwrap gets it too, so the sandbox's PID 1 (whose environment any process
    inside can read in /proc/1/environ) holds nothing more.
    """
    source = os.environ if source is None else source
    env = {
        name: source[name]
        for name in ENV_PASSTHROUGH
        if name in source and not any(marker in name.upper() for marker in SECRET_MARKERS)
    }
    if sandboxed:
        # The sandbox has its own /tmp; the server's TMPDIR is not there.
        env.pop("TMPDIR", None)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("LANG", "C.UTF-8")
    env.update(ENV_FIXED)
    env["HOME"] = str(root)
    env["PWD"] = str(root)
    env["SHELL"] = shell_path()
    return env


@functools.cache
def become_subreaper() -> bool:
    """Adopt the orphans of commands, so they can be reaped (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        logger.warning("cannot become a child subreaper; killed commands may linger: %s", exc)
        return False
    return True


class _Output:
    """Keeps the head and tail of the output and forwards it live, both capped."""

    def __init__(self, on_output: Callable[[str], None] | None) -> None:
        self.total = 0
        # Line ends in all of the output, for how many lines a cut drops.
        self.newlines = 0
        self.head = bytearray()
        self.tail = bytearray()
        self.on_output = on_output
        self.forwarded = 0
        self.live_stopped = False
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self.newlines += data.count(b"\n")
        if len(self.head) < OUTPUT_CAP:
            self.head += data[: OUTPUT_CAP - len(self.head)]
        self.tail += data
        if len(self.tail) > 2 * OUTPUT_TAIL:
            del self.tail[:-OUTPUT_TAIL]
        self._forward(data)

    def _forward(self, data: bytes) -> None:
        if self.on_output is None or self.live_stopped:
            return
        piece = data[: OUTPUT_CAP - self.forwarded]
        self.forwarded += len(piece)
        capped = len(piece) < len(data)
        self._emit(self.decoder.decode(piece, final=capped))
        if capped:
            self.live_stopped = True
            self._emit(LIVE_STOP_MARKER.format(cap=OUTPUT_CAP // 1024, half=OUTPUT_HEAD // 1024))

    def finish(self) -> None:
        if self.on_output is not None and not self.live_stopped:
            self._emit(self.decoder.decode(b"", final=True))

    def _emit(self, text: str) -> None:
        if not text or self.on_output is None:
            return
        try:
            self.on_output(clean_text(text))
        except Exception:
            # A broken listener must not stop the pipe being read (the command
            # would block on a full pipe); the result still gets everything.
            logger.exception("on_output failed; live output stopped")
            self.on_output = None

    @property
    def truncated(self) -> bool:
        return self.total > OUTPUT_CAP

    def _kept(self) -> tuple[bytes, bytes]:
        """The head and tail a truncated output keeps, cut on character boundaries:
        a character split by the cut is dropped whole."""
        head = _without_partial_end(bytes(self.head[:OUTPUT_HEAD]))
        tail = _without_partial_start(bytes(self.tail[-OUTPUT_TAIL:]))
        return head, tail

    def dropped(self) -> tuple[int, int]:
        """(bytes, line ends) of the output that the kept head and tail leave out."""
        if not self.truncated:
            return 0, 0
        head, tail = self._kept()
        return (
            self.total - len(head) - len(tail),
            self.newlines - head.count(b"\n") - tail.count(b"\n"),
        )

    def text(self) -> str:
        if not self.truncated:
            return clean_text(bytes(self.head).decode("utf-8", errors="replace"))
        head, tail = self._kept()
        dropped, _ = self.dropped()
        return clean_text(
            head.decode("utf-8", errors="replace")
            + DROP_MARKER.format(dropped=dropped)
            + tail.decode("utf-8", errors="replace")
        )


def _without_partial_end(data: bytes) -> bytes:
    """`data` without a UTF-8 sequence that its end cuts short."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # the last lead (or ASCII) byte
            if byte >= 0xF0:
                need = 4
            elif byte >= 0xE0:
                need = 3
            elif byte >= 0xC0:
                need = 2
            else:
                need = 1
            return data[:-back] if need > back else data
    return data


def _without_partial_start(data: bytes) -> bytes:
    """`data` without the continuation bytes of a sequence its start cuts into."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:
        skip += 1
    return data[skip:]


async def run_shell(
    command: str,
    root: Path,
    *,
    on_output: Callable[[str], None] | None = None,
    timeout: float = SHELL_TIMEOUT,
    policy: sandbox.Policy | None = None,
    root_fd: int | None = None,
    workspace: Path | None = None,
) -> ToolOutcome:
    """Run `command` in the resolved workspace `root`; see the module docstring.

    `root` may be a tab's working directory in `workspace`, opened as `root_fd` by
    chat.tools.workdir.open_root: the command then runs in that folder, never in
    whatever its path leads to by now (sandbox.command)."""
    policy = policy or sandbox.Policy()
    argv = [shell_path(), "-c", command]
    network: sandbox.Network | None = None
    seccomp: int | None = None
    if not policy.unsandboxed:
        verdict = await asyncio.to_thread(sandbox.check, policy)
        if not verdict.available:
            return ToolOutcome(verdict.problem, is_error=True)
        argv, network, seccomp = sandbox.wrapped(
            policy, root, argv, root_fd=root_fd, workspace=workspace
        )
    try:
        return await _run(root, argv, on_output, timeout, policy, network, seccomp, root_fd)
    finally:
        if network is not None:
            network.close()
        if seccomp is not None:
            with contextlib.suppress(OSError):
                os.close(seccomp)


async def _run(
    root: Path,
    argv: list[str],
    on_output: Callable[[str], None] | None,
    timeout: float,
    policy: sandbox.Policy,
    network: sandbox.Network | None,
    seccomp: int | None,
    root_fd: int | None = None,
) -> ToolOutcome:
    become_subreaper()
    output = _Output(on_output)
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    try:
        proc = await _start(root, argv, write_fd, policy, network, seccomp, root_fd)
    except OSError as exc:
        os.close(read_fd)
        return ToolOutcome(f"the command could not be started: {exc}", is_error=True)
    except BaseException:
        os.close(read_fd)
        raise

    eof = _read_into(loop, read_fd, output)
    try:
        timed_out, problem = await _wait(proc, network, timeout)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(eof), DRAIN_GRACE)
    finally:
        loop.remove_reader(read_fd)
        os.close(read_fd)
    output.finish()
    if problem is not None:
        return ToolOutcome(problem, is_error=True)

    kept = output.text()
    status = _status(proc.returncode, policy, timeout, timed_out=timed_out)
    result = (kept if not kept or kept.endswith("\n") else kept + "\n") + status
    dropped_bytes, dropped_lines = output.dropped()
    return ToolOutcome(
        result,
        is_error=timed_out or proc.returncode != 0,
        truncated=output.truncated,
        shell_output=kept,
        truncated_bytes=dropped_bytes,
        truncated_lines=dropped_lines,
    )


async def _start(
    root: Path,
    argv: list[str],
    write_fd: int,
    policy: sandbox.Policy,
    network: sandbox.Network | None,
    seccomp: int | None,
    root_fd: int | None,
) -> asyncio.subprocess.Process:
    """Start the command in its own session, writing to `write_fd` (closed here either way)."""
    try:
        bound = root_fd is not None and sandbox.binds_fd(policy)
        # From the event loop's thread, which lives as long as the
        # server: bwrap's parent-death signal fires when the thread that
        # started it ends, not the process.
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            # The folder opened, not its path: the child resolves its own
            # descriptor's link before it lets go of its descriptors.
            cwd=root if root_fd is None else f"/proc/self/fd/{root_fd}",
            env=shell_env(root, sandboxed=not policy.unsandboxed),
            start_new_session=True,
            pass_fds=(
                *(network.child_fds() if network is not None else ()),
                *((seccomp,) if seccomp is not None else ()),
                # bwrap closes it once bound: a command holding a descriptor of a
                # folder mounted outside its root could climb out with "..".
                *((root_fd,) if bound else ()),
            ),
        )
    finally:
        # The children hold the write end now; this process must not, or
        # the pipe would never reach end of file.
        os.close(write_fd)
        if network is not None:
            network.started()


def _read_into(
    loop: asyncio.AbstractEventLoop, read_fd: int, output: _Output
) -> asyncio.Future[None]:
    """Feed what arrives on `read_fd` to `output`; the future is done at end of file."""
    os.set_blocking(read_fd, False)
    eof: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = os.read(read_fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            output.feed(data)
        else:
            loop.remove_reader(read_fd)
            if not eof.done():
                eof.set_result(None)

    loop.add_reader(read_fd, readable)
    return eof


async def _wait(
    proc: asyncio.subprocess.Process, network: sandbox.Network | None, timeout: float
) -> tuple[bool, str | None]:
    """Wait for the command, at most `timeout`, then end its group: (timed out, the
    reason its network could not start, if it could not)."""
    timed_out = False
    problem = None
    try:
        if network is not None:
            # bwrap waits with the command until its network is up.
            problem = await network.start()
        if problem is None:
            await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        timed_out = True
    finally:
        # On cancellation too: the group dies before the call ends.
        await _end_group(proc)
    return timed_out, problem


def _status(
    returncode: int | None, policy: sandbox.Policy, timeout: float, *, timed_out: bool
) -> str:
    """The line after the output that says how the command ended."""
    if timed_out:
        return f"[timed out after {timeout:g} s; the command and everything it started were killed]"
    if returncode is not None and returncode < 0:
        return f"[killed by signal {_signal_name(-returncode)}]"
    if (
        not policy.unsandboxed
        and returncode is not None
        and SIGNAL_EXIT_BASE < returncode < SIGNAL_EXIT_END
    ):
        # bwrap reports a command killed by signal N as exit code 128 + N, as
        # shells do; the signal's name is the useful part.
        number = returncode - SIGNAL_EXIT_BASE
        return f"[exit code {returncode} (128 + {_signal_name(number)})]"
    return f"[exit code {returncode}]"


async def _end_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group and wait, bounded, until it is gone."""
    pgid = proc.pid  # a session leader's pid is its group id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GROUP_EXIT_GRACE
    try:
        # The leader is asyncio's child: its watcher reaps it, never waitpid here.
        await asyncio.wait_for(proc.wait(), GROUP_EXIT_GRACE)
    except TimeoutError:
        logger.warning("shell leader %d did not exit after SIGKILL", pgid)
        return
    while True:
        _reap_group(pgid)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            # The group is gone and its number reused by another user's process.
            return
        if loop.time() >= deadline:
            logger.warning("process group %d still has members after SIGKILL", pgid)
            return
        await asyncio.sleep(GROUP_POLL_INTERVAL)


def _reap_group(pgid: int) -> None:
    """Reap the group's dead members that were orphaned onto this process."""
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
