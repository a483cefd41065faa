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
        # grep's pager, alone or in a cluster of short options
        ("git grep --no-index -O'touch pwned' hello", None),
        ("git grep -iO'touch pwned' hello", None),
        ("git grep --open-files-in-pager=id x", None),
        ("git grep --open=id x", None),
        ("git grep -i hello", ALLOW),
        # long options abbreviated, as git's parse-options accepts them
        ("git rebase --exe=id main", None),
        ("git rebase --exe id main", None),
        ("git fetch --upload-pac=id origin", None),
        ("git push --exe=id", None),
        ("git push --receive-pac=id", None),
        ("git clone --templat=t a b", None),
        ("git ls-remote --upload-pac=id x", None),
        ("git fetch-pack --exe=id x", None),
        ("git difftool --extc=id", None),
        ("git mergetool --to=x", None),
        ("git config --ed", None),
        ("git config --fil .git/config core.pager id", None),
        ("git --git-di=x log", None),
        ("git push --recurse-submodules=check", ALLOW),
        ("git fetch --update-shallow origin", ALLOW),
        # options before a subcommand's own subcommand
        ("git submodule --quiet foreach id", None),
        ("git submodule -q foreach id", None),
        ("git bisect --x run id", None),
        ("git submodule status", ALLOW),
        # settings that name a program, any case
        ("git config gpg.ssh.defaultKeyCommand id", None),
        ("git config GPG.SSH.DEFAULTKEYCOMMAND id", None),
        ("git config set gpg.ssh.defaultKeyCommand id", None),
        ("git config submodule.x.update '!id'", None),
        ("git config core.alternateRefsCommand id", None),
        ("git config init.templateDir t", None),
        ("git config help.autocorrect 1", None),
        ("git config imap.tunnel id", None),
        ("git config man.viewer x", None),
        ("git config instaweb.httpd id", None),
        ("git config web.browser x", None),
        ("git config browser.x.cmd id", None),
        ("git config trailer.x.command id", None),
        ("git config hook.x.command id", None),
        ("git config remote.origin.vcs x", None),
        ("git -c gpg.ssh.defaultKeyCommand=id commit -S -m x", None),
        ("git -c core.alternateRefsCommand=id fetch", None),
        ("git -c help.autocorrect=1 rebse --exec=id", None),
        # programs and servers git starts
        ("git daemon --access-hook=id", None),
        ("git instaweb --httpd=id", None),
        ("git web--browse http://x", None),
        ("git help -w log", None),
        ("git help --web log", None),
        ("git help log", ALLOW),
        ("git send-email --sendmail-cmd=id x", None),
        ("git credential fill", None),
        ("git p4 sync", None),
        ("git archive --remote=x --exec=id HEAD", None),
        ("git upload-archive x", None),
        ("git receive-pack x", None),
        ("git push ../bare main", None),  # a local push runs that repository's hooks
        ("git push src/bare main", None),
        ("git push -o ci.skip ../bare main", None),
        ("git push file:///tmp/bare main", None),
        ("git push origin main", ALLOW),
        ("git push origin feature/x", ALLOW),
        ("git push git@github.com:a/b.git main", ALLOW),
        ("git config url.../bare.insteadOf origin", None),
        ("git config remote.origin.partialclonefilter blob:none", ALLOW),
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
        (GitRepository(settings=("gpg.ssh.defaultkeycommand",)), "git commit -S -m x", None),
        (GitRepository(settings=("submodule.x.update",)), "git submodule update", None),
        (GitRepository(settings=("core.alternaterefscommand",)), "git fetch", None),
        (GitRepository(settings=("init.templatedir",)), "git init x", None),
        (GitRepository(settings=("help.autocorrect",)), "git log", None),
        (GitRepository(settings=("imap.tunnel",)), "git imap-send", None),
        (GitRepository(settings=("Browser.X.Cmd",)), "git help -i log", None),
        # a push to a remote that is a folder runs that repository's hooks
        (GitRepository(push_targets=("src/bare",)), "git push x main", None),
        (GitRepository(push_targets=("../bare",)), "git push", None),
        (GitRepository(push_targets=("file:///w/bare",)), "git push", None),
        (GitRepository(push_targets=("src/bare",)), "git fetch x", ALLOW),
        (GitRepository(push_targets=(".", "origin", "git@h:a/b")), "git push", ALLOW),
    ],
)
def test_git_in_a_repository_that_names_a_command_is_unprovable(repository, command, expected):
    assert decided(GIT, "shell", lambda folder: repository, command=command) == expected


# git, cp and echo (with its writes) allowed: what an earlier part may change.
SEQUENCE = [
    "allow shell(git *)",
    "allow shell(cp *)",
    "allow shell(cd *)",
    "allow shell(echo *)",
    "allow write_file(**)",
]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git status && git log", ALLOW),
        ("git add . && git commit -m x", ALLOW),
        ("git checkout -b feature && git commit -m x", ALLOW),
        ("git stash list && git log", ALLOW),
        ("git worktree list; git status", ALLOW),
        ("cd src && git status", ALLOW),
        ("git log; cp a b", ALLOW),  # cp runs after git is done
        # a repository made or changed by an earlier part
        ("git clone a x && git -C x/b status", None),
        ("git checkout main && git log", None),
        ("git switch main; git status", None),
        ("git reset --hard x && git status", None),
        ("git merge x && git log", None),
        ("git pull && git log", None),
        ("git rebase main && git log", None),
        ("git stash && git log", None),
        ("git stash pop && git log", None),
        ("git restore . && git log", None),
        ("git am x.patch && git log", None),
        ("git apply x.patch && git log", None),
        ("git cherry-pick x && git log", None),
        ("git submodule update && git status", None),
        ("git worktree add w && git -C w status", None),
        ("git init x && git -C x status", None),
        ("git remote add x src/bare && git push x main", None),
        ("git config remote.x.url src/bare && git push x main", None),
        ("git remote -v && git push origin main", ALLOW),
        ("git config user.name A && git commit -m x", ALLOW),
        ("git log --output=b/config && git -C b log", None),
        ("cp a b/config && git -C b log", None),
        ("echo x > b/config && git -C b log", None),
        ("git status | cp a b/config", None),  # a pipeline's parts run together
    ],
)
def test_git_after_a_part_that_may_write_files_is_unprovable(command, expected):
    assert decided(SEQUENCE, "shell", lambda folder: CLEAN, command=command) == expected


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
    assert decided_in(workspace, "git log", cwd="src") == ALLOW
    assert decided_in(workspace, "git -C src log") == ALLOW
    assert decided_in(workspace, "git -C src log", cwd="src") is None  # no src/src


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
    # a folder that does not exist yet: what the command makes there is not known
    assert decided_in(workspace, "git -C missing status") is None
    assert (
        decided(
            ["allow shell(git *)", "allow shell(mkdir *)", "allow shell(cd *)"],
            "shell",
            lambda folder: GitRepository(*gitrepo.read(workspace, workspace, folder)),
            command="mkdir -p new && cd new && git log",
        )
        is None
    )


def test_the_pager_grep_opens_files_in_runs_and_is_asked_about(workspace):
    """The tester's `git grep -O`: real git runs its value as a command."""
    (workspace / "hello").write_text("hello\n")
    command = "git grep --no-index -O'touch pwned' hello"
    assert decided_in(workspace, command) is None
    subprocess.run(["sh", "-c", command], cwd=workspace, capture_output=True, check=False)
    assert (workspace / "pwned").exists()  # what an allow would have let run


def test_a_push_to_a_remote_that_is_a_folder_is_asked_about(workspace):
    """`git remote add x src/bare`, then `git push x`: receive-pack runs in src/bare, with
    hooks a checkout may have put there (executable, as tracked)."""
    assert decided_in(workspace, "git push x main") == ALLOW
    git(workspace, "remote", "add", "x", "src/bare")
    assert decided_in(workspace, "git push x main") is None
    assert decided_in(workspace, "git status") == ALLOW


def test_a_bare_repository_a_clone_brings_is_not_read_before_it_exists(workspace, tmp_path):
    """The tester's `git clone SRC x && git -C x/b status`: x/b, a bare repository with a
    pager inside the cloned tree, does not exist when rules decide."""
    assert decided_in(workspace, "git clone src x && git -C x/b status") is None
    assert decided_in(workspace, "git -C x/b status") is None


# --- the runner reads the repository before deciding (chat.turn.calls) --------------------


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
