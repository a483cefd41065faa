"""stdio MCP servers are confined as shell commands are (chat.tools.mcp, chat.tools.sandbox):
tests/mcp_servers/bare.py (standard library only, given to the system's python3 with -c:
the sandbox shows neither the project nor, unless configured, a workspace) says what it
sees from inside."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import pytest_asyncio
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat.models import McpServer
from chat.providers.base import Finish, TextDelta, ToolCallEvent
from chat.tools import mcp, sandbox, shell, workdir
from tests.engine import chunks, make_tab, running_worker, submit
from tests.test_sandbox import ROOT, host_address, host_processes_with, kill_all, marker
from tests.test_sandbox import wait_until_gone as gone

SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
BARE = (Path(__file__).parent / "mcp_servers" / "bare.py").read_text()
TIMEOUT = 20.0

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not sandbox.check(sandbox.policy_from(settings)).available or not SYSTEM_PYTHON,
        reason="needs bubblewrap and the system's python3 (the sandbox's tests say why not)",
    ),
]


@pytest_asyncio.fixture(autouse=True)
async def _sandboxed(settings, tmp_path):
    settings.DISPATCH_SHELL_UNSANDBOXED = False
    settings.DISPATCH_WORKSPACE = tmp_path / "workspace"
    settings.DISPATCH_SHELL_NETWORK = True
    yield
    await mcp.close_all()


async def server(name: str, *args: str, env: dict[str, str] | None = None, **fields) -> McpServer:
    row = McpServer(
        name=name,
        transport="stdio",
        command=SYSTEM_PYTHON,
        args=["-c", BARE, *args],
        timeout=TIMEOUT,
        **fields,
    )
    row.set_env(env or {})
    await row.asave()
    return row


async def where(name: str, owner_id: int | None = None, tool: str = "where") -> dict:
    result = await mcp.call(f"mcp__{name}__{tool}", {}, owner_id=owner_id)
    assert not result.is_error, result.result
    return json.loads(result.result)


async def user(name: str) -> tuple[int, Path]:
    """A user's id, and their workspace holding a file named after them."""
    person = await get_user_model().objects.acreate(username=name)
    place = workdir.user_workspace(person.pk)
    place.mkdir(parents=True, exist_ok=True)
    (place / f"{name}.txt").write_text(name)
    return person.pk, place.resolve()


async def test_a_server_gets_a_home_of_its_own_no_workspace_and_no_secrets(monkeypatch):
    """Its home and working directory are a folder of its own under the data directory
    (0700), never the workspace, which it does not see at all, nor the data directory's
    files; its environment is the shell's allowlist and its own variables, not the
    server's (SECRET_KEY, DATABASE_URL)."""
    monkeypatch.setenv("SECRET_KEY", "app-secret-key")
    monkeypatch.setenv("DATABASE_URL", "postgres://u:pw@127.0.0.1/db")
    workspace = Path(settings.DISPATCH_WORKSPACE)
    workspace.mkdir(parents=True, exist_ok=True)
    secret = Path(settings.DATA_DIR) / "secret_key"
    look = [str(workspace), str(secret)]
    row = await server("boxed", env={"MCP_TEST_TOKEN": "tok", "MCP_TEST_LOOK": ":".join(look)})
    seen = await where("boxed")
    home = Path(settings.DATA_DIR) / "mcp" / str(row.pk) / "home"
    assert (seen["home"], seen["cwd"]) == (str(home), str(home.resolve()))
    assert home.stat().st_mode & 0o777 == 0o700
    assert seen["looks"] == {str(workspace): False, str(secret): False}
    assert (home / "written-by-mcp.txt").read_text() == "ok"
    assert seen["token"] == "tok"
    allowed = {*shell.ENV_PASSTHROUGH, *shell.ENV_FIXED, "HOME", "PWD", "SHELL"}
    assert set(seen["environ"]) - allowed == {"MCP_TEST_TOKEN", "MCP_TEST_LOOK"}


async def test_a_server_that_mounts_the_workspace_sees_its_tab_owners_alone():
    """Configured to mount the workspace, a server finds the tab owner's at
    MCP_WORKSPACE, writable, through a connection of that user's: no other user's
    workspace is there, and their tabs get a server process (and home) of their own."""
    alice, alices = await user("alice")
    bob, bobs = await user("bob")
    mounted = mcp.MCP_WORKSPACE
    look = [str(mounted / "alice.txt"), str(mounted / "bob.txt"), str(alices), str(bobs)]
    env = {"MCP_TEST_LOOK": ":".join(look), "MCP_TEST_WRITE": str(mounted / "written")}
    row = await server("files", env=env, mount_workspace=True)
    as_alice = await where("files", alice)
    as_bob = await where("files", bob)
    assert as_alice["looks"] == dict(zip(look, [True, False, False, False], strict=True))
    assert as_bob["looks"] == dict(zip(look, [False, True, False, False], strict=True))
    assert (alices / "written").read_text() == (bobs / "written").read_text() == "ok"
    assert set(mcp._pool().connections) == {("files", alice), ("files", bob)}
    for seen, owner in ((as_alice, alice), (as_bob, bob)):
        home = McpServer.homes(row.pk) / "users" / str(owner) / "home"
        assert (seen["home"], seen["cwd"]) == (str(home), str(home.resolve()))


async def test_a_turn_calls_and_lists_a_server_in_its_tab_owners_workspace(script, monkeypatch):
    """The runner carries the tab's owner to the listing at the turn's start and to the
    call: both on that user's connection, which mounts their workspace."""
    monkeypatch.setattr(mcp, "TURN_LIST_SECONDS", TIMEOUT)
    look = str(mcp.MCP_WORKSPACE / "mine.txt")
    await server("files", env={"MCP_TEST_LOOK": look}, mount_workspace=True)
    script(
        [ToolCallEvent("c1", "mcp__files__where", {}), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab()
        workdir.user_workspace(tab.owner_id).joinpath("mine.txt").write_text("mine")
        await submit(tab, "go")
        async with asyncio.timeout(TIMEOUT):
            while not [
                c for c in await chunks(tab.pk) if c.type == "text" and c.role == "assistant"
            ]:
                await asyncio.sleep(0.05)
        assert set(mcp._pool().connections) == {("files", tab.owner_id)}
    [result] = [c.data for c in await chunks(tab.pk) if c.type == "tool_result"]
    assert json.loads(result["result"])["looks"] == {look: True}


def test_settings_test_mounts_the_testers_workspace():
    """Settings' Test of a server that mounts the workspace runs it on the tester's, as
    a tab of theirs would: one that needs it (server-filesystem /workspace) lists its
    tools instead of failing to start."""
    tester = get_user_model().objects.create_superuser("root", password="pw-root-12345")
    workdir.user_workspace(tester.pk).joinpath("ready").write_text("")
    row = McpServer(name="files", transport="stdio", command=SYSTEM_PYTHON, args=["-c", BARE])
    row.mount_workspace = True
    row.set_env({"MCP_TEST_REQUIRE": str(mcp.MCP_WORKSPACE / "ready")})
    row.save()
    client = Client()
    client.force_login(tester)
    response = client.post(reverse("mcp_test", args=[row.pk]), follow=True)
    said = [str(message) for message in response.context["messages"]]
    assert said == ["Server files offers 1 tools: where."]


def user_site() -> str:
    """The system python's per-user site-packages, relative to its $HOME."""
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import site; print(site.USER_SITE)"],
        env={"HOME": "/HOME", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip().removeprefix("/HOME/")


async def test_code_planted_in_the_workspace_does_not_run_in_the_server():
    """What a tab's shell can write into its workspace (a .pth or usercustomize in
    ~/.local's site-packages, were the workspace $HOME) never runs when the server
    starts, even in a server that mounts the workspace."""
    alice, alices = await user("alice")
    # Run, it writes into $HOME: the workspace it was planted in.
    code = "import os; open(os.path.join(os.environ['HOME'], 'planted-code-ran'), 'w')"
    workspaces = [alices, Path(settings.DISPATCH_WORKSPACE).resolve()]
    for workspace in workspaces:
        planted = workspace / user_site()
        planted.mkdir(parents=True)
        (planted / "zz.pth").write_text(code + "\n")
        (planted / "usercustomize.py").write_text(code + "\n")
    await server("files", mount_workspace=True)
    await where("files", alice)
    assert [w for w in workspaces if (w / "planted-code-ran").exists()] == []


@pytest.fixture
def listener():
    """A TCP server on every address of this host, its loopback included."""
    with socket.create_server(("0.0.0.0", 0)) as listening:
        yield listening.getsockname()[1]


@pytest.mark.parametrize(
    ("network", "slirp4netns", "loopback", "outside"),
    [(True, sandbox.SLIRP4NETNS, "no", "yes"), (False, sandbox.SLIRP4NETNS, "no", "no")],
)
async def test_a_server_never_reaches_the_hosts_loopback(
    settings, monkeypatch, listener, network, slirp4netns, loopback, outside
):
    """Network on, the shell's private network (slirp4netns): a way out, but not to a
    service on 127.0.0.1 (Redis, PostgreSQL with trust). Off: none at all."""
    if network and not sandbox.private_network(sandbox.policy_from(settings)):
        pytest.skip("needs slirp4netns and bubblewrap 0.8 (the sandbox's tests say why not)")
    settings.DISPATCH_SHELL_NETWORK = network
    addresses = [f"127.0.0.1:{listener}", f"{host_address()}:{listener}"]
    await server("netted", env={"MCP_TEST_CONNECT": " ".join(addresses)})
    seen = await where("netted")
    assert seen["reaches"] == {addresses[0]: loopback, addresses[1]: outside}


async def test_without_slirp4netns_network_on_is_the_hosts_as_for_the_shell(monkeypatch, listener):
    """The documented fallback, the shell's: without slirp4netns the network on is the
    host's own, loopback included (Settings says so)."""
    monkeypatch.setattr(sandbox, "SLIRP4NETNS", "no-such-slirp4netns")
    address = f"127.0.0.1:{listener}"
    await server("netted", env={"MCP_TEST_CONNECT": address})
    assert (await where("netted"))["reaches"] == {address: "yes"}


@pytest.mark.parametrize("stuck", [False, True])
async def test_nothing_a_server_started_outlives_its_connection(stuck):
    """Closing a connection ends the whole sandbox: a process the server left running
    in a session of its own, and the server itself when it does not exit once its stdin
    closes; slirp4netns too."""
    m = marker()
    env = {"MCP_TEST_SPAWN": m, **({"MCP_TEST_LINGER": "1"} if stuck else {})}
    await server("forks", env=env)
    await where("forks", tool="spawn")
    assert host_processes_with(m)
    await mcp.close_all()
    left = gone(m)
    kill_all(left)
    assert left == []
    # This test's server only (its environment holds the marker): other tests running
    # beside it under xdist start servers of the same script.
    assert [pid for pid in host_processes_with(BARE[:60]) if environ_has(pid, m)] == []


def environ_has(pid: int, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


APP = """
import asyncio, os, sys
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django.setup()
from chat.tools import mcp

async def main():
    config = mcp.ServerConfig(
        name="forks", transport="stdio", command=sys.argv[1], args=("-c", sys.argv[2]),
        env=(("MCP_TEST_SPAWN", sys.argv[3]),), url="", headers=(), timeout=20, id=1,
    )
    connection = await mcp._connect(config)
    await connection._session().call_tool("spawn", {})
    print("started", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_nothing_a_server_started_outlives_the_app_killed(tmp_path):
    """The app killed (SIGKILL: no cleanup runs) takes its servers' sandboxes with it:
    bwrap dies with its parent, and everything in the sandbox with bwrap's PID 1."""
    m = marker()
    app = subprocess.Popen(
        [sys.executable, "-c", APP, SYSTEM_PYTHON, BARE, m],
        cwd=ROOT,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(ROOT),
            "DISPATCH_DATA_DIR": str(tmp_path),
        },
        stdout=subprocess.PIPE,
    )
    try:
        assert app.stdout is not None
        assert app.stdout.readline() == b"started\n"
        assert host_processes_with(m)
    finally:
        app.kill()
        app.wait()
    left = gone(m)
    kill_all(left)
    assert left == []


def test_a_private_networks_descriptors_are_closed_once():
    """A descriptor number let go of is reused by the next open (another call's pipe, a
    server's stderr file): closing the network after its bwrap started must not close
    that too. (It did: a server's stderr file, then its stdin, went with it.)"""
    network = sandbox.Network(sandbox.policy_from(settings))
    network.started()
    reused = [os.open(os.devnull, os.O_RDONLY) for _ in network.child_fds()]
    try:
        network.close()
        for fd in reused:
            os.fstat(fd)
    finally:
        for fd in reused:
            os.close(fd)


async def test_a_servers_variables_are_set_inside_the_sandbox_not_for_bwrap():
    """bwrap starts on the host: a server's LD_PRELOAD there would run code before any
    namespace (the secret key read with it). Its variables are bwrap's --setenv, so the
    loader's debug output (LD_DEBUG) comes from the sandboxed server alone."""
    row = await server("loader", env={"LD_DEBUG": "files", "MCP_TEST_TOKEN": "tok"})
    assert (await where("loader"))["token"] == "tok"
    said = bytes(mcp._pool().connections[row.name, None]._stderr).decode()
    assert "python" in said  # applied inside, to the server
    bwrap = shutil.which(sandbox.policy_from(settings).bwrap)
    assert f"needed by {bwrap}" not in said


async def test_a_servers_stderr_costs_at_most_its_kept_end():
    """A server may write without end on stderr: only its last STDERR_TAIL_BYTES are kept
    (in memory, never a file), and its failure still quotes its last words."""
    await server("flood", "flood", str(8 * 1024 * 1024))
    # Imported before counting: the SDK's first import alone allocates megabytes (it
    # happens at a process's first connection, so it counted only where this test came
    # first on its xdist worker).
    mcp._import_sdk()
    tracemalloc.start()
    try:
        _, problems = await mcp.specs()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "its stderr ends: xxx" in problems[0], problems
    assert problems[0].endswith("xxx\nbare: the end)"), problems
    assert peak < 4 * 1024 * 1024  # it was read whole: 8 MB, and as much again decoded
