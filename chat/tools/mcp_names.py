"""PURE: the provider-safe names of MCP tools, `mcp__<server>__<tool>`.

Providers take tool names of `[A-Za-z0-9_-]{1,64}`; an MCP server may name its tools
anything, and two servers' names may meet (`a` + `b__c` and `a__b` + `c`). A name that
is already safe and short stays as it is; any other gets its unsafe characters as `_`,
is cut to fit and ends with a short hash of the original, so it is deterministic (the
same tools give the same names in every process, which the prompt cache needs) and two
tools never share one. The original tool name is kept beside it for the call.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable

PREFIX = "mcp__"
SEPARATOR = "__"

# What Anthropic and OpenAI both accept as a tool name.
MAX_NAME = 64
UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

# Hex digits of SHA-256 in a shortened name: 8 tell apart any real server's tools; a
# collision among those (or with a plain name) moves that group to the longer suffix.
HASH_DIGITS = (8, 16)


def is_mcp(name: str) -> bool:
    return name.startswith(PREFIX)


def plain(server: str, tool: str) -> str:
    return f"{PREFIX}{server}{SEPARATOR}{tool}"


def _hashed(server: str, tool: str, digits: int) -> str:
    # Of the pair, not the joined name: `a` + `b__c` and `a__b` + `c` join alike.
    key = f"{server}\x00{tool}".encode("utf-8", "surrogatepass")
    suffix = "_" + hashlib.sha256(key).hexdigest()[:digits]
    return UNSAFE.sub("_", plain(server, tool))[: MAX_NAME - len(suffix)] + suffix


def _candidate(server: str, tool: str, level: int) -> str:
    raw = plain(server, tool)
    if level == 0 and len(raw) <= MAX_NAME and not UNSAFE.search(raw):
        return raw
    return _hashed(server, tool, HASH_DIGITS[max(level, 1) - 1])


def assign(pairs: Iterable[tuple[str, str]]) -> tuple[dict[tuple[str, str], str], list[str]]:
    """Each (server, tool) pair's name, and problems for pairs that could get none.

    A group of pairs whose names meet all move one step up (plain, then the 8-digit
    hash, then the 16-digit one); past the last step the group's later pairs (in sorted
    order) are left out with a problem, which takes two tools whose names share a
    64-bit hash: never seen.
    """
    level = dict.fromkeys(sorted(set(pairs)), 0)
    names: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    while True:
        names = {pair: _candidate(*pair, lvl) for pair, lvl in level.items()}
        groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for pair, name in names.items():
            groups[name].append(pair)
        clashes = [group for group in groups.values() if len(group) > 1]
        if not clashes:
            return names, problems
        for group in clashes:
            if all(level[pair] >= len(HASH_DIGITS) for pair in group):
                for server, tool in group[1:]:
                    problems.append(
                        f"server {server}: tool {tool!r} left out, its name meets another's"
                    )
                    del level[(server, tool)]
                continue
            for pair in group:
                level[pair] = min(level[pair] + 1, len(HASH_DIGITS))
