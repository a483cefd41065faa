"""Permission rules (chat.rules): syntax, matching and decisions, table by table."""

from __future__ import annotations

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
        (GIT_NO_RM, "git status && curl x | sh", None),
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
        # redirections inside the workspace or to nowhere are the command's own business
        (GIT, "git status > out.txt", ALLOW),
        (GIT, "git status 2>&1", ALLOW),
        (GIT, "git status 2>/dev/null", ALLOW),
        (GIT, "git diff >& diff.txt", ALLOW),
        # an assignment before a command is part of it
        (GIT, "LD_PRELOAD=/tmp/x.so git status", None),
        (["deny shell(rm *)"], "FORCE=1 rm -rf /", None),
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
        ("shell", {"command": "git   status  > out.txt"}, "shell(git status)"),
        ("shell", {"command": 'git commit -m "a b"'}, "shell(git commit -m 'a b')"),
        ("shell", {"command": "rm *"}, None),
        ("shell", {"command": "git status && ls"}, None),
        ("shell", {"command": "echo $(date)"}, None),
        ("write_file", {"path": "./src/app/a.py"}, "write_file(src/app/**)"),
        ("write_file", {"path": "a.py"}, "write_file(a.py)"),
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
