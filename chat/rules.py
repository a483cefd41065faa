"""Permission rules: which tool calls run, wait for the user, or are refused without
asking (DESIGN §14).

Pure: no Django. A rule is an action (`allow`, `ask`, `deny`) and a pattern: a tool
name, where `*` matches any run of characters (`read_file`, `mcp__github__*`),
optionally with a specifier in parentheses for the tools whose arguments rules can
read:

- `shell(git status)`, `shell(pytest *)`: the command, as words; `*` matches anything
  (spaces too), and a trailing ` *` also matches the command with no arguments.
- `write_file(src/**)`, `read_file(*.md)`, `list_files(docs)`: the path, relative to
  the workspace; `*` stays within one folder, `**` crosses folders, and `dir/**` also
  matches `dir` itself.

`decide` takes the rules in order (a tab's own, then its owner's): deny rules first,
then ask, then allow; the first rule that matches wins.

A shell command is parsed with bashlex into its simple commands (joined by `;`, `&&`,
`||`, `|` or newlines). It is allowed only if every one of them matches an allow rule,
and denied if any matches a deny rule. What the parser cannot prove harmless (a
command or process substitution, an expansion, a redirection out of the workspace, a
here-document, any syntax past simple commands, a parse error) is never allowed by a
specifier rule; if a deny or ask rule with a specifier might have matched it, it is
asked about. A path argument with `..` or an absolute path is treated the same way.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import bashlex
import bashlex.ast

ALLOW = "allow"
ASK = "ask"
DENY = "deny"
ACTIONS = (ALLOW, ASK, DENY)

# Where a rule came from, as the audit trail and the approval card say it.
TAB = "tab"
USER = "user"
SOURCE_LABELS = {TAB: "this tab", USER: "your settings"}

SHELL = "shell"
# The tools whose `path` argument a specifier matches (list_files defaults to ".").
PATH_TOOLS = frozenset({"read_file", "write_file", "list_files"})
# The same bound as PermissionRule.pattern's column.
MAX_PATTERN_CHARS = 500

# Redirection targets outside the workspace that write nowhere.
HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
# Redirections whose target is a file name (checked like a path argument). Here-documents
# and here-strings (`<<`, `<<-`, `<<<`) are not in it: their text is input bash expands.
FILE_REDIRECTS = frozenset({">", ">>", "<", ">|", "&>", ">&", "<>", "&>>"})
# Operators between simple commands that each part's own check covers. `&` is not one:
# a job in the background outlives the part that started it.
SEPARATORS = frozenset({";", "&&", "||", "\n"})
# A word holding any of these is quoted when a command is turned back into text, so a
# quoted argument can never pass for several words (or a separator) in a rule's eyes.
QUOTE_CHARS = re.compile(r"[\s'\"\\$`;&|<>()#]")

_NAME = re.compile(r"[A-Za-z0-9_*-]+")
_PATTERN = re.compile(r"(?P<tool>[^()]*)(?:\((?P<spec>.*)\))?", re.S)


class RuleError(ValueError):
    """A rule that cannot be used; the message says why, for the user."""


class Unprovable(Exception):
    """A call's arguments are past what rules can check: the reason, in words."""


@dataclass(frozen=True)
class Rule:
    action: str
    pattern: str
    tool: str
    # The specifier normalised (a shell command as words, a path): None matches every call.
    spec: str | None = None
    source: str = USER

    @property
    def label(self) -> str:
        return f"`{self.pattern}` ({SOURCE_LABELS.get(self.source, self.source)})"

    def applies_to(self, name: str) -> bool:
        return _glob(self.tool, star=".*").fullmatch(name) is not None

    def matches(self, subject: str) -> bool:
        """Whether the specifier matches one part of a call (a simple command, a path)."""
        if self.spec is None:
            return True
        if self.tool == SHELL:
            return _shell_glob(self.spec).fullmatch(subject) is not None
        return _path_glob(self.spec).fullmatch(subject) is not None


@dataclass(frozen=True)
class Decision:
    """What rules decided about one call: the action and the rules that made it."""

    action: str
    rules: tuple[Rule, ...]
    # Why an "ask" was forced although no rule matched: what the checker could not read.
    unprovable: str = ""

    @property
    def rule(self) -> Rule:
        return self.rules[0]

    @property
    def text(self) -> str:
        """The audit trail's sentence (and, for a denial, the call's result)."""
        labels = " and ".join(rule.label for rule in self.rules)
        plural = "s" if len(self.rules) > 1 else ""
        if self.unprovable:
            return f"Asked: {self.unprovable}, which rule {labels} cannot check"
        verb = {ALLOW: "Allowed", ASK: "Asked", DENY: "Denied"}[self.action]
        return f"{verb} by rule{plural} {labels}"


def parse(action: str, pattern: str, *, source: str = USER) -> Rule:
    """A rule from its action and pattern, or RuleError saying what is wrong with it."""
    if action not in ACTIONS:
        raise RuleError(f"A rule's action is allow, ask or deny, not {action!r}.")
    pattern = pattern.strip()
    if not pattern:
        raise RuleError("A rule needs a pattern, such as read_file, shell(git status) or src/**.")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise RuleError(f"A rule's pattern has at most {MAX_PATTERN_CHARS} characters.")
    match = _PATTERN.fullmatch(pattern)
    if match is None:
        if pattern.count("(") > pattern.count(")"):
            raise RuleError(f"`{pattern}` opens a parenthesis it does not close.")
        raise RuleError(
            f"`{pattern}` is not a rule: write a tool name, then optionally its specifier "
            "in parentheses, as in shell(git status)."
        )
    tool, spec = match["tool"].strip(), match["spec"]
    if not _NAME.fullmatch(tool):
        raise RuleError(
            f"`{tool}` is not a tool name: use letters, digits, _ and -, and * as a wildcard "
            "(mcp__github__*)."
        )
    if spec is None:
        return Rule(action, pattern, tool, None, source)
    if not spec.strip():
        raise RuleError(
            f"`{pattern}` has nothing in its parentheses: write {tool} alone to match every call."
        )
    if tool == SHELL:
        return Rule(action, pattern, tool, _shell_spec(pattern, spec), source)
    if tool in PATH_TOOLS:
        return Rule(action, pattern, tool, _path_spec(pattern, spec), source)
    takes = ", ".join(sorted({SHELL, *PATH_TOOLS}))
    raise RuleError(
        f"`{pattern}`: only {takes} take a specifier in parentheses; "
        f"write {tool} alone to match every call of it."
    )


def parse_all(rows: Iterable[Mapping[str, Any]], *, source: str) -> tuple[list[Rule], list[str]]:
    """Stored rules ({action, pattern}), and a sentence for each that cannot be used
    (edited elsewhere, imported, or from an older version): those are left out."""
    rules, problems = [], []
    for row in rows:
        action, pattern = str(row.get("action") or ""), str(row.get("pattern") or "")
        try:
            rules.append(parse(action, pattern, source=source))
        except RuleError as exc:
            where = SOURCE_LABELS.get(source, source)
            problems.append(f"The rule {action} `{pattern}` ({where}) is ignored: {exc}")
    return rules, problems


def decide(rules: Sequence[Rule], name: str, arguments: Mapping[str, Any]) -> Decision | None:
    """What the rules say about calling `name` with `arguments`; None when none decides
    (the user's approval setting applies)."""
    rules = [rule for rule in rules if rule.applies_to(name)]
    if not rules:
        return None
    try:
        parts = subjects(name, arguments)
    except Unprovable as exc:
        parts, unprovable = (), str(exc)
    else:
        unprovable = ""
    guard: Rule | None = None
    for action in (DENY, ASK):
        for rule in rules:
            if rule.action != action:
                continue
            if rule.spec is None:
                return Decision(action, (rule,))
            if unprovable:
                guard = guard or rule
            elif any(rule.matches(part) for part in parts):
                return Decision(action, (rule,))
    if guard is not None:
        return Decision(ASK, (guard,), unprovable=unprovable)
    allows = [rule for rule in rules if rule.action == ALLOW]
    if whole := next((rule for rule in allows if rule.spec is None), None):
        return Decision(ALLOW, (whole,))
    if unprovable or not parts:
        return None
    chosen: list[Rule] = []
    for part in parts:
        rule = next((rule for rule in allows if rule.matches(part)), None)
        if rule is None:
            return None
        if rule not in chosen:
            chosen.append(rule)
    return Decision(ALLOW, tuple(chosen))


def subjects(name: str, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """What a specifier is matched against: each simple command of a shell call, the
    path of a file tool's call, nothing for other tools; Unprovable if unreadable."""
    if name == SHELL:
        command = arguments.get("command")
        if not isinstance(command, str):
            raise Unprovable("the call has no command")
        return tuple(shell_parts(command))
    if name in PATH_TOOLS:
        raw = arguments.get("path", "." if name == "list_files" else None)
        if not isinstance(raw, str):
            raise Unprovable("the call has no path")
        return (normalise_path(raw),)
    return ()


def natural(name: str, arguments: Mapping[str, Any]) -> str | None:
    """The rule "always allow" offers for a call, or None when no safe one exists: the
    exact command for the shell, the file's folder for write_file (the file itself at
    the top), the tool's name for the rest. A command or path holding `*` would widen
    into a wildcard, so it gets none, like a command that is not one simple command."""
    if name == SHELL:
        try:
            parts = subjects(name, arguments)
        except Unprovable:
            return None
        if len(parts) != 1 or "*" in parts[0]:
            return None
        return f"{SHELL}({parts[0]})"
    if name == "write_file":
        try:
            (path,) = subjects(name, arguments)
        except Unprovable:
            return None
        if "*" in path or path == ".":
            return None
        folder = posixpath.dirname(path)
        return f"write_file({folder}/**)" if folder else f"write_file({path})"
    return name


# --- shell commands --------------------------------------------------------------------


def shell_parts(command: str) -> list[str]:
    """The simple commands of `command` as text (words quoted where needed), or
    Unprovable with the reason."""
    if not command.strip():
        raise Unprovable("the command is empty")
    if any(ord(ch) < 32 and ch not in "\n\t" for ch in command):
        # bash and bashlex may read a control character differently.
        raise Unprovable("the command holds control characters")
    try:
        trees = bashlex.parse(command)
    except Exception as exc:  # bashlex raises several types, NotImplementedError too
        raise Unprovable(f"the command could not be parsed ({_first_line(exc)})") from None
    parts: list[str] = []
    for tree in trees:
        _collect(tree, parts)
    if not parts:
        raise Unprovable("the command has no command in it")
    return parts


def _collect(node: Any, parts: list[str]) -> None:
    kind = node.kind
    if kind == "command":
        parts.append(_command_text(node))
    elif kind == "list":
        for child in node.parts:
            if child.kind == "operator":
                if child.op not in SEPARATORS:
                    raise Unprovable(f"the command uses the operator {child.op}")
            else:
                _collect(child, parts)
    elif kind == "pipeline":
        for child in node.parts:
            if child.kind == "pipe":
                continue
            if child.kind == "reservedword":  # `! cmd`
                raise Unprovable(f"the command uses {child.word}")
            _collect(child, parts)
    else:
        raise Unprovable(f"the command uses syntax rules do not read ({_syntax(node)})")


def _command_text(node: Any) -> str:
    words: list[str] = []
    for part in node.parts:
        if part.kind in ("word", "assignment"):
            _check_word(part)
            words.append(_quoted(part.word))
        elif part.kind == "redirect":
            _check_redirect(part)
        else:
            raise Unprovable(f"the command uses syntax rules do not read ({_syntax(part)})")
    if not words:
        raise Unprovable("the command is only a redirection")
    return " ".join(words)


def _check_word(word: Any) -> None:
    for part in getattr(word, "parts", ()) or ():
        raise Unprovable(f"the command has {_EXPANSIONS.get(part.kind, 'an expansion')}")


_EXPANSIONS = {
    "commandsubstitution": "a command substitution",
    "processsubstitution": "a process substitution",
    "parameter": "a variable expansion",
    "tilde": "a ~ expansion",
}


def _check_redirect(node: Any) -> None:
    if node.type not in FILE_REDIRECTS:
        if node.type.startswith("<<"):
            raise Unprovable("the command has a here-document")
        raise Unprovable(f"the command uses the redirection {node.type}")
    target = node.output
    if isinstance(target, int):  # 2>&1, >&2
        return
    _check_word(target)
    path = target.word
    if path in HARMLESS_TARGETS:
        return
    try:
        normalise_path(path)
    except Unprovable:
        raise Unprovable(f"the command redirects to {path}, outside the workspace") from None


def _shell_spec(pattern: str, spec: str) -> str:
    try:
        parts = shell_parts(spec)
    except Unprovable as exc:
        raise RuleError(f"`{pattern}`: {exc}; a shell rule is one plain command.") from None
    if len(parts) > 1:
        raise RuleError(
            f"`{pattern}` holds {len(parts)} commands: write one rule for each; a command "
            "joined with ;, &&, || or | is allowed when every part is."
        )
    return parts[0]


def _quoted(word: str) -> str:
    if word and not QUOTE_CHARS.search(word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


_SYNTAX = {
    "for": "a for loop",
    "while": "a while loop",
    "until": "an until loop",
    "if": "an if",
    "function": "a function",
}


def _syntax(node: Any) -> str:
    if node.kind == "compound":
        inner = [p for p in node.list if p.kind != "reservedword"]
        if len(inner) == 1 and inner[0].kind in _SYNTAX:
            return _SYNTAX[inner[0].kind]
        words = [p.word for p in node.list if p.kind == "reservedword"]
        return f"{words[0]} … {words[-1]}" if words else "a compound command"
    return _SYNTAX.get(node.kind, node.kind)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# --- paths -----------------------------------------------------------------------------


def normalise_path(raw: str) -> str:
    """A path as the file tools read it, relative to the workspace (`./src//a.py` is
    `src/a.py`, the workspace itself `.`); Unprovable when it leaves the workspace or
    could (absolute, `..`)."""
    if "\x00" in raw:
        raise Unprovable("the path holds a NUL character")
    if raw.startswith("/"):
        raise Unprovable(f"the path {raw} is absolute")
    names = [name for name in raw.split("/") if name not in ("", ".")]
    if ".." in names:
        raise Unprovable(f"the path {raw} climbs out with ..")
    return "/".join(names) or "."


def _path_spec(pattern: str, spec: str) -> str:
    try:
        return normalise_path(spec.strip())
    except Unprovable as exc:
        raise RuleError(
            f"`{pattern}`: {exc}; paths in rules are relative to the workspace."
        ) from None


# --- globs -----------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _glob(text: str, *, star: str) -> re.Pattern[str]:
    return re.compile(star.join(re.escape(piece) for piece in text.split("*")), re.S)


@lru_cache(maxsize=1024)
def _shell_glob(spec: str) -> re.Pattern[str]:
    if spec.endswith(" *"):
        # `pytest *` is pytest with any arguments, none included.
        return re.compile(_glob(spec[:-2], star=".*").pattern + "(?: .*)?", re.S)
    return _glob(spec, star=".*")


@lru_cache(maxsize=1024)
def _path_glob(spec: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(spec):
        if spec.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif spec.startswith("/**", i) and i + 3 == len(spec):
            out.append("(?:/.*)?")
            i += 3
        elif spec.startswith("**", i):
            out.append(".*")
            i += 2
        elif spec[i] == "*":
            out.append("[^/]*")
            i += 1
        else:
            out.append(re.escape(spec[i]))
            i += 1
    return re.compile("".join(out), re.S)
