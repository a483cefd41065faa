"""`manage.py send`: run one turn from the command line and stream it to the terminal.

It goes through the same path as the web page: the message is queued, a turn
worker runs it (in this process unless REDIS_URL points at shared workers),
and the ops come back through the tab's channel-layer group.

`--attach FILE` (repeatable) sends files with the message, checked and normalised as the
page's uploads are (chat.blobs) before anything is stored or a tab is made; the message
may then be left out.

`--new --profile NAME` makes the tab from a profile (Settings: its system prompt,
model, allowed tools and rules; `--model` still wins), and `--workdir DIR` gives it a
working directory in the workspace (made if missing).

`--continue --tab <id>` sends no message of its own: it continues the tab's
last turn, which was cut short (turns.continue_turn: a message saying what was
interrupted and where), and follows that turn the same way.

The exit status is 0 when the turn ended normally, and 1 with one line on
stderr saying why when it ended in an error (a provider's or a crash of the
runner), was interrupted (the worker shut down) or was stopped, or when there
was nothing to send or continue.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from chat import blobs, bus, startup, turns
from chat.chunks import Kind, Role, SystemKind
from chat.models import QueuedMessage, Tab
from chat.preferences import new_tab, profile_named
from chat.turn import lease
from chat.worker import run_worker


class Command(BaseCommand):
    help = "Send a message to a tab and stream the turn to the terminal."

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--tab", help="id of an existing tab")
        target.add_argument("--new", action="store_true", help="create a new tab")
        parser.add_argument(
            "--model", help="model id, e.g. offline/demo or anthropic/claude-sonnet-4-5"
        )
        parser.add_argument(
            "--profile", metavar="NAME", help="with --new: make the tab from this profile"
        )
        parser.add_argument(
            "--workdir",
            metavar="DIR",
            help="with --new: the tab's working directory, a folder in the workspace",
        )
        parser.add_argument(
            "--yes-to-tools", action="store_true", help="run tools without asking for approval"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object per op")
        parser.add_argument(
            "--continue",
            action="store_true",
            dest="continue_turn",
            help="continue the tab's last turn, which was cut short (with --tab, no message)",
        )
        parser.add_argument(
            "--attach",
            action="append",
            default=[],
            metavar="FILE",
            help=f"send FILE with the message (repeatable, at most {blobs.MAX_FILES}): "
            f"{blobs.ACCEPTED}",
        )
        parser.add_argument("message", nargs="?")

    def handle(self, *args: Any, **options: Any) -> None:
        _check_arguments(options)
        startup.check()
        files = _read_files(options["attach"])
        tab = self._tab(options)
        printer = (
            JsonPrinter(self.stdout) if options["json"] else TextPrinter(self.stdout, self.stderr)
        )
        if not options["json"]:
            self.stderr.write(f"tab {tab.pk} · model {tab.model}")
        auto_approve = options["yes_to_tools"]
        if options["continue_turn"]:
            start = functools.partial(_continue, tab, auto_approve=auto_approve)
        else:
            start = functools.partial(
                _submit, tab, options["message"] or "", files, auto_approve=auto_approve
            )
        failure = asyncio.run(self._run(tab, start, printer, echo=options["continue_turn"]))
        if failure is not None:
            raise CommandError(failure)

    def _tab(self, options: dict[str, Any]) -> Tab:
        model = options["model"]
        if options["new"]:
            owner = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
            try:
                profile = profile_named(options["profile"]) if options["profile"] else None
                return new_tab(
                    owner, model or "", profile=profile, workdir=options["workdir"] or ""
                )
            except ValueError as exc:  # an unknown profile, a bad working directory
                raise CommandError(str(exc)) from None
        try:
            tab = Tab.objects.get(pk=uuid.UUID(options["tab"]))
        except (ValueError, Tab.DoesNotExist):
            raise CommandError(f"no tab with id {options['tab']!r}") from None
        if model and model != tab.model:
            tab.model = model
            tab.save(update_fields=["model"])
        return tab

    async def _run(
        self,
        tab: Tab,
        start: Callable[[], QueuedMessage],
        printer: JsonPrinter | TextPrinter,
        *,
        echo: bool = False,
    ) -> str | None:
        """Queue the message `start` makes and follow its turn; `echo` prints the
        message first (one the user did not type: a continue)."""
        layer = bus.layer_for(bus.tab_group(tab.pk))
        channel = await layer.new_channel()
        await layer.group_add(bus.tab_group(tab.pk), channel)
        worker = None
        if not settings.REDIS_URL:
            worker = asyncio.create_task(run_worker())
        try:
            try:
                queued = await database_sync_to_async(start)()
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            if echo:
                printer.sent(queued.text)
            return await self._follow(layer, channel, tab, queued.pk, printer)
        finally:
            await layer.group_discard(bus.tab_group(tab.pk), channel)
            if worker is not None:
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)

    async def _follow(
        self,
        layer: Any,
        channel: str,
        tab: Tab,
        queued_id: int,
        printer: JsonPrinter | TextPrinter,
    ) -> str | None:
        """Print the turn's ops until it is idle; why it failed, or None."""
        taken = False
        failure: str | None = None
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            op = message.get("op")
            if op == "taken" and queued_id in message["ids"]:
                taken = True
            if not taken:
                continue
            printer.op(message)
            if op == "seal":
                failure = failure or _failure(message["block"])
            if op == "status":
                status = message["status"]
                if status["state"] == "idle":
                    return failure
                if status["state"] == "waiting" and status.get("approval"):
                    approved = await asyncio.to_thread(printer.ask, status["approval"])
                    await database_sync_to_async(turns.approve)(
                        tab.pk, status["approval"]["call_id"], approved
                    )


def _read_files(paths: list[str]) -> list[blobs.Normalised]:
    """The --attach files, normalised; CommandError (nothing stored) for one refused."""
    if len(paths) > blobs.MAX_FILES:
        raise CommandError(
            f"{len(paths)} files attached; the most one message may carry is {blobs.MAX_FILES}"
        )
    files = []
    for path in paths:
        try:
            size = os.path.getsize(path)
            if size > blobs.MAX_UPLOAD_BYTES:
                raise blobs.AttachmentError(
                    f"{path} is {blobs.human_bytes(size)}; the most a file may be is "
                    f"{blobs.human_bytes(blobs.MAX_UPLOAD_BYTES)}."
                )
            with open(path, "rb") as f:
                data = f.read()
            files.append(blobs.normalise(data, os.path.basename(path)))
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
        except blobs.AttachmentError as exc:
            raise CommandError(str(exc)) from None
    return files


def _submit(
    tab: Tab, message: str, files: list[blobs.Normalised], *, auto_approve: bool
) -> QueuedMessage:
    """Store the files as the tab's uploads, then send them with the message, as the
    page does (committed first: the worker may take the message at once)."""
    values = blobs.add_uploads(tab.pk, files)
    return turns.submit(tab, message, attachments=values, auto_approve=auto_approve)


def _check_arguments(options: dict[str, Any]) -> None:
    """What argparse cannot say: --continue goes with --tab and nothing to send;
    --profile and --workdir make a new tab."""
    for option in ("profile", "workdir"):
        if options[option] is not None and not options["new"]:
            raise CommandError(f"--{option} is for a new tab: use it with --new")
    if not options["continue_turn"]:
        if options["message"] is None and not options["attach"]:
            raise CommandError("a message is required (or --continue --tab <id>)")
        return
    if options["attach"]:
        raise CommandError("--continue sends no files: leave --attach out")
    if options["new"]:
        raise CommandError("--continue needs --tab <id>: a new tab has nothing to continue")
    if options["message"] is not None:
        raise CommandError(
            "--continue sends its own message (what was cut short and where): leave the message out"
        )
    if options["model"]:
        # The model would be changed before it is known whether there is
        # anything to continue; an error must change nothing.
        raise CommandError("--continue keeps the tab's model: leave --model out")


def _continue(tab: Tab, *, auto_approve: bool) -> QueuedMessage:
    """Continue the tab's last turn. A lease whose worker died (a killed `send`) is
    recovered first, as the worker's scan would in a moment: until then the tab
    looks busy and there is nothing to continue yet."""
    lease.recover_stale()
    return turns.continue_turn(tab, auto_approve=auto_approve)


# What a sealed system chunk of these kinds says about how the turn ended.
ENDINGS = {
    SystemKind.INTERRUPTED: "the turn was interrupted",
    SystemKind.CANCELLED: "the turn was stopped",
}


def _failure(block: dict[str, Any]) -> str | None:
    """The one-line reason a chunk gives for a failed turn, or None."""
    data = block["data"]
    if block["type"] == Kind.ERROR:
        reason = f"the turn ended with an error: {data.get('message', '')}"
    elif block["type"] == Kind.SYSTEM and data.get("kind") in ENDINGS:
        reason = f"{ENDINGS[data['kind']]}: {data.get('text', '')}"
    else:
        return None
    return " ".join(reason.split())


class JsonPrinter:
    def __init__(self, out):
        self.out = out

    def op(self, message: dict[str, Any]) -> None:
        fields = {k: v for k, v in message.items() if k != "type"}
        self.out.write(json.dumps(fields, ensure_ascii=False, sort_keys=True))

    def ask(self, approval: dict[str, Any]) -> bool:
        return False  # --json is for scripts: pass --yes-to-tools to run tools

    def sent(self, text: str) -> None:
        pass  # one JSON object per op, and a message sent is not an op


# Model and tool output goes to a terminal: escape sequences in it could move the
# cursor, redraw a fake approval prompt or set the clipboard (OSC 52). Only
# newline and tab pass; the other C0 and C1 controls and DEL are dropped.
_TERMINAL_CONTROLS = dict.fromkeys(
    [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0)]
)


def terminal_safe(text: str) -> str:
    # A carriage return would let a line overwrite what was printed before it.
    return text.replace("\r\n", "\n").replace("\r", "\n").translate(_TERMINAL_CONTROLS)


class TextPrinter:
    """Text as it streams; one line per thinking block, tool call, result, notice and error."""

    def __init__(self, out, err):
        self.out, self.err = out, err
        self.open_type: str | None = None

    def write(self, text: str) -> None:
        self.out.write(terminal_safe(text), ending="")
        self.out.flush()

    def op(self, message: dict[str, Any]) -> None:
        match message["op"]:
            case "open":
                self.open_type = message["block"]["type"]
                if self.open_type == Kind.THINKING:
                    self.write("[thinking] ")
                elif self.open_type == Kind.TOOL_RESULT:
                    self.write(f"[{message['block']['data'].get('name', 'tool')} output]\n")
            case "delta":
                self.write(message["text"])
            case "seal":
                self._seal(message["block"])
            case "status" if message["status"].get("state") == "running":
                pass

    def _seal(self, block: dict[str, Any]) -> None:
        data, kind, was_open = block["data"], block["type"], self.open_type == block["type"]
        self.open_type = None
        match kind:
            case Kind.TEXT if block["role"] == Role.USER:
                self.write(f"> {data['text']}\n")
            case Kind.TEXT | Kind.THINKING:
                if not was_open:
                    prefix = "[thinking] " if kind == Kind.THINKING else ""
                    self.write(prefix + data.get("text", ""))
                self.write("\n")
            case Kind.TOOL_CALL:
                args = json.dumps(data.get("arguments", {}), ensure_ascii=False, sort_keys=True)
                self.write(f"→ {data['name']} {args}\n")
            case Kind.TOOL_RESULT:
                if was_open and not data.get("shell_output", "").endswith("\n"):
                    self.write("\n")
                first = (data.get("result") or "").strip().splitlines()[:1]
                mark = "✗" if data.get("is_error") else "←"
                self.write(f"{mark} {data['name']}: {first[0] if first else '(empty)'}\n")
            case Kind.ERROR:
                code = f" ({data['status_code']})" if data.get("status_code") else ""
                self.err.write(terminal_safe(f"✗ error{code}: {data['message']}"))
            case Kind.SYSTEM:
                self.write(f"· {data.get('kind')}: {data.get('text')}\n")
            case Kind.PLAN:
                marks = {"completed": "✓", "in_progress": "▸"}
                entries = [
                    f"{marks.get(str(e.get('status')), '○')} {e.get('content', '')}"
                    for e in data.get("entries") or []
                ]
                self.write(f"· plan: {' · '.join(entries)}\n")

    def sent(self, text: str) -> None:
        self.write("".join(f"> {line}\n" for line in text.splitlines()))

    def ask(self, approval: dict[str, Any]) -> bool:
        args = terminal_safe(json.dumps(approval.get("arguments", {}), ensure_ascii=False))
        if not sys.stdin.isatty():
            self.err.write(
                f"{approval['name']} {args} needs approval; denied (no terminal). "
                "Pass --yes-to-tools to run tools."
            )
            return False
        answer = input(f"Run {approval['name']} {args}? [y/N] ")
        return answer.strip().lower() in {"y", "yes"}
