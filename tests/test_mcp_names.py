"""MCP tool names (chat.tools.mcp_names): provider-safe, deterministic, never shared."""

from __future__ import annotations

import re

import pytest

from chat.tools import mcp_names, toolset

SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@pytest.mark.parametrize(
    ("server", "tool", "expected"),
    [
        ("github", "create_issue", "mcp__github__create_issue"),
        ("a-b", "x-y_z", "mcp__a-b__x-y_z"),
        # Unsafe characters become _ and the name ends with a hash of the original. The
        # names are in frozen tabs and cached prompts: they must never change.
        ("fs", "read.file", "mcp__fs__read_file_a70c2700"),
        ("fs", "lire fichier é", "mcp__fs__lire_fichier___3f111668"),
    ],
)
def test_names_table(server, tool, expected):
    names, problems = mcp_names.assign([(server, tool)])
    assert problems == []
    assert names[(server, tool)] == expected
    assert SAFE.fullmatch(expected)


def test_a_long_name_is_cut_to_64_with_a_hash():
    tool = "t" * 100
    names, _ = mcp_names.assign([("server", tool)])
    name = names[("server", tool)]
    assert len(name) == mcp_names.MAX_NAME
    assert name.startswith("mcp__server__ttt")
    assert re.fullmatch(r".*_[0-9a-f]{8}", name)


def test_names_are_deterministic_whatever_the_order():
    pairs = [("a", "x.y"), ("a", "x_y"), ("b", "q"), ("a__b", "c"), ("a", "b__c")]
    first, _ = mcp_names.assign(pairs)
    second, _ = mcp_names.assign(reversed(pairs))
    assert first == second


@pytest.mark.parametrize(
    "pairs",
    [
        # The separator meets a server's name: both would be mcp__a__b__c.
        [("a", "b__c"), ("a__b", "c")],
        # An unsafe name meets the safe one it turns into.
        [("s", "x.y"), ("s", "x_y")],
        # Two long names alike in their first 64 characters.
        [("s", "t" * 80 + "1"), ("s", "t" * 80 + "2")],
    ],
)
def test_names_never_meet(pairs):
    names, problems = mcp_names.assign(pairs)
    assert problems == []
    assert len(set(names.values())) == len(pairs)
    assert all(SAFE.fullmatch(name) for name in names.values())


def test_colliding_names_both_move_to_hashed_names():
    names, _ = mcp_names.assign([("a", "b__c"), ("a__b", "c")])
    assert all(re.fullmatch(r"mcp__a__b__c_[0-9a-f]{8}", name) for name in names.values())


def test_a_hash_collision_past_the_last_step_leaves_one_out(monkeypatch):
    monkeypatch.setattr(mcp_names, "_hashed", lambda server, tool, digits: "mcp__same")
    names, problems = mcp_names.assign([("s", "a.b"), ("s", "a:b")])
    assert list(names) == [("s", "a.b")]
    assert problems == ["server s: tool 'a:b' left out, its name meets another's"]


@pytest.mark.parametrize(
    ("allow", "server", "offers"),
    [
        ([], "github", True),
        (["*"], "github", True),
        (["mcp__*"], "github", True),
        (["mcp__github__*"], "github", True),
        (["mcp__github__create_issue"], "github", True),
        (["mcp__git*"], "github", True),
        (["mcp__g?thub__*"], "github", True),
        (["mcp__[fg]ithub__*"], "github", True),
        (["mcp__[!g]ithub__*"], "github", False),
        (["mcp__github__*"], "gitlab", False),
        (["mcp__github"], "github", False),
        (["read_file", "shell"], "github", False),
        (["read_file", "*__search"], "github", True),
        (["mcp__gh__*"], "github", False),
        # A name with unsafe characters is shortened: its tools start mcp__my_srv__.
        (["mcp__my_srv__*"], "my srv", True),
        (["mcp__my srv__*"], "my srv", False),
        # A long server's tools' names keep only its first characters before their hash.
        (["mcp__" + "s" * 42 + "*"], "s" * 60, True),
        (["mcp__" + "s" * 60 + "__*"], "s" * 60, True),
        (["mcp__" + "s" * 41 + "t*"], "s" * 60, False),
        # An unclosed [ is a literal, as fnmatch reads it: no safe name has one.
        (["mcp__[x*"], "[x", False),
        (["mcp___x*"], "[x", True),
    ],
)
def test_which_servers_an_allow_list_could_take_tools_from(allow, server, offers):
    """A turn's start asks only the servers whose tools the tab's allow-list could let
    through: every name of a server's tools, plain or shortened, starts alike."""
    assert toolset.may_offer(server, allow) is offers
    if offers:
        return
    # Never wrong the other way: no tool of the server, plain or shortened, passes.
    names, _ = mcp_names.assign([(server, tool) for tool in ("x", "create_issue", "a.b" * 30)])
    assert not any(toolset.allowed(name, allow) for name in names.values())
