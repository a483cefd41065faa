"""The agent's tools: confinement, file tools, the shell's bounds, argument checking."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from chat.providers.base import ToolSpec
from chat.tools import TOOLS, ToolOutcome, needs_approval, run_tool, tool_specs
from chat.tools.files import MAX_LIST_ENTRIES, READ_DEFAULT_LINES, READ_MAX_BYTES
from chat.tools.registry import SUPPORTED_KEYWORDS, check_arguments
from chat.tools.sandbox import Policy
from chat.tools.shell import OUTPUT_CAP, OUTPUT_HEAD, OUTPUT_TAIL

# Every shell call in these tests gets this bound, so a broken kill or a lost
# end of file fails the test instead of hanging it.
TEST_TIMEOUT = 20.0

# How long a test waits for an event the tool should cause almost at once.
EVENT_WAIT = 10.0

# The operator's opt-out: commands are plain children of this process, so the
# process-group tests below can see their pids. The sandbox's own kill is
# tested in tests/test_sandbox.py.
UNSANDBOXED = Policy(unsandboxed=True)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "secret.txt").write_text("top secret\n")
    return directory


async def sh(command: str, ws: Path, **kwargs) -> ToolOutcome:
    kwargs.setdefault("timeout", TEST_TIMEOUT)
    return await run_tool("shell", {"command": command}, ws, **kwargs)


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def number(label: str, text: str) -> int:
    match = re.search(rf"{label}=(\d+)\n", text)
    assert match, f"no {label}= in {text!r}"
    return int(match[1])


# --- the registry --------------------------------------------------------------


def test_it_keeps_the_tools_in_a_fixed_order():
    """The tool order is part of the cached prompt prefix."""
    names = ["list_files", "read_file", "write_file", "shell", "agent", "schedule_wake"]
    assert [tool.name for tool in TOOLS] == names
    assert [spec.name for spec in tool_specs()] == names


def test_it_asks_approval_for_writes_and_the_shell_only():
    """write_file and shell wait for the user; reading does not; unknown names run nothing."""
    assert not needs_approval("list_files")
    assert not needs_approval("read_file")
    assert needs_approval("write_file")
    assert needs_approval("shell")
    assert not needs_approval("rm_rf")


def test_it_exports_specs_as_stable_copies():
    """tool_specs() gives ToolSpecs whose JSON is identical on every call, even after a
    caller mutates the copy it got."""
    first = tool_specs()
    assert all(isinstance(spec, ToolSpec) for spec in first)
    before = json.dumps([[s.name, s.description, s.input_schema] for s in first], sort_keys=True)
    first[-1].input_schema["cache_control"] = {"type": "ephemeral"}
    first[1].input_schema["properties"]["path"]["type"] = "integer"
    again = tool_specs()
    after = json.dumps([[s.name, s.description, s.input_schema] for s in again], sort_keys=True)
    assert after == before


def test_it_only_uses_schema_keywords_the_checker_understands():
    """A keyword the hand-written checker ignores would be a silent hole in validation."""

    def keywords(schema: dict) -> set[str]:
        found = set(schema)
        for rule in schema.get("properties", {}).values():
            found |= keywords(rule)
        return found

    for tool in TOOLS:
        assert keywords(dict(tool.input_schema)) <= SUPPORTED_KEYWORDS, tool.name
        assert set(tool.input_schema.get("required", ())) <= set(tool.input_schema["properties"])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (59, "argument 'every' must be at least 60, got 59"),
        (60, None),
        (3600, None),
        (3601, "argument 'every' must be at most 3600, got 3601"),
    ],
)
def test_numbers_are_checked_against_their_bounds(value, problem):
    """schedule_wake's interval has both bounds; a model's 10**14 must be refused here."""
    schema = {
        "type": "object",
        "properties": {"every": {"type": "integer", "minimum": 60, "maximum": 3600}},
    }
    assert check_arguments(schema, {"every": value}) == problem


# --- invalid calls ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("rm", {}, "unknown tool 'rm'; the tools are: list_files, read_file, write_file, shell"),
        ("read_file", ["a.txt"], "the arguments must be a JSON object, not array"),
        ("read_file", "a.txt", "the arguments must be a JSON object, not string"),
        ("read_file", {}, "missing required argument 'path'"),
        ("read_file", {"path": None}, "missing required argument 'path'"),
        ("write_file", {"path": "a"}, "missing required argument 'content'"),
        ("write_file", {}, "missing required argument 'path', 'content'"),
        ("read_file", {"path": 3}, "argument 'path' must be a string, not integer"),
        ("read_file", {"path": "a", "offset": "3"}, "argument 'offset' must be an integer, not"),
        ("read_file", {"path": "a", "offset": True}, "'offset' must be an integer, not boolean"),
        ("read_file", {"path": "a", "limit": 2.5}, "'limit' must be an integer, not number"),
        ("read_file", {"path": "a", "offset": 0}, "argument 'offset' must be at least 1, got 0"),
        ("read_file", {"path": "a", "limit": -1}, "argument 'limit' must be at least 1, got -1"),
        ("write_file", {"path": "a", "content": ["x"]}, "'content' must be a string, not array"),
        ("shell", {"command": ""}, "argument 'command' must not be empty"),
        ("shell", {"command": {"a": 1}}, "argument 'command' must be a string, not object"),
        ("shell", {"command": "ls", "cwd": "/"}, "unknown argument 'cwd' (expected: command)"),
        ("list_files", {"recursive": True}, "unknown argument 'recursive' (expected: path)"),
    ],
)
async def test_it_answers_invalid_calls_with_a_clear_error(ws, name, arguments, message):
    """Unknown tools and arguments that do not fit the schema give an error outcome,
    never an exception, and nothing runs."""
    outcome = await run_tool(name, arguments, ws)
    assert outcome.is_error
    assert message in outcome.result
    assert list(ws.iterdir()) == []


async def test_it_treats_null_optional_arguments_as_absent(ws):
    """Models that send null for an unset optional argument get the default."""
    (ws / "a.txt").write_text("one\ntwo\n")
    outcome = await run_tool("read_file", {"path": "a.txt", "offset": None, "limit": None}, ws)
    assert outcome == ToolOutcome("one\ntwo\n", is_error=False)


async def test_it_rejects_a_non_positive_timeout(ws):
    """A zero or negative timeout is the caller's bug, not the model's."""
    with pytest.raises(ValueError, match="timeout must be positive"):
        await sh("true", ws, timeout=0)


# --- the workspace -------------------------------------------------------------


async def test_it_creates_the_workspace_if_missing(tmp_path):
    """The first call in a fresh install creates the workspace directory."""
    workspace = tmp_path / "new" / "ws"
    outcome = await run_tool("list_files", {}, workspace)
    assert outcome == ToolOutcome("(empty directory)", is_error=False)
    assert workspace.is_dir()


async def test_it_reports_a_workspace_that_cannot_exist(tmp_path):
    """A workspace path taken by a file gives an error outcome."""
    (tmp_path / "file").write_text("")
    outcome = await run_tool("list_files", {}, tmp_path / "file")
    assert outcome.is_error
    assert "the workspace cannot be created" in outcome.result


# --- confinement ---------------------------------------------------------------

ESCAPES = [
    ("read_file", {"path": "../outside/secret.txt"}, "'..' is not allowed"),
    ("read_file", {"path": "sub/../../outside/secret.txt"}, "'..' is not allowed"),
    ("read_file", {"path": "sub/.."}, "'..' is not allowed"),
    ("list_files", {"path": ".."}, "'..' is not allowed"),
    ("write_file", {"path": "../outside/new.txt", "content": "x"}, "'..' is not allowed"),
    ("read_file", {"path": "/etc/passwd"}, "absolute paths are not allowed"),
    ("list_files", {"path": "/"}, "absolute paths are not allowed"),
    ("write_file", {"path": "/tmp/dispatch-new.txt", "content": "x"}, "absolute paths"),
    ("read_file", {"path": "a\x00b"}, "NUL character"),
    ("read_file", {"path": ""}, "the path is empty"),
]


@pytest.mark.parametrize(("name", "arguments", "message"), ESCAPES)
async def test_it_refuses_dotdot_and_absolute_paths(ws, outside, name, arguments, message):
    """`..` anywhere, absolute paths, NUL and empty paths are refused before any access."""
    (ws / "sub").mkdir()
    outcome = await run_tool(name, arguments, ws)
    assert outcome.is_error
    assert message in outcome.result
    assert not (outside / "new.txt").exists()
    assert not Path("/tmp/dispatch-new.txt").exists()


async def test_it_refuses_a_symlink_to_a_file_outside(ws, outside):
    """A symlink in the workspace pointing at a file outside can be neither read nor
    written through."""
    (ws / "link").symlink_to(outside / "secret.txt")
    read = await run_tool("read_file", {"path": "link"}, ws)
    write = await run_tool("write_file", {"path": "link", "content": "pwned"}, ws)
    for outcome in (read, write):
        assert outcome.is_error
        assert "link: resolves outside the workspace through a symlink" in outcome.result
        assert "top secret" not in outcome.result
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_it_refuses_a_symlinked_directory_outside(ws, outside):
    """A symlink to a directory outside cannot be listed."""
    (ws / "out").symlink_to(outside)
    outcome = await run_tool("list_files", {"path": "out"}, ws)
    assert outcome.is_error
    assert "resolves outside the workspace" in outcome.result
    assert "secret.txt" not in outcome.result


async def test_it_refuses_paths_through_a_symlinked_directory(ws, outside):
    """A path whose middle component is a symlink out is refused for every tool."""
    (ws / "out").symlink_to(outside)
    (outside / "sub").mkdir()
    calls = [
        ("read_file", {"path": "out/secret.txt"}),
        ("write_file", {"path": "out/new.txt", "content": "x"}),
        ("write_file", {"path": "out/deeper/new.txt", "content": "x"}),
        ("list_files", {"path": "out/sub"}),
    ]
    for name, arguments in calls:
        outcome = await run_tool(name, arguments, ws)
        assert outcome.is_error, name
        assert "resolves outside the workspace" in outcome.result
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt", "sub"]


async def test_it_refuses_a_dangling_symlink_outside(ws, outside):
    """Writing through a symlink to a file outside that does not exist yet creates nothing."""
    (ws / "dangling").symlink_to(outside / "missing.txt")
    outcome = await run_tool("write_file", {"path": "dangling", "content": "x"}, ws)
    assert outcome.is_error
    assert "resolves outside the workspace" in outcome.result
    assert not (outside / "missing.txt").exists()


async def test_it_refuses_a_chain_of_symlinks_that_ends_outside(ws, outside):
    """A symlink to a symlink inside that points out is still out."""
    (ws / "b").symlink_to(outside)
    (ws / "a").symlink_to("b")
    outcome = await run_tool("read_file", {"path": "a/secret.txt"}, ws)
    assert outcome.is_error
    assert "resolves outside the workspace" in outcome.result


async def test_it_follows_symlinks_that_stay_inside(ws):
    """Symlinks within the workspace work like the files they point at."""
    (ws / "real").mkdir()
    (ws / "real" / "a.txt").write_text("inside\n")
    (ws / "alias").symlink_to("real")
    read = await run_tool("read_file", {"path": "alias/a.txt"}, ws)
    assert read == ToolOutcome("inside\n", is_error=False)
    write = await run_tool("write_file", {"path": "alias/b.txt", "content": "new"}, ws)
    assert not write.is_error
    assert (ws / "real" / "b.txt").read_text() == "new"


async def test_it_works_in_a_workspace_reached_through_a_symlink(tmp_path):
    """The workspace path itself may be a symlink (like /tmp on macOS)."""
    real = tmp_path / "real-ws"
    real.mkdir()
    (tmp_path / "ws-link").symlink_to(real)
    outcome = await run_tool("write_file", {"path": "a.txt", "content": "ok"}, tmp_path / "ws-link")
    assert not outcome.is_error
    assert (real / "a.txt").read_text() == "ok"


# --- list_files ----------------------------------------------------------------


async def test_it_lists_entries_with_type_and_size(ws):
    """Each entry shows its type, its size for files, and its name; sorted by name."""
    (ws / "b.txt").write_text("12345")
    (ws / "a-dir").mkdir()
    (ws / "a-dir" / "nested.txt").write_text("not listed")
    (ws / "c-link").symlink_to("b.txt")
    os.mkfifo(ws / "d-fifo")
    outcome = await run_tool("list_files", {"path": "."}, ws)
    assert outcome == ToolOutcome(
        "dir            -  a-dir/\n"
        "file           5  b.txt\n"
        "link           -  c-link\n"
        "other          -  d-fifo",
        is_error=False,
    )
    assert await run_tool("list_files", {}, ws) == outcome


async def test_it_lists_a_subdirectory(ws):
    """A relative directory path lists that directory."""
    (ws / "sub").mkdir()
    (ws / "sub" / "x.py").write_text("")
    outcome = await run_tool("list_files", {"path": "sub"}, ws)
    assert outcome == ToolOutcome("file           0  x.py", is_error=False)


async def test_it_bounds_the_listing(ws):
    """A directory with more than MAX_LIST_ENTRIES entries lists the first ones by name
    and says how many there were."""
    total = MAX_LIST_ENTRIES + 5
    for i in range(total):
        (ws / f"f{i:04d}").write_text("")
    outcome = await run_tool("list_files", {}, ws)
    lines = outcome.result.split("\n")
    assert outcome.truncated
    assert not outcome.is_error
    assert len(lines) == MAX_LIST_ENTRIES + 1
    assert lines[0].endswith("f0000")
    assert lines[-2].endswith(f"f{MAX_LIST_ENTRIES - 1:04d}")
    assert lines[-1] == (
        f"[truncated: showed the first {MAX_LIST_ENTRIES} of {total} entries by name; "
        "list a subdirectory or search with the shell tool]"
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [("missing", "missing: no such directory"), ("f.txt", "f.txt: not a directory")],
)
async def test_it_reports_listing_what_is_not_a_directory(ws, path, message):
    """Listing a missing path or a file says so."""
    (ws / "f.txt").write_text("")
    outcome = await run_tool("list_files", {"path": path}, ws)
    assert outcome.is_error
    assert message in outcome.result


# --- read_file -----------------------------------------------------------------


def numbered(count: int, start: int = 1) -> str:
    return "".join(f"line {i}\n" for i in range(start, start + count))


async def test_it_reads_a_whole_file(ws):
    """A small file comes back byte for byte, with no note."""
    (ws / "a.py").write_text("print('hi')\n\n# end")
    outcome = await run_tool("read_file", {"path": "a.py"}, ws)
    assert outcome == ToolOutcome("print('hi')\n\n# end", is_error=False)


async def test_it_reads_a_slice_by_line_offset_and_limit(ws):
    """offset is the first line (1-based), limit the line count; the note says where to
    continue."""
    (ws / "a.txt").write_text(numbered(10))
    outcome = await run_tool("read_file", {"path": "a.txt", "offset": 3, "limit": 2}, ws)
    assert outcome == ToolOutcome(
        "line 3\nline 4\n[truncated: showed lines 3-4; continue with offset=5]",
        is_error=False,
        truncated=True,
    )
    tail = await run_tool("read_file", {"path": "a.txt", "offset": 9, "limit": 5}, ws)
    assert tail == ToolOutcome("line 9\nline 10\n", is_error=False)


async def test_it_reads_the_default_number_of_lines(ws):
    """Without a limit, READ_DEFAULT_LINES lines are read."""
    (ws / "long.txt").write_text(numbered(READ_DEFAULT_LINES + 10))
    outcome = await run_tool("read_file", {"path": "long.txt"}, ws)
    assert outcome.truncated
    assert outcome.result == numbered(READ_DEFAULT_LINES) + (
        f"[truncated: showed lines 1-{READ_DEFAULT_LINES}; "
        f"continue with offset={READ_DEFAULT_LINES + 1}]"
    )


async def test_it_caps_the_bytes_read_and_says_where_to_continue(ws):
    """Past READ_MAX_BYTES the read stops, noting the cut line, and continuing from the
    offset given reads on from there."""
    line = "x" * 999 + "\n"
    count = READ_MAX_BYTES // len(line) + 10
    (ws / "wide.txt").write_text(line * count)
    outcome = await run_tool("read_file", {"path": "wide.txt", "limit": 100_000}, ws)
    full = READ_MAX_BYTES // len(line)
    assert outcome.truncated
    note = outcome.result.rsplit("\n", 1)[1]
    assert note == (
        f"[truncated at {READ_MAX_BYTES // 1024} KiB: showed lines 1-{full} "
        f"and part of line {full + 1}; continue with offset={full + 1}]"
    )
    body = outcome.result.rsplit("\n", 1)[0]
    assert len(body.encode()) == READ_MAX_BYTES
    rest = await run_tool("read_file", {"path": "wide.txt", "offset": full + 1}, ws)
    assert rest == ToolOutcome(line * (count - full), is_error=False)


async def test_it_caps_a_single_enormous_line(ws):
    """One line longer than the cap is cut, and the note points to the shell."""
    (ws / "min.js").write_text("a" * (READ_MAX_BYTES * 2))
    outcome = await run_tool("read_file", {"path": "min.js"}, ws)
    assert outcome.truncated
    assert outcome.result == "a" * READ_MAX_BYTES + (
        f"\n[truncated: line 1 alone is longer than {READ_MAX_BYTES // 1024} KiB; "
        "read it in pieces with the shell tool (e.g. head -c, cut -c)]"
    )


async def test_it_skips_enormous_lines_before_the_offset(ws):
    """Lines before the offset are skipped whatever their length."""
    (ws / "a.txt").write_text("a" * (READ_MAX_BYTES * 3) + "\nsecond\n")
    outcome = await run_tool("read_file", {"path": "a.txt", "offset": 2}, ws)
    assert outcome == ToolOutcome("second\n", is_error=False)


async def test_it_decodes_invalid_utf8_with_replacement_characters(ws):
    """Text that is not valid UTF-8 is still readable."""
    (ws / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    outcome = await run_tool("read_file", {"path": "latin1.txt"}, ws)
    assert outcome == ToolOutcome("caf\ufffd\n", is_error=False)


@pytest.mark.parametrize(
    ("setup", "arguments", "message"),
    [
        (None, {"path": "missing.txt"}, "missing.txt: no such file"),
        ("dir", {"path": "d"}, "d: is a directory; use list_files"),
        ("binary", {"path": "b.bin"}, "b.bin: looks like a binary file (6 bytes)"),
        ("fifo", {"path": "pipe"}, "pipe: not a regular file"),
        ("text", {"path": "t.txt", "offset": 4}, "offset 4 is past the end of the file (2 lines)"),
    ],
)
async def test_it_reports_files_it_cannot_read(ws, setup, arguments, message):
    """Missing files, directories, binaries, FIFOs (which would block) and offsets past
    the end give clear errors."""
    if setup == "dir":
        (ws / "d").mkdir()
    elif setup == "binary":
        (ws / "b.bin").write_bytes(b"\x7fELF\x00\x01")
    elif setup == "fifo":
        os.mkfifo(ws / "pipe")
    elif setup == "text":
        (ws / "t.txt").write_text("one\ntwo")
    outcome = await run_tool("read_file", arguments, ws)
    assert outcome.is_error
    assert message in outcome.result


async def test_it_reads_an_empty_file(ws):
    """An empty file says it is empty rather than returning nothing."""
    (ws / "empty").write_text("")
    outcome = await run_tool("read_file", {"path": "empty"}, ws)
    assert outcome == ToolOutcome("(empty file)", is_error=False)


# --- write_file ----------------------------------------------------------------


async def test_it_writes_a_file_creating_its_parents(ws):
    """Missing parent directories are created inside the workspace."""
    outcome = await run_tool("write_file", {"path": "a/b/c.txt", "content": "héllo\n"}, ws)
    assert outcome == ToolOutcome("Created a/b/c.txt (7 bytes)", is_error=False)
    assert (ws / "a" / "b" / "c.txt").read_bytes() == "héllo\n".encode()


async def test_it_overwrites_a_file(ws):
    """Writing an existing file replaces its whole content."""
    (ws / "a.txt").write_text("old content that is longer")
    outcome = await run_tool("write_file", {"path": "a.txt", "content": "new"}, ws)
    assert outcome == ToolOutcome("Overwrote a.txt (3 bytes)", is_error=False)
    assert (ws / "a.txt").read_text() == "new"


async def test_it_writes_an_empty_file(ws):
    """Empty content creates an empty file."""
    outcome = await run_tool("write_file", {"path": "empty", "content": ""}, ws)
    assert outcome == ToolOutcome("Created empty (0 bytes)", is_error=False)
    assert (ws / "empty").read_bytes() == b""


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"path": "d", "content": "x"}, "d: is a directory"),
        ({"path": ".", "content": "x"}, ".: is a directory"),
        ({"path": "f.txt/inner.txt", "content": "x"}, "f.txt/inner.txt: cannot create its parent"),
        ({"path": "pipe", "content": "x"}, "pipe: not a regular file"),
        ({"path": "s.txt", "content": "bad \ud800 surrogate"}, "content is not valid Unicode"),
    ],
)
async def test_it_reports_files_it_cannot_write(ws, arguments, message):
    """Directories, a file in the way of a parent, FIFOs and unencodable text give clear
    errors and change nothing."""
    (ws / "d").mkdir()
    (ws / "f.txt").write_text("keep")
    os.mkfifo(ws / "pipe")
    outcome = await run_tool("write_file", arguments, ws)
    assert outcome.is_error
    assert message in outcome.result
    assert (ws / "f.txt").read_text() == "keep"
    assert not (ws / "s.txt").exists()


# --- shell: results --------------------------------------------------------------


async def test_it_runs_a_command_and_reports_its_exit_code(ws):
    """The result is the output then the exit code; shell_output is the output alone."""
    outcome = await sh("echo hello", ws)
    assert outcome == ToolOutcome(
        "hello\n[exit code 0]", is_error=False, truncated=False, shell_output="hello\n"
    )


async def test_it_marks_a_failing_command_as_an_error(ws):
    """A non-zero exit is an error result carrying the code."""
    outcome = await sh("printf oops; exit 3", ws)
    assert outcome == ToolOutcome("oops\n[exit code 3]", is_error=True, shell_output="oops")


@pytest.mark.parametrize(
    ("policy", "status"),
    [
        # bwrap passes a signal death on as 128 + N, as shells do.
        (Policy(), "[exit code 137 (128 + SIGKILL)]"),
        (UNSANDBOXED, "[killed by signal SIGKILL]"),
    ],
)
async def test_it_reports_a_command_killed_by_a_signal(ws, policy, status):
    """A command that dies from a signal says which."""
    outcome = await sh("kill -KILL $$", ws, policy=policy)
    assert outcome.is_error
    assert outcome.result == status


async def test_it_runs_in_the_workspace_with_an_empty_stdin(ws):
    """The working directory and HOME are the workspace; stdin is at its end at once."""
    outcome = await sh('pwd -P; echo "$HOME"; cat; echo after-cat', ws)
    root = ws.resolve()
    assert outcome.shell_output == f"{root}\n{root}\nafter-cat\n"
    assert not outcome.is_error


async def test_it_merges_stdout_and_stderr_in_order(ws):
    """Both streams share one pipe, so the interleaving is exact, live and in the result."""
    live: list[str] = []
    outcome = await sh(
        "for i in $(seq 1 500); do echo out$i; echo err$i >&2; done", ws, on_output=live.append
    )
    expected = "".join(f"out{i}\nerr{i}\n" for i in range(1, 501))
    assert outcome.shell_output == expected
    assert "".join(live) == expected


async def test_it_streams_output_live_while_the_command_runs(ws):
    """on_output gets the output before the command ends: the command waits for a file
    that the test only creates once it has seen the first line."""
    live: list[str] = []
    ready = asyncio.Event()

    def on_output(text: str) -> None:
        live.append(text)
        if "ready\n" in "".join(live):
            ready.set()

    task = asyncio.create_task(
        sh("echo ready; until [ -e go ]; do sleep 0.01; done; echo done", ws, on_output=on_output)
    )
    await asyncio.wait_for(ready.wait(), EVENT_WAIT)
    assert not task.done()
    (ws / "go").write_text("")
    outcome = await asyncio.wait_for(task, EVENT_WAIT + TEST_TIMEOUT)
    assert outcome.shell_output == "ready\ndone\n"
    assert "".join(live) == "ready\ndone\n"


async def test_it_decodes_characters_split_across_reads(ws):
    """A UTF-8 character written in two halves arrives whole in the live stream."""
    live: list[str] = []
    outcome = await sh(r"printf '\xc3'; sleep 0.2; printf '\xa9\n'", ws, on_output=live.append)
    assert "".join(live) == "é\n"
    assert outcome.shell_output == "é\n"


async def test_it_replaces_nul_characters_in_output(ws):
    """NUL cannot be stored in PostgreSQL text; it becomes U+FFFD, live and in the result."""
    live: list[str] = []
    outcome = await sh(r"printf 'a\0b'", ws, on_output=live.append)
    assert outcome.shell_output == "a\ufffdb"
    assert "".join(live) == "a\ufffdb"


async def test_it_survives_a_failing_output_listener(ws):
    """A listener that raises stops the live stream, not the command or its result."""

    def broken(text: str) -> None:
        raise RuntimeError("listener bug")

    outcome = await sh("seq 1 2000", ws, on_output=broken)
    assert not outcome.is_error
    assert outcome.shell_output == "".join(f"{i}\n" for i in range(1, 2001))


async def test_it_reports_a_command_that_cannot_start(tmp_path, ws, monkeypatch):
    """A missing shell binary gives an error outcome, not an exception."""
    monkeypatch.setattr("chat.tools.shell.shell_path", lambda: str(tmp_path / "no-such-shell"))
    outcome = await sh("true", ws, policy=UNSANDBOXED)
    assert outcome.is_error
    assert outcome.result.startswith("the command could not be started:")


async def test_it_reports_a_shell_missing_in_the_sandbox(tmp_path, ws, monkeypatch):
    """In the sandbox bwrap starts and cannot run the shell: its message and status."""
    monkeypatch.setattr("chat.tools.shell.shell_path", lambda: str(tmp_path / "no-such-shell"))
    outcome = await sh("true", ws)
    assert outcome.is_error
    assert outcome.result == (
        f"bwrap: execvp {tmp_path / 'no-such-shell'}: No such file or directory\n[exit code 1]"
    )


# --- shell: output cap -------------------------------------------------------------


async def test_it_caps_the_output_of_a_command_printing_50_mb(ws):
    """Of 50 MB of output the result keeps the first and last halves of OUTPUT_CAP, with
    a marker counting the dropped bytes; the live stream stops at the cap."""
    live: list[str] = []
    size = 50_000_000
    outcome = await sh(
        f"printf START; head -c {size} /dev/zero | tr '\\0' x; printf END",
        ws,
        on_output=live.append,
    )
    total = len("START") + size + len("END")
    assert outcome.truncated
    assert not outcome.is_error
    marker = f"\n[... {total - OUTPUT_CAP} bytes of output dropped ...]\n"
    assert outcome.shell_output == (
        "START" + "x" * (OUTPUT_HEAD - 5) + marker + "x" * (OUTPUT_TAIL - 3) + "END"
    )
    assert outcome.result == outcome.shell_output + "\n[exit code 0]"
    streamed = "".join(live)
    assert streamed.startswith("START" + "x" * (OUTPUT_CAP - 5) + "\n[live output stopped after")
    assert len(streamed) < OUTPUT_CAP + 200


async def test_it_keeps_output_at_the_cap_whole(ws):
    """Exactly OUTPUT_CAP bytes of output are kept whole, unmarked."""
    outcome = await sh(f"head -c {OUTPUT_CAP} /dev/zero | tr '\\0' y", ws)
    assert not outcome.truncated
    assert outcome.shell_output == "y" * OUTPUT_CAP


async def test_it_cuts_capped_output_on_character_boundaries(ws):
    """Where the cap splits a multi-byte character, the character is dropped whole
    instead of leaving replacement characters."""
    # 'a' shifts every 'é' by one byte, so both cuts fall inside a character.
    outcome = await sh("printf a; yes é | head -n 40000 | tr -d '\\n'; printf b", ws)
    total = 1 + 2 * 40000 + 1
    assert outcome.truncated
    text = outcome.shell_output
    assert "\ufffd" not in text
    head, tail = text.split("\n[... ")
    dropped = int(tail.split(" ")[0])
    tail = tail.split(" dropped ...]\n")[1]
    assert head == "a" + "é" * ((OUTPUT_HEAD - 1) // 2)
    assert tail == "é" * ((OUTPUT_TAIL - 1) // 2) + "b"
    assert dropped == total - len(head.encode()) - len(tail.encode())


# --- shell: environment ------------------------------------------------------------

SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-fake-1",
    "OPENAI_API_KEY": "sk-fake-2",
    "SECRET_KEY": "django-fake-3",
    "DATABASE_URL": "postgres://u:fake-4@db/x",
    "REDIS_URL": "redis://:fake-5@cache:6379/0",
    "GITHUB_TOKEN": "ghp_fake6",
    "AWS_SECRET_ACCESS_KEY": "fake-7",
    "PGPASSWORD": "fake-8",
    "DISPATCH_MASTER_KEY": "fake-9",
}


async def test_it_gives_the_command_no_secrets(ws, monkeypatch):
    """Keys, tokens, passwords and service URLs in this process's environment never
    reach the command; it gets a small fixed environment."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    outcome = await sh("env", ws)
    env = dict(line.split("=", 1) for line in outcome.shell_output.splitlines())
    for name, value in SECRETS.items():
        assert name not in env
        assert value not in outcome.result
    assert env["HOME"] == str(ws.resolve())
    assert env["TERM"] == "dumb"
    assert env["PATH"] == os.environ["PATH"]


# --- shell: process group (unsandboxed; the sandbox's kill: tests/test_sandbox.py) ------


async def test_it_kills_the_whole_group_on_timeout(ws):
    """At the timeout the command and its background children are killed, and the
    call returns only once no process of the group remains."""
    outcome = await sh(
        "echo pgid=$$; sleep 60 & echo child=$!; wait", ws, timeout=0.5, policy=UNSANDBOXED
    )
    assert outcome.is_error
    assert outcome.result.endswith(
        "[timed out after 0.5 s; the command and everything it started were killed]"
    )
    pgid = number("pgid", outcome.result)
    child = number("child", outcome.result)
    assert not group_exists(pgid)
    assert not process_exists(child)


async def test_it_kills_background_children_when_the_command_ends(ws):
    """A command that exits leaving a child in the background returns at once, and the
    child is killed with the group."""
    outcome = await sh("sleep 60 & echo pgid=$$", ws, policy=UNSANDBOXED)
    assert outcome.result.endswith("[exit code 0]")
    assert not group_exists(number("pgid", outcome.result))


async def test_it_kills_the_whole_group_when_cancelled(ws):
    """Cancelling the run_tool task kills the group and re-raises CancelledError."""
    live: list[str] = []
    started = asyncio.Event()

    def on_output(text: str) -> None:
        live.append(text)
        if "child=" in "".join(live) and "".join(live).endswith("\n"):
            started.set()

    task = asyncio.create_task(
        sh(
            "echo pgid=$$; sleep 60 & echo child=$!; wait",
            ws,
            on_output=on_output,
            policy=UNSANDBOXED,
        )
    )
    await asyncio.wait_for(started.wait(), EVENT_WAIT)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, EVENT_WAIT)
    assert task.cancelled()
    output = "".join(live)
    assert not group_exists(number("pgid", output))
    assert not process_exists(number("child", output))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's")
async def test_it_adopts_the_orphans_of_a_command(ws):
    """This process is a child subreaper, so a command's orphans become its children and
    are reaped at once, even under a PID 1 that reaps late or never."""
    outcome = await sh(
        "bash -c 'sleep 30 & echo $! > pid'; grep PPid /proc/$(cat pid)/status",
        ws,
        policy=UNSANDBOXED,
    )
    assert outcome.shell_output.split() == ["PPid:", str(os.getpid())]


async def test_it_returns_when_an_escaped_process_holds_the_output_open(ws):
    """Unsandboxed, a process that left the group (setsid) keeps the pipe open and survives
    the group kill; the call still returns with the output it has."""
    outcome = await asyncio.wait_for(
        sh("setsid sleep 600 & echo escaped=$!", ws, policy=UNSANDBOXED), EVENT_WAIT + TEST_TIMEOUT
    )
    escaped = number("escaped", outcome.result)
    try:
        assert outcome == ToolOutcome(
            f"escaped={escaped}\n[exit code 0]",
            is_error=False,
            shell_output=f"escaped={escaped}\n",
        )
    finally:
        # Gone already when setsid had to fork: $! names the parent that exited.
        with suppress(ProcessLookupError):
            os.kill(escaped, signal.SIGKILL)
        with suppress(ChildProcessError):
            os.waitpid(escaped, 0)
