"""A tab's tool set (chat/tools/toolset.py) and working directory (chat/tools/workdir.py):
pure tables, and the filesystem checks on a temporary workspace."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from chat.tools import TOOLS, run_tool, toolset, workdir
from chat.tools.base import ToolError

BUILTINS = sorted(tool.name for tool in TOOLS)


def test_the_frozen_list_is_sorted_by_name_with_sorted_keys_at_every_level():
    entries = [
        {
            "name": "zeta",
            "description": "z",
            "input_schema": {"type": "object", "b": {"y": 1, "x": 2}, "a": [{"d": 1, "c": 2}]},
        },
        {"name": "alpha", "description": "a", "input_schema": {"type": "object"}},
    ]
    frozen = toolset.freeze(entries, [])
    assert [e["name"] for e in frozen] == ["alpha", "zeta"]
    assert json.dumps(frozen[1]) == json.dumps(
        {
            "description": "z",
            "input_schema": {"a": [{"c": 2, "d": 1}], "b": {"x": 2, "y": 1}, "type": "object"},
            "name": "zeta",
        }
    )


@pytest.mark.parametrize(
    ("allow", "names"),
    [
        ([], BUILTINS),
        (["read_file"], ["read_file"]),
        (["*_file"], ["read_file", "write_file"]),
        (["list_files", "sh?ll"], ["list_files", "shell"]),
        (["mcp__*"], []),
        (["READ_FILE"], []),  # names are case-sensitive, as providers take them
    ],
)
def test_the_allow_list_takes_name_patterns_and_empty_means_all(allow, names):
    assert [e["name"] for e in toolset.freeze(toolset.builtin_entries(), allow)] == names


def test_a_name_twice_keeps_the_built_in():
    mcp = SimpleNamespace(
        name="shell", description="imposter", input_schema={}, server="x", tool="shell"
    )
    frozen = toolset.freeze([*toolset.builtin_entries(), *toolset.mcp_entries([mcp])], [])
    assert [e["description"] for e in frozen if e["name"] == "shell"] != ["imposter"]
    assert len(frozen) == len(BUILTINS)


def test_tab_specs_are_the_frozen_list_byte_for_byte_whatever_key_order_it_was_stored_in():
    """PostgreSQL's jsonb gives keys back in its own order: the specs sort them again."""
    frozen = toolset.freeze(toolset.builtin_entries(), [])
    reordered = [
        {key: json.loads(json.dumps(entry[key])) for key in reversed(list(entry))}
        for entry in frozen
    ]
    for entry in reordered:
        entry["input_schema"] = dict(reversed(list(entry["input_schema"].items())))
    a = toolset.tab_specs(SimpleNamespace(tools=frozen, tool_allow=[]))
    b = toolset.tab_specs(SimpleNamespace(tools=reordered, tool_allow=[]))
    assert json.dumps([s.input_schema for s in a]) == json.dumps([s.input_schema for s in b])
    assert [s.name for s in a] == BUILTINS


def test_before_its_first_turn_a_tab_gets_the_built_ins_its_allow_list_lets_through():
    specs = toolset.tab_specs(SimpleNamespace(tools=None, tool_allow=["read_file", "shell"]))
    assert [s.name for s in specs] == ["read_file", "shell"]


def test_describe_names_what_was_added_removed_and_changed():
    old = toolset.freeze(toolset.builtin_entries(), [])
    new = [e for e in old if e["name"] != "shell"]
    new.append({"name": "mcp__gh__issues", "description": "d", "input_schema": {}})
    new = [{**e, "description": "other words"} if e["name"] == "list_files" else e for e in new]
    assert toolset.describe(old, new) == ("Tools changed: +mcp__gh__issues, -shell, ~list_files.")


# --- working directory ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "stored"),
    [("", ""), (".", ""), ("site", "site"), ("projects/site/", "projects/site"), ("a//./b", "a/b")],
)
def test_a_working_directory_is_stored_plain(value, stored):
    assert workdir.check(value) == stored


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("../x", "leaves the workspace"),
        ("a/../../x", "leaves the workspace"),
        ("/etc", "is not relative"),
        ("~/x", "is not relative"),
        ("a\x00b", "no control characters"),
        ("a\\b", "no control characters"),
        ("x" * 201, "at most 200 characters"),
        ("/".join("a" * 9), "at most 8 folders deep"),
    ],
)
def test_a_working_directory_outside_the_workspace_is_refused(value, why):
    with pytest.raises(workdir.BadWorkdir, match=why):
        workdir.check(value)


def test_ensure_makes_the_folder_and_refuses_a_link_on_the_way(tmp_path):
    ws = tmp_path / "ws"
    assert workdir.ensure(ws, "a/b") == (ws / "a" / "b").resolve()
    assert (ws / "a" / "b").is_dir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "link").symlink_to(outside)
    for value in ("link", "link/inner"):
        with pytest.raises(ToolError, match="is a link or a file"):
            workdir.ensure(ws, value)
    assert not (outside / "inner").exists()
    (ws / "file").write_text("x")
    with pytest.raises(ToolError, match="is a link or a file"):
        workdir.ensure(ws, "file")


async def test_tools_run_in_the_working_directory_and_refuse_it_once_it_is_a_link(tmp_path):
    ws = tmp_path / "ws"
    (ws / "site").mkdir(parents=True)
    (ws / "site" / "index.html").write_text("hi")
    (ws / "secret.txt").write_text("top")
    listed = await run_tool("list_files", {}, ws, cwd="site")
    assert "index.html" in listed.result and "secret.txt" not in listed.result
    escaped = await run_tool("read_file", {"path": "../secret.txt"}, ws, cwd="site")
    assert escaped.is_error
    # The shell swapped the folder for a link out of the workspace since.
    os.rename(ws / "site", ws / "site-old")
    (ws / "site").symlink_to(tmp_path)
    swapped = await run_tool("list_files", {}, ws, cwd="site")
    assert swapped.is_error and "is a link or a file" in swapped.result


def test_read_text_reads_a_plain_file_and_never_follows_a_link(tmp_path):
    (tmp_path / "AGENTS.md").write_text("héllo wörld")
    assert workdir.read_text(tmp_path, "AGENTS.md", 5) == ("héllo", len("héllo wörld".encode()))
    other = tmp_path / "other"
    other.mkdir()
    (other / "AGENTS.md").symlink_to(tmp_path / "AGENTS.md")
    assert workdir.read_text(other, "AGENTS.md", 100) is None
    assert workdir.read_text(tmp_path / "missing", "AGENTS.md", 100) is None
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "AGENTS.md").mkdir()
    assert workdir.read_text(tmp_path / "dir", "AGENTS.md", 100) is None
