"""Tool cards: a call's card (its command or arguments, its approval buttons, a running
clock) and the results nested in it (the output's box, its size, what was cut)."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from chat import rules
from chat.chunks import Kind, Role
from chat.render.figures import counts, line_count, output_text, size
from chat.render.item import Attachment, Item
from chat.tools import shell

# Tool arguments longer than this many lines start collapsed (a write_file call
# carries a whole file; the card should still fit on a screen).
ARGS_OPEN_LINES = 12
# The one-line summary of a call's arguments in its card header.
ARGS_SUMMARY_CHARS = 120
# An argument value longer than this is shown as a block, not inline.
ARGS_INLINE_CHARS = 80
# Argument names that hold a shell command (shown as a terminal line).
COMMAND_KEYS = ("command", "cmd")
# Argument names that say best what a call does, in order of preference.
SUMMARY_KEYS = ("command", "cmd", "path", "file", "query", "url", "pattern", "name")
# A tool's output box shows about this many lines before it scrolls (app.css: .term's
# max-height of 24rem at a line height of 0.8rem x 1.45): past it, or past as many
# lines' worth of characters (long lines wrap), the card offers full height and the
# plain-text view.
OUTPUT_BOX_LINES = 20
OUTPUT_BOX_CHARS = OUTPUT_BOX_LINES * 100


def slot_key(turn_id: Any, step: int, call_id: str) -> str:
    """The result slot of one call. Servers reuse call ids across steps and turns, so
    the key includes both; it is hashed to be a safe CSS value whatever the id holds."""
    raw = f"{turn_id}:{step}:{call_id}".encode()
    return "s" + hashlib.blake2s(raw, digest_size=8).hexdigest()


def approve_key(call_id: str) -> str:
    """Where a call's approval buttons go (the pending approval names the call only)."""
    return "a" + hashlib.blake2s(call_id.encode(), digest_size=8).hexdigest()


@dataclass(eq=False)
class CallPart(Item):
    """A call or one of its results: both name the call, and a result goes to its
    call's slot."""

    @property
    def call_id(self) -> str:
        return str(self.data.get("call_id") or "")

    @property
    def name(self) -> str:
        return str(self.data.get("name") or "")

    @property
    def slot(self) -> str:
        return slot_key(self.turn_id, self.step, self.call_id)


@dataclass(eq=False)
class ToolCall(CallPart):
    """A tool call's card: what it runs, its approval, and its results (`results`)."""

    @property
    def approve(self) -> str:
        return approve_key(self.call_id)

    @property
    def arguments(self) -> Any:
        return self.data.get("arguments") or {}

    @property
    def always_rule(self) -> str | None:
        """The rule the approval buttons' "always allow" adds (chat.rules.natural)."""
        args = self.arguments
        return rules.natural(self.name, args) if isinstance(args, dict) else None

    @property
    def command(self) -> str:
        """A shell command to show as a terminal line, if the call is one."""
        args = self.arguments
        if isinstance(args, dict):
            for key in COMMAND_KEYS:
                if isinstance(args.get(key), str):
                    return str(args[key])
        return ""

    @cached_property
    def args_items(self) -> list[tuple[str, str, bool]]:
        """(name, text, as a block) per argument: strings as written, the rest as JSON.

        A shell call's command is left out (the card shows it as a terminal line).
        """
        args = self.arguments
        if not isinstance(args, dict):
            return [("", json.dumps(args, indent=2, ensure_ascii=False), True)]
        command_key = next((k for k in COMMAND_KEYS if isinstance(args.get(k), str)), None)
        items = []
        for name, value in args.items():
            if name == command_key:
                continue
            text = (
                value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
            )
            items.append((str(name), text, "\n" in text or len(text) > ARGS_INLINE_CHARS))
        return items

    @property
    def args_long(self) -> bool:
        return sum(text.count("\n") + 1 for _, text, _ in self.args_items) >= ARGS_OPEN_LINES

    @property
    def show_args(self) -> bool:
        """Whether the arguments say more than the card's header already does."""
        items = self.args_items
        if not items:
            return False
        if len(items) == 1 and not items[0][2] and not self.command:
            return items[0][1] != self.args_summary
        return True

    @property
    def args_summary(self) -> str:
        args = self.arguments
        if not isinstance(args, dict) or not args:
            return ""
        value = next((args[k] for k in SUMMARY_KEYS if isinstance(args.get(k), str)), None)
        if value is None:
            value = next((v for v in args.values() if isinstance(v, str)), "")
        line = " ".join(value.split())
        if len(line) > ARGS_SUMMARY_CHARS:
            line = line[: ARGS_SUMMARY_CHARS - 1] + "…"
        return line

    @property
    def answered(self) -> bool:
        return any(isinstance(r, ToolResult) and r.has_result for r in self.results)

    @property
    def since_ms(self) -> int:
        """When the call was made (epoch ms): where a running call's clock starts when
        the page did not see it start (app.js, "Tool cards")."""
        when = self.created_at.timestamp() if self.created_at else time.time()
        return int(when * 1000)

    @classmethod
    def asked(cls, approval: dict[str, Any]) -> ToolCall:
        """The call an approval request ({call_id, name, arguments}) names, on no page."""
        return cls(
            id=uuid.uuid4(),
            seq=None,
            turn_id=None,
            step=0,
            role=Role.ASSISTANT,
            type=Kind.TOOL_CALL,
            data=dict(approval),
        )


@dataclass(eq=False)
class ToolResult(CallPart):
    """A tool's result in its call's card (or alone, `orphan`): its output's box, its
    size, the plain-text view, what was cut, the images it brought."""

    @property
    def css_states(self) -> list[str]:
        states = []
        if self.has_result:
            states.append("has-result")
        if self.data.get("is_error"):
            states.append("is-error")
        return states

    @property
    def text(self) -> str:
        return self.data.get("shell_output") or ""

    @cached_property
    def attachments(self) -> list[Attachment]:
        """The images a tool result brought (read_file's, an MCP tool's), as the model
        got them."""
        return Attachment.all_of(self.data)

    @property
    def has_result(self) -> bool:
        return "result" in self.data

    @property
    def result(self) -> str:
        return str(self.data.get("result") or "")

    @property
    def has_output(self) -> bool:
        """Something to copy: its output, else what the model got."""
        return not self.open and bool(self.text or self.result)

    @cached_property
    def output(self) -> str:
        """The text of a sealed result's box (and of its plain-text view)."""
        return output_text(self.data)

    @property
    def shows_counts(self) -> bool:
        """A sealed result says how big its output is; not a bare error message
        (denied, cancelled, refused), which is one short line."""
        return self.sealed and (
            bool(self.text) or (self.has_result and not self.data.get("is_error"))
        )

    @property
    def output_counts(self) -> str:
        return counts(self.output)

    @property
    def output_long(self) -> bool:
        """Longer than its box: full height and the plain-text view are offered."""
        text = self.output
        return len(text) > OUTPUT_BOX_CHARS or line_count(text) > OUTPUT_BOX_LINES

    @property
    def cut_note(self) -> str:
        """What a truncated result left out, as far as the log knows."""
        cut = self.data.get("truncated_bytes")
        if not isinstance(cut, int) or isinstance(cut, bool) or cut <= 0:
            return "The output was cut to fit; the model was told how to get the rest."
        lines = self.data.get("truncated_lines")
        amount = size(cut)
        if isinstance(lines, int) and not isinstance(lines, bool) and lines > 0:
            amount += f" ({lines:,} line{'s' if lines != 1 else ''})"
        return (
            f"{amount} cut from the middle of the output: the model got its first and "
            f"last {shell.OUTPUT_HEAD // 1024} KiB."
        )
