"""Permission rules and git (chat.rules): `allow shell(git *)` is not a way to run any
command. A config write of a setting that runs a command, an option or subcommand of git
that runs one, a write to git's own files, and a git command whose repository (or HOME)
names a command are unprovable: never allowed by a specifier rule, asked about."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from channels.db import database_sync_to_async

from chat import rules, turns
from chat.models import PermissionRule
from chat.providers.base import Finish, TextDelta, ToolCallEvent
from chat.rules import ALLOW, ASK, GitRepository
from chat.tools import gitrepo
from tests.engine import Watcher, make_tab, owner_workspace, running_worker, submit
from tests.test_rules import rule

GIT = ["allow shell(git *)"]
# Every write allowed, and echo: what an attacker needs besides git.
WRITES = ["allow shell(git *)", "allow shell(echo *)", "allow write_file(**)"]


def decided(rule_texts, name, repository=None, **arguments):
    decision = rules.decide([rule(t) for t in rule_texts], name, arguments, repository=repository)
    return decision.action if decision else None


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git status", ALLOW),
        ("git log --oneline -5", ALLOW),
        ("git config user.name Alice", ALLOW),
        ("git config --global user.email a@example.com", ALLOW),
        ("git config --get alias.x", ALLOW),
        ("git config alias.x", ALLOW),  # one name: a read
        ("git config -l", ALLOW),
        ("git config --unset core.pager", ALLOW),
        ("git config get core.pager", ALLOW),
        ("git -c color.ui=never log", ALLOW),
        ("git -c alias.st=status st", ALLOW),  # an alias seen, of a git command that runs none
        ("git -C src status", ALLOW),
        # writes of settings that run commands
        ("git config alias.x '!sh -c id'", None),
        ("git config alias.x 'config core.pager id'", None),
        ("git config alias.x status", None),  # a later `git x`: its value is not seen then
        ("git config core.pager 'sh -c id'", None),
        ("git config core.editor vim", None),
        ("git config core.fsmonitor ./fsmon", None),
        ("git config core.sshCommand 'ssh -o ProxyCommand=id'", None),
        ("git config core.hooksPath hooks", None),
        ("git config pager.log id", None),
        ("git config diff.pdf.textconv id", None),
        ("git config diff.x.command id", None),
        ("git config filter.lfs.clean id", None),
        ("git config filter.lfs.smudge id", None),
        ("git config filter.lfs.process id", None),
        ("git config credential.helper '!id'", None),
        ("git config gpg.program id", None),
        ("git config gpg.ssh.program id", None),
        ("git config sequence.editor id", None),
        ("git config merge.ours.driver id", None),
        ("git config include.path other.cfg", None),
        ("git config includeIf.gitdir:/.path other.cfg", None),
        ("git config remote.origin.uploadpack id", None),
        ("git config protocol.ext.allow always", None),
        ("git config uploadpack.packObjectsHook id", None),
        ("git config --global alias.x '!id'", None),
        ("git config --local core.pager id", None),
        ("git config --file .git/config core.pager id", None),
        ("git config -f .git/config core.pager id", None),
        ("git config --add alias.x '!id'", None),
        ("git config --replace-all core.pager id", None),
        ("git config set core.pager id", None),
        ("git config set --global alias.x '!id'", None),
        ("git config CORE.PAGER id", None),
        ("git config --edit", None),
        ("git config --rename-section x alias", None),
        ("git -c alias.x='!id' x", None),
        ("git -c 'alias.x=config core.pager id' x", None),
        ("git -c core.pager=id log", None),
        ("git --config-env=core.pager=X log", None),
        ("git --git-dir=elsewhere log", None),
        ("git --exec-path=bin log", None),
        ("GIT_DIR=elsewhere git log", None),
        ("GIT_EXTERNAL_DIFF=id git diff", None),
        # options and subcommands that run a command
        ("git rebase -x id main", None),
        ("git rebase --exec=id main", None),
        ("git difftool --extcmd=id", None),
        ("git fetch --upload-pack=id origin", None),
        ("git clone -u id a b", None),
        ("git clone --template=t a b", None),
        ("git init --template t", None),
        ("git push --receive-pack=id", None),
        ("git submodule foreach id", None),
        ("git bisect run id", None),
        ("git filter-branch --tree-filter id", None),
    ],
)
def test_git_commands_that_may_run_another_are_unprovable(command, expected):
    assert decided(GIT, "shell", command=command) == expected


@pytest.mark.parametrize(
    ("rule_texts", "name", "arguments", "expected"),
    [
        (WRITES, "write_file", {"path": "src/a.py"}, ALLOW),
        (WRITES, "write_file", {"path": ".git/config"}, None),
        (WRITES, "write_file", {"path": ".git/hooks/pre-commit"}, None),
        (WRITES, "write_file", {"path": "sub/.git/hooks/post-checkout"}, None),
        (WRITES, "write_file", {"path": ".git"}, None),  # a .git file naming a repository
        (WRITES, "write_file", {"path": ".gitconfig"}, None),  # HOME's settings
        (WRITES, "write_file", {"path": ".config/git/config"}, None),
        (WRITES, "shell", {"command": "echo x > src/a.py"}, ALLOW),
        (WRITES, "shell", {"command": "echo '[core] pager = id' > .git/config"}, None),
        (WRITES, "shell", {"command": "echo id >> .git/hooks/pre-commit && git commit"}, None),
        (WRITES, "shell", {"command": "echo x > .gitconfig; git log"}, None),
        # a rule that names git's files allows them; so does the whole tool
        (["allow write_file(.git/hooks/*)"], "write_file", {"path": ".git/hooks/x"}, ALLOW),
        (["allow write_file"], "write_file", {"path": ".git/config"}, ALLOW),
        (["ask write_file(**)", "allow write_file(**)"], "write_file", {"path": ".git/x"}, ASK),
    ],
)
def test_writes_to_gits_own_files_are_not_allowed_by_a_broad_rule(
    rule_texts, name, arguments, expected
):
    assert decided(rule_texts, name, **arguments) == expected


CLEAN = GitRepository(settings=("core.bare", "user.name", "remote.origin.url"))


@pytest.mark.parametrize(
    ("repository", "command", "expected"),
    [
        (CLEAN, "git status", ALLOW),
        (CLEAN, "git log && git status", ALLOW),
        (GitRepository(settings=("alias.x",)), "git x", None),
        (GitRepository(settings=("core.pager",)), "git log", None),
        (GitRepository(settings=("core.fsmonitor",)), "git status", None),
        (GitRepository(settings=("diff.x.textconv",)), "git diff", None),
        (GitRepository(settings=("core.sshcommand",)), "git fetch", None),
        (GitRepository(hooks=(".git/hooks/pre-commit",)), "git commit -m x", None),
        (GitRepository(), "cd $HOME && git log", None),  # a folder rules cannot follow
    ],
)
def test_git_in_a_repository_that_names_a_command_is_unprovable(repository, command, expected):
    assert decided(GIT, "shell", lambda folder: repository, command=command) == expected


def test_each_folder_git_runs_in_is_read_and_the_reason_is_said():
    seen = []

    def repository(folder):
        seen.append(folder)
        return GitRepository(settings=("core.pager",) if folder == "sub/deep" else ())

    decision = rules.decide(
        [rule("allow shell(git *)"), rule("ask shell(rm *)")],
        "shell",
        {"command": "git status; cd sub && git -C deep log"},
        repository=repository,
    )
    # A cd that fails leaves the shell where it was: both folders are read.
    assert seen == [".", "deep", "sub/deep"]
    assert decision.action == ASK
    assert decision.text == (
        "Asked: git's settings for sub/deep name a command (core.pager), which rule "
        "`shell(rm *)` (your settings) cannot check"
    )


def test_a_repository_that_cannot_be_read_is_unprovable():
    def repository(folder):
        raise OSError("permission denied")

    assert decided(GIT, "shell", repository, command="git status") is None
    assert decided(GIT, "shell", repository, command="ls") is None  # no rule allows ls
    assert decided(["allow shell(ls *)"], "shell", repository, command="ls -l") == ALLOW


# --- the repository as the runner reads it (chat.tools.gitrepo), real repositories -------


def git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True)


def decided_in(workspace: Path, command: str, cwd: str = "") -> str | None:
    root = workspace / cwd

    def repository(folder: str) -> GitRepository:
        return GitRepository(*gitrepo.read(workspace, root, folder))

    return decided(GIT, "shell", repository, command=command)


@pytest.fixture
def workspace(tmp_path) -> Path:
    git(tmp_path, "init", "-q")
    (tmp_path / "src").mkdir()
    return tmp_path


def test_a_fresh_repository_names_no_command(workspace):
    assert decided_in(workspace, "git status") == ALLOW
    assert decided_in(workspace, "git -C src log", cwd="src") == ALLOW


def include_a_pager(workspace: Path) -> None:
    """An include, written by hand, of a file that names a command: --includes reads it."""
    (workspace / "other").write_text("[core]\n\tsshCommand = id\n")
    with (workspace / ".git" / "config").open("a") as config:
        config.write("[include]\n\tpath = ../other\n")


@pytest.mark.parametrize(
    "attack",
    [
        lambda ws: git(ws, "config", "alias.x", "!id"),
        lambda ws: git(ws, "config", "core.pager", "id"),
        lambda ws: git(ws, "config", "core.fsmonitor", "id"),
        lambda ws: git(ws, "config", "include.path", "other"),
        lambda ws: (ws / ".git/hooks/pre-commit").write_text("#!/bin/sh\nid\n"),
        # the shell's HOME is its root: its .gitconfig is read as the user's settings
        lambda ws: (ws / ".gitconfig").write_text("[core]\n\tpager = id\n"),
        include_a_pager,
    ],
)
def test_a_repository_that_names_a_command_is_asked_about(workspace, attack):
    attack(workspace)
    assert decided_in(workspace, "git status") is None


def test_the_repository_is_found_as_git_finds_it(workspace):
    bare = workspace / "src" / "bare"
    git(workspace, "init", "-q", "--bare", str(bare))
    git(bare, "config", "core.pager", "id")
    assert decided_in(workspace, "git status") == ALLOW
    assert decided_in(workspace, "cd src/bare && git log") is None
    assert decided_in(workspace, "git -C src/bare log") is None
    # a .git file naming a repository outside the workspace is not read: unprovable
    inner = workspace / "src" / "inner"
    inner.mkdir()
    (inner / ".git").write_text("gitdir: /etc\n")
    assert decided_in(workspace, "git -C src/inner log") is None
    # a folder the command makes: git starts from the one above it
    assert decided_in(workspace, "mkdir -p new && cd new && git log") is None  # mkdir: no rule
    assert (
        decided(
            ["allow shell(git *)", "allow shell(mkdir *)", "allow shell(cd *)"],
            "shell",
            lambda folder: GitRepository(*gitrepo.read(workspace, workspace, folder)),
            command="mkdir -p new && cd new && git log",
        )
        == ALLOW
    )


# --- the runner reads the repository before deciding (chat.agent) --------------------


@pytest.mark.django_db(transaction=True)
async def test_the_runner_asks_before_git_runs_an_alias_its_repository_names(
    script, tmp_path, settings
):
    """`allow shell(git *)` ran `git x` with `alias.x = !touch pwned` in the repository;
    now the call waits for approval, and a refusal runs nothing."""
    workspace = await database_sync_to_async(owner_workspace)(settings, tmp_path)
    git(workspace, "init", "-q")
    git(workspace, "config", "alias.x", "!touch pwned")
    script(
        [ToolCallEvent("g1", "shell", {"command": "git x"}), Finish(stop_reason="tool_use")],
        [TextDelta("done"), Finish()],
    )
    async with running_worker():
        tab = await make_tab(approve_tools=True)
        await PermissionRule.objects.acreate(
            user_id=tab.owner_id, action="allow", pattern="shell(git *)"
        )
        async with Watcher(tab.pk) as watcher:
            await submit(tab, "go")
            await watcher.until(
                lambda m: (
                    m["op"] == "status"
                    and (m["status"].get("approval") or {}).get("call_id") == "g1"
                )
            )
            await database_sync_to_async(turns.approve)(tab.pk, "g1", False)
            await watcher.until_idle()
    assert not (workspace / "pwned").exists()
