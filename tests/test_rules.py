"""Permission rules (chat.rules): syntax, matching and decisions, table by table."""

from __future__ import annotations

import bashlex
import pytest

from chat import rules
from chat.rules import ALLOW, ASK, DENY, RuleError


def rule(text: str, source: str = rules.USER) -> rules.Rule:
    action, pattern = text.split(" ", 1)
    return rules.parse(action, pattern, source=source)


def action_of(rule_texts: list[str], name: str, **arguments) -> str | None:
    decision = rules.decide([rule(t) for t in rule_texts], name, arguments)
    return decision.action if decision else None


# --- syntax ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "tool", "spec"),
    [
        ("read_file", "read_file", None),
        ("  shell  ", "shell", None),
        ("mcp__github__*", "mcp__github__*", None),
        ("*", "*", None),
        ("shell(git status)", "shell", "git status"),
        ("shell(git   status)", "shell", "git status"),
        ("shell(pytest *)", "shell", "pytest *"),
        ('shell(echo "a b")', "shell", "echo 'a b'"),
        ("write_file(src/**)", "write_file", "src/**"),
        ("write_file(./src//**)", "write_file", "src/**"),
        ("list_files(.)", "list_files", "."),
        ("read_file(*.md)", "read_file", "*.md"),
    ],
)
def test_it_parses_a_pattern(pattern, tool, spec):
    parsed = rules.parse(ALLOW, pattern)
    assert (parsed.tool, parsed.spec, parsed.action) == (tool, spec, ALLOW)


@pytest.mark.parametrize(
    ("action", "pattern", "message"),
    [
        ("permit", "shell", "A rule's action is allow, ask or deny, not 'permit'."),
        ("allow", "   ", "A rule needs a pattern"),
        ("allow", "x" * 501, "at most 500 characters"),
        ("allow", "shell(git status", "opens a parenthesis it does not close"),
        ("allow", "shell(a)(b)", "could not be parsed"),
        ("allow", "shell(git status) now", "is not a rule: write a tool name"),
        ("allow", "she ll", "`she ll` is not a tool name"),
        ("allow", "shell;rm", "is not a tool name"),
        ("allow", "(git status)", "`` is not a tool name"),
        ("allow", "shell()", "has nothing in its parentheses: write shell alone"),
        ("allow", "mcp__github__x(a)", "only list_files, read_file, shell, write_file take"),
        ("allow", "*(x)", "only list_files"),
        ("allow", "shell(git status && rm -rf /)", "holds 2 commands: write one rule for each"),
        ("allow", "shell(a; b; c)", "holds 3 commands"),
        ("allow", "shell(git status\nrm x)", "holds 2 commands"),
        ("allow", "shell(echo $(date))", "has a command substitution; a shell rule is one"),
        ("allow", "shell(cat <<EOF)", "could not be parsed"),
        ("allow", "shell(for i in 1; do x; done)", "syntax rules do not read (a for loop)"),
        ("allow", "shell(git status > /etc/passwd)", "redirects to /etc/passwd"),
        ("deny", "write_file(/etc/**)", "the path /etc/** is absolute; paths in rules are"),
        ("deny", "write_file(../x)", "climbs out with .."),
    ],
)
def test_a_bad_rule_says_what_is_wrong(action, pattern, message):
    with pytest.raises(RuleError) as caught:
        rules.parse(action, pattern)
    assert message in str(caught.value)


def test_stored_rules_that_cannot_be_used_are_left_out_with_a_sentence():
    parsed, problems = rules.parse_all(
        [{"action": "allow", "pattern": "read_file"}, {"action": "allow", "pattern": "shell("}],
        source=rules.TAB,
    )
    assert [r.pattern for r in parsed] == ["read_file"]
    assert parsed[0].source == rules.TAB
    assert problems == [
        "The rule allow `shell(` (this tab) is ignored: `shell(` opens a parenthesis it "
        "does not close."
    ]


# --- shell commands ----------------------------------------------------------------------

GIT = ["allow shell(git *)"]
GIT_NO_RM = ["allow shell(git *)", "allow shell(ls *)", "deny shell(rm *)"]


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        # plain matches
        (["allow shell(git status)"], "git status", ALLOW),
        (["allow shell(git status)"], "git  status", ALLOW),
        (["allow shell(git status)"], "git status --short", None),
        (["allow shell(git status)"], "git statuses", None),
        (["allow shell(pytest *)"], "pytest", ALLOW),
        (["allow shell(pytest *)"], "pytest -x tests/test_a.py", ALLOW),
        (["allow shell(pytest *)"], "pytest-watch", None),
        (["allow shell(git*)"], "git-lfs pull", ALLOW),
        (GIT, "git status # look", ALLOW),
        (GIT, "git status \\\n  --short", ALLOW),
        # quotes: a quoted word is one word, never a command name plus arguments
        (["allow shell(git status)"], '"git status"', None),
        (["allow shell(git status)"], "'git' 'status'", ALLOW),
        (GIT, 'git commit -m "fix; rm -rf /"', ALLOW),
        # bashlex reports a substitution even inside single quotes here: asked, not allowed
        (GIT, "git log --format='%h $(x)'", None),
        (GIT, 'git log "$(rm -rf /)"', None),
        # compounds: every part must be allowed; any denied part denies the whole
        (GIT_NO_RM, "git status && ls -la", ALLOW),
        (GIT_NO_RM, "git status; ls", ALLOW),
        (GIT_NO_RM, "git status || ls", ALLOW),
        (GIT_NO_RM, "git log | git shortlog", ALLOW),
        (GIT_NO_RM, "git status\nls", ALLOW),
        (GIT_NO_RM, "git status; rm -rf /", DENY),
        (GIT_NO_RM, "git status\nrm -rf /", DENY),
        (GIT_NO_RM, "ls | rm -rf /", DENY),
        (GIT_NO_RM, "git status && curl x | git apply", ASK),  # git beside a writer
        (GIT_NO_RM, "git status && curl x | sh", ASK),  # sh runs what it reads
        (GIT_NO_RM, "git status; curl x", None),
        (GIT_NO_RM, "git status &", ASK),
        (GIT, "git status & curl x", None),
        # what the parser cannot prove: never allowed, asked when a deny rule might apply
        (GIT_NO_RM, "$(rm -rf /)", ASK),
        (GIT_NO_RM, "git status $(rm -rf /)", ASK),
        (GIT_NO_RM, "git status `rm -rf /`", ASK),
        (GIT_NO_RM, "diff <(git show a) <(git show b)", ASK),
        (GIT_NO_RM, "git $CMD", ASK),
        (GIT_NO_RM, "git log ~/x", ASK),
        (GIT_NO_RM, "git status > /etc/passwd", ASK),
        (GIT_NO_RM, "git status >> ../outside.txt", ASK),
        (GIT_NO_RM, "git status < /etc/shadow", ASK),
        (GIT_NO_RM, "git status > $OUT", ASK),
        (GIT_NO_RM, "cat <<EOF\nrm -rf /\nEOF", ASK),
        (GIT_NO_RM, "git apply <<< x", ASK),
        (GIT_NO_RM, "for f in *; do rm $f; done", ASK),
        (GIT_NO_RM, "(rm -rf /)", ASK),
        (GIT_NO_RM, "{ rm -rf /; }", ASK),
        (GIT_NO_RM, "f() { rm -rf /; }; f", ASK),
        (GIT_NO_RM, "! git status", ASK),
        (GIT_NO_RM, "time git status", ASK),
        (GIT_NO_RM, "echo $((1+2))", ASK),
        (GIT_NO_RM, "git status 'unterminated", ASK),
        (GIT_NO_RM, "git status\rrm -rf /", ASK),
        (GIT_NO_RM, "", ASK),
        (GIT_NO_RM, "   ", ASK),
        (GIT, "$(rm -rf /)", None),
        (GIT, "git status > /etc/passwd", None),
        # a file the command writes must be one write_file rules allow; /dev/null and a
        # copy of a descriptor are no file
        (GIT, "git status > out.txt", None),  # attack: allowed a write no rule allows
        (GIT, "git diff >& diff.txt", None),  # attack
        ([*GIT, "allow write_file(out.txt)"], "git status > out.txt", ALLOW),
        (GIT, "git status 2>&1", ALLOW),
        (GIT, "git status 2>/dev/null", ALLOW),
        (GIT, "git status < notes.txt", ALLOW),
        # an assignment before a command is part of it
        (GIT, "LD_PRELOAD=/tmp/x.so git status", None),
        (["deny shell(rm *)"], "FORCE=1 rm -rf /", DENY),
        (["deny shell(*rm *)"], "FORCE=1 rm -rf /", DENY),
        # order: deny, then ask, then allow; first match wins
        (["allow shell(git *)", "deny shell(git push *)"], "git push origin", DENY),
        (["allow shell(git *)", "ask shell(git push *)"], "git push", ASK),
        (["ask shell(git push *)", "deny shell(git *)"], "git push", DENY),
        (["allow shell", "deny shell(rm *)"], "rm x", DENY),
        (["allow shell", "deny shell(rm *)"], "$(rm x)", ASK),
        (["allow shell"], "$(rm x)", ALLOW),
        (["deny shell"], "$(rm x)", DENY),
        (["ask shell"], "ls", ASK),
        (["deny shell(rm *)", "deny shell"], "$(x)", DENY),
        (["allow read_file"], "git status", None),
        ([], "git status", None),
        # the name pattern
        (["deny *"], "ls", DENY),
        (["allow sh*"], "ls", ALLOW),
    ],
)
def test_shell_decisions(rule_texts, command, expected):
    assert action_of(rule_texts, "shell", command=command) == expected


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("$(rm -rf /)", "the command has a command substitution"),
        ("cat <(ls)", "the command has a process substitution"),
        ("echo $HOME", "the command has a variable expansion"),
        ("ls > /etc/passwd", "the command redirects to /etc/passwd, outside the workspace"),
        ("cat <<EOF\nx\nEOF", "the command has a here-document"),
        ("ls &", "the command uses the operator &"),
        ("if true; then ls; fi", "the command uses syntax rules do not read (an if)"),
        ("", "the command is empty"),
        ("ls\x00", "the command holds control characters"),
    ],
)
def test_an_unprovable_command_says_why(command, reason):
    decision = rules.decide([rule("deny shell(rm *)")], "shell", {"command": command})
    assert decision.action == ASK
    assert decision.unprovable == reason
    assert (
        decision.text == f"Asked: {reason}, which rule `shell(rm *)` (your settings) cannot check"
    )


def test_a_shell_call_without_a_command_string_is_never_allowed_by_a_specifier():
    assert action_of(GIT, "shell", command=["git", "status"]) is None
    assert action_of(GIT_NO_RM, "shell") == ASK


# --- paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule_texts", "name", "path", "expected"),
    [
        (["allow write_file(src/**)"], "write_file", "src/a.py", ALLOW),
        (["allow write_file(src/**)"], "write_file", "./src/a.py", ALLOW),
        (["allow write_file(src/**)"], "write_file", "src//deep/er/a.py", ALLOW),
        (["allow write_file(src/**)"], "write_file", "src", ALLOW),
        (["allow write_file(src/**)"], "write_file", "srcx/a.py", None),
        (["allow write_file(src/**)"], "write_file", "a.py", None),
        (["allow write_file(src/**)"], "write_file", "src/../a.py", None),
        (["allow write_file(src/**)"], "write_file", "src/../../etc/passwd", None),
        (["allow write_file(src/**)"], "write_file", "/work/src/a.py", None),
        (["allow write_file(src/*)"], "write_file", "src/a.py", ALLOW),
        (["allow write_file(src/*)"], "write_file", "src/deep/a.py", None),
        (["allow write_file(**/*.md)"], "write_file", "README.md", ALLOW),
        (["allow write_file(**/*.md)"], "write_file", "docs/a/b.md", ALLOW),
        (["allow write_file(**/*.md)"], "write_file", "docs/a/b.mdx", None),
        (["allow write_file(a.py)"], "write_file", "./a.py", ALLOW),
        (["allow read_file(src/**)"], "write_file", "src/a.py", None),
        (["allow write_file(src/[ab].py)"], "write_file", "src/a.py", None),
        (["allow write_file(src/[ab].py)"], "write_file", "src/[ab].py", ALLOW),
        (["allow list_files(.)"], "list_files", None, ALLOW),
        (["allow list_files(docs)"], "list_files", "docs/", ALLOW),
        (["deny read_file(.env)"], "read_file", ".env", DENY),
        (["deny read_file(.env)"], "read_file", "./.env", DENY),
        (["deny read_file(.env)"], "read_file", "x/../.env", ASK),
        (["deny read_file(secrets/**)", "allow read_file"], "read_file", "secrets/k", DENY),
        (["deny read_file(secrets/**)"], "read_file", "/etc/passwd", ASK),
        (
            ["allow write_file(src/**)", "ask write_file(src/prod/**)"],
            "write_file",
            "src/prod/x",
            ASK,
        ),  # fmt: skip
    ],
)
def test_path_decisions(rule_texts, name, path, expected):
    arguments = {} if path is None else {"path": path}
    assert action_of(rule_texts, name, **arguments) == expected


# --- other tools -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule_texts", "name", "expected"),
    [
        (["allow mcp__github__*"], "mcp__github__create_issue", ALLOW),
        (["allow mcp__github__*"], "mcp__gitlab__create_issue", None),
        (["allow mcp__github__*", "deny mcp__github__delete_*"], "mcp__github__delete_repo", DENY),
        (["allow mcp__github__list"], "mcp__github__list_all", None),
        (["ask read_file"], "read_file", ASK),
    ],
)
def test_tool_name_decisions(rule_texts, name, expected):
    assert action_of(rule_texts, name, anything="x") == expected


# --- what a decision says ----------------------------------------------------------------


def test_a_decision_names_its_rules_and_where_they_come_from():
    listed = [rule("allow shell(git *)"), rule("allow shell(ls *)", rules.TAB)]
    decision = rules.decide(listed, "shell", {"command": "git status && ls && git log"})
    assert decision.text == (
        "Allowed by rules `shell(git *)` (your settings) and `shell(ls *)` (this tab)"
    )
    denied = rules.decide([rule("deny write_file(src/**)", rules.TAB)], "write_file",
                          {"path": "src/a"})  # fmt: skip
    assert denied.text == "Denied by rule `write_file(src/**)` (this tab)"
    assert denied.rule.source == rules.TAB


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("shell", {"command": "git status"}, "shell(git status)"),
        ("shell", {"command": "git   status  2>/dev/null"}, "shell(git status)"),
        ("shell", {"command": "git status > out.txt"}, None),
        ("shell", {"command": "sort < names.txt"}, None),
        ("shell", {"command": 'git commit -m "a b"'}, "shell(git commit -m 'a b')"),
        ("shell", {"command": "rm *"}, None),
        ("shell", {"command": "git status && ls"}, None),
        ("shell", {"command": "echo $(date)"}, None),
        ("write_file", {"path": "./src/app/a.py"}, "write_file(src/app/**)"),
        ("write_file", {"path": "a.py"}, "write_file(a.py)"),
        ("write_file", {"path": ".github/ci.yml"}, "write_file(.github/ci.yml)"),
        ("write_file", {"path": ".git/hooks/pre-commit"}, "write_file(.git/hooks/pre-commit)"),
        ("write_file", {"path": "src/.cache/x"}, "write_file(src/.cache/x)"),
        ("write_file", {"path": "src/.env"}, "write_file(src/**)"),
        ("write_file", {"path": "src/*.py"}, None),
        ("write_file", {"path": "../a.py"}, None),
        ("read_file", {"path": "x"}, "read_file"),
        ("mcp__github__create_issue", {}, "mcp__github__create_issue"),
    ],
)
def test_the_rule_always_allow_offers(name, arguments, expected):
    natural = rules.natural(name, arguments)
    assert natural == expected
    if natural is not None:
        assert rules.decide([rules.parse(ALLOW, natural)], name, arguments).action == ALLOW


# --- links, wrappers, redirections -------------------------------------------------------
# Each row below marked "attack" is a way a call could get past a deny rule.

# The workspace as the file tools see it: src/h is a link to .git/hooks, up leads out of
# the workspace, loop is a link to itself (what chat.tools.files.resolve answers).
LINKS = {"src/h": ".git/hooks", "alias.md": ".env"}


def resolve(path: str) -> str:
    names = rules.normalise_path(path).split("/")
    if names[0] in ("up", "loop"):
        raise ValueError(f"{path}: resolves outside the workspace through a symlink; refused")
    for link, target in LINKS.items():
        if names[: len(link.split("/"))] == link.split("/"):
            return "/".join([target, *names[len(link.split("/")) :]])
    return "/".join(names)


# What exists in that workspace (where it leads): a redirection's target that does not,
# after a command that may make links, may be a link that command makes.
EXISTING = {".", "src", "src/a.py", ".git", ".git/hooks", ".git/config", ".env", "notes.txt"}


def exists(path: str) -> bool:
    try:
        return resolve(path) in EXISTING
    except ValueError:
        return False


def decided(rule_texts: list[str], name: str, **arguments) -> rules.Decision | None:
    return rules.decide(
        [rule(t) for t in rule_texts], name, arguments, resolve=resolve, exists=exists
    )


GIT_DIR = ["deny write_file(.git/**)", "allow write_file(**)"]


@pytest.mark.parametrize(
    ("rule_texts", "name", "path", "expected"),
    [
        (GIT_DIR, "write_file", "src/h/pre-commit", DENY),  # attack
        (GIT_DIR, "write_file", "./src//h/pre-commit", DENY),  # attack
        (GIT_DIR, "write_file", ".git/hooks/pre-commit", DENY),
        (GIT_DIR, "write_file", "src/a.py", ALLOW),
        (["ask write_file(.git/**)"], "write_file", "src/h/x", ASK),  # attack
        (["deny read_file(.env)"], "read_file", "alias.md", DENY),  # attack
        (["deny list_files(.git/**)"], "list_files", "src/h", DENY),  # attack
        # allow needs both the path as written and the one it lands on
        (["allow write_file(src/**)"], "write_file", "src/h/pre-commit", None),  # attack
        (["allow write_file(.git/**)"], "write_file", "src/h/x", None),
        (
            ["allow write_file(src/**)", "allow write_file(.git/**)"],
            "write_file",
            "src/h/x",
            ALLOW,
        ),  # fmt: skip
        # a path that cannot be followed (out of the workspace, a loop) is unprovable
        (["deny write_file(.git/**)"], "write_file", "up/x", ASK),
        (["deny write_file(.git/**)"], "write_file", "loop", ASK),
        (["allow write_file(**)"], "write_file", "up/x", None),
        (["allow write_file"], "write_file", "up/x", ALLOW),
        (["deny write_file"], "write_file", "up/x", DENY),
    ],
)
def test_path_rules_judge_where_a_link_leads(rule_texts, name, path, expected):
    decision = decided(rule_texts, name, path=path)
    assert (decision.action if decision else None) == expected


def test_a_decision_on_a_linked_path_names_where_it_leads():
    denied = decided(GIT_DIR, "write_file", path="src/h/pre-commit")
    assert denied.text == (
        "Denied by rule `write_file(.git/**)` (your settings) for src/h/pre-commit, "
        "a link to .git/hooks/pre-commit"
    )
    asked = decided(["deny write_file(.git/**)"], "write_file", path="up/x")
    assert asked.text == (
        "Asked: the path up/x cannot be followed (up/x: resolves outside the workspace "
        "through a symlink; refused), which rule `write_file(.git/**)` (your settings) "
        "cannot check"
    )


NO_RM = ["deny shell(rm *)"]
SAFE = ["allow shell(git *)", "allow shell(ls *)", "allow shell(timeout *)",
        "allow shell(env *)", "allow shell(nice *)", "deny shell(rm *)"]  # fmt: skip


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        # the command's name: a path or quoting is the same program
        (NO_RM, "/bin/rm -rf x", DENY),  # attack
        (NO_RM, "/usr/bin/rm x", DENY),  # attack
        (NO_RM, "./rm x", DENY),
        (NO_RM, "\\rm x", DENY),
        (NO_RM, "'rm' x", DENY),
        (NO_RM, '"r"m x', DENY),
        # a variable assignment in front does not hide the command from deny
        (NO_RM, "FORCE=1 rm -rf x", DENY),  # attack
        # wrappers run the command they are given
        (NO_RM, "command rm x", DENY),  # attack
        (NO_RM, "command -p rm x", DENY),  # attack
        (NO_RM, "builtin rm x", DENY),  # attack
        (NO_RM, "exec rm x", DENY),  # attack
        (NO_RM, "exec -a name rm x", DENY),  # attack
        (NO_RM, "env rm x", DENY),  # attack
        (NO_RM, "env FOO=1 rm x", DENY),  # attack
        (NO_RM, "env -i A=1 rm x", DENY),  # attack
        (NO_RM, "env -u HOME -- rm x", DENY),  # attack
        (NO_RM, "env --chdir=src rm x", DENY),  # attack
        (NO_RM, "nice rm x", DENY),  # attack
        (NO_RM, "nice -n 5 rm x", DENY),  # attack
        (NO_RM, "nice -5 rm x", DENY),  # attack
        (NO_RM, "nice --adjustment=5 rm x", DENY),  # attack
        (NO_RM, "nohup rm x", DENY),  # attack
        (NO_RM, "timeout 5 rm x", DENY),  # attack
        (NO_RM, "timeout -s KILL 5 rm x", DENY),  # attack
        (NO_RM, "timeout --signal=KILL -k 1 5s rm x", DENY),  # attack
        (NO_RM, "sudo rm x", DENY),  # attack
        (NO_RM, "sudo -u root -- rm x", DENY),  # attack
        (NO_RM, "doas -u root rm x", DENY),  # attack
        (NO_RM, "stdbuf -o L rm x", DENY),  # attack
        (NO_RM, "setsid -f rm x", DENY),  # attack
        (NO_RM, "ionice -c 3 rm x", DENY),  # attack
        (NO_RM, "busybox rm x", DENY),  # attack
        (NO_RM, "/usr/bin/time -f %e rm x", DENY),  # attack
        (NO_RM, "command nice -n 1 env A=1 /bin/rm x", DENY),  # attack
        (NO_RM, "git status && sudo rm x", DENY),  # attack
        (NO_RM, "time rm x", ASK),  # bash's keyword: past what the parser reads
        # a wrapper with an option rules do not know: where its command starts is unknown
        (NO_RM, "timeout --frobnicate 5 rm x", ASK),
        (NO_RM, "env -Z rm x", ASK),
        # commands that run a string or commands rules cannot see: unprovable
        (NO_RM, "eval 'rm x'", ASK),  # attack
        (NO_RM, "sh -c 'rm x'", ASK),  # attack
        (NO_RM, "bash -c 'rm x'", ASK),  # attack
        (NO_RM, "bash -xc 'rm x'", ASK),  # attack
        (NO_RM, "zsh -c 'rm x'", ASK),  # attack
        (NO_RM, "/bin/dash -c 'rm x'", ASK),  # attack
        (NO_RM, "echo 'rm x' | sh", ASK),  # attack
        (NO_RM, "echo 'rm x' | bash -s", ASK),  # attack
        (NO_RM, "echo 'rm x' | bash -", ASK),  # attack
        (NO_RM, "echo 'rm x' | bash -eo pipefail", ASK),  # attack
        (NO_RM, "echo 'rm x' | bash --noprofile", ASK),  # attack
        (NO_RM, "bash -euo pipefail build.sh", None),
        (NO_RM, "bash --posix -- build.sh", None),
        (NO_RM, "env -S 'rm x'", ASK),  # attack
        (NO_RM, "sudo sh -c 'rm x'", ASK),  # attack
        (NO_RM, "sudo -s", ASK),
        (NO_RM, "su -c 'rm x'", ASK),  # attack
        (NO_RM, "echo x | xargs rm", ASK),  # attack
        (NO_RM, "find . -name '*.o' -exec rm {} +", ASK),  # attack
        (NO_RM, "find . -execdir rm {} ;", ASK),  # attack
        (NO_RM, "find . -ok rm {} ;", ASK),  # attack
        (NO_RM, "source ./x.sh", ASK),  # attack
        (NO_RM, ". ./x.sh", ASK),  # attack
        (NO_RM, "parallel rm ::: a b", ASK),  # attack
        (NO_RM, "watch rm x", ASK),  # attack
        (NO_RM, "trap 'rm x' EXIT", ASK),  # attack
        (NO_RM, "flock /tmp/l -c 'rm x'", ASK),  # attack
        (NO_RM, "alias ls=rm", ASK),  # attack
        (NO_RM, "timeout 5 bash -c 'rm x'", ASK),  # attack
        # a command name bash expands as a pattern is not a name rules can read
        (NO_RM, "/bin/r? -rf x", ASK),  # attack
        (NO_RM, "/???/rm x", ASK),  # attack
        (NO_RM, "/bin/r[m] x", ASK),  # attack
        (NO_RM, "[ -f x ] && ls", None),
        # braces are expanded as bash expands them, and the command judged both ways
        (NO_RM, "{rm,-rf,x}", DENY),  # attack
        (NO_RM, "sudo {rm,x}", DENY),  # attack
        (["deny shell(git push *)"], "git {push,origin}", DENY),  # attack
        (["deny shell(git push *)"], "git pu{sh,} origin", DENY),  # attack
        (["deny shell(git push *)"], "git {pu,}sh", DENY),  # attack
        (["allow shell(echo *)"], "echo '{a,b}' \"*\" \\{a,b}", ALLOW),
        (["allow shell(echo *)"], "echo {a,b}", ALLOW),
        (["allow shell(mkdir *)"], "mkdir -p src/{a,b}/x", ALLOW),
        (["allow shell(echo *)"], "echo {}", ALLOW),
        (["allow shell(echo *)", "deny shell(rm *)"], "echo {a,{b,c}}", ASK),
        (["allow shell(echo *)", "deny shell(rm *)"], "echo {1..3}", ASK),
        (["allow shell(echo *)"], "echo {a,b} {c,d} {e,f} {g,h} {i,j} {k,l} {m,n}", ALLOW),
        (["allow shell(echo *)"], "echo {a,b}{c,d}{e,f}{g,h}{i,j}{k,l}{m,n}", None),  # 128
        (["allow shell(echo *)"], "echo " + "{a,b}" * 1000, None),
        # a script run by a shell, python -c: matched as the command it is
        (NO_RM, "bash ./build.sh", None),
        (NO_RM, "python -c 'print(1)'", None),
        (NO_RM, "find . -name '*.py'", None),
        # rm among the arguments: a program rules do not know may run it (asked, below)
        (NO_RM, "git rm x", ASK),
        (NO_RM, "echo rm x", ASK),
        (NO_RM, "echo remove x", None),
        # allow: the whole command and the one it wraps must both be allowed
        (SAFE, "timeout 60 git fetch", ALLOW),
        (SAFE, "nice -n 5 ls -la", ALLOW),
        (SAFE, "timeout 60 curl x", None),  # attack
        (SAFE, "env curl x", None),  # attack
        (SAFE, "env A=1 git status", None),
        (SAFE, "env rm x", DENY),
        (SAFE, "timeout 5 sh -c 'git status'", ASK),
        (["allow shell(git *)"], "/usr/bin/git status", None),
        (["allow shell(git *)"], "command git status", None),
        (["allow shell(git *)", "allow shell(command *)"], "command git status", ALLOW),
        (["allow shell(sh *)"], "sh -c 'rm x'", None),  # attack
        (["allow shell(bash *)"], "bash build.sh", ALLOW),
        (["allow shell(xargs *)"], "xargs rm", None),  # attack
        (["allow shell(find *)"], "find . -exec rm {} ;", None),  # attack
        (["allow shell(eval *)"], "eval ls", None),  # attack
        (["allow shell"], "eval ls", ALLOW),
        (["deny shell(sh *)"], "sh -c ls", DENY),
        (["deny shell(eval *)", "allow shell"], "eval ls", DENY),
    ],
)
def test_wrapped_and_hidden_commands(rule_texts, command, expected):
    assert action_of(rule_texts, "shell", command=command) == expected


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("eval 'rm x'", "the command eval runs a string as a command"),
        ("sh -c 'rm x'", "the command sh -c runs a string as a command"),
        ("echo x | bash", "the command bash reads the commands it runs from its input"),
        ("echo x | xargs rm", "the command xargs runs commands it builds from its input"),
        ("find . -exec rm {} ;", "the command find -exec runs a command for each file"),
        ("source x.sh", "the command source runs the commands in a file in this shell"),
        ("/bin/r? x", "the command name /bin/r? is a pattern bash expands"),
        ("timeout --frobnicate 5 rm x", "the option --frobnicate of timeout is not one rules read"),
    ],
)
def test_a_hidden_command_says_why(command, reason):
    decision = rules.decide([rule("deny shell(rm *)")], "shell", {"command": command})
    assert (decision.action, decision.unprovable) == (ASK, reason)


REDIRECTS = ["deny write_file(.git/**)", "ask write_file(prod/**)", "deny read_file(.env)"]


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        (REDIRECTS, "echo x > .git/hooks/pre-commit", DENY),  # attack
        (REDIRECTS, "echo x >> .git/hooks/pre-commit", DENY),  # attack
        (REDIRECTS, "echo x >| .git/config", DENY),  # attack
        (REDIRECTS, "echo x &> .git/config", DENY),  # attack
        (REDIRECTS, "echo x &>> .git/config", DENY),  # attack
        (REDIRECTS, "echo x >& .git/config", DENY),  # attack
        (REDIRECTS, "echo x 2> .git/config", DENY),  # attack
        (REDIRECTS, "cat <> .git/config", DENY),  # attack
        (REDIRECTS, "cat < .env", DENY),  # attack
        (REDIRECTS, "cat <> .env", DENY),  # attack
        (REDIRECTS, "echo x > src/h/pre-commit", DENY),  # attack: through the link
        (REDIRECTS, "ls; echo x > ./.git//hooks/x", DENY),  # attack
        (REDIRECTS, "echo x > prod/app.py", ASK),  # attack
        (["allow shell(echo *)", *REDIRECTS], "echo x > .git/hooks/pre-commit", DENY),  # attack
        (["allow shell"], "echo x > .git/x", ALLOW),
        # no path rule that matches: a redirection changes nothing
        (REDIRECTS, "echo x > out.txt", None),
        (REDIRECTS, "cat < notes.txt", None),
        (REDIRECTS, "echo x 2>&1 > /dev/null", None),
        (["allow shell(echo *)", *REDIRECTS], "echo x > out.txt", None),  # attack
        (["allow shell(echo *)", "allow write_file(src/**)"], "echo x > out.txt", None),
        (["allow shell(echo *)", "allow write_file(src/**)"], "echo x > src/o.txt", ALLOW),
        (["allow write_file(**)"], "echo x > out.txt", None),
        (["deny read_file(.env)"], "echo x > .env", None),
        (["deny write_file(.git/**)"], "cat < .git/config", None),
        # a rule without a path is the file tool's own, not the shell's
        (["deny write_file"], "echo x > out.txt", None),
        (["ask write_file", "allow shell(echo *)"], "echo x > out.txt", None),
        # a target rules cannot read, when a path rule could have matched it
        (REDIRECTS, "echo x > $OUT", ASK),
        (REDIRECTS, "echo x > .g*/hooks/x", ASK),  # attack
        (REDIRECTS, "echo x > .git/hooks/pre-commi?", DENY),
        (REDIRECTS, "echo x > ~/x", ASK),
        (REDIRECTS, "echo x > /work/ws/.git/config", ASK),  # attack
        (REDIRECTS, "echo x > ../ws/.git/config", ASK),  # attack
        (REDIRECTS, "echo x > up/x", ASK),
        (REDIRECTS, "echo $(echo x > .git/config)", ASK),  # attack
        (REDIRECTS, "for f in a; do echo x > .git/config; done", ASK),  # attack
        (REDIRECTS, "bash -c 'echo x > .git/config'", ASK),  # attack
        (REDIRECTS, "echo x | sh", ASK),  # attack
        (REDIRECTS, "cat <<EOF > out.txt\n$(echo x > .git/config)\nEOF", ASK),  # attack
        (REDIRECTS, "cat <<EOF > .git/config\nx\nEOF", DENY),  # attack
        (REDIRECTS, "exec 3> .git/config", DENY),  # attack
        # a cd moves where later redirections land (and a failed one does not)
        (REDIRECTS, "cd .git/hooks && echo x > pre-commit", DENY),  # attack
        (REDIRECTS, "cd .git; cd hooks; echo x > pre-commit", DENY),  # attack
        (REDIRECTS, "cd nowhere; echo x > .git/config", DENY),  # attack
        (REDIRECTS, "cd src/h && echo x > pre-commit", DENY),  # attack: through the link
        (REDIRECTS, "builtin cd -P .git && echo x > config", DENY),  # attack
        (REDIRECTS, "pushd .git && echo x > config", DENY),  # attack
        (REDIRECTS, "cd - && echo x > config", ASK),  # attack
        (REDIRECTS, "cd && echo x > config", ASK),  # attack
        (REDIRECTS, "cd $D && echo x > config", ASK),  # attack
        (REDIRECTS, "cd .g* && echo x > config", ASK),  # attack
        (REDIRECTS, "popd && echo x > config", ASK),  # attack
        (REDIRECTS, "CDPATH=.git cd hooks && echo x > pre-commit", ASK),  # attack
        (REDIRECTS, "shopt -s cdable_vars; cd x; echo x > pre-commit", ASK),  # attack
        (REDIRECTS, "cd src && echo x > a.py", None),
        (REDIRECTS, "echo x > a.txt && cd .git", None),
        (REDIRECTS, "cd .git > out.txt", None),
        (["allow shell(cd *)", "allow shell(echo *)"], "cd - && echo x", ALLOW),
        (
            ["allow shell(cd *)", "allow shell(echo *)", "allow write_file"],
            "cd - && echo x > config",
            None,
        ),  # fmt: skip
        (REDIRECTS, "echo 'a > b' 'unterminated", ASK),
        (["allow shell(echo *)"], "echo x > $OUT", None),
        (["deny read_file(.env)"], "echo x > $OUT", None),
        (["allow write_file(**)"], "echo x > $OUT", None),
        (["ask write_file(prod/**)"], 'echo x > "prod/a b"', ASK),
        (["ask write_file(prod/**)"], "echo x > 'prod'/a", ASK),
    ],
)
def test_redirections_are_judged_by_path_rules(rule_texts, command, expected):
    decision = decided(rule_texts, "shell", command=command)
    assert (decision.action if decision else None) == expected


def test_a_redirection_decision_names_the_redirection_and_the_rule():
    denied = decided(REDIRECTS, "shell", command="echo x >> src/h/pre-commit")
    assert denied.text == (
        "Denied by rule `write_file(.git/**)` (your settings) for the redirection "
        ">> src/h/pre-commit, a link to .git/hooks/pre-commit"
    )
    moved = decided(REDIRECTS, "shell", command="cd .git && echo x > config")
    assert moved.text == (
        "Denied by rule `write_file(.git/**)` (your settings) for the redirection > config in .git"
    )
    asked = decided(REDIRECTS, "shell", command="echo x > $OUT")
    assert asked.action == ASK
    assert asked.text == (
        "Asked: the redirection > $OUT has a variable expansion, which rule "
        "`write_file(.git/**)` (your settings) cannot check"
    )


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("/bin/rm x", None),
        ("\\rm x", "shell(rm x)"),
        ("timeout 5 git fetch", None),
        ("env A=1 git status", None),
        ("sh -c 'git status'", None),
        ("eval ls", None),
        ("xargs ls", None),
        ("bash build.sh", "shell(bash build.sh)"),
        ("FOO=1 git status", "shell(FOO=1 git status)"),
        ("git status > .git/x", None),
    ],
)
def test_always_allow_offers_no_rule_for_a_wrapped_or_hidden_command(command, expected):
    natural = rules.natural("shell", {"command": command})
    assert natural == expected
    if natural is not None:
        decision = rules.decide([rules.parse(ALLOW, natural)], "shell", {"command": command})
        assert decision.action == ALLOW


# --- closed descriptors, unreadable calls, targets an earlier part makes, wrappers ------


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        # closing a descriptor writes no file, and must not crash the whole decision
        (GIT, "git status 2>&-", ALLOW),
        (GIT, "git status >&-", ALLOW),
        (GIT, "git status <&-", ALLOW),
        (GIT, "git status 0<&0", ALLOW),
        (["allow shell(ls *)"], "ls 1>&- 2>&-", ALLOW),
        (["allow shell(echo *)"], "echo >&-", ALLOW),
        (GIT_NO_RM, "exec 3>&-", None),
        (GIT_NO_RM, "rm x 2>&-", DENY),
        ([], "echo hi 2>&-", None),
        (["deny write_file(.git/**)"], "echo hi 2>&- >&-", None),
    ],
)
def test_a_closed_descriptor_is_no_file(rule_texts, command, expected):
    assert action_of(rule_texts, "shell", command=command) == expected
    assert rules.natural("shell", {"command": command}) is not None


@pytest.mark.parametrize(
    ("rule_texts", "expected", "unprovable"),
    [
        (["deny shell(rm *)", "allow shell"], ASK, True),
        (["deny write_file(.git/**)", "allow shell"], ASK, True),
        (["allow shell"], None, False),
        (["allow shell(git *)"], None, False),
        (["deny write_file"], None, False),
        (["deny shell", "ask shell(rm *)"], DENY, False),
        ([], None, False),
    ],
)
def test_a_call_rules_fail_to_read_is_never_allowed_and_never_raises(
    monkeypatch, rule_texts, expected, unprovable
):
    # No input is known to break the parser's output now (the fuzzer in the issue found
    # >&-); a parser returning a tree of a shape rules do not know stands for the next one.
    parsed = [rule(t) for t in rule_texts]
    monkeypatch.setattr(bashlex, "parse", lambda command: [object()])
    decision = rules.decide(parsed, "shell", {"command": "git status"})
    assert (decision.action if decision else None) == expected
    if unprovable:
        assert decision.unprovable == (
            "rules could not read the call (AttributeError: 'object' object has no "
            "attribute 'kind')"
        )
    assert rules.natural("shell", {"command": "git status"}) is None


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        # a shell allow rule does not allow a write that write_file rules would not
        (["allow shell(echo hi)"], "echo hi > src/main.py", None),  # attack
        (["allow shell(echo hi)"], "echo hi >> src/main.py", None),  # attack
        (["allow shell(echo hi)"], "echo hi &> src/main.py", None),  # attack
        (["allow shell(echo hi)"], "echo hi 2> src/main.py", None),  # attack
        (["allow shell(cat *)"], "cat <> src/a.py", None),  # attack
        (["allow shell(echo hi)", "allow write_file(src/**)"], "echo hi > src/main.py", ALLOW),
        (["allow shell(echo hi)", "allow write_file"], "echo hi > src/main.py", ALLOW),
        (["allow shell(echo hi)", "allow write_*"], "echo hi > src/main.py", ALLOW),
        (["allow shell(echo hi)", "allow write_file(src/**)"], "echo hi > docs/a.md", None),
        (["allow shell(echo hi)", "allow write_file(src/**)"], "echo hi > src/a 2> b", None),
        (["allow shell(echo hi)", "allow read_file(src/**)"], "echo hi > src/main.py", None),
        # through a link: the write_file allow must cover where it leads too
        (["allow shell(echo hi)", "allow write_file(src/**)"], "echo hi > src/h/x", None),  # attack
        (["allow shell(echo hi)", "allow write_file(src/**)"], "echo hi > up/x", None),
        (["allow shell(echo *)", "allow write_file"], "echo hi > .g*/x", None),
        (["allow shell(echo *)", "allow write_file"], "echo hi > ../x", None),
        # no file: /dev/null, a copy or close of a descriptor; reading is the command's own
        (["allow shell(echo hi)"], "echo hi > /dev/null 2>&1", ALLOW),
        (["allow shell(echo hi)"], "echo hi 2>&-", ALLOW),
        (["allow shell(cat *)"], "cat < src/a.py", ALLOW),
        # a failed cd leaves the shell where it was: both targets must be allowed
        (
            ["allow shell(cd *)", "allow shell(echo *)", "allow write_file(src/**)"],
            "cd src && echo x > a.py",
            None,
        ),  # fmt: skip
        (
            ["allow shell(cd *)", "allow shell(echo *)", "allow write_file(**)"],
            "cd src && echo x > a.py",
            ALLOW,
        ),  # fmt: skip
        # the whole shell allowed is the whole shell
        (["allow shell"], "echo x > src/main.py", ALLOW),
        (["allow *"], "echo x > src/main.py", ALLOW),
        # a deny or ask path rule still decides first
        (
            ["allow shell(echo *)", "allow write_file", "deny write_file(.git/**)"],
            "echo x > .git/config",
            DENY,
        ),  # fmt: skip
    ],
)
def test_a_shell_allow_needs_write_file_rules_for_the_files_it_writes(
    rule_texts, command, expected
):
    decision = decided(rule_texts, "shell", command=command)
    assert (decision.action if decision else None) == expected


def test_an_allowed_redirection_names_the_write_file_rule_too():
    decision = decided(
        ["allow shell(echo *)", "allow write_file(src/**)"], "shell", command="echo x > src/b"
    )
    assert decision.text == (
        "Allowed by rules `shell(echo *)` (your settings) and `write_file(src/**)` (your settings)"
    )


LINKING = ["allow shell(ln *)", "allow shell(echo *)", "allow shell(cd *)",
           "allow shell(mkdir *)", "allow shell(git *)", "deny write_file(.git/**)"]  # fmt: skip


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        # a link made earlier in the same command: the target does not exist yet
        (LINKING, "ln -s ../.git/hooks src/h3; echo x > src/h3/pre-commit", ASK),  # attack
        (LINKING, "ln -s ../.git/hooks/pre-commit src/pc && echo x >> src/pc", ASK),  # attack
        (LINKING, "ln -s .git g2 && cd g2 && echo x > config", ASK),  # attack
        (LINKING, "ln -s .git g2; cd g2/hooks; echo x > pre-commit", ASK),  # attack
        (LINKING, "git checkout x && echo x > new.txt", ASK),
        (["deny read_file(.env)"], "ln -s .env n && cat < n", ASK),  # attack
        (["ask write_file(.git/**)"], "ln -s .git g && echo x > g/config", ASK),  # attack
        # a target that exists is judged where it leads now
        (LINKING, "git checkout x && echo x > src/a.py", None),
        ([*LINKING, "allow write_file(src/**)"], "git checkout x && echo x > src/a.py", ALLOW),
        # commands that make no links leave the target provable
        ([*LINKING, "allow write_file(src/**)"], "mkdir -p src/n && echo x > src/n/a", ALLOW),
        ([*LINKING, "allow write_file(**)"], "cd src && echo x > new.py", ALLOW),
        ([*LINKING, "allow write_file(**)"], "echo a > n.txt; echo b >> n.txt", ALLOW),
        # and an allow does not cover a target an earlier command may make a link
        (
            ["allow shell(ln *)", "allow shell(echo *)", "allow write_file(src/**)"],
            "ln -s ../.git/hooks src/h3; echo x > src/h3/pre-commit",
            None,
        ),  # fmt: skip
        # no deny or ask path rule: nothing to ask about
        (["allow shell(ln *)", "allow shell(echo *)"], "ln -s a b; echo x > b", None),
    ],
)
def test_a_target_an_earlier_part_may_make_is_unprovable(rule_texts, command, expected):
    decision = decided(rule_texts, "shell", command=command)
    assert (decision.action if decision else None) == expected


def test_a_made_target_says_why_and_without_exists_every_late_target_is_unprovable():
    asked = decided(LINKING, "shell", command="ln -s ../.git/hooks src/h3; echo x > src/h3/x")
    assert asked.text == (
        "Asked: the target of the redirection > src/h3/x does not exist yet (an earlier "
        "command may make it a link), which rule `write_file(.git/**)` (your settings) "
        "cannot check"
    )
    listed = [rule(t) for t in [*LINKING, "allow write_file(src/**)"]]
    command = {"command": "git pull && echo x > src/a.py"}
    blind = rules.decide(listed, "shell", command, resolve=resolve)
    assert blind.action == ASK
    assert rules.decide(listed, "shell", command, resolve=resolve, exists=exists).action == ALLOW
    # Without exists (the runner's way), a path an earlier part replaces is covered too.
    swap = {"command": "rm -rf src; ln -s .git src; echo x > src/a.py"}
    assert rules.decide(listed, "shell", swap, resolve=resolve).action == ASK


@pytest.mark.parametrize(
    ("rule_texts", "command", "expected"),
    [
        # wrappers rules now read: the command inside is denied
        (NO_RM, "strace rm x", DENY),  # attack
        (NO_RM, "strace -f -o log.txt -e trace=file rm x", DENY),  # attack
        (NO_RM, "ltrace rm x", DENY),  # attack
        (NO_RM, "taskset 1 rm x", DENY),  # attack
        (NO_RM, "taskset -c 0,1 rm x", DENY),  # attack
        (NO_RM, "chrt 1 rm x", DENY),  # attack
        (NO_RM, "chrt -f 1 rm x", DENY),  # attack
        (NO_RM, "chroot / rm x", DENY),  # attack
        (NO_RM, "chroot --userspec=a:b / rm x", DENY),  # attack
        (NO_RM, "unshare rm x", DENY),  # attack
        (NO_RM, "unshare -r -n --mount-proc rm x", DENY),  # attack
        (NO_RM, "nsenter -t 1 -m rm x", DENY),  # attack
        (NO_RM, "fakeroot rm x", DENY),  # attack
        (NO_RM, "fakeroot -- rm x", DENY),  # attack
        (NO_RM, "firejail --quiet --net=none rm x", DENY),  # attack
        (NO_RM, "systemd-run --user --wait -p A=1 rm x", DENY),  # attack
        (NO_RM, "pkexec rm x", DENY),  # attack
        (NO_RM, "pkexec --user root rm x", DENY),  # attack
        (NO_RM, "caffeinate -i rm x", DENY),  # attack
        (NO_RM, "npx rm x", DENY),  # attack
        (NO_RM, "npx --yes -p pkg rm x", DENY),  # attack
        (NO_RM, "bunx rm x", DENY),  # attack
        (NO_RM, "uvx rm x", DENY),  # attack
        (NO_RM, "uv run rm x", DENY),  # attack
        (NO_RM, "uv run --with pytest -- rm x", DENY),  # attack
        (NO_RM, "npm exec rm x", DENY),  # attack
        (NO_RM, "pnpm dlx rm x", DENY),  # attack
        (NO_RM, "poetry run rm x", DENY),  # attack
        (NO_RM, "pipenv run rm x", DENY),  # attack
        (NO_RM, "conda run -n base rm x", DENY),  # attack
        (NO_RM, "sudo strace -f nice rm x", DENY),  # attack
        # what they run out of sight
        (NO_RM, "sg staff rm", ASK),  # attack: sg runs a string
        (NO_RM, "echo 'rm x' | chroot /", ASK),  # attack
        (NO_RM, "echo 'rm x' | unshare -r", ASK),  # attack
        (NO_RM, "echo 'rm x' | fakeroot", ASK),  # attack
        (NO_RM, "echo 'rm x' | newgrp staff", ASK),  # attack
        (NO_RM, "systemd-run -S", ASK),  # attack
        (NO_RM, "npx -c 'rm x'", ASK),  # attack
        (NO_RM, "uv run --frobnicate rm x", ASK),
        (NO_RM, "git -c alias.x='!rm x' x", ASK),  # attack
        (NO_RM, "git -c ALIAS.x='! rm x' x", ASK),  # attack
        (NO_RM, "git -c core.pager='rm x' log", ASK),  # attack
        (NO_RM, "git -c core.sshCommand='rm x' fetch", ASK),  # attack
        (NO_RM, "git --config-env=alias.x=CMD x", ASK),  # attack
        (NO_RM, "GIT_CONFIG_PARAMETERS=\"'alias.x=!rm x'\" git x", ASK),  # attack
        (NO_RM, "env GIT_CONFIG_COUNT=1 git x", ASK),  # attack
        (NO_RM, "git -c alias.st=status st", None),
        (NO_RM, "git -c user.name=x commit -m y", None),
        # an unknown program given the denied command: it may run it, so it is asked about
        (NO_RM, "mywrap rm x", ASK),  # attack
        (NO_RM, "mywrap -q /bin/rm -rf x", ASK),  # attack
        (NO_RM, "mywrap --opt rm", ASK),  # attack
        (NO_RM, "echo farm x", None),
        (["deny shell(git push *)", "allow shell"], "mywrap git push origin", ASK),  # attack
        (["deny shell(git push *)", "allow shell"], "mywrap git pull", ALLOW),
        (["ask shell(git push *)", "allow shell"], "nohup2 git push", ASK),
        (["deny shell(rm -rf *)", "allow shell"], "mywrap rm -rf x", ASK),  # attack
        (["deny shell(rm -rf *)", "allow shell"], "mywrap rm x", ALLOW),
        # allow: the wrapper and what it runs must both be allowed
        (["allow shell(uv run *)"], "uv run rm x", None),
        (["allow shell(uv run *)", "allow shell(pytest *)"], "uv run pytest -x", ALLOW),
        (["allow shell(strace *)"], "strace rm x", None),
        (["allow shell(git *)"], "git -c alias.x='!rm x' x", None),
        (["allow shell(git *)"], "git -c user.name=x commit", ALLOW),
    ],
)
def test_more_wrappers_and_a_denied_program_among_the_arguments(rule_texts, command, expected):
    assert action_of(rule_texts, "shell", command=command) == expected


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("sg staff rm", "the command sg runs a string as a command"),
        ("git -c alias.x='!rm x' x", "the command git -c alias.x runs a string as a command"),
        ("echo x | chroot /", "the command chroot with no command runs a shell that reads its"),
        ("uv run --frob rm x", "the option --frob of uv run is not one rules read"),
        ("mywrap -q /bin/rm -rf x", "the command mywrap -q /bin/rm -rf x may run rm -rf x"),
    ],
)
def test_a_wrapped_or_named_command_says_why_it_is_asked(command, reason):
    decision = rules.decide([rule("deny shell(rm *)")], "shell", {"command": command})
    assert decision.action == ASK and decision.unprovable.startswith(reason)
