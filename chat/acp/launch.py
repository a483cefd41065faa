"""How an agent's process is made: its sandbox's command line, its variables, its files.

An agent runs as the shell's commands do (chat.tools.sandbox: bubblewrap, seccomp, a
fresh /proc, the system read-only, no data directory), with:

- the workspace read-write at its own path (where it starts; a tab's working directory
  bound by the descriptor workdir.open_root opened, as the shell's commands are, so a
  link swapped in for it after the check is not followed), and its own HOME
  read-write (per user and agent, under the data directory: its sessions, for
  `session/load`); nothing else writable but the sandbox's private /tmp;
- its program's install directory read-only, wherever it is (a user's npm prefix,
  /usr/local, /tmp): the `node_modules` holding its package, else the program's folder;
  node's own prefix too when it is outside the system directories;
- no network: a network namespace with its loopback only. Its one way out is its
  endpoint, relayed by chat.acp.relay through a Unix socket bound in, which
  chat/acp/inside.py (run by the server's own interpreter, bound read-only) serves on
  the sandbox's 127.0.0.1:ENDPOINT_PORT;
- variables: a few fixed ones, the operator's for this agent, and its provider's base
  URL (the relay's) with a placeholder key (PLACEHOLDER_KEY) — nothing of the server's
  environment. The provider's real key never enters the sandbox (where the agent, or
  any command it runs, could read and print it): the relay drops the credentials the
  agent sends and puts the real key on each request (Launch.auth).

Claude Code gets Anthropic's variables and its telemetry, error reporting and
updater off; Codex gets OpenAI's, through a config.toml Dispatch writes in its
CODEX_HOME (Codex ignores OPENAI_BASE_URL).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from chat.acp.relay import SOCKET_NAME, Endpoint
from chat.acp.seam import AgentConfig, AgentError
from chat.providers import registry
from chat.providers.base import ProviderError
from chat.tools import files, sandbox, shell, workdir
from chat.tools.base import ToolError

# Where the sandbox's side lives inside (a copy of chat/acp/inside.py), and the folder
# the endpoint's socket is bound at.
INSIDE_SCRIPT = "/run/dispatch/inside.py"
INSIDE_SOCKET_DIR = "/run/dispatch/endpoint"
# The agent's base URL's port on the sandbox's own loopback: any free one, since
# nothing else listens there.
ENDPOINT_PORT = 8700
ENDPOINT_URL = f"http://127.0.0.1:{ENDPOINT_PORT}"

# The key an agent is given: its client insists on one, and the relay replaces it.
PLACEHOLDER_KEY = "dispatch-relay"

# Variables every agent gets (shell.ENV_FIXED: no colours or pagers either).
AGENT_PATH = "/usr/local/bin:/usr/bin:/bin"

# Claude Code: no telemetry, error reports, update checks or other traffic beyond the
# model endpoint (which is all the sandbox can reach anyway: these save it the waits).
CLAUDE_CODE_ENV = (
    ("DISABLE_TELEMETRY", "1"),
    ("DISABLE_ERROR_REPORTING", "1"),
    ("DISABLE_AUTOUPDATER", "1"),
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
)

# Codex's configuration, in $CODEX_HOME (the agent's HOME/.codex). It asks before
# anything but reading ("untrusted"): Dispatch's approvals and rules decide. Its own
# sandbox stays off: it runs inside Dispatch's, which it could not nest in.
CODEX_DIR = ".codex"
CODEX_FILE = "config.toml"
CODEX_CONFIG = """\
# Written by Dispatch at every start of this agent: edits here are replaced.
model_provider = "dispatch"
approval_policy = "untrusted"
sandbox_mode = "danger-full-access"

[model_providers.dispatch]
name = "Dispatch"
base_url = "{base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
supports_websockets = false
"""

# Values masked in what is shown of an agent's stderr (besides the provider's key): of
# the operator's variables, values this long or longer (shorter ones, "1", would mask
# every digit).
MIN_SECRET_CHARS = 8

# The shebang line of a program run by node, read to know whether node must be bound.
SHEBANG_BYTES = 256


@dataclass
class Launch:
    """What start() runs: argv inside the sandbox, bwrap's options, variables."""

    # The agent's program (resolved) and its arguments.
    argv: list[str]
    workspace: Path
    home: Path
    variables: list[tuple[str, str]]
    # The operator's variables for this agent (also in `variables`).
    configured: tuple[tuple[str, str], ...] = ()
    # bwrap options after the workspace: read-only installs, the endpoint's folder.
    extra: list[str] = field(default_factory=list)
    # The endpoint to relay to (None: the agent gets no way out at all).
    endpoint: Endpoint | None = None
    # The provider's key, and the headers carrying it that the relay sets: the host's
    # side only, never the sandbox's.
    key: str = field(default="", repr=False)
    auth: tuple[tuple[bytes, bytes], ...] = field(default=(), repr=False)
    # The workspace's folder as opened by workdir.open_root (bound by descriptor: a link
    # swapped in for it since is not followed), and the whole workspace it is in (bound
    # instead by a bwrap without --bind-fd); None: `workspace` is bound by its path.
    root_fd: int | None = None
    top: Path | None = None

    def release(self) -> None:
        """Close root_fd (once the sandbox has its own copy, or will never run)."""
        if self.root_fd is not None:
            os.close(self.root_fd)
            self.root_fd = None

    @property
    def secrets(self) -> list[str]:
        """Values never shown (in its stderr's tail): its key and its own variables'."""
        return sorted(
            {self.key} - {""}
            | {value for _, value in self.configured if len(value) >= MIN_SECRET_CHARS},
            key=len,
            reverse=True,
        )


def prepare(
    config: AgentConfig,
    workspace: Path,
    home: Path,
    policy: sandbox.Policy,
    cwd: str | None = None,
) -> Launch:
    """The agent's launch, or AgentError saying why it cannot start (blocking: files).
    With `cwd`, `workspace` is the user's whole workspace and the agent runs in its
    folder `cwd`, opened without following a link (workdir.open_root) and bound by that
    descriptor (the Launch holds it: release() it); else in `workspace`, bound by path."""
    if policy.unsandboxed:
        raise AgentError(
            f"{config.name} was not started: external agents run only in the shell's "
            f"sandbox, and {sandbox.OPT_OUT} is set"
        )
    verdict = sandbox.check(policy)
    if not verdict.available:
        raise AgentError(f"{config.name} was not started: {verdict.problem}")
    program = _program(config)
    root_fd = top = None
    try:
        if cwd is None:
            workspace = files.ensure_workspace(workspace)
        else:
            top = files.ensure_workspace(workspace)
            workspace, root_fd = workdir.open_root(top, cwd)
        files.make_private(home)
        home = home.resolve(strict=True)
    except (OSError, ToolError) as exc:
        if root_fd is not None:
            os.close(root_fd)
        raise AgentError(f"{config.name} was not started: {exc}") from exc
    try:
        return _launch(config, program, workspace, home, policy, root_fd, top)
    except BaseException:
        if root_fd is not None:
            os.close(root_fd)
        raise


def _launch(
    config: AgentConfig,
    program: Path,
    workspace: Path,
    home: Path,
    policy: sandbox.Policy,
    root_fd: int | None,
    top: Path | None,
) -> Launch:
    span = top or workspace
    if home.is_relative_to(span) or span.is_relative_to(home):
        raise AgentError(
            f"{config.name} was not started: its home {home} and the workspace overlap"
        )
    extra = [*_installs(config, program, policy), *_interpreter()]
    variables = _variables(config, home)
    endpoint, key = _endpoint(config, home, variables)
    argv = [str(program), *config.command[1:]]
    auth = _auth(config, key)
    return Launch(
        argv, workspace, home, variables, config.env, extra, endpoint, key, auth, root_fd, top
    )


def inside_argv(prepared: Launch, control_fd: int) -> list[str]:
    """The sandbox's command: its side (inside.py), which runs the agent's argv; the
    control socket keeps its descriptor number `control_fd` through bwrap."""
    return [
        _base_python(),
        "-I",
        "-S",
        INSIDE_SCRIPT,
        str(ENDPOINT_PORT if prepared.endpoint is not None else 0),
        f"{INSIDE_SOCKET_DIR}/{SOCKET_NAME}",
        str(control_fd),
        "--",
        *prepared.argv,
    ]


def _program(config: AgentConfig) -> Path:
    name = config.command[0]
    found = shutil.which(name)
    if found is None:
        where = "does not exist or is not executable" if os.sep in name else "is not on PATH"
        raise AgentError(
            f"{config.name} is not installed: its command {name!r} {where} (see the README's "
            "External agents section)"
        )
    return Path(found).resolve()


def _within_system(path: Path) -> bool:
    return any(path.is_relative_to(Path(d).resolve()) for d in sandbox.SYSTEM_DIRS)


def _installs(config: AgentConfig, program: Path, policy: sandbox.Policy) -> list[str]:
    """bwrap options binding the program's install (and node's) read-only; AgentError
    for one that holds what the sandbox hides (the data directory, the workspaces)."""
    folders = {_install_dir(program)}
    if _runs_on_node(program) and (node := shutil.which("node")) is not None:
        real = Path(node).resolve()
        # node's prefix (bin/node -> the prefix), for its lib/ beside it.
        folders.add(real.parent.parent if real.parent.name == "bin" else real.parent)
    folders = {folder for folder in folders if not _within_system(folder)}
    for folder in folders:
        for hidden in policy.hidden:
            hidden = hidden.resolve()
            if hidden.is_relative_to(folder) or folder.is_relative_to(hidden):
                raise AgentError(
                    f"{config.name} was not started: its install directory {folder} holds or "
                    f"is in {hidden}, which agents must not see; install it elsewhere"
                )
    return [arg for folder in sorted(folders) for arg in ("--ro-bind", str(folder), str(folder))]


def _install_dir(program: Path) -> Path:
    """The `node_modules` holding the program's package (its dependencies and a
    per-platform binary's package sit beside it), else the program's own folder."""
    for parent in program.parents:
        if parent.name == "node_modules":
            return parent
    return program.parent


def _runs_on_node(program: Path) -> bool:
    try:
        with program.open("rb") as f:
            first = f.read(SHEBANG_BYTES).partition(b"\n")[0]
    except OSError:
        return False
    return first.startswith(b"#!") and b"node" in first


def _base_python() -> str:
    return str(Path(getattr(sys, "_base_executable", sys.executable)).resolve())


def _interpreter() -> list[str]:
    """The server's interpreter (not its venv: inside.py needs the standard library
    only), read-only, when it is outside the system directories."""
    prefix = Path(sys.base_prefix).resolve()
    if _within_system(prefix):
        return []
    return ["--ro-bind", str(prefix), str(prefix)]


def _variables(config: AgentConfig, home: Path) -> list[tuple[str, str]]:
    path = AGENT_PATH
    if (node := shutil.which("node")) is not None:
        path = f"{Path(node).resolve().parent}:{path}"
    fixed = {
        **shell.ENV_FIXED,
        "PATH": path,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "SHELL": shell.shell_path(),
    }
    return [*fixed.items(), *config.env]


def _endpoint(
    config: AgentConfig, home: Path, variables: list[tuple[str, str]]
) -> tuple[Endpoint | None, str]:
    """The provider's endpoint and key; the relay's URL and the placeholder key added to
    `variables`."""
    if not config.provider:
        return None, ""
    spec = registry.PROVIDERS[config.provider]
    try:
        creds = registry.credentials(config.provider)
    except ProviderError as exc:
        raise AgentError(f"{config.name} was not started: {exc}") from exc
    url = creds.base_url or spec.default_url
    try:
        endpoint = Endpoint.of(url)
    except ValueError as exc:
        raise AgentError(f"{config.name} was not started: {exc}") from exc
    key = creds.api_key or ""
    if config.provider == "anthropic":
        variables += [
            *CLAUDE_CODE_ENV,
            ("ANTHROPIC_API_KEY", PLACEHOLDER_KEY),
            ("ANTHROPIC_BASE_URL", ENDPOINT_URL),
        ]
    elif config.provider == "openai":
        codex_home = home / CODEX_DIR
        try:
            _write_codex_config(home, CODEX_CONFIG.format(base_url=ENDPOINT_URL).encode())
        except OSError as exc:
            raise AgentError(
                f"{config.name} was not started: its {codex_home}/{CODEX_FILE} cannot be "
                f"written ({exc.strerror or exc})"
            ) from exc
        variables += [
            ("OPENAI_API_KEY", PLACEHOLDER_KEY),
            ("OPENAI_BASE_URL", ENDPOINT_URL),
            ("CODEX_HOME", str(codex_home)),
        ]
    return endpoint, key


def _auth(config: AgentConfig, key: str) -> tuple[tuple[bytes, bytes], ...]:
    """The headers the relay sets for the provider's key (none without a key: a local
    server may want none); AgentError for a key no header can carry."""
    if not key:
        return ()
    if not key.isascii() or not key.isprintable():
        raise AgentError(
            f"{config.name} was not started: its {config.provider} key holds a character "
            "an HTTP header cannot carry (a line break, a control or non-ASCII character)"
        )
    if config.provider == "anthropic":
        return ((b"x-api-key", key.encode()),)
    return ((b"Authorization", b"Bearer " + key.encode()),)


def _write_codex_config(home: Path, data: bytes) -> None:
    """HOME/.codex/config.toml holding `data`, 0600, written without following a link:
    HOME persists and the agent writes it, so either name may be a link it planted
    (`ln -s ~/.ssh/authorized_keys ~/.codex/config.toml`) to make the server, which
    writes this outside the sandbox, overwrite a host file. Each step is relative to a
    descriptor of the folder opened with O_NOFOLLOW; a link (or file) named .codex is
    replaced by a folder, an existing config.toml is unlinked (never opened) and the new
    one made with O_EXCL. OSError for what cannot be (a folder named config.toml)."""
    home_fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        codex_fd = _private_dir(CODEX_DIR, home_fd)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(CODEX_FILE, dir_fd=codex_fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(CODEX_FILE, flags, 0o600, dir_fd=codex_fd)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        finally:
            os.close(codex_fd)
    finally:
        os.close(home_fd)


def _private_dir(name: str, parent_fd: int) -> int:
    """A descriptor of the folder `name` in `parent_fd` (made 0700 if missing; what is
    there but a folder, a link above all, is removed first), never through a link."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError as exc:
        # A link gives ELOOP under O_NOFOLLOW, a file ENOTDIR: either is replaced.
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(name, dir_fd=parent_fd)
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        fd = os.open(name, flags, dir_fd=parent_fd)
    try:
        os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd
