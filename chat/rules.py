"""Permission rules: which tool calls run, wait for the user, or are refused without
asking (ARCHITECTURE.md, Permission rules).

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

Each simple command is matched as written and as what it runs: the program's name
without its folder (`/bin/rm` is `rm`), and the command a wrapper runs (`env A=1 rm`,
`timeout 5 rm`, `sudo rm`, `strace rm`, `uv run rm`: WRAPPERS, SUBCOMMANDS), with the
variables set before it and without them. A deny or ask rule matching any of these forms
decides; an allow rule must match every form but the one without variables (`timeout 60
git fetch` needs `timeout *` and `git *`). A program rules do not know may run its
arguments too: a deny or ask rule that matches a run of a command's arguments starting
with the rule's program (`rm x` in `mywrap rm x` or `git rm x` for `shell(rm *)`) asks.
A program that runs a string or commands it does not name (`eval`, `sh -c`, `xargs`,
`find -exec`, `source`, `sg`, `git -c alias.x=!cmd`: HIDING, SHELLS), a wrapper option
rules do not know, a wrapper with no command that runs a shell reading its input
(`chroot /`) and a program's name bash would expand (`/bin/r?`) are unprovable like the
rest. So are git's own ways to run a command: a config write of a setting that runs one
(`git config alias.x ...`, `core.pager`, hooks, filters, helpers: _GIT_RUNS), an option
or subcommand that runs one (`rebase -x`, `submodule foreach`: _GIT_RUN_OPTIONS; a long
option by any prefix git takes), a git command whose repository or HOME names one
(decide's `repository`), and a git command after a part of the same command that may
change files (`git clone SRC x && git -C x/b status`: Shell.writes). A write to git's
own files (`.git/`, `.gitconfig`) is allowed only by an allow rule that names them.

Paths are judged where they lead as well as as written: `decide` is given `resolve`,
which follows links as the file tools do (a link `src/h` to `.git/hooks` makes
`src/h/x` also `.git/hooks/x`); a deny or ask rule matching either decides, an allow
must match both, and a path that cannot be followed is unprovable. A redirection of a
shell command into the workspace is judged as a write_file call on its target (`>`,
`>>`, `>|`, `&>`, `&>>`, `>&`), a read_file call (`<`) or both (`<>`), by the deny and
ask rules of those tools that have a path: a deny denies the command, an ask asks. A
command a specifier rule allows is allowed only if every file it writes that way is one
a write_file allow rule allows (written and where it leads); otherwise no rule decides
(None: the tab's approval setting applies). A target rules cannot read (an expansion, a
pattern, outside the workspace), a command that may redirect out of sight (a
substitution, `sh -c`) and a target that does not exist yet after a part of the same
command that may make links (`ln -s .git g; echo x > g/config`: where it leads is made
by the command itself) are asked about when such a deny or ask rule exists, and never
allowed.

Rules see what a command says, not what the programs do: `cp`, `tee`, a script or
`python -c` write files and run commands rules never see. The shell's sandbox is the
boundary; rules decide what to run without asking.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

ALLOW = "allow"
ASK = "ask"
DENY = "deny"
ACTIONS = (ALLOW, ASK, DENY)

# Where a rule came from, as the audit trail and the approval card say it.
TAB = "tab"
USER = "user"
# A sub-agent's rules (chat.turn.agents): its parent tab's, and the deny and ask rules of the
# profile the model chose for it. Kept in the tab's rules with the source they came from.
PARENT = "parent"
PROFILE = "profile"
SOURCE_LABELS = {
    TAB: "this tab",
    USER: "your settings",
    PARENT: "the parent tab",
    PROFILE: "this tab's profile",
}

SHELL = "shell"
# The tools whose `path` argument a specifier matches (list_files defaults to ".").
PATH_TOOLS = frozenset({"read_file", "write_file", "list_files"})
# The same bound as PermissionRule.pattern's column.
MAX_PATTERN_CHARS = 500

# Redirection targets outside the workspace that write nowhere.
HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
# Redirections whose target is a file name, and the file tools whose path rules judge
# it as that tool's call on the path. Here-documents and here-strings (`<<`, `<<-`,
# `<<<`) are not in it: their text is input bash expands.
REDIRECT_TOOLS = {
    ">": ("write_file",),
    ">>": ("write_file",),
    ">|": ("write_file",),
    "&>": ("write_file",),
    ">&": ("write_file",),
    "&>>": ("write_file",),
    "<": ("read_file",),
    "<>": ("read_file", "write_file"),
}
FILE_REDIRECTS = frozenset(REDIRECT_TOOLS)
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

    def tail(self, part: Subject) -> str:
        """The run of a simple command's arguments, from a word that names this shell
        rule's program on, that the rule matches (`rm x` in `strace rm x` for
        `shell(rm *)`), or "": a program rules do not know may run its arguments."""
        if self.tool != SHELL or self.spec is None:
            return ""
        program = _glob(_program(self.spec), star=".*")
        tried = 0
        for i in range(1, len(part.words)):
            name = posixpath.basename(part.words[i]) or part.words[i]
            if program.fullmatch(name) is None:
                continue
            run = _text([(name, name)] + [(word, word) for word in part.words[i + 1 :]])
            tried += 1
            # Each try reads the rest of the command: a bound keeps a long one cheap.
            if tried > MAX_TAILS or self.matches(run):
                return run
        return ""


@dataclass(frozen=True)
class Subject:
    """One thing a call does that specifiers are matched against: a simple command, a
    path, a redirection."""

    # The forms an allow rule must match, each of them: the text as written first, then
    # what it turns out to be (the command a wrapper runs, where a link leads).
    every: tuple[str, ...]
    # Forms only deny and ask rules look at: a command without the variables set before it.
    extra: tuple[str, ...] = ()
    # How a decision names it, when the call's own text would not say (a link, a redirection).
    label: str = ""
    # A simple command's words as bash makes them, its program's first (Rule.tail).
    words: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return self.every[0]


@dataclass(frozen=True)
class Decision:
    """What rules decided about one call: the action and the rules that made it."""

    action: str
    rules: tuple[Rule, ...]
    # Why an "ask" was forced although no rule matched: what the checker could not read.
    unprovable: str = ""
    # What the deciding rule matched, when not the call as it reads (Subject.label).
    subject: str = ""

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
        text = f"{verb} by rule{plural} {labels}"
        return f"{text} for {self.subject}" if self.subject else text


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
    """Stored rules ({action, pattern}, and a sub-agent's `source`: PARENT or PROFILE,
    which names the rule's origin in place of `source`), and a sentence for each that
    cannot be used (edited elsewhere, imported, or from an older version): those are
    left out."""
    rules, problems = [], []
    for row in rows:
        action, pattern = str(row.get("action") or ""), str(row.get("pattern") or "")
        came = row.get("source")
        came = came if came in (PARENT, PROFILE) else source
        try:
            rules.append(parse(action, pattern, source=came))
        except RuleError as exc:
            where = SOURCE_LABELS.get(came, came)
            problems.append(f"The rule {action} `{pattern}` ({where}) is ignored: {exc}")
    return rules, problems


def decide(
    rules: Sequence[Rule],
    name: str,
    arguments: Mapping[str, Any],
    *,
    resolve: Callable[[str], str] | None = None,
    exists: Callable[[str], bool] | None = None,
    repository: Callable[[str], GitRepository] | None = None,
) -> Decision | None:
    """What the rules say about calling `name` with `arguments`; None when none decides
    (the user's approval setting applies).

    `repository` says what git run in a folder (from the same folder as `resolve`)
    would read that may name a command: the repository's settings and hooks, and the
    settings in HOME. A git command whose repository names one is unprovable (an
    alias, a pager or a hook runs what no rule sees); so is any git command when the
    folder it runs in is not known. Without `repository`, repositories are not read.

    `resolve` says where a workspace path leads once links are followed, as the file
    tools and the shell would follow them (chat.tools.files.resolve, from the tab's
    working directory); anything it raises makes that path unprovable. Without it,
    paths are judged as written. `exists` says whether a path (from the same folder)
    exists now: a shell redirection's target that does not may be a link an earlier
    part of the command makes, so it is unprovable then; without `exists`, every such
    target after a part that may make links is. That is stricter, and the runner's
    choice: an earlier part may also replace a path that exists (`rm -rf src; ln -s
    .git src; echo x > src/config`), which `exists` cannot see.

    Never raises: a call rules fail to read (a parser's shape they do not know) is
    unprovable, whatever the reason, so it is never allowed and a turn never crashes on it."""
    if not rules:
        return None
    try:
        return _decide(rules, name, arguments, resolve, exists, repository)
    except Exception as exc:
        logger.exception("rules could not read a %s call", name)
        return _failed(rules, name, exc)


def _failed(rules: Sequence[Rule], name: str, exc: Exception) -> Decision | None:
    """The decision on a call rules failed to read: a whole-tool deny still denies, any
    other deny or ask rule that might have had a say asks, nothing allows."""
    why = f"rules could not read the call ({type(exc).__name__}: {_first_line(exc)})"
    own = [rule for rule in rules if rule.applies_to(name) and rule.action != ALLOW]
    if whole := next((rule for rule in own if rule.action == DENY and rule.spec is None), None):
        return Decision(DENY, (whole,))
    if name == SHELL:
        own += [
            rule for rule in rules if rule.tool in PATH_TOOLS and rule.spec is not None
            and rule.action != ALLOW
        ]  # fmt: skip
    return Decision(ASK, (own[0],), unprovable=why) if own else None


def _decide(
    rules: Sequence[Rule],
    name: str,
    arguments: Mapping[str, Any],
    resolve: Callable[[str], str] | None,
    exists: Callable[[str], bool] | None,
    repository: Callable[[str], GitRepository] | None = None,
) -> Decision | None:
    own = [rule for rule in rules if rule.applies_to(name)]
    if name == SHELL:
        shell = read_shell(arguments.get("command"))
        why = shell.unprovable or shell.runs
        if not why and any(rule.spec is not None for rule in own):
            # Only a rule with a specifier reads the command: no need to read git's
            # settings (a few git processes) for the others.
            why = _git_repository_runs(shell, repository)
        main = _judge(own, shell.parts, why) if own else None
        if main is not None and main.action == DENY:
            return main
        side = _judge_redirects(rules, shell, resolve, exists)
        if side is not None and (side.action == DENY or main is None or main.action == ALLOW):
            return side
        if main is not None and main.action == ALLOW and main.rule.spec is not None:
            # `allow shell(echo *)` is not `echo x > src/main.py`: a file the command
            # writes must be one write_file rules allow too.
            writes = _allowed_writes(rules, shell, resolve, exists)
            if writes is None:
                return None
            main = Decision(ALLOW, tuple(dict.fromkeys(main.rules + writes)))
        return main
    if not own:
        return None
    if not any(rule.spec for rule in own):
        resolve = None  # no rule reads the path: no need to follow it
    try:
        parts = _path_subjects(name, arguments, resolve) if name in PATH_TOOLS else []
    except Unprovable as exc:
        return _judge(own, [], str(exc))
    decision = _judge(own, parts, "")
    if name == "write_file" and decision is not None and decision.action == ALLOW:
        git = [rule for rule in own if rule.action == ALLOW and _allows_git_files(rule)]
        if any(_git_file(f) and not any(r.matches(f) for r in git) for f in parts[0].every):
            return None
    return decision


def _judge(rules: Sequence[Rule], parts: Sequence[Subject], unprovable: str) -> Decision | None:
    """Deny, then ask, then allow; `unprovable` (why the call cannot all be read) keeps
    every specifier rule from allowing it and makes a deny or ask rule ask."""
    guard: Rule | None = None
    # A deny or ask rule's command among a command's arguments: an ask, as unprovable.
    tail: tuple[Rule, str] | None = None
    for action in (DENY, ASK):
        for rule in rules:
            if rule.action != action:
                continue
            if rule.spec is None:
                return Decision(action, (rule,))
            for part in parts:
                if any(rule.matches(form) for form in part.every + part.extra):
                    return Decision(action, (rule,), subject=part.label)
                if tail is None and (run := rule.tail(part)):
                    tail = (rule, f"the command {part.text} may run {run}")
            if unprovable:
                guard = guard or rule
    if guard is not None:
        return Decision(ASK, (guard,), unprovable=unprovable)
    if tail is not None:
        return Decision(ASK, (tail[0],), unprovable=tail[1])
    allows = [rule for rule in rules if rule.action == ALLOW]
    if whole := next((rule for rule in allows if rule.spec is None), None):
        return Decision(ALLOW, (whole,))
    if unprovable or not parts:
        return None
    chosen: list[Rule] = []
    for part in parts:
        for form in part.every:
            allowed = next((rule for rule in allows if rule.matches(form)), None)
            if allowed is None:
                return None
            if allowed not in chosen:
                chosen.append(allowed)
    return Decision(ALLOW, tuple(chosen))


def _judge_redirects(
    rules: Sequence[Rule],
    shell: Shell,
    resolve: Callable[[str], str] | None,
    exists: Callable[[str], bool] | None,
) -> Decision | None:
    """A shell command's redirections judged by the deny and ask rules of read_file and
    write_file that have a path: DENY or ASK, or None when none of them has a say."""
    path_rules = [
        rule for rule in rules if rule.spec is not None and rule.tool in PATH_TOOLS
        and rule.action != ALLOW
    ]  # fmt: skip
    if not path_rules:
        return None
    checks: list[tuple[str, Subject | None, str]] = []
    for tool in ("read_file", "write_file"):
        if shell.hidden:
            checks.append((tool, None, shell.hidden))
    for redirect in shell.redirects:
        what = redirect.what
        for tool in REDIRECT_TOOLS[redirect.op]:
            if redirect.why:
                # A pattern or a variable may still be judged by what it says as written.
                written = _path_or_none(redirect.path)
                subject = Subject((written,), label=what) if written else None
                checks.append((tool, subject, f"{what} {redirect.why}"))
                continue
            try:
                subject = _landing(redirect.where, resolve, what, what)
            except Unprovable as exc:
                checks.append((tool, None, str(exc)))
                continue
            # Matched as it leads now, and unprovable when an earlier part may change that.
            checks.append((tool, subject, _made_before(redirect, exists)))
    guard: tuple[Rule, str] | None = None
    for action in (DENY, ASK):
        for rule in path_rules:
            if rule.action != action:
                continue
            for tool, subject, why in checks:
                if not rule.applies_to(tool):
                    continue
                if subject is not None and any(rule.matches(form) for form in subject.every):
                    return Decision(action, (rule,), subject=subject.label)
                if why and guard is None:
                    guard = (rule, why)
    if guard is not None:
        return Decision(ASK, (guard[0],), unprovable=guard[1])
    return None


def _made_before(redirect: Redirect, exists: Callable[[str], bool] | None) -> str:
    """Why where `redirect` leads may be made by an earlier part of its command (a link
    made on the way: `ln -s .git g; echo x > g/config`), or "" when it cannot."""
    if not redirect.after_links:
        return ""
    try:
        there = exists is not None and exists(redirect.where)
    except Exception:  # the checker's refusal, whatever its type: not known to exist
        there = False
    if there:
        return ""
    return (
        f"the target of {redirect.what} does not exist yet (an earlier command may make it a link)"
    )


def _allowed_writes(
    rules: Sequence[Rule],
    shell: Shell,
    resolve: Callable[[str], str] | None,
    exists: Callable[[str], bool] | None,
) -> tuple[Rule, ...] | None:
    """The write_file allow rules that allow every file the command's redirections
    write, as a write_file call on it would be allowed; None when one is not."""
    allows = [rule for rule in rules if rule.action == ALLOW and rule.applies_to("write_file")]
    chosen: list[Rule] = []
    for redirect in shell.redirects:
        if "write_file" not in REDIRECT_TOOLS[redirect.op]:
            continue
        if redirect.why or _made_before(redirect, exists):
            return None
        try:
            subject = _landing(redirect.where, resolve, redirect.what, "")
        except Unprovable:
            return None
        for form in subject.every:
            git = _git_file(form)
            rule = next(
                (r for r in allows if r.matches(form) and (not git or _allows_git_files(r))),
                None,
            )
            if rule is None:
                return None
            chosen.append(rule)
    return tuple(chosen)


def _path_subjects(
    name: str, arguments: Mapping[str, Any], resolve: Callable[[str], str] | None
) -> list[Subject]:
    raw = arguments.get("path", "." if name == "list_files" else None)
    if not isinstance(raw, str):
        raise Unprovable("the call has no path")
    return [_landing(raw, resolve, f"the path {raw}", "")]


def _git_file(path: str) -> bool:
    """Whether a path is one of git's own files: a repository's config and hooks, a
    .git file naming a repository, the settings in HOME. Writing one may make a later
    git command run anything."""
    names = path.split("/")
    return ".git" in names or names[-1] == ".gitconfig" or "/".join(names[:2]) == ".config/git"


def _allows_git_files(rule: Rule) -> bool:
    """Whether an allow rule may allow writing git's own files: one that names them
    (`write_file(.git/hooks/pre-commit)`), or the whole tool; `write_file(**)` does not."""
    return rule.spec is None or ".git" in rule.spec or ".config/git" in rule.spec


def _landing(raw: str, resolve: Callable[[str], str] | None, what: str, label: str) -> Subject:
    """The path `raw` as written and where it leads: an allow must match both, a deny
    or ask either. Unprovable when it leaves the workspace or cannot be followed."""
    written = normalise_path(raw)
    if resolve is None:
        return Subject((written,), label=label)
    try:
        landed = normalise_path(resolve(raw))
    except Exception as exc:  # the resolver's refusal, whatever its type: never allowed
        raise Unprovable(f"{what} cannot be followed ({_first_line(exc)})") from None
    if landed == written:
        return Subject((written,), label=label)
    return Subject((written, landed), label=f"{label or raw}, a link to {landed}")


def natural(name: str, arguments: Mapping[str, Any]) -> str | None:
    """The rule "always allow" offers for a call, or None when no safe one exists: the
    exact command for the shell, the file's folder for write_file (the file itself at
    the top or inside a folder whose name starts with a dot), the tool's name for the
    rest. A command or path holding `*` would widen into a wildcard, so it gets none,
    like a command that is not one simple command, one that runs another (a wrapper, a
    path to the program: the rule would not allow the command inside), one that
    redirects to a file (the rule would not allow the write) and one that runs what
    rules cannot read."""
    try:
        return _natural(name, arguments)
    except Exception:
        logger.exception("rules could not read a %s call", name)
        return None


def _natural(name: str, arguments: Mapping[str, Any]) -> str | None:
    if name == SHELL:
        shell = read_shell(arguments.get("command"))
        if shell.unprovable or shell.runs or shell.redirects or len(shell.parts) != 1:
            return None
        (part,) = shell.parts
        if part.every != (part.text,) or "*" in part.text:
            return None
        return f"{SHELL}({part.text})"
    if name == "write_file":
        try:
            (part,) = _path_subjects(name, arguments, None)
        except Unprovable:
            return None
        path = part.text
        if "*" in path or path == ".":
            return None
        folder = posixpath.dirname(path)
        if any(name.startswith(".") for name in folder.split("/")):
            # .git, .github, .venv: a file there is code that runs; one file, not the folder.
            return f"write_file({path})"
        return f"write_file({folder}/**)" if folder else f"write_file({path})"
    return name


# --- shell commands --------------------------------------------------------------------


@dataclass(frozen=True)
class Redirect:
    """A redirection of a shell command to a file, once for each folder it may land in."""

    op: str
    # The target as written.
    path: str
    # Why rules cannot read the target ("" when they can).
    why: str = ""
    # The folder a `cd` before it may have moved to ("": where the command started).
    folder: str = ""
    # Whether an earlier part of the command may have made links (or moved files), so
    # that where a target that does not exist yet leads is not known before it runs.
    after_links: bool = False

    @property
    def where(self) -> str:
        return posixpath.join(self.folder, self.path) if self.folder else self.path

    @property
    def what(self) -> str:
        return f"the redirection {self.op} {self.path}" + (
            f" in {self.folder}" if self.folder else ""
        )


@dataclass
class Shell:
    """A shell command as rules read it."""

    # Its simple commands (Subject.every: as written, then each command it runs).
    parts: list[Subject] = field(default_factory=list)
    # Its redirections to files.
    redirects: list[Redirect] = field(default_factory=list)
    # Whether a part read so far may make links (any command but MAKES_NO_LINKS).
    links: bool = False
    # The folders a `cd` may have left the shell in by now ("": where it started); a cd
    # that fails leaves it where it was, so each is kept. None after a cd rules cannot
    # follow.
    dirs: list[str] | None = field(default_factory=lambda: [""])
    # The first reason its syntax cannot all be checked ("" when it can).
    unprovable: str = ""
    # The first reason one of its commands runs what rules cannot read (`sh -c`, a
    # wrapper's unknown option, a program's name as a pattern).
    runs: str = ""
    # The first reason it may run commands (or redirections) out of sight: a string it
    # runs, a substitution, syntax rules do not read.
    hidden: str = ""
    # The folders its git commands run in (`cd`, `git -C`); None when one is not known.
    git_dirs: list[str] | None = field(default_factory=list)
    # Why a part read so far may have written files (a program that may, a redirection,
    # a git command that changes the work tree), "" when none may: a git command after
    # it reads settings and hooks that were not there when rules read them.
    writes: str = ""
    # How many of its parts run git, and whether one pushes (another repository's
    # hooks run then: GitRepository.push_targets).
    gits: int = 0
    pushes: bool = False

    def cannot(self, reason: str, *, hides: bool = True) -> None:
        self.unprovable = self.unprovable or reason
        if hides:
            self.hidden = self.hidden or reason


def read_shell(command: object) -> Shell:
    """What rules read in a shell command: its simple commands, its redirections, and
    what they cannot read in it."""
    shell = Shell()
    if not isinstance(command, str):
        shell.cannot("the call has no command")
    elif not command.strip():
        shell.cannot("the command is empty")
    elif any(ord(ch) < 32 and ch not in "\n\t" for ch in command):
        # bash and bashlex may read a control character differently.
        shell.cannot("the command holds control characters")
    else:
        # Imported here: bashlex takes a tenth of a second to import, which every Django
        # process would pay at its start, and only a shell call checked against rules needs it.
        import bashlex

        try:
            trees = bashlex.parse(command)
        except Exception as exc:  # bashlex raises several types, NotImplementedError too
            shell.cannot(f"the command could not be parsed ({_first_line(exc)})")
        else:
            for tree in trees:
                _collect(tree, shell, command)
            if not shell.parts:
                shell.cannot("the command has no command in it")
    return shell


def _collect(node: Any, shell: Shell, source: str) -> None:
    kind = node.kind
    if kind == "command":
        _command(node, shell, source)
    elif kind == "list":
        for child in node.parts:
            if child.kind == "operator":
                if child.op not in SEPARATORS:
                    shell.cannot(f"the command uses the operator {child.op}", hides=False)
            else:
                _collect(child, shell, source)
    elif kind == "pipeline":
        gits, writes = shell.gits, shell.writes
        for child in node.parts:
            if child.kind == "pipe":
                continue
            if child.kind == "reservedword":  # `! cmd`
                shell.cannot(f"the command uses {child.word}", hides=False)
                continue
            _collect(child, shell, source)
        if shell.gits > gits and shell.writes and not writes:
            # A pipeline's parts run together: a writer after git may write before it reads.
            _git_after_writes(shell, f"git runs beside a part that {shell.writes}")
    else:
        shell.cannot(f"the command uses syntax rules do not read ({_syntax(node)})")


def _command(node: Any, shell: Shell, source: str) -> None:
    # Its own redirections are opened before it runs but write after git has read.
    writes_before = shell.writes
    written: list[str] = []
    # The words as bash makes them (braces expanded), each with its text in the command.
    words: list[tuple[str, str]] = []
    assignments = 0
    for part in node.parts:
        if part.kind in ("word", "assignment"):
            written.append(part.word)
            if _check_word(part, shell):
                words.append((part.word, part.word))
                continue
            raw = source[part.pos[0] : part.pos[1]]
            if part.kind == "assignment" and len(words) == assignments:
                assignments += 1
                words.append((part.word, raw))
                continue
            expanded = _braces(raw)
            if expanded is None:
                shell.cannot("the command has a brace expansion rules do not read", hides=False)
                expanded = [raw]
            words.extend((_dequoted(one), one) for one in expanded)
        elif part.kind == "redirect":
            _redirect(part, shell, source)
        else:
            shell.cannot(f"the command uses syntax rules do not read ({_syntax(part)})")
    if not words:
        shell.cannot("the command is only a redirection", hides=False)
        return
    literal = " ".join(_quoted(word) for word in written)
    every, extra, runs, inner = _forms(literal, words[:assignments], words[assignments:])
    if runs:
        shell.runs = shell.runs or runs
        shell.hidden = shell.hidden or runs
    shell.parts.append(Subject(every, extra, words=tuple(word for word, _ in words[assignments:])))
    may_link = bool(runs or not inner or inner[0][0] not in MAKES_NO_LINKS)
    shell.links = shell.links or may_link
    if inner and inner[0][0] == "git":
        args = [word for word, _ in inner[1:]]
        _git_folders(shell, args)
        shell.gits += 1
        sub = args[_git_subcommand(args)[0] :][:1]
        shell.pushes = shell.pushes or sub in (["push"], ["send-pack"])
        if writes_before:
            _git_after_writes(shell, f"the command {literal} runs git after a part that "
                              f"{writes_before}")  # fmt: skip
        if what := _git_writes(args):
            shell.writes = shell.writes or f"runs {what}, which may change files"
    elif may_link and not shell.writes:
        shell.writes = f"runs {inner[0][0] if inner else words[0][0]}, which may write files"
    if any("CDPATH" in word for word in written):
        shell.dirs = None
    elif inner and inner[0][0] in CHANGES_DIR:
        _change_dir(shell, inner)


def _git_after_writes(shell: Shell, why: str) -> None:
    """A git command that may read what an earlier part wrote: an alias, a pager, a hook
    its repository names by then was not there when rules read it (`git clone SRC x &&
    git -C x/b status`, `git checkout evil && git log` with a tracked .gitconfig)."""
    shell.runs = shell.runs or why
    shell.hidden = shell.hidden or why


def _check_word(word: Any, shell: Shell) -> str:
    """Why bash may read `word` as something else than its text ("" when it cannot)."""
    for part in getattr(word, "parts", ()) or ():
        what = _EXPANSIONS.get(part.kind, "an expansion")
        shell.cannot(f"the command has {what}", hides=part.kind not in _VISIBLE_EXPANSIONS)
        return f"has {what}"
    return ""


_EXPANSIONS = {
    "commandsubstitution": "a command substitution",
    "processsubstitution": "a process substitution",
    "parameter": "a variable expansion",
    "tilde": "a ~ expansion",
}
# Expansions that make a word unknown but run nothing.
_VISIBLE_EXPANSIONS = frozenset({"parameter", "tilde"})


def _redirect(node: Any, shell: Shell, source: str) -> None:
    target = node.output
    if node.type in (">&", "<&") and (isinstance(target, int) or target == "-"):
        return  # 2>&1, >&2, <&0 copy a descriptor, 2>&- closes one: no file either way
    if node.type not in FILE_REDIRECTS:
        if node.type.startswith("<<"):
            # The text of a here-document is expanded: it may run commands.
            shell.cannot("the command has a here-document")
        else:
            shell.cannot(f"the command uses the redirection {node.type}", hides=False)
        return
    if not isinstance(getattr(target, "word", None), str):
        shell.cannot(f"the command uses the redirection {node.type} in a way rules do not read")
        return
    path = target.word
    why = _check_word(target, shell)
    if not why:
        raw = source[target.pos[0] : target.pos[1]]
        path = _dequoted(raw)
        if _is_pattern(raw):
            why = "is a pattern bash expands"
    if not why and path in HARMLESS_TARGETS:
        return
    if "write_file" in REDIRECT_TOOLS[node.type]:
        shell.writes = shell.writes or f"writes {path}"
    if not why and (problem := _path_problem(path)):
        shell.cannot(f"the command redirects to {path}, outside the workspace", hides=False)
        why = problem
    if why or shell.dirs is None:
        why = why or "comes after a change of folder rules cannot follow"
        shell.redirects.append(Redirect(node.type, path, why))
        return
    for folder in shell.dirs:
        shell.redirects.append(Redirect(node.type, path, "", folder, shell.links))


# Programs that make no links and move no files (their own redirections are judged on
# their own): a redirection after them lands where it would land before the command.
MAKES_NO_LINKS = frozenset(
    {"cd", "pushd", "popd", "mkdir", "touch", "echo", "printf", "true", "false", ":", "pwd",
     "ls", "cat", "test", "["}
)  # fmt: skip


# Builtins that change the folder later redirections are relative to (CDPATH and
# `shopt -s cdable_vars` change where cd goes).
CHANGES_DIR = frozenset({"cd", "pushd", "popd", "shopt"})
# The most folders rules follow a command's cds into.
MAX_DIRS = 8


def _change_dir(shell: Shell, words: list[tuple[str, str]]) -> None:
    args = [(word, raw) for word, raw in words[1:] if word != "--" and not (
        word.startswith("-") and len(word) > 1)]  # fmt: skip
    if shell.dirs is None or words[0][0] not in ("cd", "pushd") or len(args) != 1:
        shell.dirs = None
        return
    word, raw = args[0]
    unknown = word in ("-", "") or word[0] in "+~" or "$" in word or "`" in word
    if unknown or _path_problem(word) or _is_pattern(raw):
        shell.dirs = None
        return
    moved = [normalise_path(posixpath.join(folder, word)) for folder in shell.dirs]
    dirs = list(dict.fromkeys([*shell.dirs, *moved]))
    shell.dirs = dirs if len(dirs) <= MAX_DIRS else None


# --- commands that run other commands ---------------------------------------------------


@dataclass(frozen=True)
class Wrapper:
    """How a program that runs the command after its own arguments reads them, so that
    rules can see the command it runs."""

    flags: str = ""  # one-letter options alone
    valued: str = ""  # one-letter options that take a value (the next word, or the rest)
    long_flags: frozenset[str] = frozenset()
    long_valued: frozenset[str] = frozenset()
    operands: int = 0  # words before the command (timeout's duration)
    assignments: bool = False  # NAME=value words before the command (env, sudo)
    numeric: bool = False  # `-5` is a value (nice)
    # Options whose value is a command line in one string, or that make it read one.
    hides: str = ""
    long_hides: frozenset[str] = frozenset()
    # Every long option is one word (`--name` or `--name=value`: firejail).
    long_any: bool = False
    # With no command, it runs a shell that reads its commands from its input.
    empty_reads: bool = False


def _longs(*names: str) -> frozenset[str]:
    return frozenset(names)


def _split(names: str) -> frozenset[str]:
    return frozenset(names.split())


# The programs rules look through: a deny or ask rule matches the command they run too.
# Their options are read as their manuals give them; one rules do not know makes the
# command unprovable rather than a guess at where the inner command starts.
WRAPPERS = {
    "command": Wrapper(flags="pvV"),
    "builtin": Wrapper(),
    "exec": Wrapper(flags="cl", valued="a"),
    "env": Wrapper(
        flags="i0v",
        valued="uC",
        long_flags=_longs(
            "ignore-environment",
            "null",
            "debug",
            "ignore-signal",
            "default-signal",
            "block-signal",
            "list-signal-handling",
        ),
        long_valued=_longs("unset", "chdir"),
        assignments=True,
        hides="S",
        long_hides=_longs("split-string"),
    ),  # fmt: skip
    "nice": Wrapper(valued="n", long_valued=_longs("adjustment"), numeric=True),
    "nohup": Wrapper(),
    "timeout": Wrapper(
        flags="v",
        valued="sk",
        long_flags=_longs("foreground", "preserve-status", "verbose"),
        long_valued=_longs("signal", "kill-after"),
        operands=1,
    ),
    "sudo": Wrapper(
        flags="AbEeHiKklnPSsVv",
        valued="CDghpRrTtUu",
        long_flags=_longs(
            "askpass",
            "background",
            "bell",
            "edit",
            "set-home",
            "login",
            "remove-timestamp",
            "reset-timestamp",
            "list",
            "non-interactive",
            "preserve-groups",
            "shell",
            "stdin",
            "validate",
            "preserve-env",
        ),
        long_valued=_longs(
            "close-from",
            "chdir",
            "chroot",
            "group",
            "host",
            "prompt",
            "role",
            "type",
            "command-timeout",
            "other-user",
            "user",
        ),
        assignments=True,
    ),  # fmt: skip
    "doas": Wrapper(flags="ns", valued="uC"),
    "stdbuf": Wrapper(valued="ioe", long_valued=_longs("input", "output", "error")),
    "setsid": Wrapper(flags="cfw", long_flags=_longs("ctty", "fork", "wait")),
    "ionice": Wrapper(
        flags="t",
        valued="cn",
        long_flags=_longs("ignore"),
        long_valued=_longs("class", "classdata"),
    ),
    "time": Wrapper(
        flags="apqvV",
        valued="fo",
        long_flags=_longs("append", "portability", "quiet", "verbose"),
        long_valued=_longs("format", "output"),
    ),
    "busybox": Wrapper(),
    "toybox": Wrapper(),
    "strace": Wrapper(
        flags="cCdDfFhiknqrtTvVwxyzZ",
        valued="abeEIoOpPsSuUX",
        long_flags=_split(
            "follow-forks output-separately summary-only summary quiet verbose timestamps "
            "syscall-times decode-fds no-abbrev absolute-timestamps relative-timestamps "
            "instruction-pointer stack-trace seccomp-bpf daemonize kill-on-exit "
            "summary-wall-clock"
        ),
        long_valued=_split(
            "output trace signal status string-limit user env attach trace-path abbrev "
            "verbose raw read write inject fault"
        ),
    ),
    "ltrace": Wrapper(
        flags="bcCfhiLrStTV",
        valued="aADeFlnopsuwx",
        long_flags=_longs("demangle", "help", "version"),
        long_valued=_longs("output", "library", "config", "indent", "align"),
    ),
    "taskset": Wrapper(flags="acp", long_flags=_longs("all-tasks", "cpu-list", "pid"), operands=1),
    "chrt": Wrapper(
        flags="abdefiomprRv",
        valued="TPD",
        long_flags=_split(
            "all-tasks batch deadline ext fifo idle other rr reset-on-fork max pid verbose"
        ),
        long_valued=_longs("sched-runtime", "sched-period", "sched-deadline"),
        operands=1,
    ),
    "chroot": Wrapper(
        long_flags=_longs("skip-chdir"),
        long_valued=_longs("userspec", "groups"),
        operands=1,
        empty_reads=True,
    ),
    "unshare": Wrapper(
        flags="imnpuUCTfrc",
        valued="RwSG",
        long_flags=_split(
            "mount uts ipc net pid user cgroup time fork map-root-user map-current-user "
            "map-auto mount-proc mount-binfmt kill-child keep-caps"
        ),
        long_valued=_split(
            "propagation setgroups root wd setuid setgid map-user map-group map-users "
            "map-groups monotonic boottime load-interp"
        ),
        empty_reads=True,
    ),
    "nsenter": Wrapper(
        # -r and -w take a folder only when it is attached (-r/x): that is unprovable.
        flags="amuinpUCTFZrw",
        valued="tSG",
        long_flags=_split(
            "all mount uts ipc net pid user cgroup time root wd no-fork "
            "preserve-credentials follow-context user-parent env"
        ),
        long_valued=_longs("target", "setuid", "setgid", "wdns"),
        empty_reads=True,
    ),
    "fakeroot": Wrapper(
        flags="uhv",
        valued="lsib",
        long_flags=_longs("unknown-is-real", "help", "version"),
        long_valued=_longs("lib", "faked"),
        empty_reads=True,
    ),
    "firejail": Wrapper(long_any=True, empty_reads=True),
    "systemd-run": Wrapper(
        flags="dtPGqr",
        valued="upEHM",
        long_flags=_split(
            "scope user system wait no-block pty pipe collect quiet remain-after-exit "
            "same-dir no-ask-password send-sighup slice-inherit"
        ),
        long_valued=_split(
            "unit property setenv host machine uid gid nice working-directory description "
            "slice service-type on-active on-boot on-startup on-unit-active "
            "on-unit-inactive on-calendar timer-property path-property socket-property"
        ),
        hides="S",
        long_hides=_longs("shell"),
    ),
    "pkexec": Wrapper(
        long_flags=_longs("disable-internal-agent", "keep-cwd"),
        long_valued=_longs("user"),
        empty_reads=True,
    ),
    "caffeinate": Wrapper(flags="dimsu", valued="tw"),
    "npx": Wrapper(
        flags="yq",
        valued="p",
        long_flags=_longs("yes", "no", "quiet", "ignore-existing"),
        long_valued=_longs("package"),
        hides="c",
        long_hides=_longs("call"),
    ),
    "bunx": Wrapper(valued="p", long_flags=_longs("bun"), long_valued=_longs("package")),
    "uvx": Wrapper(
        flags="qv",
        valued="pw",
        long_flags=_split("isolated quiet verbose offline no-cache refresh no-project native-tls"),
        long_valued=_split(
            "from with with-editable with-requirements python index default-index index-url "
            "extra-index-url find-links cache-dir directory project config-file"
        ),
    ),
}

# Programs whose subcommand runs the command after its own options (`uv run pytest`):
# read as wrappers from the subcommand on.
_PACKAGE_RUN = Wrapper(
    flags="qvy",
    valued="p",
    long_flags=_longs("quiet", "verbose", "yes", "no"),
    long_valued=_longs("package"),
    hides="c",
    long_hides=_longs("call", "shell-mode"),
)
SUBCOMMANDS = {
    ("uv", "run"): Wrapper(
        flags="qvms",
        valued="pw",
        long_flags=_split(
            "no-project frozen locked isolated no-sync all-extras no-dev dev all-packages "
            "all-groups active no-env-file quiet verbose offline no-cache exact refresh "
            "script module gui-script only-dev no-editable native-tls"
        ),
        long_valued=_split(
            "with with-editable with-requirements python project directory package extra "
            "group only-group no-group env-file index default-index index-url "
            "extra-index-url find-links config-file cache-dir"
        ),
    ),
    ("npm", "exec"): _PACKAGE_RUN,
    ("npm", "x"): _PACKAGE_RUN,
    ("pnpm", "exec"): _PACKAGE_RUN,
    ("pnpm", "dlx"): _PACKAGE_RUN,
    ("yarn", "exec"): _PACKAGE_RUN,
    ("yarn", "dlx"): _PACKAGE_RUN,
    ("bun", "x"): _PACKAGE_RUN,
    ("poetry", "run"): Wrapper(),
    ("pipenv", "run"): Wrapper(),
    ("pdm", "run"): Wrapper(),
    ("hatch", "run"): Wrapper(),
    ("bundle", "exec"): Wrapper(long_flags=_longs("keep-file-descriptors")),
    ("conda", "run"): Wrapper(
        valued="np",
        long_flags=_longs("no-capture-output", "live-stream"),
        long_valued=_longs("name", "prefix", "cwd"),
    ),
    ("pipx", "run"): Wrapper(
        flags="qv",
        long_flags=_longs("no-cache", "quiet", "verbose", "path", "pypackages"),
        long_valued=_longs("spec", "python", "index-url", "pip-args"),
    ),
}

# Programs that run a command given as one string, read from their input or from a
# file, or commands they build: what they run is out of the rules' sight.
HIDING = {
    "eval": "runs a string as a command",
    "source": "runs the commands in a file in this shell",
    ".": "runs the commands in a file in this shell",
    "xargs": "runs commands it builds from its input",
    "parallel": "runs commands it builds from its arguments and input",
    "watch": "runs a string as a command",
    "trap": "runs a string as a command later",
    "alias": "renames commands",
    "su": "runs a shell that reads its commands",
    "runuser": "runs a shell that reads its commands",
    "flock": "runs a command rules do not read",
    "script": "runs a shell that reads its commands",
    "sg": "runs a string as a command",
    "newgrp": "runs a shell that reads its commands",
}
# Shells: `sh -c STRING` runs a string, `sh` alone (or -s, -i) reads the commands it
# runs from its input; `sh FILE` runs a script, like any program.
SHELLS = frozenset(
    {"sh", "bash", "rbash", "dash", "ash", "zsh", "ksh", "mksh", "yash", "fish", "csh", "tcsh"}
)
# find's actions that run a command for each file.
FIND_RUNS = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
# More wrappers than this in one command is not a command, it is a puzzle.
MAX_WRAPPERS = 8

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def _forms(
    literal: str, assignments: list[tuple[str, str]], words: list[tuple[str, str]]
) -> tuple[tuple[str, ...], tuple[str, ...], str, list[tuple[str, str]]]:
    """A simple command's forms (as written, then as bash makes its words, with its
    program's name alone and through each wrapper), the same without the variables set
    before them, why it runs something rules cannot read ("" when it does not), and the
    innermost command read (its name alone)."""
    every = [literal]
    extra: list[str] = []
    hidden = ""
    inner: list[tuple[str, str]] = []
    for _ in range(MAX_WRAPPERS + 1):
        if not words:
            break
        word, raw = words[0]
        if _is_pattern(raw):
            hidden = f"the command name {word} is a pattern bash expands"
            break
        name = posixpath.basename(word) or word
        args = words[1:]
        inner = [(name, raw), *args]
        every.append(_text(assignments + [(name, name)] + args))
        extra.append(_text([(name, name)] + args))
        hidden = _hides(name, [arg for arg, _ in args]) or _git_config(name, assignments)
        wrapper, label = WRAPPERS.get(name), name
        if wrapper is None and args and (name, args[0][0]) in SUBCOMMANDS:
            wrapper, label = SUBCOMMANDS[name, args[0][0]], f"{name} {args[0][0]}"
            args = args[1:]
        if hidden or wrapper is None:
            break
        try:
            more, words = _unwrap(wrapper, label, args)
        except Unprovable as exc:
            hidden = str(exc)
            break
        if not words and wrapper.empty_reads:
            hidden = f"the command {label} with no command runs a shell that reads its commands"
            break
        assignments = assignments + more
    else:
        hidden = f"the command is wrapped more than {MAX_WRAPPERS} times"
    every = list(dict.fromkeys(every))
    extra = [form for form in dict.fromkeys(extra) if form not in every]
    return tuple(every), tuple(extra), hidden, inner


# git's settings whose value is a command it runs (`alias.x=!cmd`, or any alias: it may
# run `config` to write one), a pager, an editor, a helper, a hook folder or hook, a
# transport that runs one, a folder it copies hooks from, a typo it runs corrected
# (help.autocorrect: `git rebse --exec=cmd`), or that read more settings from a file.
# A submodule's `update` may be `!cmd`, and a URL rewritten (insteadOf) may make a push
# one to a folder, whose hooks run (see _local_repository). The rest of
# git-config(1)'s list, by section and by the last part's name (`*command`, `*cmd`,
# `*program`: gpg.ssh.defaultKeyCommand, core.alternateRefsCommand, sendemail.ccCmd), so a
# key added later under such a name is caught too. Matched on the whole key, any case
# (git reads sections and names in any case; a subsection matched loosely asks more).
_GIT_RUNS = re.compile(
    r"(alias|include|includeif|pager|sendemail|protocol|uploadpack|help|man|instaweb|imap"
    r"|browser|web|hook|difftool|mergetool|guitool)\..*"
    r"|core\.(fsmonitor|hookspath|worktree)|diff\.external|init\.templatedir"
    r"|interactive\.difffilter"
    r"|receive\.procreceiverefs|submodule\..*\.update|url\..*\.(pushinsteadof|insteadof)"
    r"|.*\.[^.]*(command|cmd|program|helper|editor|pager|proxy|hook|askpass|textconv|tool"
    r"|browser|viewer)"
    r"|.*\.(process|clean|smudge|driver|path|uploadpack|receivepack|httpd|tunnel|vcs)",
    re.IGNORECASE | re.S,
)
# Variables naming what git reads settings, programs or its repository from.
_GIT_VARIABLES = (
    "GIT_CONFIG", "GIT_EXEC_PATH", "GIT_PAGER", "GIT_EDITOR", "GIT_SSH", "GIT_DIR",
    "GIT_COMMON_DIR", "GIT_EXTERNAL_DIFF", "GIT_SEQUENCE_EDITOR", "GIT_ASKPASS",
    "GIT_PROXY_COMMAND", "GIT_TEMPLATE_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM", "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    # git runs these when its own settings name none
    "PAGER", "EDITOR", "VISUAL", "BROWSER", "LESSOPEN", "LESSCLOSE", "SSH_ASKPASS",
)  # fmt: skip
# git's own options before its subcommand that take the next word as their value.
_GIT_VALUED = frozenset(
    {"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--super-prefix", "--attr-source"}
)
# Options of git's subcommands whose value is a command it runs (or a folder it copies
# hooks from, a repository whose hooks run), the subcommand's own subcommands that run
# one (a word: `submodule foreach`), and subcommands that run one whatever they are given
# (""). A long option is matched by any prefix git would take for it (`--exe=`: git's
# parse-options accepts a unique prefix), a one-letter one anywhere in a cluster (`-iO`).
_GIT_RUN_OPTIONS = {
    "grep": ("-O", "--open-files-in-pager"),
    "rebase": ("-x", "--exec"),
    "difftool": ("-x", "--extcmd", "-t", "--tool"),
    "mergetool": ("-t", "--tool"),
    "fetch": ("--upload-pack",),
    "pull": ("--upload-pack",),
    "clone": ("-u", "--upload-pack", "--template", "-c", "--config"),
    "init": ("--template",),
    "ls-remote": ("--upload-pack",),
    "push": ("--receive-pack", "--exec", "--repo"),
    "archive": ("--exec", "--remote"),
    "send-pack": ("--receive-pack", "--exec"),
    "fetch-pack": ("--upload-pack", "--exec"),
    "submodule": ("foreach",),
    "bisect": ("run",),
    "help": ("-w", "--web"),
    "config": ("-e", "--edit", "edit", "--rename-section", "rename-section"),
    # servers, browsers and helpers that run programs or another repository's hooks
    **dict.fromkeys(
        ("filter-branch", "send-email", "daemon", "instaweb", "web--browse", "credential",
         "credential-cache", "credential-cache--daemon", "credential-store", "p4", "svn",
         "cvsimport", "cvsexportcommit", "cvsserver", "archimport", "upload-archive",
         "upload-pack", "receive-pack", "remote-ext", "shell", "merge-index", "maintenance",
         "difftool--helper", "for-each-repo", "submodule--helper"),
        ("",),
    ),
}  # fmt: skip
# git's own options that name a repository or settings rules do not read, or a folder it
# runs its programs from (--exec-path alone only prints it).
_GIT_OWN_RUNS = {
    "--config-env": "reads a setting that may run a string",
    "--git-dir": "names a repository rules do not read",
    "--exec-path=": "runs its programs from a folder",
}
# Subcommands that change no file outside .git (so a git command after them reads the
# settings and hooks it was judged by), and subcommands of theirs that do not either:
# any other may write the work tree (a checkout of a tracked .gitconfig in HOME, of a
# bare repository's config in a subfolder), make a repository, or remove one.
_GIT_KEEPS_FILES = frozenset(
    {"status", "log", "show", "diff", "grep", "blame", "annotate", "shortlog", "describe",
     "rev-parse", "rev-list", "ls-files", "ls-tree", "ls-remote", "cat-file", "show-ref",
     "for-each-ref", "show-branch", "branch", "tag", "remote", "config", "add", "commit",
     "fetch", "push", "version", "help", "whatchanged", "count-objects", "fsck", "name-rev",
     "var", "check-ignore", "check-attr", "check-ref-format", "merge-base", "cherry",
     "range-diff", "notes", "hash-object", "update-index", "update-ref", "symbolic-ref",
     "verify-commit", "verify-tag", "diff-files", "diff-index", "diff-tree", "reflog",
     "gc", "prune", "repack", "pack-refs", "write-tree", "commit-tree", "mktree"}
)  # fmt: skip
_GIT_KEEPS_FILES_VERBS = frozenset(
    {("stash", "list"), ("stash", "show"), ("worktree", "list"), ("submodule", ""),
     ("submodule", "status"), ("submodule", "summary"), ("bisect", "log"),
     ("bisect", "terms")}
)  # fmt: skip
# What git's own config command reads, so writes nothing.
_GIT_CONFIG_READS = frozenset({"--get", "--get-all", "--get-regexp", "--get-urlmatch", "-l",
    "--list", "--get-color", "--get-colorbool", "--unset", "--unset-all", "--remove-section",
    "get", "list", "unset", "remove-section"})  # fmt: skip
_GIT_CONFIG_VALUED = ("-f", "--file", "--blob", "--type", "--default", "--comment", "--value")


@dataclass(frozen=True)
class GitRepository:
    """What git run in a folder reads that may name a command (decide's `repository`)."""

    # The keys of its settings (`core.pager`), the repository's and HOME's.
    settings: tuple[str, ...] = ()
    # The hooks it would run (`.git/hooks/pre-commit`): any file there but a sample.
    hooks: tuple[str, ...] = ()
    # Where its pushes may go: remotes' URLs, and the remote names its settings give
    # (git takes a name no remote has for a URL). A folder's hooks run on a push to it.
    push_targets: tuple[str, ...] = ()


def _git_runs(setting: str) -> bool:
    """Whether a git setting (`key`, or `key=value` as `git -c` gives it) may run a
    command. An alias whose value is seen runs one if it starts with `!` or if the git
    command it stands for does (`config core.pager ...`); one whose value is not seen may."""
    key, given, value = setting.partition("=")
    if given and key.strip().lower().startswith("alias."):
        try:
            words = shlex.split(value)
        except ValueError:
            return True
        return value.lstrip().startswith("!") or bool(_git_hides(words))
    return _GIT_RUNS.fullmatch(key.strip()) is not None


def _git_config(name: str, assignments: list[tuple[str, str]]) -> str:
    """Why git, given these variables, may run a string from its settings, or ""."""
    if name != "git":
        return ""
    for word, _ in assignments:
        if word.startswith(_GIT_VARIABLES):
            variable = word.split("=", 1)[0]
            return f"the command git reads settings from {variable}, which may run a string"
    return ""


def _git_subcommand(args: list[str]) -> tuple[int, str]:
    """Where git's subcommand is among its words, and why git's own options may run a
    string ("" when they cannot)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        # git reads its own options whole, but a prefix costs only an ask: no guessing.
        for option, why in _GIT_OWN_RUNS.items():
            if _long_prefix(arg, option.rstrip("=")) and ("=" in arg or option[-1] != "="):
                return i, f"the command git {option} {why}"
        if arg == "-c" and i + 1 < len(args) and _git_runs(args[i + 1]):
            key = args[i + 1].split("=", 1)[0]
            return i, f"the command git -c {key} runs a string as a command"
        i += 2 if arg in _GIT_VALUED else 1
    return i, ""


def _git_hides(args: list[str]) -> str:
    """Why git run with `args` runs what rules cannot read, or ""."""
    i, why = _git_subcommand(args)
    if why or i >= len(args):
        return why
    sub, rest = args[i], args[i + 1 :]
    verb = _git_verb(rest)
    for option in _GIT_RUN_OPTIONS.get(sub, ()):
        if not option or option == verb or any(_git_option(arg, option) for arg in rest):
            shown = f" {option}" if option else ""
            return f"the command git {sub}{shown} runs a command rules do not read"
    target = _git_verb(rest, valued=("-o", "--push-option"))
    if sub in ("push", "send-pack") and _local_repository(target):
        # receive-pack runs in that repository, with its hooks, which no rule has read
        return f"the command git {sub} {target} runs the hooks of a repository rules do not read"
    if sub == "config":
        return _git_config_write(rest)
    return ""


def _git_option(arg: str, option: str) -> bool:
    """Whether the word `arg` gives git's option `option` (`--exec`, `-x`): a long one by
    any prefix (`--exe=cmd`), a one-letter one anywhere in a cluster (`-iO'cmd'`). A
    letter that is another option's value (`-eO`) is asked about too: no guessing."""
    if option.startswith("--"):
        return _long_prefix(arg, option)
    if option.startswith("-"):
        return arg.startswith("-") and not arg.startswith("--") and option[1] in arg[1:]
    return False


def _long_prefix(arg: str, option: str) -> bool:
    """Whether `arg` (`--name` or `--name=value`) names a prefix of the long `option`."""
    name = arg.split("=", 1)[0]
    return name.startswith("--") and len(name) > 2 and option.startswith(name)


def _git_verb(rest: list[str], valued: tuple[str, ...] = ()) -> str:
    """A git subcommand's own subcommand (`foreach` in `submodule --quiet foreach`), or
    its first operand (push's repository): its first word that is not an option or the
    value of one of the `valued` options, or ""."""
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        given = rest[i] in valued or any(_long_prefix(rest[i], o) for o in valued)
        i += 2 if given and "=" not in rest[i] else 1
    return rest[i] if i < len(rest) else ""


def _local_repository(target: str) -> bool:
    """Whether a push's destination is a folder (`../bare`, `file://…`), not a remote's
    name or a URL (`host:path`, `https://…`)."""
    if target.startswith("file:"):
        return True
    if not target or "://" in target or ":" in target.split("/", 1)[0]:
        return False
    return "/" in target or target.startswith((".", "~"))


def _git_writes(args: list[str]) -> str:
    """The git command (`git checkout`) when `args` may change files a later git command
    reads (its settings in HOME, a repository's config or hooks, where one is), or ""."""
    i, _ = _git_subcommand(args)
    if i >= len(args):
        return ""
    sub, rest = args[i], args[i + 1 :]
    if output := next((arg for arg in rest if _long_prefix(arg, "--output")), None):
        return f"git {sub} {output}"
    verb = _git_verb(rest)
    if sub == "remote" and verb not in ("", "show", "get-url"):
        return f"git remote {verb}"  # a remote's URL: where a later push goes
    if sub == "config" and any(arg.lower().startswith(("remote.", "branch.")) for arg in rest):
        return "git config"  # the same, by its settings
    if sub in _GIT_KEEPS_FILES or (sub, verb) in _GIT_KEEPS_FILES_VERBS:
        return ""
    if sub in ("checkout", "switch") and len(rest) == 2 and rest[0] in ("-b", "-c"):
        return ""  # a new branch where HEAD is: the files stay as they are
    return f"git {sub}"


def _git_config_write(args: list[str]) -> str:
    """Why `git config ARGS` may write a setting that runs a command, or ""."""
    positional: list[str] = []
    writes = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-") and len(arg) > 1:
            if arg in _GIT_CONFIG_READS:
                return ""
            writes = writes or arg in ("--add", "--replace-all")
            # `--fil x` is `--file x` to git: its value is not the key
            valued = arg == "-f" or any(_long_prefix(arg, o) for o in _GIT_CONFIG_VALUED)
            i += 2 if valued and "=" not in arg else 1
            continue
        positional.append(arg)
        i += 1
    if positional[:1] == ["set"]:
        positional, writes = positional[1:], True
    elif positional[:1] and positional[0] in _GIT_CONFIG_READS:
        return ""
    if not positional or not (writes or len(positional) >= 2):
        return ""
    if _git_runs(positional[0]):
        return f"the command git config writes {positional[0]}, a setting that runs a command"
    return ""


def _git_folders(shell: Shell, args: list[str]) -> None:
    """Note the folders a git command runs in: the shell's, moved by its -C options."""
    if shell.git_dirs is None:
        return
    if shell.dirs is None:
        shell.git_dirs = None
        return
    folders = list(shell.dirs)
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] == "-C" and i + 1 < len(args):
            moved = args[i + 1]
            if _path_problem(moved) or moved.startswith("~"):
                shell.git_dirs = None
                return
            folders = [posixpath.join(folder, moved) for folder in folders]
        i += 2 if args[i] in _GIT_VALUED else 1
    shell.git_dirs = list(
        dict.fromkeys(shell.git_dirs + [normalise_path(f or ".") for f in folders])
    )


def _git_repository_runs(shell: Shell, repository: Callable[[str], GitRepository] | None) -> str:
    """Why a git command of `shell` may run a command its repository (or HOME) names,
    or "": an alias or a pager in its settings, a hook."""
    if repository is None or shell.git_dirs == []:
        return ""
    if shell.git_dirs is None:
        return "the command runs git in a folder rules cannot follow"
    for folder in shell.git_dirs:
        try:
            found = repository(folder)
        except Exception as exc:  # the reader's refusal, whatever its type: never allowed
            return f"the repository git uses in {folder} cannot be read ({_first_line(exc)})"
        if key := next((key for key in found.settings if _git_runs(key)), None):
            return f"git's settings for {folder} name a command ({key})"
        if found.hooks:
            return f"the repository git uses in {folder} has the hook {found.hooks[0]}"
        # "." is this repository, whose hooks were just read
        local = (url for url in found.push_targets if url != "." and _local_repository(url))
        if shell.pushes and (url := next(local, None)):
            return f"git pushes from {folder}, whose settings name the repository {url}"
    return ""


def _hides(name: str, args: list[str]) -> str:
    """Why the program `name` run with `args` runs what rules cannot read, or ""."""
    if name in HIDING:
        return f"the command {name} {HIDING[name]}"
    if name == "git":
        return _git_hides(args)
    if name == "find":
        runs = next((arg for arg in args if arg in FIND_RUNS), None)
        return f"the command find {runs} runs a command for each file" if runs else ""
    if name in SHELLS:
        return _shell_hides(name, args)
    if name in ("sudo", "doas") and any(
        arg in ("-s", "-i", "--shell", "--login")
        or (arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) & {"s", "i"})
        for arg in args
    ):
        try:
            _, inner = _unwrap(WRAPPERS[name], name, [(arg, arg) for arg in args])
        except Unprovable:
            return ""  # said by the caller's own unwrapping
        if not inner:
            return f"the command {name} reads the commands it runs from its input"
    return ""


def _shell_hides(name: str, args: list[str]) -> str:
    runs_string = f"the command {name} -c runs a string as a command"
    reads = f"the command {name} reads the commands it runs from its input"
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return "" if i + 1 < len(args) else reads
        if arg == "-":
            return reads
        if arg.startswith("--"):
            if arg.startswith("--command"):
                return runs_string
            i += 2 if arg in ("--rcfile", "--init-file") else 1
            continue
        if arg[0] in "-+" and len(arg) > 1:
            letters = arg[1:]
            if arg[0] == "-" and "c" in letters.lower():
                return runs_string
            if arg[0] == "-" and set(letters) & {"s", "i"}:
                return reads
            # -o and -O take an option's name: `bash -eo pipefail`.
            i += 2 if letters[-1] in "oO" else 1
            continue
        return ""  # a script file: a program like any other
    return reads


def _unwrap(
    wrapper: Wrapper, name: str, args: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The variables a wrapper sets and the command it runs (both as (word, raw)
    pairs); Unprovable for an option rules do not read."""
    i = 0
    while i < len(args):
        arg = args[i][0]
        if arg == "--":
            i += 1
            break
        if arg.startswith("--"):
            key, eq, _ = arg[2:].partition("=")
            if key in wrapper.long_hides:
                raise Unprovable(f"the command {name} --{key} runs a string as a command")
            if wrapper.long_any:
                i += 1
            elif key in wrapper.long_valued:
                i += 1 if eq else 2
            elif key in wrapper.long_flags:
                i += 1
            else:
                raise Unprovable(f"the option --{key} of {name} is not one rules read")
            continue
        if arg == "-" and wrapper.assignments:  # env's old spelling of -i
            i += 1
            continue
        if arg.startswith("-") and len(arg) > 1:
            if wrapper.numeric and arg[1:].isdigit():
                i += 1
                continue
            step = 1
            for j, letter in enumerate(arg[1:], 1):
                if letter in wrapper.hides:
                    raise Unprovable(f"the command {name} -{letter} runs a string as a command")
                if letter in wrapper.valued:
                    step = 1 if j + 1 < len(arg) else 2
                    break
                if letter not in wrapper.flags:
                    raise Unprovable(f"the option -{letter} of {name} is not one rules read")
            i += step
            continue
        break
    assignments = []
    while wrapper.assignments and i < len(args) and _ASSIGNMENT.match(args[i][0]):
        assignments.append(args[i])
        i += 1
    return assignments, args[i + wrapper.operands :]


def _text(words: Sequence[tuple[str, str]]) -> str:
    return " ".join(_quoted(word) for word, _ in words)


def _unquoted(raw: str) -> str:
    """`raw` (a word as it stands in the command) with every quoted or escaped character
    blanked out, character for character: what is left is what bash may expand."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(raw):
        ch = raw[i]
        if quote and ch == quote:
            quote = ""
        elif ch == "\\" and quote != "'":
            out.append(" ")
            i += 1
        elif not quote and ch in "'\"":
            quote = ch
        elif not quote:
            out.append(ch)
            i += 1
            continue
        out.append(" ")
        i += 1
    return "".join(out)[: len(raw)]


def _dequoted(raw: str) -> str:
    """`raw` after bash's quote removal (a word with no expansion left in it)."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(raw):
        ch = raw[i]
        if quote and ch == quote:
            quote = ""
        elif ch == "\\" and quote != "'" and i + 1 < len(raw):
            i += 1
            if quote and raw[i] not in '$`"\\\n':
                out.append("\\")
            if raw[i] != "\n":
                out.append(raw[i])
        elif not quote and ch in "'\"":
            quote = ch
        else:
            out.append(ch)
        i += 1
    return "".join(out)


# A bracket expression of a file name pattern (`[ab]`): a `[` alone is a name (`[ -f x ]`).
_BRACKETS = re.compile(r"\[.*\]")
# The most words rules expand one word's braces into; more is asked about. Seven groups
# of two already make more, so a word with more braces than this is not expanded at all.
MAX_BRACE_WORDS = 64
MAX_BRACE_GROUPS = 16


def _is_pattern(raw: str) -> bool:
    """Whether bash would expand `raw` as a file name pattern or with braces."""
    bare = _unquoted(raw)
    return "*" in bare or "?" in bare or bool(_BRACKETS.search(bare)) or _braces(raw) != [raw]


def _braces(raw: str) -> list[str] | None:
    """The words bash's brace expansion makes of `raw` (`a{b,c}` is `ab ac`), each as it
    stands in the command; None for what rules do not expand (nesting, `{1..9}`, too many)."""
    bare = _unquoted(raw)
    if bare.count("{") > MAX_BRACE_GROUPS:
        return None
    start = bare.find("{")
    while start != -1:
        depth, commas, end = 0, [], -1
        for i in range(start, len(bare)):
            if bare[i] == "{":
                depth += 1
            elif bare[i] == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
            elif bare[i] == "," and depth == 1:
                commas.append(i)
        if end == -1:
            return [raw]
        inner = bare[start + 1 : end]
        if commas:
            if "{" in inner:
                return None
            cuts = [start, *commas, end]
            words: list[str] = []
            for left, right in zip(cuts, cuts[1:], strict=False):
                expanded = _braces(raw[:start] + raw[left + 1 : right] + raw[end + 1 :])
                if expanded is None:
                    return None
                words.extend(expanded)
                if len(words) > MAX_BRACE_WORDS:
                    return None
            return words
        if ".." in inner and "{" not in inner:
            return None
        start = bare.find("{", start + 1)
    return [raw]


def _shell_spec(pattern: str, spec: str) -> str:
    shell = read_shell(spec)
    if shell.unprovable:
        raise RuleError(f"`{pattern}`: {shell.unprovable}; a shell rule is one plain command.")
    if len(shell.parts) > 1:
        raise RuleError(
            f"`{pattern}` holds {len(shell.parts)} commands: write one rule for each; a "
            "command joined with ;, &&, || or | is allowed when every part is."
        )
    return shell.parts[0].text


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
    kind: str = node.kind
    return _SYNTAX.get(kind, kind)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# --- paths -----------------------------------------------------------------------------


def normalise_path(raw: str) -> str:
    """A path as the file tools read it, relative to the workspace (`./src//a.py` is
    `src/a.py`, the workspace itself `.`); Unprovable when it leaves the workspace or
    could (absolute, `..`)."""
    if problem := _path_problem(raw):
        raise Unprovable(f"the path {raw} {problem}")
    return "/".join(name for name in raw.split("/") if name not in ("", ".")) or "."


def _path_problem(raw: str) -> str:
    """Why `raw` is not a path rules can read in the workspace, or ""."""
    if "\x00" in raw:
        return "holds a NUL character"
    if raw.startswith("/"):
        return "is absolute"
    if ".." in raw.split("/"):
        return "climbs out with .."
    return ""


def _path_or_none(raw: str) -> str | None:
    return None if _path_problem(raw) else normalise_path(raw)


def _path_spec(pattern: str, spec: str) -> str:
    try:
        return normalise_path(spec.strip())
    except Unprovable as exc:
        raise RuleError(
            f"`{pattern}`: {exc}; paths in rules are relative to the workspace."
        ) from None


# --- globs -----------------------------------------------------------------------------

# The most words naming a deny or ask rule's program that one command's arguments are
# matched from (Rule.tail); past it, the command is asked about.
MAX_TAILS = 64


@lru_cache(maxsize=1024)
def _program(spec: str) -> str:
    """A shell rule's program: the first word of its command, without its folder."""
    try:
        first = shlex.split(spec)[0]
    except (ValueError, IndexError):
        first = spec.split(" ", 1)[0]
    return posixpath.basename(first) or first


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
