"""chat.tools.files.resolve: where a path leads, links followed as the file tools follow
them, so that permission rules judge the file a call touches (chat.rules.decide)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chat.tools import files
from chat.tools.base import ToolError


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """src/h links to .git/hooks, abs to .git by its absolute path, detour through a
    folder that does not exist, up and out leave the workspace, loop is a loop."""
    root = files.ensure_workspace(tmp_path / "ws")
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("a")
    (root / "src" / "h").symlink_to("../.git/hooks")
    (root / "abs").symlink_to(root / ".git")
    (root / "detour").symlink_to("nowhere/../src/h")
    (root / "notes.md").symlink_to("src/a.py")
    (root / "up").symlink_to("..")
    (root / "out").symlink_to("/etc")
    (root / "loop").symlink_to("loop")
    return root


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".", "."),
        ("src", "src"),
        ("./src//a.py", "src/a.py"),
        ("src/h", ".git/hooks"),
        ("src/h/pre-commit", ".git/hooks/pre-commit"),
        ("src/h/new/deeper/x", ".git/hooks/new/deeper/x"),
        ("abs/hooks/x", ".git/hooks/x"),
        ("detour/x", ".git/hooks/x"),
        ("notes.md", "src/a.py"),
        ("new/dir/file", "new/dir/file"),
    ],
)
def test_resolve_follows_links_as_the_tools_do_and_creates_nothing(ws, path, expected):
    before = sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))
    assert files.resolve(ws, path) == expected
    assert sorted(str(p.relative_to(ws)) for p in ws.rglob("*")) == before


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("up/x", "up/x: resolves outside the workspace through a symlink; refused"),
        ("out/passwd", "out/passwd: resolves outside the workspace through a symlink"),
        ("loop", "loop: more than 40 symbolic links on the way (a loop?); refused"),
        ("../x", "'..' is not allowed in paths"),
        ("/etc/passwd", "absolute paths are not allowed"),
        ("src/a.py/x", "cannot create its parent directory: a.py is not a directory"),
    ],
)
def test_resolve_refuses_what_the_tools_refuse(ws, path, message):
    with pytest.raises(ToolError) as caught:
        files.resolve(ws, path)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "path", ["src/h/pre-commit", "detour/x", "abs/hooks/y", "notes.md", "new/dir/file"]
)
def test_write_file_writes_where_resolve_says(ws, path):
    landed = files.resolve(ws, path)
    files.write_file(ws, path, "written")
    assert (ws / landed).read_text() == "written"
    assert not (ws / landed).is_symlink()
