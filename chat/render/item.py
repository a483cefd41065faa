"""What every chunk element has, as the templates see it (`Item`), and the things a
chunk's element shows that are not chunks: a file attached to it, a branch starting
after it. Each kind of chunk has its presenter, a subclass (chat.render.presenters
picks it)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, ClassVar, cast

from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from chat import chunks
from chat.chunks import Role
from chat.render.figures import count
from chat.render.markup import markdown, stream_text

# The long edge of an image attachment's thumbnail in a message, in CSS pixels: a
# screenshot is recognisable at this size, and two side by side fit a phone's bubble.
THUMB_EDGE_PX = 160
# What a blob's URL may carry: a chunk's data could come from an edited import.
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# An image that can hold script: never shown, a download (templates/chat/_attachment.html
# makes the same exception).
SVG_TYPE = "image/svg+xml"
# What a branch in a tab's lists is called, by the action that made it (chat.turns.Action).
FORK_LABELS = {
    "branch": "Branch",
    "edit": "Edited message",
    "regenerate": "Answered again",
    "retry": "Retried after an error",
}


@dataclass(eq=False)
class Item:
    """One chunk element as the templates see it: what every kind has (its place in the
    log and on the page, its text, what can be done from it). A chunk of a kind no
    presenter knows is shown as this, as "unknown"."""

    id: uuid.UUID
    seq: int | None
    turn_id: uuid.UUID | None
    step: int
    role: str
    type: str
    data: dict[str, Any]
    open: bool = False
    # An open text chunk's body, its Markdown rendered as it streams (`live_body`).
    live: SafeString | None = None
    # A tool call's results, in seq order (live output, then the result).
    results: list[Item] = field(default_factory=list)
    # The chunk before it is of another turn: it starts a bubble. Only `group`
    # sets it, where it sees that chunk. A live chunk joins whatever the page
    # shows before it: a turn opens with the user's messages, so an assistant-side
    # chunk only ever follows a chunk of its own turn (or a user's or a lone one,
    # which no bubble joins across).
    turn_start: bool = False
    # A result whose call is not in the same run of chunks: it is shown on its
    # own, or (live) sent to its card's slot.
    orphan: bool = False
    pending_approval: bool = False
    # The chunk a search result opened the page at: highlighted, scrolled to.
    hit: bool = False
    # What a page render knows about the log around the chunk (`mark_page`): a
    # valid cut here ("Branch from here"), a valid cut right before it ("Edit"),
    # the end of the tab's last answer ("Regenerate"), the last notice of an
    # interrupted last turn ("Continue"). A live fragment knows none of it
    # (`known` False): see `offers_end`.
    known: bool = False
    cut: bool = False
    cut_before: bool = False
    last_answer: bool = False
    resumable: bool = False
    # Branches of the tab that start right after this chunk (or a result in its
    # card), and, on the first chunk, those that start before it (at seq 0).
    forks: list[Fork] = field(default_factory=list)
    forks_before: list[Fork] = field(default_factory=list)
    # The "‹ n / total ›" controls under this chunk (chat.render.versions.mark).
    versions: list[Any] = field(default_factory=list)
    # A `forked` notice on a page render: whether the tab it names still exists.
    origin_gone: bool = False
    # When the log took it (a Chunk row's); None for a stream Block, sealed just now.
    created_at: datetime | None = None
    # On the chunk a finished turn's tokens and cost show under (`mark_usage`): what
    # the `turn_usage` partial shows (`usage_line`).
    usage: dict[str, Any] | None = None

    # A kind whose chunk may be the last of a turn that ended (an answer, an error, a
    # notice): it carries "Regenerate" and "Branch from here" for CSS to show there.
    may_end_turn: ClassVar[bool] = False
    # Which branch of the `chunk` partial shows it: the presenter's kind, so the
    # template compares no kind strings (a bare Item is none of them).
    kind_is_thinking: ClassVar[bool] = False
    kind_is_text: ClassVar[bool] = False
    kind_is_tool_call: ClassVar[bool] = False
    kind_is_tool_result: ClassVar[bool] = False
    kind_is_error: ClassVar[bool] = False
    kind_is_notice: ClassVar[bool] = False
    kind_is_compaction: ClassVar[bool] = False
    kind_is_plan: ClassVar[bool] = False

    @property
    def seq_attr(self) -> str:
        return "" if self.seq is None else str(self.seq)

    @property
    def turn_attr(self) -> str:
        return "" if self.turn_id is None else str(self.turn_id)

    @property
    def assistant_side(self) -> bool:
        """Part of a turn's bubble (the user's own messages, lone notices and compactions
        are not: a compaction splits a turn it happens in)."""
        return self.role != Role.USER

    @property
    def css(self) -> str:
        names = ["chunk", f"t-{self.type.replace('_', '-')}"]
        if self.role == Role.USER:
            names.append("user")
        elif self.assistant_side:
            names.append("a")
        else:
            names.append("alone")
        if self.open:
            names.append("open")
        if self.turn_start:
            names.append("turn-start")
        if self.hit:
            names.append("hit")
        return " ".join([*names, *self.css_states])

    @property
    def css_states(self) -> list[str]:
        """Classes a kind adds after the common ones."""
        return []

    # Text -----------------------------------------------------------------------------

    @property
    def text(self) -> str:
        # The kinds whose data has a `text` (an unknown kind's too, if it has one).
        data = cast(chunks.UserText | chunks.AssistantText | chunks.Thinking, self.data)
        return data.get("text") or ""

    @property
    def body(self) -> SafeString:
        """The streamed body of an open chunk, escaped."""
        return stream_text(self.text)

    @cached_property
    def html(self) -> SafeString:
        return markdown(self.text)

    @property
    def attachments(self) -> list[Attachment]:
        """Files shown under the chunk: a user's message's, a tool result's images."""
        return []

    # State and actions ------------------------------------------------------------------

    @property
    def sealed(self) -> bool:
        return self.seq is not None and not self.open

    @property
    def forked(self) -> bool:
        """A notice that this tab is a branch of another (chat.render.messages.Notice)."""
        return False

    @property
    def ends_turn(self) -> bool:
        """An error or a notice that cuts a turn short: what Continue applies to."""
        return False

    @property
    def offers_end(self) -> bool:
        """A live chunk that may turn out to be the end of its turn: it carries
        "Regenerate" and "Branch from here", which CSS shows only where it is that
        end (the next chunk starts a turn, or it is the last and nothing runs)."""
        return (
            self.may_end_turn
            and not self.known
            and self.sealed
            and self.turn_id is not None
            and self.role != Role.USER
        )

    @property
    def offers_edit(self) -> bool:
        return False

    @property
    def offers_retry(self) -> bool:
        return False

    @property
    def offers_continue(self) -> bool:
        return self.sealed and (self.resumable or (not self.known and self.ends_turn))

    @property
    def offers_regenerate(self) -> bool:
        return self.last_answer or self.offers_end

    @property
    def offers_branch(self) -> bool:
        return self.cut or self.offers_end

    @property
    def offers_copy(self) -> bool:
        return False

    @property
    def offers_compact(self) -> bool:
        return False

    @property
    def has_output(self) -> bool:
        """A tool result with something to copy (chat.render.cards.ToolResult)."""
        return False

    @property
    def has_actions(self) -> bool:
        if not self.sealed:
            return False
        return (
            self.offers_copy
            or self.has_output
            or self.offers_retry
            or self.offers_continue
            or self.offers_branch
            or self.offers_regenerate
        )


@dataclass(frozen=True)
class Attachment:
    """A file under a user's message or in a tool's result (`data["attachments"]`, see
    ARCHITECTURE.md, "Attachments"): a reference to its blob, never its bytes. Images
    show as a thumbnail linking to the image; anything else (an SVG too) as a chip that
    downloads it."""

    sha256: str
    name: str
    mime: str
    size: int
    width: int | None
    height: int | None

    @classmethod
    def of(cls, value: Any) -> Attachment | None:
        """None for an entry without a blob address to link to."""
        if not isinstance(value, dict):
            return None
        ref = cast(chunks.FileRef, value)
        if not SHA256_HEX.fullmatch(str(ref.get("sha256"))):
            return None
        return cls(
            sha256=ref["sha256"],
            name=str(ref.get("name") or "attachment"),
            mime=str(ref.get("mime") or ""),
            size=count(ref.get("size")) or 0,
            width=count(ref.get("width")),
            height=count(ref.get("height")),
        )

    @classmethod
    def all_of(cls, data: chunks.UserText | chunks.ToolResult) -> list[Attachment]:
        """A message's or a tool result's attachments that link to a blob."""
        attachments: Any = data.get("attachments")
        if not isinstance(attachments, list):
            return []
        found = (cls.of(value) for value in attachments)
        return [a for a in found if a is not None]

    @property
    def image(self) -> bool:
        """A raster image: the normaliser measured it, so there is a thumbnail."""
        return bool(self.width and self.height) and self.mime != SVG_TYPE

    @property
    def url(self) -> str:
        return reverse("blob", args=[self.sha256])

    @property
    def thumb_url(self) -> str:
        return reverse("blob_thumb", args=[self.sha256])

    @property
    def thumb_size(self) -> tuple[int, int]:
        """The thumbnail's box, the image's shape at most THUMB_EDGE_PX long: given to
        the <img> before it loads, so nothing below it moves when it does."""
        width, height = self.width or 1, self.height or 1
        scale = min(1.0, THUMB_EDGE_PX / max(width, height))
        return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class Fork:
    """A branch of the tab, as its lists show it."""

    id: uuid.UUID
    action: str
    fork_seq: int
    created_at: datetime

    @property
    def label(self) -> str:
        return FORK_LABELS.get(self.action, FORK_LABELS["branch"])

    @property
    def age(self) -> str:
        """How long ago it was made, for a glance ("just now", "3 minutes ago")."""
        if timezone.now() - self.created_at < timedelta(minutes=1):
            return "just now"
        return f"{timesince(self.created_at)} ago"
