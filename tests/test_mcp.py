"""The MCP client (chat.tools.mcp) against real servers written with the SDK's server
side: tests/mcp_servers/tools.py over stdio (a subprocess per connection) and over
streamable HTTP (one process for the module, on 127.0.0.1), and tests/mcp_servers/bare.py
(standard library only); test_mcp_confinement.py runs them in the sandbox.

The module shares one event loop, so its connections (and the stdio servers' processes)
are shared by its tests, as a worker's are by its turns.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import urllib.request
from pathlib import Path

import pytest
import pytest_asyncio

from chat import worker
from chat.models import McpServer
from chat.tools import mcp, needs_approval, run_tool, sandbox, shell
from harness.servers import Proc, clean_env

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.django_db(transaction=True)]

SERVERS = Path(__file__).parent / "mcp_servers"
TOOLS = str(SERVERS / "tools.py")
TIMEOUT = 20.0


@pytest.fixture(scope="module")
def web(tmp_path_factory) -> str:
    log = tmp_path_factory.mktemp("mcp") / "web.log"
    proc = Proc("mcp-web", [sys.executable, TOOLS, "http"], clean_env(), log).start()
    yield f"http://127.0.0.1:{proc.listening().port}"
    proc.stop()


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> str:
    log = tmp_path_factory.mktemp("mcp") / "many.log"
    proc = Proc("mcp-many", [sys.executable, TOOLS, "http", "--many"], clean_env(), log).start()
    yield f"http://127.0.0.1:{proc.listening().port}/mcp"
    proc.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module", autouse=True)
async def _closed():
    yield
    await mcp.close_all()


@pytest.fixture(autouse=True)
def _unsandboxed(settings):
    # tools.py needs the project's packages, which the sandbox does not show; the
    # sandbox has tests of its own (test_mcp_confinement.py).
    settings.DISPATCH_SHELL_UNSANDBOXED = True


@pytest.fixture
def servers(web):
    McpServer.objects.create(
        name="local",
        transport="stdio",
        command=sys.executable,
        args=[TOOLS, "stdio"],
        timeout=TIMEOUT,
    )
    McpServer.objects.create(name="web", transport="http", url=f"{web}/mcp", timeout=TIMEOUT)


def deletes(web: str) -> int:
    with urllib.request.urlopen(f"{web}/deletes") as response:
        return int(response.read())


def connection(name: str) -> mcp.Connection | None:
    return mcp._pool().connections.get((name, None))


TRANSPORTS = pytest.mark.parametrize("server", ["local", "web"])


async def test_it_lists_every_enabled_servers_tools(servers):
    await McpServer.objects.acreate(
        name="off", transport="http", url="http://127.0.0.1:9/", enabled=False
    )
    found, problems = await mcp.specs()
    assert problems == []
    names = [spec.name for spec in found]
    assert names == sorted(names)
    assert {"mcp__local__echo", "mcp__web__echo", "mcp__local__add"} <= set(names)
    assert not any(name.startswith("mcp__off__") for name in names)
    echo = next(spec for spec in found if spec.name == "mcp__web__echo")
    assert (echo.server, echo.tool, echo.description) == ("web", "echo", "Say the text back.")
    assert list(echo.input_schema) == sorted(echo.input_schema)
    assert echo.input_schema["properties"]["text"]["type"] == "string"


@TRANSPORTS
async def test_it_calls_a_tool_for_text(servers, server):
    result = await mcp.call(f"mcp__{server}__echo", {"text": "hi"})
    assert (result.result, result.is_error) == ("echo: hi", False)


@TRANSPORTS
async def test_structured_content_is_sorted_key_json(servers, server):
    result = await mcp.call(f"mcp__{server}__add", {"b": 2, "a": 1})
    assert result.result == '{"a": 1, "b": 2, "sum": 3}'


@TRANSPORTS
async def test_an_image_goes_to_the_outcome(servers, server):
    result = await mcp.call(f"mcp__{server}__pixel", {})
    [image] = result.images
    assert image.data.startswith(b"\x89PNG")
    assert (image.path, image.name) == ("", "pixel")
    assert (result.result, result.is_error) == ("(an image)", False)


@TRANSPORTS
async def test_is_error_is_kept(servers, server):
    result = await mcp.call(f"mcp__{server}__fail", {"why": "x"})
    assert result.is_error
    assert "fail" in result.result


@TRANSPORTS
async def test_progress_streams_to_on_output(servers, server):
    seen: list[str] = []
    result = await mcp.call(f"mcp__{server}__slow", {"steps": 3}, on_output=seen.append)
    assert result.result == "slow done"
    assert "".join(seen) == "[1/3] step 1\n[2/3] step 2\n[3/3] step 3\n"


@TRANSPORTS
async def test_a_hung_call_times_out_and_the_next_call_works(servers, server):
    result = await mcp.call(f"mcp__{server}__hang", {}, timeout=1.0)
    assert result.is_error
    assert result.result == f"server {server}: hang did not answer within 1 s"
    again = await mcp.call(f"mcp__{server}__echo", {"text": "again"})
    assert again.result == "echo: again"


async def test_a_server_exiting_mid_call_is_an_error_naming_it(servers):
    result = await mcp.call("mcp__local__crash", {})
    assert result.is_error
    assert result.result.startswith("server local: crash failed: ")
    assert "closed the connection" in result.result
    # What it said last is what a user needs to fix it.
    assert result.result.endswith("; its stderr ends: crash: out of patience")
    again = await mcp.call("mcp__local__echo", {"text": "back"})
    assert again.result == "echo: back"


async def test_a_message_past_the_line_cap_fails_the_call_saying_so(servers, monkeypatch):
    """A stdio server's message is one line, kept whole until it ends: one longer than
    MAX_STDIO_LINE_BYTES fails the call with why (not "the server exited"), and the
    next call starts the server afresh."""
    monkeypatch.setattr(mcp, "MAX_STDIO_LINE_BYTES", 64 * 1024)
    await McpServer.objects.acreate(
        name="capped", transport="stdio", command=sys.executable, args=[TOOLS, "stdio"]
    )
    result = await mcp.call("mcp__capped__huge", {"megabytes": 1})
    assert (result.result, result.is_error) == (
        f"server capped: huge failed: it sent a message of more than {64 * 1024} bytes",
        True,
    )
    assert (await mcp.call("mcp__capped__echo", {"text": "x"})).result == "echo: x"


@TRANSPORTS
async def test_a_10_mb_result_is_capped_like_shell_output(servers, server):
    result = await mcp.call(f"mcp__{server}__huge", {"megabytes": 10})
    assert result.truncated
    assert len(result.result.encode()) < shell.OUTPUT_CAP + 200
    assert result.truncated_bytes > 10 * 1024 * 1024 - shell.OUTPUT_CAP - 100
    assert "bytes of output dropped" in result.result


async def test_500_tools_are_capped_with_a_problem(many):
    await McpServer.objects.acreate(name="many", transport="http", url=many, timeout=TIMEOUT)
    found, problems = await mcp.specs()
    assert len(found) == mcp.MAX_TOOLS_PER_SERVER
    assert problems == [
        f"server many: 509 tools, only the first {mcp.MAX_TOOLS_PER_SERVER} are offered"
    ]


async def test_list_changed_is_picked_up_at_the_next_listing(servers):
    await McpServer.objects.acreate(
        name="growing", transport="stdio", command=sys.executable, args=[TOOLS, "stdio"]
    )
    before, _ = await mcp.specs()
    assert "mcp__growing__extra" not in {spec.name for spec in before}
    assert (await mcp.call("mcp__growing__grow", {})).result == "grown"
    for _ in range(100):
        if connection("growing").tools is None:
            break
        await asyncio.sleep(0.05)
    after, _ = await mcp.specs()
    assert "mcp__growing__extra" in {spec.name for spec in after}
    assert (await mcp.call("mcp__growing__extra", {})).result == "extra"


async def test_idle_connections_close_and_http_sessions_are_terminated(servers, web):
    await mcp.call("mcp__web__echo", {"text": "x"})
    held = connection("web")
    assert held is not None and held.session is not None
    before = deletes(web)
    await mcp.close_idle(held.last_used + mcp.MCP_IDLE_SECONDS - 1)
    assert connection("web") is held
    # Past the limit, not at it: (t + limit) - t is not always `limit` in floating point
    # (CI failed once on exactly that).
    await mcp.close_idle(held.last_used + mcp.MCP_IDLE_SECONDS + 0.5)
    assert connection("web") is None
    assert held.closed
    assert deletes(web) == before + 1


async def test_a_stopping_worker_ends_its_http_sessions(servers, web):
    """run_worker's drain closes the MCP connections, each HTTP session with its DELETE
    (a server otherwise keeps every session a stopped worker opened)."""
    await mcp.call("mcp__web__echo", {"text": "x"})
    held = connection("web")
    before = deletes(web)
    task = asyncio.create_task(worker.run_worker())
    await asyncio.sleep(0.2)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert held.closed and connection("web") is None
    assert deletes(web) == before + 1


async def test_an_edited_server_gets_a_new_connection(servers):
    await mcp.call("mcp__web__echo", {"text": "x"})
    old = connection("web")
    await McpServer.objects.filter(name="web").aupdate(timeout=TIMEOUT + 1)
    await mcp.call("mcp__web__echo", {"text": "x"})
    assert connection("web") is not old
    assert old.closed


async def test_stop_cancels_a_call_and_the_connection_stays_usable(servers):
    await mcp.call("mcp__local__echo", {"text": "warm"})
    held = connection("local")
    task = asyncio.create_task(mcp.call("mcp__local__hang", {}))
    for _ in range(200):
        if held.busy:
            break
        await asyncio.sleep(0.02)
    assert held.busy == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert held.busy == 0
    assert (await mcp.call("mcp__local__echo", {"text": "after"})).result == "echo: after"
    assert connection("local") is held


async def test_a_server_that_does_not_start_is_a_problem_and_its_calls_errors():
    await McpServer.objects.acreate(name="nothing", transport="stdio", command="/nonexistent/mcp")
    await McpServer.objects.acreate(
        name="quits",
        transport="stdio",
        command=sys.executable,
        args=[str(SERVERS / "bare.py"), "exit"],
        timeout=10,
    )
    found, problems = await mcp.specs()
    assert found == []
    assert problems[0].startswith("server nothing: not reachable (")
    assert "No such file" in problems[0]
    assert problems[1].startswith("server quits: not reachable (")
    assert "bare: cannot start, no configuration" in problems[1]
    result = await mcp.call("mcp__nothing__echo", {})
    assert result.is_error
    assert result.result.startswith(
        "mcp__nothing__echo cannot be called now: server nothing: not reachable ("
    )


async def test_garbage_on_stdout_is_a_problem_saying_so():
    await McpServer.objects.acreate(
        name="garbage",
        transport="stdio",
        command=sys.executable,
        args=[str(SERVERS / "bare.py"), "garbage"],
        timeout=2,
    )
    found, problems = await mcp.specs()
    assert found == []
    assert problems[0].startswith("server garbage: not reachable (no answer within 2 s; ")
    assert "not MCP" in problems[0]


async def test_a_tool_whose_schema_no_provider_takes_is_left_out_with_a_problem():
    """The SDK checks a listing as a whole: one bad tool would refuse all the server's
    tools. Only the bad ones are left out, each named with the reason."""
    await McpServer.objects.acreate(
        name="odd",
        transport="stdio",
        command=sys.executable,
        args=[str(SERVERS / "bare.py"), "broken"],
    )
    found, problems = await mcp.specs()
    assert [spec.name for spec in found] == ["mcp__odd__fine", "mcp__odd__where"]
    assert problems == [
        "server odd: tool 'broken' is left out: it is not valid MCP "
        "(inputSchema.properties.x.dict[str,any]: Input should be a valid dictionary; "
        "inputSchema.properties.x.bool: Input should be a valid boolean, unable to interpret "
        "input)",
        "server odd: tool 'typo' is left out: its input schema is not valid JSON Schema "
        "(at properties/x/type: 'strng' is not valid under any of the given schemas)",
    ]
    assert (await mcp.call("mcp__odd__fine", {})).is_error is False


async def test_a_tool_that_is_not_plain_json_is_left_out_with_a_problem():
    """NaN in a schema or a NUL in a description would make saving the tab's frozen
    tool list fail in every turn (SQLite's JSON check, PostgreSQL's json): such a tool is
    left out, the server's others are offered."""
    await McpServer.objects.acreate(
        name="odd",
        transport="stdio",
        command=sys.executable,
        args=[str(SERVERS / "bare.py"), "unstorable"],
    )
    found, problems = await mcp.specs()
    assert [spec.name for spec in found] == ["mcp__odd__where"]
    assert problems == [
        "server odd: tool 'nan' is left out: its schema is not plain JSON "
        "(Out of range float values are not JSON compliant: nan)",
        "server odd: tool 'nul' is left out: its name, description or schema holds a NUL character",
    ]


async def test_a_tool_whose_schema_providers_refuse_at_its_top_or_too_big_is_left_out():
    """Anthropic and OpenAI refuse a tool whose input schema has oneOf, anyOf, allOf, not
    or enum at its top, so every request of every tab offering it would fail; a huge
    schema goes with every request. Each is left out, named with its server and why."""
    await McpServer.objects.acreate(
        name="odd",
        transport="stdio",
        command=sys.executable,
        args=[str(SERVERS / "bare.py"), "shapes"],
    )
    found, problems = await mcp.specs()
    assert [spec.name for spec in found] == ["mcp__odd__where"]
    top = [
        f"server odd: tool {key.lower()!r} is left out: its input schema has {key} at its "
        "top, which providers refuse"
        for key in ["oneOf", "anyOf", "allOf", "not", "enum"]
    ]
    huge = {"type": "object", "properties": {"x": {"type": "string", "description": "x" * 20000}}}
    size = len(json.dumps(huge, sort_keys=True))
    assert problems == [
        *top,
        f"server odd: tool 'huge' is left out: its input schema takes {size} bytes, more than "
        f"{mcp.MAX_SCHEMA_BYTES}",
    ]


async def test_a_servers_tools_past_its_total_size_are_left_out_with_a_problem():
    """Ten tools of 10 KB each are fine one by one: together they pass what one server's
    definitions may take, and the ones past it are left out, named."""
    await McpServer.objects.acreate(
        name="bulky",
        transport="stdio",
        command=sys.executable,
        args=[str(SERVERS / "bare.py"), "bulky"],
    )
    found, problems = await mcp.specs()
    kept = ["where", *(f"bulky{n}" for n in range(6))]
    assert sorted(spec.tool for spec in found) == sorted(kept)
    assert sum(len(json.dumps(spec.input_schema)) for spec in found) <= mcp.MAX_SERVER_TOOLS_BYTES
    assert problems == [
        "server bulky: 4 tools are left out ('bulky6', 'bulky7', 'bulky8', 'bulky9'): its "
        f"tools' definitions may take {mcp.MAX_SERVER_TOOLS_BYTES} bytes in all, and go with "
        "every request"
    ]


async def test_problems_and_errors_never_show_the_servers_secrets():
    """A problem goes into every tab that has the server's tools: a server quoting its
    token on stderr, or a URL carrying one, shows users no secret."""
    leaky = McpServer(name="leaky", transport="stdio", command=sys.executable)
    leaky.args = [str(SERVERS / "bare.py"), "leak"]
    leaky.set_env({"MCP_TEST_TOKEN": "sekrit-123"})
    await leaky.asave()
    await McpServer.objects.acreate(
        name="down", transport="http", url="http://u:pw-9876@127.0.0.1:9/mcp?token=tok-4567"
    )
    found, problems = await mcp.specs()
    text = " ".join(problems)
    assert "leaky" in text and "down" in text and mcp.REDACTED in text
    for secret in ("sekrit-123", "tok-4567", "pw-9876"):
        assert secret not in text
    called = await mcp.call("mcp__down__x", {})
    assert called.is_error and "tok-4567" not in called.result


async def test_a_secret_that_the_cut_of_stderr_goes_through_is_not_shown_in_part():
    """The end of a server's stderr is quoted when it fails: redacted before it is cut,
    or a token the cut went through would no longer be found, and show its end."""
    leaky = McpServer(name="leaky", transport="stdio", command=sys.executable)
    leaky.args = [str(SERVERS / "bare.py"), "leak-long", str(mcp.DETAIL_CHARS)]
    leaky.set_env({"MCP_TEST_TOKEN": "sekrit-123456"})
    await leaky.asave()
    _, problems = await mcp.specs()
    said = f"bare: token {mcp.REDACTED}{'.' * (mcp.DETAIL_CHARS - 5)}"[-mcp.DETAIL_CHARS :]
    assert problems == [
        "server leaky: not reachable (the server closed the connection (it may have exited); "
        f"its stderr ends: {said})"
    ]


async def test_a_servers_url_is_shown_without_its_password_or_query_values():
    shown = mcp.shown_url("https://me:pw-9876@mcp.example:8443/mcp?token=tok-4567&v=2#part")
    assert shown == "https://me:•••@mcp.example:8443/mcp?token=•••&v=•••#•••"
    assert mcp.shown_url("https://mcp.example/mcp") == "https://mcp.example/mcp"
    assert mcp.shown_url("http://me@mcp.example/mcp?sekrit") == "http://me@mcp.example/mcp?•••"


async def test_a_server_that_failed_at_a_turn_start_is_not_asked_again_for_a_while(
    tmp_path, monkeypatch
):
    """A turn's start asks a server that failed once again only after FAILED_SECONDS
    (every turn of every tab would wait for it otherwise), or at once when it is edited;
    its last known tools are kept meanwhile."""
    starts = tmp_path / "starts"
    failing = McpServer(name="failing", transport="stdio", command=sys.executable)
    failing.args = [str(SERVERS / "bare.py"), "exit"]
    failing.set_env({"MCP_TEST_STARTS": str(starts)})
    await failing.asave()
    known = [mcp.McpToolSpec("mcp__failing__x", "", {"type": "object"}, "failing", "x")]
    first = await mcp.refresh(known, turn=True)
    again = await mcp.refresh(known, turn=True)
    assert starts.read_text() == "started\n"
    assert first == again
    assert [spec.name for spec in again.specs] == ["mcp__failing__x"]
    assert again.failed["failing"].startswith("server failing: not reachable (")
    assert again.failed["failing"].endswith(
        "; kept its last known tools, calls to them fail until it answers"
    )
    # Edited: asked at once.
    failing.timeout = 7
    await failing.asave()
    await mcp.refresh(known, turn=True)
    assert starts.read_text() == "started\n" * 2
    # The while over: asked again.
    monkeypatch.setattr(mcp, "FAILED_SECONDS", 0.0)
    await mcp.refresh(known, turn=True)
    await mcp.refresh(known, turn=True)
    assert starts.read_text() == "started\n" * 4


async def test_a_server_slow_at_a_turn_start_is_left_for_the_turn_and_listed_for_the_next(
    monkeypatch,
):
    """A server that does not list its tools within TURN_LIST_SECONDS is given up for the
    turn; its listing goes on, and once it answers the next turn takes its tools."""
    monkeypatch.setattr(mcp, "TURN_LIST_SECONDS", 0.0)
    await McpServer.objects.acreate(
        name="slow", transport="stdio", command=sys.executable, args=[TOOLS, "stdio"]
    )
    first = await mcp.refresh(turn=True)
    assert (first.specs, first.failed) == (
        [],
        {"slow": "server slow: did not list its tools within 0 s"},
    )
    # Still listing: the next turn waits for that listing rather than start another.
    listing = mcp._pool().listings[("slow", None)]
    await listing
    assert ("slow", None) not in mcp._pool().failed
    second = await mcp.refresh(turn=True)
    assert "mcp__slow__echo" in [spec.name for spec in second.specs]
    assert second.failed == {}


async def test_a_server_that_is_down_is_a_problem_naming_it():
    await McpServer.objects.acreate(name="down", transport="http", url="http://127.0.0.1:9/mcp")
    found, problems = await mcp.specs()
    assert found == []
    assert problems[0].startswith("server down: not reachable (")


async def test_run_tool_routes_mcp_names_and_asks_approval(servers, tmp_path):
    assert needs_approval("mcp__web__echo")
    result = await run_tool("mcp__web__echo", {"text": "routed"}, tmp_path)
    assert result.result == "echo: routed"
    bad = await run_tool("mcp__web__echo", ["not", "an", "object"], tmp_path)
    assert bad.is_error


async def test_undecryptable_secrets_are_a_problem():
    await McpServer.objects.acreate(
        name="stale", transport="http", url="http://127.0.0.1:9/mcp", env_encrypted="garbage"
    )
    _, problems = await mcp.specs()
    assert problems == [
        "server stale: not reachable (its env or headers cannot be decrypted "
        "(SECRET_KEY changed): save them again)"
    ]


# --- The sandbox (tests/test_mcp_confinement.py: what a server sees in it) -----------------


@pytest.fixture
def sandboxed(settings):
    settings.DISPATCH_SHELL_UNSANDBOXED = False


async def test_without_bubblewrap_stdio_servers_are_refused(sandboxed, monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "no-such-bwrap")
    await McpServer.objects.acreate(name="unboxed", transport="stdio", command="/bin/true")
    _, problems = await mcp.specs()
    assert problems[0].startswith(
        "server unboxed: not reachable (not started, since stdio servers run in the shell's "
        "sandbox: The shell tool is unavailable: bubblewrap ('no-such-bwrap') is not installed."
    )


@pytest.fixture(scope="module")
def hanging(tmp_path_factory) -> str:
    log = tmp_path_factory.mktemp("mcp") / "hanging.log"
    argv = [sys.executable, TOOLS, "http", "--hang"]
    proc = Proc("mcp-hanging", argv, clean_env(), log).start()
    yield f"http://127.0.0.1:{proc.listening().port}/mcp"
    proc.kill()  # its requests never end: a polite stop waits for them


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_stop_while_a_server_hangs_in_its_handshake_ends_the_call_and_the_pool_works(
    servers, hanging, transport, caplog
):
    """Stop (the turn's task cancelled) while connecting to a server that never answers
    `initialize` ends the call at once, not at the server's timeout, and leaves nothing
    behind: no connection, no lock held, other servers' calls work."""
    fields = {"url": hanging} if transport == "http" else {"command": sys.executable}
    if transport == "stdio":
        fields["args"] = [str(SERVERS / "bare.py"), "silent"]
    await McpServer.objects.acreate(name="stuck", transport=transport, timeout=3600, **fields)
    # Its tool's name is known from an earlier listing (the tab's frozen list).
    task = asyncio.create_task(mcp.call("mcp__stuck__where", {}))
    for _ in range(500):
        if mcp._pool().lock(("stuck", None)).locked():
            break
        await asyncio.sleep(0.01)
    assert mcp._pool().lock(("stuck", None)).locked()
    await asyncio.sleep(0.3)
    task.cancel()
    # Far below the server's timeout: a Stop that waited for it would fail here.
    done, _ = await asyncio.wait({task}, timeout=30)
    assert done and task.cancelled()
    gc.collect()
    assert not [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not mcp._pool().lock(("stuck", None)).locked()
    assert connection("stuck") is None
    assert (await mcp.call("mcp__web__echo", {"text": "after"})).result == "echo: after"


async def test_servers_whose_joined_names_meet_get_apart_names_and_each_its_own_calls():
    """`a` + `b__c` and `a__b` + `c` both join to mcp__a__b__c (a name saved before such
    names were refused): each gets a name of its own and a call reaches its server."""
    for server, tool in (("a", "b__c"), ("a__b", "c")):
        await McpServer.objects.acreate(
            name=server,
            transport="stdio",
            command=sys.executable,
            args=[TOOLS, "stdio", f"--tool={tool}=from {server}"],
            timeout=TIMEOUT,
        )
    found, problems = await mcp.specs()
    assert problems == []
    mine = {
        (s.server, s.tool): s.name
        for s in found
        if (s.server, s.tool) in {("a", "b__c"), ("a__b", "c")}
    }
    assert len(set(mine.values())) == 2
    assert all(name.startswith("mcp__a__b__c_") for name in mine.values())
    assert (await mcp.call(mine[("a", "b__c")], {})).result == "from a"
    assert (await mcp.call(mine[("a__b", "c")], {})).result == "from a__b"
