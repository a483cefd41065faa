"""A tab's tool set: the built-ins and the MCP servers' tools, frozen on the tab.

Every request of a tab sends the same tools, byte for byte: they come first in
the provider's cached prefix, so a list that changed between two requests would
make the whole conversation a cache miss. The runner computes the list at a
turn's start (`current`), stores it in `Tab.tools` the first time, and after
that replaces it only when it differs, with a `config-reload` chunk saying what
changed (`describe`): never within a turn. Requests read it back with
`tab_specs`. Entries are sorted by name, schemas by key at every level, so the
bytes depend on the tools alone (not on the order servers answer in, nor on how
a database stores JSON: PostgreSQL's jsonb reorders keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from fnmatch import fnmatchcase
from typing import Any

from chat.providers.base import ToolSpec
from chat.tools import mcp, mcp_names
from chat.tools.registry import TOOLS

Entry = dict[str, Any]


def sorted_keys(value: Any) -> Any:
    """`value` with every mapping's keys in sorted order (a deep copy), and whole numbers
    written with an exponent (`1e+300`) as the integers they are: PostgreSQL's jsonb gives
    them back so, and a list that reads back otherwise would send other bytes (and look
    changed) at every later turn."""
    if isinstance(value, Mapping):
        return {key: sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [sorted_keys(item) for item in value]
    if isinstance(value, float) and value.is_integer() and "e" in repr(value):
        return int(Decimal(repr(value)))
    return value


def allowed(name: str, allow: Sequence[str]) -> bool:
    """Whether a tool is in an allow-list of name patterns (`*`, `?`, `[…]`; empty: all)."""
    return not allow or any(fnmatchcase(name, pattern) for pattern in allow)


def builtin_entries() -> list[Entry]:
    return [
        {"name": t.name, "description": t.description, "input_schema": dict(t.input_schema)}
        for t in TOOLS
    ]


def mcp_entries(specs: Iterable[mcp.McpToolSpec]) -> list[Entry]:
    """MCP tools as entries; `tool` is the name the server knows it by."""
    return [
        {
            "name": s.name,
            "description": s.description,
            "input_schema": dict(s.input_schema),
            "server": s.server,
            "tool": s.tool,
        }
        for s in specs
    ]


def freeze(entries: Iterable[Entry], allow: Sequence[str]) -> list[Entry]:
    """The entries the allow-list lets through, sorted by name, keys sorted throughout;
    a name twice keeps its first entry (a built-in before an MCP tool)."""
    seen: dict[str, Entry] = {}
    for entry in entries:
        if allowed(entry["name"], allow):
            seen.setdefault(entry["name"], sorted_keys(entry))
    return [seen[name] for name in sorted(seen)]


def may_offer(server: str, allow: Sequence[str]) -> bool:
    """Whether the allow-list could let any tool of the MCP server `server` through: a
    pattern that matches some name starting as that server's tools' names all do."""
    if not allow:
        return True
    # Every name of its tools, plain or shortened, starts so (mcp_names: a shortened name
    # keeps at least this much of the safe joined name before its hash).
    start = mcp_names.UNSAFE.sub("_", mcp_names.plain(server, ""))
    start = start[: mcp_names.MAX_NAME - 1 - mcp_names.HASH_DIGITS[-1]]
    return any(_may_match(_glob(pattern), start) for pattern in allow)


def _glob(pattern: str) -> list[str]:
    """`pattern` as fnmatch reads it: `*`, `?`, a `[…]` class, or one literal character."""
    tokens: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            end = pattern.find("]", j)
            if end != -1:
                tokens.append(pattern[i : end + 1])
                i = end + 1
                continue
        tokens.append(char)
        i += 1
    return tokens


def _may_match(tokens: list[str], prefix: str) -> bool:
    """Whether the glob `tokens` matches some string that starts with `prefix`: the
    pattern positions reachable after reading the prefix (what follows it is free)."""

    def closure(states: set[int]) -> set[int]:
        # A `*` may match nothing: the position after it is reachable too.
        todo = list(states)
        while todo:
            state = todo.pop()
            if state < len(tokens) and tokens[state] == "*" and state + 1 not in states:
                states.add(state + 1)
                todo.append(state + 1)
        return states

    states = closure({0})
    for char in prefix:
        following: set[int] = set()
        for state in states:
            if state == len(tokens):
                continue
            token = tokens[state]
            if token == "*":
                following.add(state)
            elif token == "?" or token == char or (len(token) > 1 and fnmatchcase(char, token)):
                following.add(state + 1)
        states = closure(following)
        if not states:
            return False
    return True


async def current(
    allow: Sequence[str], frozen: Sequence[Entry] | None = None, owner_id: int | None = None
) -> tuple[list[Entry], list[str], list[str]]:
    """The tool set a tab with this allow-list gets now, what went wrong listing it (a
    server down, too many tools: the turn goes on with the rest), and which servers
    could not be listed, each a message. Such a server keeps its tools of `frozen` (the
    tab's list): only a listing that answered changes them. Servers none of whose tools
    the allow-list could let through are not asked (mcp.refresh). `owner_id`: the tab's
    owner, whose connection a server that mounts the workspace lists its tools on."""
    known = [
        mcp.McpToolSpec(e["name"], e["description"], e["input_schema"], e["server"], e["tool"])
        for e in frozen or ()
        if "server" in e and "tool" in e
    ]
    listing = await mcp.refresh(
        known, lambda server: may_offer(server, allow), turn=True, owner_id=owner_id
    )
    entries = freeze([*builtin_entries(), *mcp_entries(listing.specs)], allow)
    return entries, listing.problems, list(listing.failed.values())


def tab_specs(tab: Any) -> tuple[ToolSpec, ...]:
    """The tab's frozen tools as sent to the provider. Before its first turn (nothing
    frozen yet) the built-ins its allow-list lets through."""
    entries = tab.tools if tab.tools is not None else freeze(builtin_entries(), tab.tool_allow)
    return tuple(
        ToolSpec(e["name"], e["description"], sorted_keys(e["input_schema"])) for e in entries
    )


def describe(old: Sequence[Entry], new: Sequence[Entry]) -> str:
    """What changed between two tool sets, for the config-reload chunk: tool names
    added (+), removed (-) and changed (~: description or schema)."""
    before = {e["name"]: sorted_keys(e) for e in old}
    after = {e["name"]: sorted_keys(e) for e in new}
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = sorted(n for n in after.keys() & before.keys() if after[n] != before[n])
    parts = [f"+{n}" for n in added] + [f"-{n}" for n in removed] + [f"~{n}" for n in changed]
    return "Tools changed: " + ", ".join(parts) + "."
