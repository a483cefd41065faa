"""The presenters of a conversation's words: messages and answers, reasoning, errors,
notices and compactions (tool calls and results are chat.render.cards')."""

from __future__ import annotations

import uuid
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, ClassVar, cast

from django.urls import reverse
from django.utils.safestring import SafeString

from chat import chunks, schedule
from chat.chunks import ErrorFix, OriginKind, Role, SystemKind
from chat.render.figures import count, tokens
from chat.render.item import Attachment, Item
from chat.render.markup import code_spans, markdown
from chat.render.versions import VERSION_ACTIONS

SYSTEM_LABELS = {
    SystemKind.NOTICE: "Notice",
    SystemKind.MODEL_CHANGED: "Model changed",
    SystemKind.CONFIG_RELOAD: "Settings reloaded",
    SystemKind.CANCELLED: "Stopped",
    SystemKind.INTERRUPTED: "Interrupted",
    SystemKind.FORKED: "Branch",
    SystemKind.STEP_LIMIT: "Step limit",
    SystemKind.RULE: "Rule",
    SystemKind.ELIDE: "Context trimmed",
}
# The system notices that end a turn early: with an error chunk, what Continue
# applies to (as chat.resume reads them).
ENDING_KINDS = SystemKind.ENDINGS
# How a compaction chunk says it was asked for (chat.turn.compaction writes one of these).
COMPACTION_TRIGGERS = ("auto", "manual")
# How the user's own Stop's notice begins (chat.turn.ending.End.stopped).
OWN_STOP = "Stopped by the user"
# A notice longer than this is one line that opens to the rest: about a line at 375 px.
NOTICE_LINE_CHARS = 90
# Where a tab page's model is chosen (chat/_model_picker.html; app.js opens it).
MODEL_PICKER_ANCHOR = "#model-picker"


@dataclass(eq=False)
class Text(Item):
    """A text chunk: the model's answer (a user's message is `UserText`)."""

    may_end_turn: ClassVar[bool] = True
    kind_is_text: ClassVar[bool] = True

    @property
    def wake(self) -> dict[str, str] | None:
        """The wake that sent a user's message (`UserText`)."""
        return None

    @property
    def offers_copy(self) -> bool:
        # A message of files alone has no Markdown to copy.
        return self.sealed and bool(self.text)

    @property
    def offers_compact(self) -> bool:
        """ "Summarise up to here": on an answer that ends its turn (a compaction keeps
        turns whole). A page render knows where (`cut`, as for a branch); a live answer
        carries it `if-end`, as `offers_end`."""
        return (
            self.sealed
            and self.role == Role.ASSISTANT
            and self.turn_id is not None
            and (self.cut or not self.known)
        )


@dataclass(eq=False)
class UserText(Text):
    """A user's message: its files, the wake that sent it, and Edit."""

    @property
    def fields(self) -> chunks.UserText:
        return cast(chunks.UserText, self.data)

    @cached_property
    def wake(self) -> dict[str, str] | None:
        """A wake's message: its name and scheduled time in its zone, for the clock badge."""
        found: Any = self.fields.get("origin")
        if not isinstance(found, dict):
            return None
        origin = cast(chunks.Origin, found)
        if origin.get("kind") != OriginKind.WAKE:
            return None
        when = str(origin.get("scheduled_for", ""))
        with suppress(ValueError, schedule.ScheduleError):
            zone = schedule.zone(str(origin.get("timezone") or "UTC"))
            at = datetime.fromisoformat(when).astimezone(zone)
            when = f"{at:%Y-%m-%d %H:%M %Z}"
        return {"name": str(origin.get("name") or "wake"), "when": when}

    @cached_property
    def attachments(self) -> list[Attachment]:
        """The message's files, shown under it as the model got them."""
        return Attachment.all_of(self.fields)

    @property
    def offers_edit(self) -> bool:
        return self.sealed and (self.cut_before or not self.known)


@dataclass(eq=False)
class Thinking(Item):
    """The model's reasoning: shown folded, or said to be encrypted or hidden."""

    kind_is_thinking: ClassVar[bool] = True

    @property
    def fields(self) -> chunks.Thinking:
        return cast(chunks.Thinking, self.data)

    @property
    def redacted(self) -> bool:
        # A Responses reasoning item without a summary is encrypted reasoning too.
        fields = self.fields
        return bool(fields.get("redacted_data") or fields.get("reasoning_item")) and not self.text

    @property
    def duration(self) -> str:
        ms: Any = self.fields.get("duration_ms")
        if not isinstance(ms, int | float) or ms < 0:
            return ""
        seconds = ms / 1000
        return (
            f"{seconds:.1f} s"
            if seconds < 60
            else f"{int(seconds // 60)} min {int(seconds % 60)} s"
        )


@dataclass(eq=False)
class Error(Item):
    """A provider's or the runner's error, as a card: what happened, what to do."""

    may_end_turn: ClassVar[bool] = True
    kind_is_error: ClassVar[bool] = True

    @property
    def fields(self) -> chunks.Error:
        return cast(chunks.Error, self.data)

    @property
    def assistant_side(self) -> bool:
        # An error outside any turn stands alone.
        return self.role != Role.USER and self.turn_id is not None

    @property
    def message(self) -> str:
        return str(self.fields.get("message") or "")

    @property
    def status_code(self) -> object:
        return self.fields.get("status_code")

    @property
    def summary(self) -> str:
        """What happened, in words (providers.errors.explain); older errors have none."""
        return str(self.fields.get("summary") or "")

    @property
    def hint(self) -> SafeString:
        """What to do about the error: its text escaped, `names` as code."""
        return code_spans(str(self.fields.get("hint") or ""))

    @property
    def base_url(self) -> str:
        """The endpoint tried, when the hint does not already say it."""
        url = str(self.fields.get("base_url") or "")
        return "" if url in str(self.fields.get("hint") or "") else url

    @property
    def ends_turn(self) -> bool:
        return self.turn_id is not None

    @property
    def offers_retry(self) -> bool:
        return self.sealed and self.turn_id is not None

    @property
    def fix(self) -> str:
        """Where a configuration error is fixed (errors.where_to_fix); an older error's
        refused key (401, 403) too."""
        fix = str(self.fields.get("fix") or "")
        if not fix and self.status_code in (401, 403):
            return ErrorFix.CONNECTIONS
        return fix

    @property
    def fix_link(self) -> tuple[str, str] | None:
        """The card's main action for a configuration error: (href, words)."""
        if self.fix == ErrorFix.CONNECTIONS:
            # Settings opens on Connections: keys and base URLs.
            return reverse("settings"), "Fix it in Settings → Connections"
        if self.fix == ErrorFix.MODEL:
            return MODEL_PICKER_ANCHOR, "Choose another model"
        return None

    @property
    def offers_continue(self) -> bool:
        # Nothing can go on before the configuration is fixed.
        return not self.fix and super().offers_continue

    # An error's Retry asks again; answering again from before it (Regenerate) is the
    # same, and a branch that keeps the error helps nobody.
    @property
    def offers_regenerate(self) -> bool:
        return False

    @property
    def offers_branch(self) -> bool:
        return False


@dataclass(eq=False)
class Notice(Item):
    """A system notice: a model change, a stop, a branch's origin, a rule's decision …
    (its `kind`)."""

    may_end_turn: ClassVar[bool] = True
    kind_is_notice: ClassVar[bool] = True

    @property
    def fields(self) -> chunks.SystemNotice:
        return cast(chunks.SystemNotice, self.data)

    @property
    def assistant_side(self) -> bool:
        # A notice outside any turn (a model change, a branch's origin) stands alone.
        return self.role != Role.USER and self.turn_id is not None

    @property
    def kind(self) -> str:
        return str(self.fields.get("kind") or SystemKind.NOTICE)

    @property
    def kind_label(self) -> str:
        return SYSTEM_LABELS.get(self.kind, self.kind.replace("-", " ").capitalize())

    @property
    def rule_text(self) -> SafeString:
        """A rule's decision (chat.rules.Decision.text): its `patterns` as code."""
        return code_spans(str(self.fields.get("text") or ""))

    @property
    def is_rule(self) -> bool:
        return self.kind == SystemKind.RULE

    @property
    def notice_text(self) -> object:
        """The notice's text as the data holds it (the template shows None as "None",
        as it always has; "" when there is none)."""
        return self.fields.get("text", "")

    @property
    def forked(self) -> bool:
        return self.kind == SystemKind.FORKED

    @property
    def css_states(self) -> list[str]:
        states = []
        # A version's origin says nothing the page's "‹ n / total ›" does not (app.css).
        if self.forked and self.fields.get("action") in VERSION_ACTIONS:
            states.append("version-fork")
        # The user's own Stop (turn.ending.End.stopped without a reason) is no alarm.
        if self.kind == SystemKind.CANCELLED and str(self.notice_text).startswith(OWN_STOP):
            states.append("own-stop")
        return states

    @property
    def folded(self) -> bool:
        """A notice shown as one line (its kind) that opens to its text: a settings
        reload's list of changes, or any long or many-lined text."""
        if self.forked or self.is_rule:
            return False
        text = str(self.notice_text)
        return (
            self.kind == SystemKind.CONFIG_RELOAD
            or len(text) > NOTICE_LINE_CHARS
            or "\n" in text.strip()
        )

    @property
    def from_tab(self) -> str:
        """The tab a `forked` notice names, as a string ("None" when it names none)."""
        return str(self.fields.get("from_tab"))

    @property
    def ends_turn(self) -> bool:
        return self.turn_id is not None and self.kind in ENDING_KINDS

    @property
    def has_actions(self) -> bool:
        # A notice outside any turn is no place to act from: the chunk before it offers
        # the same cut.
        return self.turn_id is not None and super().has_actions

    @property
    def fork_text(self) -> tuple[str, str, str]:
        """A `forked` notice's text around the parent's title: (before, title, after).
        ("", "", text) when the text does not quote a title."""
        text = str(self.fields.get("text") or "")
        before, quote, rest = text.partition("“")
        title, close, after = rest.rpartition("”")
        if not quote or not close:
            return "", "", text
        return before, f"“{title}”", after

    @property
    def origin_url(self) -> str:
        """The parent tab at the cut, for a `forked` notice ("" when its data is not one)."""
        try:
            tab_id = uuid.UUID(str(self.fields.get("from_tab")))
            at_seq = int(self.fields["at_seq"])
        except (KeyError, TypeError, ValueError):
            return ""
        url = reverse("tab", args=[tab_id])
        # The tab page's ?seq= starts at 1: a cut before the first message shows that one.
        return f"{url}?seq={max(at_seq, 1)}"


@dataclass(eq=False)
class Compaction(Item):
    """A compaction (chat.context): a thin notice that opens to the summary the model is
    sent instead of the log before it."""

    kind_is_compaction: ClassVar[bool] = True

    @property
    def fields(self) -> chunks.Compaction:
        return cast(chunks.Compaction, self.data)

    @property
    def assistant_side(self) -> bool:
        # A compaction splits a turn it happens in.
        return False

    @property
    def compaction_summary(self) -> str:
        return str(self.fields.get("summary") or "")

    @cached_property
    def compaction_html(self) -> SafeString:
        """The summary is the model's Markdown: rendered and sanitised as its answers are."""
        return markdown(self.compaction_summary)

    @property
    def compaction_line(self) -> str:
        """What the folded notice says after its label: how it was asked for, how much,
        up to where."""
        parts = []
        if (trigger := self.fields.get("trigger")) in COMPACTION_TRIGGERS:
            parts.append(str(trigger))
        if before := count(self.fields.get("tokens_before")):
            parts.append(f"{tokens(before)} tokens summarised")
        if through := count(self.fields.get("through_seq")):
            parts.append(f"up to #{through}")
        return " · ".join(parts)

    @property
    def compaction_note(self) -> str:
        """Under the summary: who wrote it, what it was told to focus on."""
        notes = [
            "The model is sent this summary instead of the messages before it; the log keeps them."
        ]
        if model := str(self.fields.get("model") or ""):
            notes.append(f"Written by {model}.")
        if focus := " ".join(str(self.fields.get("instructions") or "").split()):
            notes.append(f"Focus: {focus}")
        return " ".join(notes)


# How a plan entry's status shows: a mark before its text.
PLAN_MARKS = {"completed": "✓", "in_progress": "▸", "pending": "○"}


@dataclass(eq=False)
class Plan(Item):
    """An external agent's plan as it stood at one revision. A turn's later revisions go
    in its first plan's slot (`results`, chat.render.page.group), where CSS shows only the
    last: the plan seems updated in place, and every revision stays in the log."""

    kind_is_plan: ClassVar[bool] = True

    @property
    def fields(self) -> chunks.Plan:
        return cast(chunks.Plan, self.data)

    @property
    def entries(self) -> list[dict[str, str]]:
        shown = []
        for entry in self.fields.get("entries") or []:
            status = str(entry.get("status") or "pending")
            mark = PLAN_MARKS.get(status, PLAN_MARKS["pending"])
            shown.append(
                {"content": str(entry.get("content") or ""), "status": status, "mark": mark}
            )
        return shown

    @property
    def done(self) -> int:
        return sum(1 for entry in self.entries if entry["status"] == "completed")

    @property
    def omitted(self) -> int:
        return int(self.fields.get("omitted") or 0)
