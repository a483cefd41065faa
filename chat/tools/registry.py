"""The tool table the model sees, argument checking, and the one entry point run_tool.

The order of TOOLS is part of every request's cached prefix: changing it (or
any name, description or schema) invalidates every tab's prompt cache. Append
new tools at the end.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chat.providers.base import ToolSpec
from chat.tools import files, mcp, mcp_names, sandbox, shell, wake, workdir
from chat.tools.base import ToolError, ToolOutcome

logger = logging.getLogger(__name__)

OnOutput = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Place:
    """Where a call runs: the folder `root` (the workspace or a tab's working directory in
    it), opened as `fd` by chat.tools.workdir.open_root; tools use the descriptor, so a
    link swapped in for the folder since leads them nowhere."""

    root: Path
    fd: int
    workspace: Path


Runner = Callable[
    [Mapping[str, Any], Place, "OnOutput | None", float, sandbox.Policy], Awaitable[ToolOutcome]
]


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    # Never mutated; tool_specs() hands out copies.
    input_schema: Mapping[str, Any]
    needs_approval: bool
    run: Runner


async def _list_files(
    args: Mapping[str, Any],
    place: Place,
    on_output: OnOutput | None,
    timeout: float,
    policy: sandbox.Policy,
) -> ToolOutcome:
    return await asyncio.to_thread(
        functools.partial(files.list_files, root_fd=place.fd),
        place.root,
        args.get("path", "."),
    )


async def _read_file(
    args: Mapping[str, Any],
    place: Place,
    on_output: OnOutput | None,
    timeout: float,
    policy: sandbox.Policy,
) -> ToolOutcome:
    return await asyncio.to_thread(
        functools.partial(files.read_file, root_fd=place.fd),
        place.root,
        args["path"],
        args.get("offset", 1),
        args.get("limit", files.READ_DEFAULT_LINES),
    )


async def _write_file(
    args: Mapping[str, Any],
    place: Place,
    on_output: OnOutput | None,
    timeout: float,
    policy: sandbox.Policy,
) -> ToolOutcome:
    return await asyncio.to_thread(
        functools.partial(files.write_file, root_fd=place.fd),
        place.root,
        args["path"],
        args["content"],
    )


async def _shell(
    args: Mapping[str, Any],
    place: Place,
    on_output: OnOutput | None,
    timeout: float,
    policy: sandbox.Policy,
) -> ToolOutcome:
    return await shell.run_shell(
        args["command"],
        place.root,
        on_output=on_output,
        timeout=timeout,
        policy=policy,
        root_fd=place.fd,
        workspace=place.workspace,
    )


async def _schedule_wake(
    args: Mapping[str, Any],
    place: Place,
    on_output: OnOutput | None,
    timeout: float,
    policy: sandbox.Policy,
) -> ToolOutcome:
    # run_tool calls chat.tools.wake with the tab instead: a wake is made for a tab.
    return ToolOutcome(f"{wake.NAME} runs only in a tab's turn", is_error=True)


_PATH = {"type": "string", "description": "A path relative to the workspace."}

# The sub-agent tool. The turn runner runs it (chat.turn.agents: it makes a tab and waits
# for that tab's turn), never run_tool, which has no tab to make one from.
AGENT = "agent"
AGENT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "description": {
            "type": "string",
            "minLength": 1,
            "description": "A short title of the task, a few words: the sub-agent's tab is "
            "named after it.",
        },
        "prompt": {
            "type": "string",
            "minLength": 1,
            "description": "The task, complete: the sub-agent sees nothing of this "
            "conversation but this text.",
        },
        "profile": {
            "type": "string",
            "description": "The name of a profile to run the sub-agent with (its model, "
            "prompt, tools and rules); default: this tab's own.",
        },
    },
    "required": ["description", "prompt"],
    "additionalProperties": False,
}


async def _agent(
    args: Mapping[str, Any],
    place: Place,
    on_output: OnOutput | None,
    timeout: float,
    policy: sandbox.Policy,
) -> ToolOutcome:
    return ToolOutcome(f"{AGENT} runs only in a tab's turn", is_error=True)


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="list_files",
        description=(
            "List one directory of the workspace (not recursive): each entry's type "
            "(file, dir, link, other), size in bytes for files, and name, sorted by name; "
            f"at most {files.MAX_LIST_ENTRIES} entries."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "A directory relative to the workspace; default '.'.",
                },
            },
            "additionalProperties": False,
        },
        needs_approval=False,
        run=_list_files,
    ),
    Tool(
        name="read_file",
        description=(
            "Read a text file of the workspace. Returns its lines as they are, without line "
            f"numbers: {files.READ_DEFAULT_LINES} lines unless `limit` says otherwise, and at "
            f"most {files.READ_MAX_BYTES // 1024} KiB. When the file goes on, a last line in "
            "[brackets] says which offset to continue from. An image file (PNG, JPEG, GIF, "
            "WebP, HEIC) is shown to you as an image instead."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": _PATH,
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "The 1-based line number to start at; default 1.",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": (f"How many lines to read; default {files.READ_DEFAULT_LINES}."),
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        needs_approval=False,
        run=_read_file,
    ),
    Tool(
        name="write_file",
        description=(
            "Create or overwrite a file of the workspace with the given text (UTF-8). "
            "Missing parent directories are created."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": _PATH,
                "content": {"type": "string", "description": "The whole new content."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        needs_approval=True,
        run=_write_file,
    ),
    Tool(
        name="shell",
        description=(
            "Run a command with bash in the workspace directory, which is also $HOME. "
            "stdin is empty; stdout and stderr are merged. Output past "
            f"{shell.OUTPUT_CAP // 1024} KiB keeps only its first and last "
            f"{shell.OUTPUT_HEAD // 1024} KiB. The command is killed after "
            f"{shell.SHELL_TIMEOUT:g} s, and anything it left running in the background is "
            "killed when it ends. The environment holds no credentials."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "command": {
                    "type": "string",
                    "minLength": 1,
                    "description": "The command line, run as `bash -c COMMAND`.",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        needs_approval=True,
        run=_shell,
    ),
    Tool(
        name=AGENT,
        description=(
            "Hand a self-contained task to a sub-agent: a new tab with the same workspace "
            "and tools, which works on it alone and returns the text of its final answer, "
            "followed by a JSON line {child_tab, status, usage}. Several calls in one step "
            "run at the same time. Give it everything it needs in `prompt`."
        ),
        input_schema=AGENT_SCHEMA,
        needs_approval=False,
        run=_agent,
    ),
    Tool(
        name=wake.NAME,
        description=wake.DESCRIPTION,
        input_schema=wake.INPUT_SCHEMA,
        needs_approval=True,
        run=_schedule_wake,
    ),
)

_BY_NAME = {tool.name: tool for tool in TOOLS}

# The schema keywords check_arguments understands; a test keeps TOOLS within them.
SUPPORTED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "description",
        "minimum",
        "maximum",
        "minLength",
    }
)


def tool_specs() -> tuple[ToolSpec, ...]:
    """The tools as sent to the provider, in their fixed order (fresh copies)."""
    return tuple(
        ToolSpec(tool.name, tool.description, copy.deepcopy(dict(tool.input_schema)))
        for tool in TOOLS
    )


def streams_output(name: str) -> bool:
    """Whether a call's output streams into its result block as it runs (the shell's
    output, an MCP tool's progress)."""
    return name == "shell" or mcp_names.is_mcp(name)


# Tools that wait for the user even when an allow rule or the "don't ask" setting would
# let them run: what they set up happens later, with nobody watching (a wake).
ALWAYS_ASK = frozenset({wake.NAME})


def always_asks(name: str) -> bool:
    return name in ALWAYS_ASK


def needs_approval(name: str) -> bool:
    """Whether a call must wait for the user's approval.

    An unknown name needs none: nothing runs, run_tool answers it with an error
    at once, and the model can correct itself without bothering the user. An MCP
    tool (`mcp__*`) needs it: whatever it does happens outside the workspace.
    """
    if mcp_names.is_mcp(name):
        return True
    tool = _BY_NAME.get(name)
    return tool is not None and tool.needs_approval


async def run_tool(
    name: str,
    arguments: Mapping[str, Any],
    workspace: Path,
    *,
    on_output: OnOutput | None = None,
    timeout: float | None = None,
    policy: sandbox.Policy | None = None,
    cwd: str = "",
    tab_id: uuid.UUID | None = None,
    owner_id: int | None = None,
) -> ToolOutcome:
    """Run one tool call in `workspace` (created if missing), or in its subfolder
    `cwd` (a tab's working directory, chat.tools.workdir), which is then the tool's
    whole world: paths are relative to it and the shell can write nothing else.

    An `mcp__*` name is called at the MCP server offering it (chat.tools.mcp), with
    `timeout` (None: the server's own), as a tab of `owner_id` (a server that mounts the
    workspace mounts that user's).
    Bad calls (unknown tool, invalid arguments, a path leaving the workspace, a
    failing command) come back as an `is_error` outcome, never as an exception;
    cancelling the awaiting task kills a running command and re-raises.
    `timeout` (seconds) bounds the shell tool and `policy` confines it (default:
    sandboxed, with network); the file tools ignore both.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    if mcp_names.is_mcp(name):
        return await mcp.call(
            name, arguments, on_output=on_output, timeout=timeout, owner_id=owner_id
        )
    tool = _BY_NAME.get(name)
    if tool is None:
        known = ", ".join(_BY_NAME)
        return ToolOutcome(f"unknown tool {name!r}; the tools are: {known}", is_error=True)
    problem = check_arguments(tool.input_schema, arguments)
    if problem is not None:
        return ToolOutcome(f"invalid arguments for {name}: {problem}", is_error=True)
    # Optional arguments sent as null (as OpenAI-style models do) mean "not given".
    args = {key: value for key, value in arguments.items() if value is not None}
    try:
        if name == wake.NAME:
            return await wake.schedule_wake(args, tab_id)
        place = await asyncio.to_thread(_place, Path(workspace), cwd)
        try:
            return await tool.run(
                args, place, on_output, timeout or shell.SHELL_TIMEOUT, policy or sandbox.Policy()
            )
        finally:
            os.close(place.fd)
    except ToolError as exc:
        return ToolOutcome(str(exc), is_error=True)
    except Exception as exc:
        # A bug in a tool must not end the turn; the model sees it and the log has it.
        logger.exception("tool %s failed", name)
        return ToolOutcome(f"{name} failed unexpectedly: {exc!r}", is_error=True)


def _place(workspace: Path, cwd: str) -> Place:
    root, fd = workdir.open_root(workspace, cwd)
    return Place(root, fd, files.ensure_workspace(workspace))


def check_arguments(schema: Mapping[str, Any], arguments: object) -> str | None:
    """What is wrong with `arguments` for this schema, or None when they fit."""
    if not isinstance(arguments, Mapping):
        return f"the arguments must be a JSON object, not {_json_type(arguments)}"
    properties: Mapping[str, Any] = schema["properties"]
    required = schema.get("required", ())
    unknown = [str(key) for key in arguments if key not in properties]
    if unknown:
        expected = ", ".join(properties) or "none"
        return f"unknown argument {_names(unknown)} (expected: {expected})"
    missing = [key for key in required if arguments.get(key) is None]
    if missing:
        return f"missing required argument {_names(missing)}"
    for key, value in arguments.items():
        if value is None:
            continue
        rule = properties[key]
        actual = _json_type(value)
        if actual != rule["type"]:
            return f"argument '{key}' must be {_article(rule['type'])}, not {actual}"
        if "minimum" in rule and value < rule["minimum"]:
            return f"argument '{key}' must be at least {rule['minimum']}, got {value}"
        if "maximum" in rule and value > rule["maximum"]:
            return f"argument '{key}' must be at most {rule['maximum']}, got {value}"
        if "minLength" in rule and len(value) < rule["minLength"]:
            return f"argument '{key}' must not be empty"
    return None


def _json_type(value: object) -> str:
    # bool before int: True is an int in Python but not an integer in JSON.
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _article(json_type: str) -> str:
    return ("an " if json_type[0] in "aeiou" else "a ") + json_type


def _names(keys: list[str]) -> str:
    return ", ".join(repr(key) for key in keys)
