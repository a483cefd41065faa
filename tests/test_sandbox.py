"""The shell's bubblewrap sandbox, with real bwrap and real processes.

What a command can reach (environment, processes, files, /tmp, network), that
nothing it starts outlives the call or the server, and what happens where bwrap
cannot run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from chat import render
from chat.providers.base import Finish, ToolCallEvent
from chat.providers.replay import ScriptedProvider
from chat.tools import run_tool, sandbox, workdir
from chat.tools.base import ToolOutcome
from chat.tools.sandbox import Policy
from chat.tools.shell import run_shell
from chat.turn import step
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.ui_helpers import tidy_tags

ROOT = Path(__file__).resolve().parent.parent

# Every call gets this bound, so a broken kill fails the test instead of hanging it.
TEST_TIMEOUT = 20.0
# How long a test waits for an event the tool should cause almost at once.
EVENT_WAIT = 10.0
# The sandbox's teardown after its server was killed is the kernel's work, done
# asynchronously; the test waits this long for the processes to be gone.
TEARDOWN_WAIT = 10.0
POLL = 0.02

# Ways a command tries to outlive its call: a new session, nohup, a double fork.
# Each process's argv[0] is the marker (`exec -a`), so the host can find it.
ESCAPES = (
    "setsid bash -c 'exec -a {m} sleep 1000' & "
    "nohup bash -c 'exec -a {m} sleep 1000' >/dev/null 2>&1 & "
    "( bash -c 'exec -a {m} sleep 1000' & ) ; "
    # Inside the sandbox the command sees its own processes: wait for all three.
    "until [ $(pgrep -c -f '^{m}') -ge 3 ]; do sleep 0.01; done; echo started"
)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A data directory laid out like the default one: secrets, database, workspace."""
    directory = tmp_path / "data"
    (directory / "workspace").mkdir(parents=True)
    (directory / "secret_key").write_text("the-secret-key\n")
    (directory / "dispatch.db").write_text("SQLite format 3 api keys\n")
    return directory


@pytest.fixture
def ws(data: Path) -> Path:
    return (data / "workspace").resolve()


@pytest.fixture
def policy(data: Path) -> Policy:
    return Policy(hidden=(data,))


def marker() -> str:
    return f"dispatch-sandbox-test-{uuid.uuid4().hex}"


def host_processes_with(text: str) -> list[int]:
    """Live (not zombie) processes on the host whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def wait_until_gone(text: str) -> list[int]:
    deadline = time.monotonic() + TEARDOWN_WAIT
    while (left := host_processes_with(text)) and time.monotonic() < deadline:
        time.sleep(POLL)
    return left


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def sh(command: str, ws: Path, policy: Policy, **kwargs) -> ToolOutcome:
    kwargs.setdefault("timeout", TEST_TIMEOUT)
    return await run_shell(command, ws, policy=policy, **kwargs)


# --- what the command can see ---------------------------------------------------------


async def test_it_hides_the_servers_environment(ws, policy, monkeypatch):
    """Neither the parent's nor PID 1's environment in /proc holds the server's secrets:
    the server is not the parent, and bwrap runs with the command's scrubbed environment."""
    secret = f"sk-test-{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.setenv("DISPATCH_SANDBOX_PROBE", secret)
    outcome = await sh(
        "tr '\\0' '\\n' < /proc/$PPID/environ; echo --; tr '\\0' '\\n' < /proc/1/environ",
        ws,
        policy,
    )
    assert not outcome.is_error, outcome.result
    assert secret not in outcome.result
    parent, init = outcome.shell_output.split("--\n")
    assert "TERM=dumb" in parent.splitlines()
    assert "TERM=dumb" in init.splitlines()


async def test_it_hides_the_servers_processes(ws, policy):
    """/proc lists the sandbox's own processes only: bwrap's PID 1, the shell, and what
    it runs; never this test process."""
    outcome = await sh(
        "cd /proc; for p in [0-9]*; do echo \"$p $(tr '\\0' ' ' < $p/cmdline)\"; done",
        ws,
        policy,
    )
    assert not outcome.is_error, outcome.result
    lines = outcome.shell_output.splitlines()
    # This test runs in Python; nothing in the sandbox does.
    assert "python" not in outcome.shell_output
    assert str(os.getpid()) not in [line.split()[0] for line in lines]
    assert lines[0].startswith("1 ") and "bwrap" in lines[0]
    assert len(lines) <= 4  # PID 1, bash, the subshell; nothing of the host


async def test_it_does_not_mount_the_data_directory(ws, policy, data):
    """The secret key and the database next to the workspace are not there at all; the
    workspace's parent is empty but for the workspace."""
    outcome = await sh(
        f"ls -A ..; cat ../secret_key; cat ../dispatch.db; ls {data}/secret_key", ws, policy
    )
    assert outcome.is_error
    assert "the-secret-key" not in outcome.result
    assert "api keys" not in outcome.result
    assert outcome.shell_output == (
        "workspace\n"
        "cat: ../secret_key: No such file or directory\n"
        "cat: ../dispatch.db: No such file or directory\n"
        f"ls: cannot access '{data}/secret_key': No such file or directory\n"
    )


async def test_it_does_not_mount_the_home_directory_or_the_code(ws, policy):
    """The server user's home and Dispatch's own files are not in the sandbox."""
    home = Path.home()
    outcome = await sh(
        f"ls -d {home} {ROOT}/manage.py {ROOT}/dispatch/settings.py 2>&1", ws, policy
    )
    assert outcome.shell_output == (
        f"ls: cannot access '{home}': No such file or directory\n"
        f"ls: cannot access '{ROOT}/manage.py': No such file or directory\n"
        f"ls: cannot access '{ROOT}/dispatch/settings.py': No such file or directory\n"
    )


async def test_it_writes_only_in_the_workspace(ws, policy, tmp_path):
    """The system is read-only, paths outside the workspace do not exist, and the
    workspace is writable and shared with the host."""
    outside = tmp_path / "outside"
    outside.mkdir()
    outcome = await sh(
        f"touch /usr/x /etc/x {outside}/x; echo made > inside.txt; cat inside.txt", ws, policy
    )
    assert outcome.shell_output == (
        "touch: cannot touch '/usr/x': Read-only file system\n"
        "touch: cannot touch '/etc/x': Read-only file system\n"
        f"touch: cannot touch '{outside}/x': No such file or directory\n"
        "made\n"
    )
    assert (ws / "inside.txt").read_text() == "made\n"
    assert list(outside.iterdir()) == []


def swapped_after_its_check(monkeypatch, ws: Path, name: str, outside: Path) -> None:
    """Another tab's shell winning the race: `ws/name` (a folder on the way to a tab's
    working directory) becomes a link to `outside` right after the working directory
    was checked and opened, before the tool uses it. Deterministic, not a race loop."""
    checked = workdir.open_root

    def then_swapped(workspace: Path, cwd: str) -> tuple[Path, int]:
        opened = checked(workspace, cwd)
        (ws / name).rename(ws / f"{name}.real")
        (ws / name).symlink_to(outside)
        return opened

    monkeypatch.setattr(workdir, "open_root", then_swapped)


@pytest.fixture
def bwrap_without_bind_fd(tmp_path: Path) -> str:
    """bwrap as one older than 0.5 looks: no --bind-fd in its --help."""
    path = tmp_path / "old-bwrap"
    real = shutil.which("bwrap")
    path.write_text(
        f'#!/bin/sh\nif [ "$1" = --help ]; then "{real}" --help | grep -v -- --bind-fd; '
        f'exit 0; fi\nexec "{real}" "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("old_bwrap", [False, True], ids=["bind-fd", "no-bind-fd"])
async def test_a_working_directory_swapped_for_a_link_after_its_check_leads_nowhere(
    ws, data, tmp_path, monkeypatch, request, old_bwrap
):
    """The shell runs in the folder that was checked, never where a link swapped in
    since leads (bwrap's --bind follows links): with --bind-fd the folder itself is
    bound; an older bwrap binds the whole workspace and starts in the folder there."""
    bwrap = request.getfixturevalue("bwrap_without_bind_fd") if old_bwrap else sandbox.BWRAP
    policy = Policy(hidden=(data,), bwrap=bwrap)
    assert sandbox.binds_fd(policy) is not old_bwrap
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (ws / "a" / "b").mkdir(parents=True)
    swapped_after_its_check(monkeypatch, ws, "a", outside)
    outcome = await run_tool(
        "shell",
        {"command": "touch escaped && pwd"},
        ws,
        policy=policy,
        cwd="a/b",
        timeout=TEST_TIMEOUT,
    )
    assert (ws / "a").is_symlink()
    assert list(outside.rglob("*")) == [outside / "b"]
    if old_bwrap:
        # Inside the sandbox a/b leads to the link's target, which is not there.
        assert outcome.is_error and "Can't chdir" in outcome.result
    else:
        assert outcome.result == f"{ws}/a/b\n[exit code 0]"
        assert (ws / "a.real" / "b" / "escaped").exists()


async def test_the_shell_in_a_working_directory_gets_no_descriptor_of_it(ws, policy):
    """The descriptor bwrap binds is closed before the command runs: one of a folder
    mounted outside the sandbox's root would let it climb out with `..`."""
    outcome = await run_tool(
        "shell", {"command": "ls /proc/self/fd"}, ws, policy=policy, cwd="site"
    )
    # stdin, stdout and stderr, and ls's own descriptor of the folder it lists.
    assert outcome.result == "0\n1\n2\n3\n[exit code 0]"


async def test_a_working_directory_that_is_a_link_is_refused(ws, policy, tmp_path):
    """Swapped before the call: the shell and the file tools refuse it, naming it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "site").symlink_to(outside)
    shell = await run_tool("shell", {"command": "touch x"}, ws, policy=policy, cwd="site")
    write = await run_tool("write_file", {"path": "x", "content": "x"}, ws, cwd="site")
    for outcome in (shell, write):
        assert outcome == ToolOutcome(
            "the working directory site is not a folder of the workspace "
            "(site is a link or a file)",
            is_error=True,
        )
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("tmp", ["/tmp", "/var/tmp"])
async def test_it_gives_the_command_a_private_tmp(ws, policy, tmp):
    """The host's /tmp is not visible, and what the command leaves in its /tmp is gone."""
    name = marker()
    host_file = Path(tmp) / name
    host_file.write_text("host\n")
    try:
        outcome = await sh(
            f"cat {tmp}/{name}; echo sandbox > {tmp}/{name}-inside; cat {tmp}/{name}-inside",
            ws,
            policy,
        )
    finally:
        host_file.unlink()
    assert outcome.shell_output == f"cat: {tmp}/{name}: No such file or directory\nsandbox\n"
    assert not (Path(tmp) / f"{name}-inside").exists()


async def test_it_drops_the_servers_tmpdir(ws, policy, monkeypatch, tmp_path):
    """TMPDIR names a directory of the host, which is not in the sandbox."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    outcome = await sh('echo "${TMPDIR-unset}"; mktemp', ws, policy)
    assert outcome.shell_output.splitlines()[0] == "unset"
    assert outcome.shell_output.splitlines()[1].startswith("/tmp/tmp.")


async def test_it_drops_every_capability_even_as_root(ws, policy):
    """Root in the sandbox has no capabilities (no mount, no raw devices)."""
    outcome = await sh("grep CapEff /proc/self/status", ws, policy)
    assert outcome.shell_output.split() == ["CapEff:", "0000000000000000"]


# Kernel settings that act on the host. Each write puts back the value that is there, so
# nothing changes should it unexpectedly succeed (as it did as root before /proc/sys was
# bound read-only; core_pattern then ran a program as host root).
KERNEL_SETTINGS = ("/proc/sys/vm/swappiness", "/proc/sys/kernel/core_pattern")


@pytest.mark.parametrize("path", KERNEL_SETTINGS)
async def test_it_cannot_change_the_hosts_kernel_settings(ws, policy, path):
    before = Path(path).read_text()
    outcome = await sh(f'value=$(cat {path}) && printf "%s\\n" "$value" > {path}', ws, policy)
    assert Path(path).read_text() == before
    assert outcome.is_error
    assert outcome.shell_output.endswith(f" {path}: Read-only file system\n")
    assert outcome.shell_output.count("\n") == 1


async def test_nothing_in_proc_is_writable_but_the_commands_own_processes(ws, policy):
    outcome = await sh(
        "find /proc -writable -not -path '/proc/[0-9]*' -not -path '/proc/self/*' "
        "-not -path '/proc/thread-self/*' 2>/dev/null; true",
        ws,
        policy,
    )
    assert outcome.shell_output == ""


async def test_it_allows_no_user_namespace_inside(ws, policy):
    """One would give the command every capability over its own mounts again."""
    outcome = await sh("unshare -U true && echo unshared", ws, policy)
    assert outcome.is_error
    assert outcome.shell_output == "unshare: unshare failed: No space left on device\n"


@pytest.mark.parametrize("path", ["/tmp", "/var/tmp", "/dev/shm"])
async def test_its_memory_backed_directories_are_bounded(ws, policy, path):
    """Each is a tmpfs of TMPFS_SIZE: writing past it fails instead of filling the host's RAM."""
    over = sandbox.TMPFS_SIZE // (1024 * 1024) + 1
    outcome = await sh(f"head -c {over}M /dev/zero > {path}/big", ws, policy)
    assert outcome.is_error
    assert "No space left on device" in outcome.shell_output


async def test_it_makes_no_setuid_or_setgid_files(ws, policy):
    """As root they would run as root for any other user who reaches the workspace: chmod,
    install (fchmod), a creating open and mknod with either bit are refused; plain modes
    work."""
    outcome = await sh(
        "cp /usr/bin/id s; chmod 4755 s; chmod g+s s; install -m 2755 /usr/bin/id t; "
        "python3 -c 'import os; os.open(\"u\", os.O_CREAT | os.O_WRONLY, 0o4755)' 2>&1 "
        "| tail -1; python3 -c 'import os, stat; os.mknod(\"v\", stat.S_IFREG | 0o6755)' "
        "2>&1 | tail -1; mkdir d; chmod 2775 d; chmod 755 s && echo plain",
        ws,
        policy,
    )
    assert outcome.shell_output.count("Operation not permitted") == 6, outcome.shell_output
    assert outcome.shell_output.endswith("plain\n")
    made = [p for p in ws.iterdir() if p.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)]
    assert made == []
    assert stat.S_IMODE((ws / "s").stat().st_mode) == 0o755


async def test_its_root_and_dev_take_no_files(ws, policy):
    """The root and /dev are tmpfs too, unbounded: read-only, so they cannot fill RAM."""
    outcome = await sh(
        "echo x > /big; echo x > /dev/big; echo x > /dev/null && echo null", ws, policy
    )
    first, second, last = outcome.shell_output.splitlines()
    assert first.endswith(" /big: Read-only file system")
    assert second.endswith(" /dev/big: Read-only file system")
    assert last == "null"


# --- nothing outlives the call ------------------------------------------------------


async def test_no_process_outlives_a_command_that_ends(ws, policy):
    """setsid, nohup and a double fork all die with the sandbox when the command ends."""
    m = marker()
    outcome = await sh(ESCAPES.format(m=m), ws, policy)
    left = host_processes_with(m)
    kill_all(left)
    assert outcome.shell_output == "started\n"
    assert left == []


async def test_no_process_outlives_a_timeout(ws, policy):
    """At the timeout everything the command started is gone before the call returns."""
    m = marker()
    outcome = await sh(ESCAPES.format(m=m) + "; sleep 1000", ws, policy, timeout=5)
    left = host_processes_with(m)
    kill_all(left)
    assert outcome.shell_output == "started\n"
    assert outcome.result.endswith(
        "[timed out after 5 s; the command and everything it started were killed]"
    )
    assert left == []


async def test_no_process_outlives_a_cancelled_call(ws, policy):
    """Cancelling the call kills the sandbox before CancelledError reaches the caller."""
    m = marker()
    started = asyncio.Event()
    live: list[str] = []

    def on_output(text: str) -> None:
        live.append(text)
        if "started\n" in "".join(live):
            started.set()

    task = asyncio.create_task(
        run_tool(
            "shell",
            {"command": ESCAPES.format(m=m) + "; sleep 1000"},
            ws,
            on_output=on_output,
            timeout=TEST_TIMEOUT,
            policy=policy,
        )
    )
    await asyncio.wait_for(started.wait(), EVENT_WAIT)
    assert len(host_processes_with(m)) >= 3
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, EVENT_WAIT)
    left = host_processes_with(m)
    kill_all(left)
    assert left == []


SERVER = """
import asyncio, os, sys
from pathlib import Path
import django
# chat.tools reads the MCP servers' rows: the app's models load first, as in the server.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from chat.tools.sandbox import Policy
from chat.tools.shell import run_shell

asyncio.run(run_shell(
    os.environ["COMMAND"], Path(os.environ["WORKSPACE"]),
    on_output=lambda text: print(text, end="", flush=True), policy=Policy(), timeout=600,
))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_no_process_outlives_the_server(ws, sig):
    """A server process killed in the middle of a call takes the sandbox with it:
    bwrap dies with its parent, and the namespace with bwrap's PID 1."""
    m = marker()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(ROOT),
            # In the environment, not the command line: only the sandbox has the marker.
            "COMMAND": ESCAPES.format(m=m) + f"; exec -a {m} sleep 1000",
            "WORKSPACE": str(ws),
        },
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == b"started\n"
        # bwrap and its PID 1 carry the command, so the marker, in their arguments.
        sandbox_pids = host_processes_with(m)
        assert len(sandbox_pids) >= 4
        server.send_signal(sig)
        server.wait(EVENT_WAIT)
    finally:
        server.kill()
        server.wait()
    left = wait_until_gone(m)
    kill_all(left)
    # Orphaned onto this process when it is a child subreaper (an earlier test ran the
    # shell here): reap what is left of bwrap and its PID 1.
    for pid in sandbox_pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    assert left == []


# --- network -------------------------------------------------------------------------


@pytest.fixture
def listener():
    """A TCP server on this host's loopback; connections complete in the kernel's backlog."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


CONNECT = "exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"


def host_address() -> str:
    """This host's first non-loopback IPv4 address (the route out of a private network)."""
    done = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()[3].split("/")[0]


def slirp_children() -> list[int]:
    """slirp4netns processes this test process started, or adopted, and has not reaped
    (a killed server's, adopted as a child subreaper, would show here too)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 :].split(")", 1)
        if name == "slirp4netns" and int(rest.split()[1]) == os.getpid():
            found.append(int(entry.name))
    return found


async def test_network_on_is_a_private_network_with_a_route_out(ws, policy):
    """Its own interface with a default route, and the DNS relay as its resolver; the relay
    is gone (and reaped) when the call returns."""
    before = slirp_children()
    outcome = await sh(
        "awk '$2 == \"00000000\" {print $1}' /proc/net/route; cat /etc/resolv.conf", ws, policy
    )
    assert outcome.shell_output == f"{sandbox.NETWORK_DEVICE}\nnameserver {sandbox.NETWORK_DNS}\n"
    assert slirp_children() == before


async def test_network_on_reaches_the_host_beyond_its_loopback(ws, policy):
    """Outbound connections leave through slirp4netns (no internet here: the host's own
    address stands in for it)."""
    address = host_address()
    with socket.create_server((address, 0)) as server:
        port = server.getsockname()[1]
        outcome = await sh(f"exec 3<>/dev/tcp/{address}/{port} && echo connected", ws, policy)
    assert outcome.shell_output == "connected\n"


async def test_network_on_does_not_reach_the_hosts_loopback(ws, policy, listener):
    """A database or Redis on 127.0.0.1 is out of reach, directly or through the relay's
    address for the host (10.0.2.2)."""
    outcome = await sh(
        CONNECT.format(port=listener) + f"; exec 3<>/dev/tcp/10.0.2.2/{listener} && echo relayed",
        ws,
        policy,
    )
    assert outcome.is_error
    lines = outcome.shell_output.splitlines()
    assert lines[0].endswith("connect: Connection refused")
    assert lines[2].endswith("connect: Network is unreachable")
    assert "connected" not in outcome.shell_output and "relayed" not in outcome.shell_output


async def test_network_on_does_not_reach_the_hosts_abstract_sockets(ws, policy):
    """Abstract unix sockets belong to a network namespace: the host's are not there."""
    name = marker()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(f"\0{name}")
        server.listen()
        outcome = await sh(
            f"python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"\\0{name}\")'"
            " 2>&1 | tail -1",
            ws,
            policy,
        )
    assert outcome.shell_output == "ConnectionRefusedError: [Errno 111] Connection refused\n"


async def test_without_slirp4netns_network_on_is_the_hosts_network(ws, data, listener, tmp_path):
    """The fallback: the host's network, loopback included; the state says so and how to
    avoid it."""
    missing = str(tmp_path / "no-slirp4netns")
    policy = Policy(hidden=(data,), slirp4netns=missing)
    outcome = await sh(CONNECT.format(port=listener), ws, policy)
    assert outcome.shell_output == "connected\n"
    assert (
        f"with this host's network, services on its loopback (127.0.0.1) included, since "
        f"{missing} is not installed (install it to keep them out of reach, or set "
        "DISPATCH_SHELL_NETWORK=0)." in sandbox.state(policy).detail
    )
    assert "through a private network" in sandbox.state(Policy()).detail


async def test_a_failing_slirp4netns_fails_the_call_with_its_words(ws, data, tmp_path):
    path = tmp_path / "slirp4netns"
    path.write_text("#!/bin/sh\necho 'slirp4netns: cannot open /dev/net/tun' >&2\nexit 1\n")
    path.chmod(0o755)
    outcome = await sh("touch ran", ws, Policy(hidden=(data,), slirp4netns=str(path)))
    assert outcome == ToolOutcome(
        "The sandbox's network could not be set up: slirp4netns failed: slirp4netns: cannot "
        "open /dev/net/tun. Turn the network off (DISPATCH_SHELL_NETWORK=0) or fix "
        "slirp4netns; the command did not run.",
        is_error=True,
    )
    assert not (ws / "ran").exists()


async def test_it_has_no_network_when_it_is_off(ws, data, listener):
    """Off: a network namespace of its own, whose loopback has nothing listening."""
    outcome = await sh(
        CONNECT.format(port=listener) + "; cat /proc/net/route | wc -l",
        ws,
        Policy(hidden=(data,), network=False),
    )
    assert outcome.shell_output.splitlines()[0].endswith("connect: Connection refused")
    # The header of the routing table, and not one route.
    assert outcome.shell_output.splitlines()[-1] == "1"
    assert "connected\n" not in outcome.shell_output


# --- where bwrap cannot run ---------------------------------------------------------


async def test_it_refuses_the_shell_without_bwrap(ws, tmp_path):
    """No bwrap: the call is an error that says why and how to fix it; nothing runs."""
    missing = str(tmp_path / "no-bwrap")
    outcome = await run_tool("shell", {"command": "touch ran"}, ws, policy=Policy(bwrap=missing))
    assert outcome == ToolOutcome(
        f"The shell tool is unavailable: bubblewrap ({missing!r}) is not installed. Install "
        "it (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) "
        "and restart Dispatch, or set DISPATCH_SHELL_UNSANDBOXED=1 to run commands without a "
        "sandbox (they can then read everything the server can, including its API keys, "
        "database and secret key).",
        is_error=True,
    )
    assert not (ws / "ran").exists()


@pytest.fixture
def failing_bwrap(tmp_path: Path) -> str:
    """A bwrap that fails the way it does without user namespaces."""
    path = tmp_path / "bwrap"
    path.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because "
        "the kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    path.chmod(0o755)
    return str(path)


async def test_it_refuses_the_shell_where_bwrap_fails(ws, failing_bwrap):
    """bwrap that cannot sandbox: its own words, and the fix."""
    outcome = await run_tool(
        "shell", {"command": "touch ran"}, ws, policy=Policy(bwrap=failing_bwrap)
    )
    assert outcome.is_error
    assert outcome.result == (
        f"The shell tool is unavailable: its sandbox, bubblewrap ({failing_bwrap}), cannot "
        "run here; it said: bwrap: No permissions to creating new namespace, likely because "
        "the kernel does not allow non-privileged user namespaces.. It needs user namespaces: "
        "allow them (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
        "kernel.apparmor_restrict_unprivileged_userns=0; in Docker, run the container with "
        "--security-opt seccomp=unconfined --security-opt apparmor=unconfined) and restart "
        "Dispatch, or set DISPATCH_SHELL_UNSANDBOXED=1 to run commands without a sandbox "
        "(they can then read everything the server can, including its API keys, database "
        "and secret key)."
    )
    assert not (ws / "ran").exists()


async def test_the_opt_out_runs_commands_unsandboxed(ws, failing_bwrap):
    """With the operator's opt-out the command runs, and sees the host (the code here)."""
    outcome = await run_tool(
        "shell",
        {"command": f"touch ran; ls {ROOT}/manage.py"},
        ws,
        policy=Policy(bwrap=failing_bwrap, unsandboxed=True),
    )
    assert outcome.result == f"{ROOT}/manage.py\n[exit code 0]"
    assert (ws / "ran").exists()


def test_the_state_says_what_the_shell_runs_in(failing_bwrap):
    """What the status line, Settings and dispatch_status show."""
    assert sandbox.state(Policy()).state == "sandboxed"
    assert sandbox.state(Policy()).warning == ""
    unavailable = sandbox.state(Policy(bwrap=failing_bwrap))
    assert (unavailable.state, unavailable.warning) == ("unavailable", "Shell unavailable")
    assert unavailable.detail == sandbox.check(Policy(bwrap=failing_bwrap)).problem
    opted_out = sandbox.state(Policy(unsandboxed=True, network=False))
    assert (opted_out.state, opted_out.warning) == ("unsandboxed", "Shell unsandboxed")
    assert "DISPATCH_SHELL_UNSANDBOXED is set" in opted_out.detail


def test_the_policy_comes_from_the_settings(settings, tmp_path):
    settings.DISPATCH_SHELL_NETWORK = False
    settings.DISPATCH_SHELL_UNSANDBOXED = True
    settings.DATA_DIR = tmp_path
    settings.DISPATCH_WORKSPACE = tmp_path / "ws"
    assert sandbox.policy_from(settings) == Policy(
        network=False,
        unsandboxed=True,
        hidden=(tmp_path, tmp_path / "ws"),
        slirp4netns="slirp4netns",
    )


@pytest.mark.django_db(transaction=True)
async def test_a_turn_runs_its_shell_in_the_sandbox_the_settings_describe(
    settings, data, ws, listener, monkeypatch
):
    """The turn runner builds the policy from the settings: here the network is off and
    the data directory (with the secret key) is the server's."""
    settings.DATA_DIR = data
    settings.DISPATCH_WORKSPACE = ws
    settings.DISPATCH_SHELL_NETWORK = False
    command = f"cat {data}/secret_key; " + CONNECT.format(port=listener)
    provider = ScriptedProvider(
        [[ToolCallEvent("s", "shell", {"command": command}), Finish(stop_reason="tool_use")], []]
    )

    async def provider_for(model: str):
        return provider

    monkeypatch.setattr(step, "provider_for", provider_for)
    async with running_worker():
        tab = await make_tab()
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "run it")
            await watcher.until_idle()
    result = next(row for row in await chunks(tab.pk) if row.type == "tool_result").data
    assert result["is_error"] is True
    assert "the-secret-key" not in result["result"]
    assert f"cat: {data}/secret_key: No such file or directory" in result["shell_output"]
    assert "Connection refused" in result["shell_output"]


# --- what people see ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unsandboxed", "bwrap_ok", "warning"),
    [
        (False, True, None),
        (True, True, "Shell unsandboxed"),
        (False, False, "Shell unavailable"),
    ],
)
def test_the_status_line_warns_only_without_a_sandbox(
    settings, monkeypatch, tmp_path, unsandboxed, bwrap_ok, warning
):
    """The chat page's status line carries a warning, with the details as its title, only
    when commands run unsandboxed or the shell is unavailable."""
    settings.DISPATCH_SHELL_UNSANDBOXED = unsandboxed
    if not bwrap_ok:
        monkeypatch.setattr(sandbox, "BWRAP", str(tmp_path / "no-bwrap"))
    html = tidy_tags(render.fragment_status({"state": "idle"}))
    if warning is None:
        assert "sandbox-warning" not in html
    else:
        detail = escape(sandbox.state(sandbox.policy_from(settings)).detail)
        assert f'<span class="sep sandbox-warning" title="{detail}">{warning}</span>' in html


@pytest.fixture
def owner(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("owner", password="pw-owner-123", is_staff=True))
    return client


def test_settings_show_the_sandbox(owner, settings):
    settings.DISPATCH_SHELL_NETWORK = False
    html = tidy_tags(owner.get(reverse("settings_section", args=["tools"])).content.decode())
    assert '<span class="badge ok">sandboxed</span>' in html
    assert "Shell commands run in a bubblewrap sandbox" in html
    assert "without network access" in html
    assert "Network access for shell commands: off" in html


def test_settings_say_why_the_shell_is_unavailable(owner, monkeypatch, tmp_path):
    missing = str(tmp_path / "no-bwrap")
    monkeypatch.setattr(sandbox, "BWRAP", missing)
    html = tidy_tags(owner.get(reverse("settings_section", args=["tools"])).content.decode())
    assert '<span class="badge warn">unavailable</span>' in html
    assert f"bubblewrap (&#x27;{missing}&#x27;) is not installed" in html


def test_settings_show_the_opt_out(owner, settings):
    settings.DISPATCH_SHELL_UNSANDBOXED = True
    html = tidy_tags(owner.get(reverse("settings_section", args=["tools"])).content.decode())
    assert '<span class="badge warn">unsandboxed</span>' in html
    assert "DISPATCH_SHELL_UNSANDBOXED is set" in html


@pytest.mark.parametrize(("euid", "shown"), [(0, True), (1000, False)])
def test_settings_warn_when_the_server_runs_as_root(owner, monkeypatch, euid, shown):
    """As root, commands are host root for every file they reach (a setuid program left in
    the workspace runs as root for other users): Settings say so, and how to avoid it."""
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: euid)
    html = tidy_tags(owner.get(reverse("settings_section", args=["tools"])).content.decode())
    assert ('<span class="badge warn">root</span> Dispatch runs as root' in html) is shown
    assert sandbox.state(Policy()).as_root == (sandbox.AS_ROOT if shown else "")


@pytest.fixture
def old_bwrap(tmp_path: Path) -> str:
    """bwrap as before 0.7 (Ubuntu 22.04 has 0.6): no --disable-userns, no --size."""
    path = tmp_path / "bwrap"
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --help ]; then bwrap --help | grep -v -e --disable-userns -e --size; '
        "exit 0; fi\n"
        'for arg; do case "$arg" in --disable-userns|--size) '
        'echo "bwrap: Unknown option $arg" >&2; exit 1;; esac; done\n'
        'exec bwrap "$@"\n'
    )
    path.chmod(0o755)
    return str(path)


async def test_an_older_bwrap_still_runs_commands_on_the_hosts_network(
    ws, data, listener, old_bwrap
):
    """Without --disable-userns no private network can be set up (it waits for the nested
    user namespace that option makes): the host's network, and the state says why. Its
    /tmp is unbounded (no --size)."""
    policy = Policy(hidden=(data,), bwrap=old_bwrap)
    outcome = await sh(CONNECT.format(port=listener), ws, policy)
    assert outcome.shell_output == "connected\n"
    assert sandbox.state(policy).state == "sandboxed"
    assert "since this bubblewrap is older than 0.8" in sandbox.state(policy).detail
