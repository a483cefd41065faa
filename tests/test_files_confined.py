"""The file tools stay inside the workspace even against a concurrent attacker.

The race test flips a directory of the workspace for a symlink out while the
tools use it; the tables pin what each kind of odd path gives.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import uuid
from contextlib import suppress
from pathlib import Path

import pytest

from chat.tools import files, run_tool, workdir
from chat.tools.base import ToolError

# Calls made while the path flips. The old check-then-open code lost the race in
# 9-20 of 80 calls, so a few hundred of each tool is far past any luck.
RACE_ROUNDS = 600


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return files.ensure_workspace(workspace)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    directory = tmp_path / "outside"
    directory.mkdir()
    return directory


# --- the race ------------------------------------------------------------------


class Flipper(threading.Thread):
    """Turns `ws/sub` into a symlink to `outside` and back, as fast as it can.

    A write_file in one of the gaps may create a fresh `sub`; the flipper removes
    it and puts the real directory back, so the loop never wedges.
    """

    def __init__(self, ws: Path, outside: Path):
        super().__init__(daemon=True)
        self.sub = ws / "sub"
        self.parked = ws / "parked"
        self.outside = outside
        self.stop = threading.Event()
        self.flips = 0

    def run(self) -> None:
        while not self.stop.is_set():
            with suppress(OSError):
                os.rename(self.sub, self.parked)
            with suppress(OSError):
                os.symlink(self.outside, self.sub)
                self.flips += 1
            with suppress(OSError):
                os.unlink(self.sub)
            if self.sub.is_dir() and not self.sub.is_symlink() and self.parked.exists():
                shutil.rmtree(self.sub, ignore_errors=True)
            with suppress(OSError):
                os.rename(self.parked, self.sub)


def test_a_path_flipped_to_a_symlink_out_never_leads_out(ws, outside):
    """While `sub` flips between a real directory and a symlink out, every read,
    write and listing of `sub/...` either works inside or fails with a ToolError:
    the outside secret is never returned or listed, and nothing is written out."""
    marker = f"OUTSIDE-{uuid.uuid4()}"
    (outside / "secret.txt").write_text(marker + "\n")
    (outside / f"{marker}.txt").write_text("")
    (ws / "sub").mkdir()
    (ws / "sub" / "secret.txt").write_text("harmless\n")
    flipper = Flipper(ws, outside)
    flipper.start()
    errors: set[str] = set()
    successes = 0
    try:
        for i in range(RACE_ROUNDS):
            calls = [
                lambda: files.read_file(ws, "sub/secret.txt"),
                lambda: files.list_files(ws, "sub"),
                lambda i=i: files.write_file(ws, "sub/secret.txt", f"written {i}\n"),
                lambda i=i: files.write_file(ws, "sub/new.txt", f"new {i}\n"),
            ]
            for call in calls:
                try:
                    outcome = call()
                except ToolError as exc:
                    errors.add(str(exc))
                    assert marker not in str(exc)
                    continue
                successes += 1
                assert not outcome.is_error
                assert marker not in outcome.result
    finally:
        flipper.stop.set()
        flipper.join()
    assert sorted(p.name for p in outside.iterdir()) == sorted(["secret.txt", f"{marker}.txt"])
    assert (outside / "secret.txt").read_text() == marker + "\n"
    assert flipper.flips > 0
    assert successes > 0
    for message in errors:
        assert message.startswith(("sub/secret.txt: ", "sub: ", "sub/new.txt: ")), message


# --- symlinks ------------------------------------------------------------------


def run(tool: str, ws: Path, path: str, *args) -> str:
    """The tool's result text, or 'error: ' and the ToolError's message."""
    function = {"list": files.list_files, "read": files.read_file, "write": files.write_file}
    try:
        return function[tool](ws, path, *args).result
    except ToolError as exc:
        return f"error: {exc}"


def link(ws: Path, name: str, target: str | Path) -> None:
    path = ws / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


OUT = "resolves outside the workspace through a symlink; refused"

SYMLINKS = [
    # (links: name -> target, with {ws} and {out} filled in), tool, path, expected
    ({"a.txt": "real.txt"}, "read", "a.txt", "inside\n"),
    ({"d/a.txt": "../real.txt"}, "read", "d/a.txt", "inside\n"),
    ({"a.txt": "{ws}/real.txt"}, "read", "a.txt", "inside\n"),
    ({"alias": "realdir"}, "read", "alias/f.txt", "in dir\n"),
    ({"alias": "realdir"}, "list", "alias", "file           7  f.txt"),
    ({"d/self": "."}, "list", "d/self", "link           -  self"),
    ({"d/up": ".."}, "read", "d/up/real.txt", "inside\n"),
    ({"a": "b", "b": "realdir"}, "read", "a/f.txt", "in dir\n"),
    ({"a.txt": "{out}/secret.txt"}, "read", "a.txt", f"error: a.txt: {OUT}"),
    ({"a.txt": "../outside/secret.txt"}, "read", "a.txt", f"error: a.txt: {OUT}"),
    ({"d/e/a.txt": "../../../outside/secret.txt"}, "read", "d/e/a.txt", f"error: d/e/a.txt: {OUT}"),
    ({"a.txt": "{ws}/../outside/secret.txt"}, "read", "a.txt", f"error: a.txt: {OUT}"),
    ({"out": "{out}"}, "read", "out/secret.txt", f"error: out/secret.txt: {OUT}"),
    ({"out": "{out}"}, "list", "out", f"error: out: {OUT}"),
    ({"out": "../outside"}, "write", "out/new.txt", f"error: out/new.txt: {OUT}"),
    ({"out": "{out}"}, "write", "out/deeper/new.txt", f"error: out/deeper/new.txt: {OUT}"),
    ({"a": "realdir", "realdir/b": "{out}"}, "list", "a/b", f"error: a/b: {OUT}"),
    ({"gone": "missing.txt"}, "read", "gone", "error: gone: no such file"),
    ({"gone": "nodir/missing.txt"}, "read", "gone", "error: gone: no such file"),
    ({"gone": "{out}/missing.txt"}, "write", "gone", f"error: gone: {OUT}"),
    ({"gone": "made.txt"}, "write", "gone", "Created gone (1 bytes)"),
    ({"a": "a"}, "read", "a", f"error: a: more than {files.MAX_SYMLINK_HOPS} symbolic links"),
    ({"a": "b", "b": "a"}, "write", "a/x", f"error: a/x: more than {files.MAX_SYMLINK_HOPS}"),
    ({"d": "d/d"}, "list", "d", f"error: d: more than {files.MAX_SYMLINK_HOPS}"),
]


@pytest.mark.parametrize(("links", "tool", "path", "expected"), SYMLINKS)
def test_it_follows_symlinks_only_while_they_stay_inside(ws, outside, links, tool, path, expected):
    """Relative links and absolute ones naming the workspace are followed while they
    stay inside; a link out (relative or absolute, at any component) is refused, a
    dangling one is missing for reading and created for writing, a loop is refused;
    nothing outside is read or changed."""
    (outside / "secret.txt").write_text("top secret\n")
    (ws / "real.txt").write_text("inside\n")
    (ws / "realdir").mkdir()
    (ws / "realdir" / "f.txt").write_text("in dir\n")
    for name, target in links.items():
        link(ws, name, str(target).format(ws=ws, out=outside))
    result = run(tool, ws, path, *(["x"] if tool == "write" else []))
    assert result.startswith(expected), result
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


def test_it_follows_a_chain_of_links_up_to_the_bound(ws):
    """A chain of MAX_SYMLINK_HOPS links is followed; one more is refused as a loop."""
    (ws / "end.txt").write_text("end\n")
    hops = files.MAX_SYMLINK_HOPS
    for i in range(hops + 1):
        (ws / f"l{i}").symlink_to(f"l{i + 1}" if i < hops else "end.txt")
    assert run("read", ws, "l1") == "end\n"
    assert run("read", ws, "l0") == (
        f"error: l0: more than {hops} symbolic links on the way (a loop?); refused"
    )


def test_a_dangling_link_creates_its_target_inside_with_its_parents(ws):
    """Writing through a dangling relative link creates what it points at, like the
    kernel does, and the missing directories on the way."""
    (ws / "gone").symlink_to("a/b/made.txt")
    assert run("write", ws, "gone", "hi") == "Created gone (2 bytes)"
    assert (ws / "a" / "b" / "made.txt").read_text() == "hi"
    assert (ws / "gone").is_symlink()


# --- what is swapped in at the worst moment ------------------------------------


@pytest.fixture
def swap_after_check(monkeypatch):
    """Run `swap` once, right after the tool's check of what it is about to open
    and before it opens it: the window a check by path followed by a use by path leaves open."""

    def install(checker: str, swap) -> None:
        real = getattr(files, checker)
        done = False

        def checked(*args):
            nonlocal done
            result = real(*args)
            if not done:
                done = True
                swap()
            return result

        monkeypatch.setattr(files, checker, checked)

    return install


def test_a_fifo_swapped_in_before_reading_does_not_block(ws, swap_after_check):
    """A regular file replaced by a FIFO between the check and the open is refused
    from the descriptor, without blocking on the FIFO."""
    (ws / "a.txt").write_text("text\n")
    swap_after_check("_check_readable", lambda: (os.unlink(ws / "a.txt"), os.mkfifo(ws / "a.txt")))
    assert run("read", ws, "a.txt") == "error: a.txt: not a regular file"


def test_a_fifo_swapped_in_before_writing_does_not_block(ws, swap_after_check):
    """Writing a file replaced by a reader-less FIFO in the window is refused at once."""
    (ws / "a.txt").write_text("text\n")
    swap_after_check("_check_writable", lambda: (os.unlink(ws / "a.txt"), os.mkfifo(ws / "a.txt")))
    assert run("write", ws, "a.txt", "x") == "error: a.txt: not a regular file"


@pytest.mark.parametrize(
    ("tool", "checker"), [("read", "_check_readable"), ("write", "_check_writable")]
)
def test_a_link_swapped_in_before_opening_is_not_followed(
    ws, outside, swap_after_check, tool, checker
):
    """A file replaced by a link out in the window is not opened through the link."""
    (outside / "secret.txt").write_text("top secret\n")
    (ws / "a.txt").write_text("text\n")

    def swap():
        os.unlink(ws / "a.txt")
        os.symlink(outside / "secret.txt", ws / "a.txt")

    swap_after_check(checker, swap)
    result = run(tool, ws, "a.txt", *(["pwned"] if tool == "write" else []))
    assert result == "error: a.txt: changed while it was being opened; try again"
    assert (outside / "secret.txt").read_text() == "top secret\n"


@pytest.mark.parametrize("tool", ["read", "write", "list"])
def test_a_directory_swapped_for_a_link_mid_walk_is_not_followed(ws, outside, monkeypatch, tool):
    """A directory on the way replaced by a link out after its lstat is not entered."""
    (outside / "secret.txt").write_text("top secret\n")
    (ws / "sub").mkdir()
    (ws / "sub" / "secret.txt").write_text("harmless\n")
    real = files._lstat

    def lstat_then_swap(here, name, shown):
        info = real(here, name, shown)
        if name == "sub":
            os.rename(ws / "sub", ws / "parked")
            os.symlink(outside, ws / "sub")
        return info

    monkeypatch.setattr(files, "_lstat", lstat_then_swap)
    path = "sub" if tool == "list" else "sub/secret.txt"
    result = run(tool, ws, path, *(["pwned"] if tool == "write" else []))
    assert result == f"error: {path}: changed while it was being opened; try again"
    assert (outside / "secret.txt").read_text() == "top secret\n"


# --- what is not a plain file or directory -------------------------------------


@pytest.mark.parametrize(
    ("tool", "path", "expected"),
    [
        ("read", "null", "error: null: not a regular file"),
        ("read", "zero", "error: zero: not a regular file"),
        ("write", "null", "error: null: not a regular file"),
        ("list", "null", "error: null: not a directory; use read_file to read a file"),
    ],
)
def test_it_refuses_device_files(tool, path, expected):
    """Device files are refused before being opened (the workspace here is /dev,
    which every Linux has, so no mknod and no root are needed)."""
    assert run(tool, Path("/dev"), path, *(["x"] if tool == "write" else [])) == expected


def test_it_refuses_a_socket(ws):
    """A Unix socket in the workspace is neither read nor written."""
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(ws / "sock"))
        assert run("read", ws, "sock") == "error: sock: not a regular file"
        assert run("write", ws, "sock", "x") == "error: sock: not a regular file"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ("read", "error: f.txt/x: no such file"),
        ("list", "error: f.txt/x: no such directory"),
        ("write", "error: f.txt/x: cannot create its parent directory: f.txt is not a directory"),
    ],
)
def test_a_path_through_a_file_is_refused(ws, tool, expected):
    """'a/b' where a is a regular file is missing for reading and listing, and cannot
    be written; the file is left alone."""
    (ws / "f.txt").write_text("keep")
    assert run(tool, ws, "f.txt/x", *(["x"] if tool == "write" else [])) == expected
    assert (ws / "f.txt").read_text() == "keep"


# --- long, deep and odd names --------------------------------------------------


def test_it_reaches_deep_paths(ws):
    """A path of a thousand directories is written, read and listed."""
    deep = "d/" * 1000
    assert run("write", ws, deep + "f.txt", "deep") == f"Created {deep}f.txt (4 bytes)"
    assert run("read", ws, deep + "f.txt") == "deep"
    assert run("list", ws, deep) == "file           4  f.txt"


def test_it_refuses_a_path_longer_than_path_max(ws):
    """A path over MAX_PATH_BYTES is refused without creating anything."""
    path = "d/" * (files.MAX_PATH_BYTES // 2) + "f.txt"
    assert run("write", ws, path, "x") == (
        f"error: the path is {len(path)} bytes long; at most {files.MAX_PATH_BYTES} are allowed"
    )
    assert list(ws.iterdir()) == []


def test_it_reports_a_name_too_long(ws):
    """A component over the file system's limit gets the system's message."""
    assert run("read", ws, "x" * 300) == f"error: {'x' * 300}: File name too long"


def test_it_handles_names_with_newlines_and_undecodable_bytes(ws):
    """A newline is an ordinary character; a name that is not UTF-8 is listed with
    U+FFFD and reachable through its surrogate escape."""
    assert run("write", ws, "a\nb.txt", "nl") == "Created a\nb.txt (2 bytes)"
    Path(os.fsdecode(bytes(ws) + b"/caf\xe9.txt")).write_text("latin\n")
    assert run("list", ws, ".") == "file           2  a\nb.txt\nfile           6  caf\ufffd.txt"
    assert run("read", ws, "caf\udce9.txt") == "latin\n"


def test_it_refuses_a_path_that_is_not_unicode(ws):
    """A lone surrogate (possible in JSON) cannot name a file; it is refused clearly."""
    assert run("read", ws, "a\ud800b") == (
        "error: the path is not valid Unicode (surrogates not allowed)"
    )


# --- descriptors ---------------------------------------------------------------


def test_it_closes_every_descriptor(ws, outside):
    """Successful and failed calls alike leave no descriptor open."""
    (ws / "realdir").mkdir()
    (ws / "realdir" / "f.txt").write_text("x\n")
    (ws / "sub").mkdir()
    (ws / "sub" / "up").symlink_to("../realdir")
    (ws / "out").symlink_to(outside)
    (ws / "loop").symlink_to("loop")
    os.mkfifo(ws / "pipe")
    before = sorted(os.listdir("/proc/self/fd"))
    for tool, path in [
        ("read", "sub/up/f.txt"),
        ("list", "sub/up"),
        ("write", "sub/up/g.txt"),
        ("write", "new/dirs/h.txt"),
        ("read", "out/x"),
        ("read", "loop"),
        ("read", "pipe"),
        ("write", "pipe"),
        ("read", "realdir"),
        ("list", "missing"),
        ("read", "realdir/f.txt/x"),
    ]:
        run(tool, ws, path, *(["x"] if tool == "write" else []))
    assert sorted(os.listdir("/proc/self/fd")) == before


# --- a tab's working directory -------------------------------------------------


def swap_after_its_check(monkeypatch, ws: Path, name: str, outside: Path) -> None:
    """Another tab's shell winning the race: `ws/name`, a folder on the way to the tab's
    working directory, becomes a link to `outside` right after the working directory was
    checked and opened, before the tool uses it."""
    checked = workdir.open_root

    def then_swapped(workspace: Path, cwd: str) -> tuple[Path, int]:
        opened = checked(workspace, cwd)
        (ws / name).rename(ws / f"{name}.real")
        (ws / name).symlink_to(outside)
        return opened

    monkeypatch.setattr(workdir, "open_root", then_swapped)


@pytest.mark.parametrize("tool", ["write_file", "read_file", "list_files"])
async def test_a_working_directory_swapped_for_a_link_after_its_check_leads_nowhere(
    ws, outside, monkeypatch, tool
):
    """The file tools start from the descriptor of the folder that was checked: a link
    swapped in for a folder on its way since is never followed."""
    (outside / "b").mkdir()
    (outside / "b" / "f.txt").write_text("outside\n")
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f.txt").write_text("inside\n")
    swap_after_its_check(monkeypatch, ws, "a", outside)
    args = {"path": "f.txt", "content": "written\n"} if tool == "write_file" else {}
    if tool == "read_file":
        args = {"path": "f.txt"}
    outcome = await run_tool(tool, args, ws, cwd="a/b")
    assert (ws / "a").is_symlink()
    assert (outside / "b" / "f.txt").read_text() == "outside\n"
    expected = {
        "write_file": "Overwrote f.txt (8 bytes)",
        "read_file": "inside\n",
        "list_files": "file           7  f.txt",
    }[tool]
    assert (outcome.result, outcome.is_error) == (expected, False)
    if tool == "write_file":
        assert (ws / "a.real" / "b" / "f.txt").read_text() == "written\n"


async def test_a_working_directory_that_is_a_link_is_refused(ws, outside):
    """Swapped before the call, a link anywhere on the way is refused, naming it."""
    (outside / "b").mkdir()
    (ws / "a").symlink_to(outside)
    for tool, args in [
        ("write_file", {"path": "x", "content": "x"}),
        ("read_file", {"path": "x"}),
        ("list_files", {}),
    ]:
        outcome = await run_tool(tool, args, ws, cwd="a/b")
        assert (outcome.result, outcome.is_error) == (
            "the working directory a/b is not a folder of the workspace (a is a link or a file)",
            True,
        )
    assert list(outside.rglob("*")) == [outside / "b"]
