"""What pages, commands and the API do to a tab's turns: submit, cancel, approve,
notice; branch (and edit, regenerate, retry, which are branches) and continue.

Every user message goes through the QueuedMessage table first: it survives a
refresh or a restart the moment it is accepted, and the turn that holds the
tab's lease moves it into the log at its next step (or starts with it). The
tab row lock orders "queue a message" against "release the lease", so a
message is never left behind by a turn that was just ending.

All of it is sync (ORM + channel layer); from async code wrap it in
database_sync_to_async. Who runs the turns is `worker`; the lease is `lease`.
"""

from __future__ import annotations

import logging
import unicodedata
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from chat import blobs, bus, cuts, log, resume
from chat.cuts import CutError
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from chat.render import versions
from chat.stream import Block, Kind, Role
from chat.turn import agents, lease

logger = logging.getLogger(__name__)

# Characters that show nothing on their own: controls, format characters (zero
# width spaces and joiners, the BOM, direction marks), separators, and marks,
# which only decorate a base character (a variation selector is one). A message
# needs one character outside these; emoji, and letters with marks, have one.
# Unassigned code points count as visible: they may be a newer emoji.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp", "Mn", "Me"})
# Letters and symbols that are drawn blank (Hangul fillers, the braille blank).
BLANK_CHARACTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def visible(text: str) -> bool:
    return any(
        ch not in BLANK_CHARACTERS and unicodedata.category(ch) not in INVISIBLE_CATEGORIES
        for ch in text
    )


def submit(
    tab: Tab,
    text: str,
    *,
    attachments: Iterable[str] = (),
    auto_approve: bool = False,
    origin: dict[str, Any] | None = None,
) -> QueuedMessage:
    """Accept a user message: persist it, show it as queued, and make sure a turn takes it.

    `attachments`: the composer's `<sha256>:<name>` values, each a blob one of the tab
    owner's tabs uses (an upload of theirs). `origin`: who sent it when not the user
    (a wake, a parent agent); its user chunk keeps it. ValueError (for the user) for
    an empty message, or a file that is not theirs (blobs.AttachmentError): nothing
    is queued.
    """
    text = text.strip()
    files = blobs.refs(tab.owner_id, attachments)
    if not visible(text) and not files:
        raise ValueError("The message is empty.")
    with transaction.atomic():
        # A message without text carries a file (refused above otherwise).
        _sending(tab, text or files[0]["name"])
        queued = _enqueue(tab, text, files, origin)
        blobs.mark_sent(tab.pk, files)
    # At once when this is the outermost transaction; inside a caller's (a wake's firing),
    # once that commits: a worker asked before would find no message, and none after a
    # rollback.
    transaction.on_commit(lambda: bus.request_run(tab.pk, auto_approve=auto_approve))
    return queued


def _enqueue(
    tab: Tab,
    text: str,
    attachments: list[dict[str, Any]] | None = None,
    origin: dict[str, Any] | None = None,
) -> QueuedMessage:
    """Queue a message; the caller's transaction holds the tab's lock (`_sending`)."""
    queued = QueuedMessage.objects.create(
        tab=tab, text=text, attachments=attachments or [], origin=origin
    )
    # Before the commit: a runner cannot take the row (and send "taken")
    # until then, so "queued" always reaches the pages first.
    bus.publish(tab.pk, {"op": "queued", "id": queued.pk, "text": queued.text})
    return queued


def _sending(tab: Tab, text: str) -> None:
    """The tab is being sent `text`: its draft (an edit's old text) is sent or replaced by
    it, and a tab without a title is named after it. One write, which also takes the tab
    row's lock for the caller's transaction, as select_for_update does: it orders the
    message against a turn's release (chat.turn.lease). Tab.DoesNotExist when the tab is
    gone."""
    fields = {"draft": ""}
    if not tab.title:
        tab.title = _title_from(text)
        fields["title"] = tab.title
    if not Tab.objects.filter(pk=tab.pk).update(**fields):
        raise Tab.DoesNotExist(f"tab {tab.pk} does not exist")


# What the composer takes as a compaction: `/compact` and what to focus on.
COMPACT_COMMAND = "/compact"


def compact_command(text: str) -> str | None:
    """The focus of a `/compact [focus]` message, or None when it is a message."""
    head, _, rest = text.strip().partition(" ")
    first, _, more = head.partition("\n")
    if first != COMPACT_COMMAND:
        return None
    return (more + " " + rest).strip()


def compact(tab: Tab, *, through: int | None = None, instructions: str = "") -> QueuedMessage:
    """Ask for a compaction of the tab's context ("Context management" in ARCHITECTURE.md):
    through the end of the turn of chunk `through`, or of everything. It runs as a turn of
    its own, so asked while a turn runs it waits for that turn's end (queued, as a message
    does). ValueError (for the user) for a chunk that does not exist, or when a
    compaction is already waiting."""
    with transaction.atomic():
        last = Tab.objects.select_for_update().filter(pk=tab.pk).values_list("last_seq").get()[0]
        if not last:
            raise ValueError("Nothing to compact yet: the tab has no messages.")
        if through is not None and not (
            0 < through <= last and Chunk.objects.filter(tab_id=tab.pk, seq=through).exists()
        ):
            raise ValueError(f"There is no chunk {through} in this tab.")
        if QueuedMessage.objects.filter(tab_id=tab.pk, compact=True).exists():
            raise ValueError("A compaction is already waiting to run.")
        queued = QueuedMessage.objects.create(
            tab=tab, text=instructions.strip(), compact=True, compact_through=through
        )
        bus.publish(
            tab.pk,
            {"op": "queued", "id": queued.pk, "text": queued.label, "compact": True},
        )
    bus.request_run(tab.pk)
    return queued


FROZEN_PROMPT = (
    "The system prompt is fixed once the first message is sent: every request starts with "
    "it, and changing it would lose the prompt cache. Start a new tab for another prompt."
)


def set_system_prompt(tab: Tab, text: str) -> None:
    """Give a tab its own system prompt, before its first message only. ValueError (for
    the user) once the tab has a log or a message waiting: the prompt is then frozen."""
    with transaction.atomic():
        locked = Tab.objects.select_for_update().filter(pk=tab.pk).values_list("last_seq").get()
        if locked[0] or QueuedMessage.objects.filter(tab_id=tab.pk).exists():
            raise ValueError(FROZEN_PROMPT)
        Tab.objects.filter(pk=tab.pk).update(system_prompt=text)
    tab.system_prompt = text


# A title is a label, not the message: the first line, cut at a word.
TITLE_LENGTH = 60


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0]
    if len(line) <= TITLE_LENGTH:
        return line
    return line[:TITLE_LENGTH].rsplit(" ", 1)[0] + "…"


def cancel(tab_id: uuid.UUID, turn_id: uuid.UUID | None = None) -> bool:
    """Ask the turn running on this tab to stop. False when none is running.

    With `turn_id` (what the page showed when Stop was pressed), only that turn:
    a Stop that lands as one turn ends must not stop the next one.
    """
    if not lease.request_cancel(tab_id, turn_id):
        # A sub-agent's tab whose prompt no worker took yet (its parent's other children
        # hold the workers): its Stop stops it before it starts, as its parent's would.
        return turn_id is None and agents.cancel(tab_id)
    message = {"type": "turn.cancel", "tab_id": str(tab_id)}
    if turn_id is not None:
        message["turn_id"] = str(turn_id)
    bus.group_send(bus.control_group(tab_id), message)
    return True


def notice(tab_id: uuid.UUID, kind: str, text: str) -> None:
    """A system event on a tab: in the log at once when idle; a running turn reports
    the change itself at its next step (a config-reload chunk in the turn)."""
    with transaction.atomic():
        Tab.objects.select_for_update().filter(pk=tab_id).values_list("pk").get()
        if RunningTurn.objects.filter(tab_id=tab_id).exists():
            return
        block = Block(uuid.uuid4(), None, 0, Role.SYSTEM, Kind.SYSTEM, {"kind": kind, "text": text})
        log.append(tab_id, [block])
    bus.publish(tab_id, {"op": "seal", "block": block.to_dict()})


def approve(
    tab_id: uuid.UUID, call_id: str, approved: bool, *, rule: dict[str, Any] | None = None
) -> None:
    """Answer the approval the running turn waits for on `call_id`; `rule` is what
    "always allow" did ({text, rule: {action, pattern, source, added}}), for its log."""
    message = {"type": "turn.approve", "tab_id": str(tab_id), "call_id": call_id}
    bus.group_send(
        bus.control_group(tab_id),
        {**message, "approved": approved, **({"rule": rule} if rule else {})},
    )


# --- Branches and continue (ARCHITECTURE.md) -----------------------------------------

# The same branch asked for again within this long (a double click, a client
# retrying a request) is the branch made the first time, not a second one.
REPEAT_WINDOW = timedelta(seconds=10)


class Action:
    """Why a branch was made: what its `forked` chunk says, and what a repeat must match."""

    BRANCH = "branch"
    EDIT = "edit"
    REGENERATE = "regenerate"
    RETRY = "retry"


FORKED_TEXT = {
    Action.BRANCH: "Branched from {title}.",
    Action.EDIT: "Branched from {title} to edit a message.",
    Action.REGENERATE: "Branched from {title} to answer again.",
    Action.RETRY: "Branched from {title} to try again after an error.",
}


@dataclass(frozen=True)
class Branched:
    tab: Tab
    # False: the same branch was asked for within REPEAT_WINDOW; this is that one.
    created: bool


def branch(
    tab: Tab, at_seq: int, *, action: str = Action.BRANCH, run: bool = False, draft: str = ""
) -> Branched:
    """A new tab holding a verbatim copy of `tab`'s chunks up to `at_seq`, and a
    `forked` system chunk (never sent). It keeps `tab`'s owner, frozen system
    prompt and model, so its first request shares `tab`'s bytes up to the cut
    (and its prompt cache). `run` starts a turn that answers the copy as it
    stands; `draft` goes into its composer. Raises CutError for a cut that
    cannot be made. Nothing in `tab` changes.

    Edit, Regenerate and Retry make a version: the branch stays in `tab`'s
    conversation (one sidebar entry) with its place among the versions in its
    lineage (chat.render.versions). A plain Branch starts a conversation of its own.
    """
    with transaction.atomic():
        Tab.objects.select_for_update().filter(pk=tab.pk).values_list("pk").get()
        _check_cut(tab.pk, at_seq)
        if run:
            _check_answerable(tab.pk, at_seq)
        repeat = _recent_branch(tab, at_seq, action, run)
        if repeat is not None:
            return Branched(repeat, created=False)
        version = action in versions.VERSION_ACTIONS
        family = (
            {
                "conversation": tab.conversation,
                "lineage": versions.lineage_for(tab.lineage, tab.pk, _content_until(tab, at_seq)),
            }
            if version
            else {}
        )
        child = Tab.objects.create(
            **family,
            owner_id=tab.owner_id,
            title=tab.title,
            model=tab.model,
            system_prompt=tab.system_prompt,
            # Its tools too (the same bytes), and what the tab may do and where.
            tools=tab.tools,
            tool_allow=tab.tool_allow,
            rules=tab.rules,
            workdir=tab.workdir,
            profile_id=tab.profile_id,
            profile_by_model=tab.profile_by_model,
            parent=tab,
            fork_seq=at_seq,
            last_seq=at_seq,
            draft=draft,
        )
        log.copy(tab.pk, child.pk, through=at_seq)
        blobs.copy_refs(tab.pk, child.pk)
        text = FORKED_TEXT[action].format(title=f"“{tab}”")
        forked = Block(
            uuid.uuid4(),
            None,
            0,
            Role.SYSTEM,
            Kind.SYSTEM,
            {
                "kind": "forked",
                "text": text,
                "from_tab": str(tab.pk),
                "at_seq": at_seq,
                "action": action,
                "run": run,
            },
        )
        log.append(child.pk, [forked])
        if run:
            QueuedMessage.objects.create(tab=child, rerun=True)
    if run:
        bus.request_run(child.pk)
    child.refresh_from_db()
    return Branched(child, created=True)


def edit(tab: Tab, seq: int) -> Branched:
    """Edit one of the user's messages: a branch right before it, its text in the composer."""
    chunk = _chunk(tab.pk, seq)
    if chunk.role != Role.USER or chunk.type != Kind.TEXT:
        raise CutError("Only your own messages can be edited.")
    return branch(tab, seq - 1, action=Action.EDIT, draft=chunk.data.get("text") or "")


def regenerate(tab: Tab, seq: int) -> Branched:
    """Answer again the question of the turn that chunk `seq` is in: a branch right
    after the user's messages that start that turn (right before a turn that has
    none), run at once."""
    turn = _turn_of(tab.pk, _chunk(tab.pk, seq))
    if turn[0].role != Role.USER:
        # A turn run without a message of its own (a regenerated or retried branch's)
        # answered the log as it stood before it: answer that again.
        return branch(tab, turn[0].seq - 1, action=Action.REGENERATE, run=True)
    return branch(tab, cuts.regenerate_at(turn), action=Action.REGENERATE, run=True)


def retry(tab: Tab, seq: int) -> Branched:
    """Try again after the error chunk at `seq`: a branch at the end of the last
    step that finished before it (its tool work kept, not run again), run at once."""
    chunk = _chunk(tab.pk, seq)
    if chunk.type != Kind.ERROR:
        raise CutError("Only an error can be retried.")
    turn = _turn_of(tab.pk, chunk)
    try:
        at_seq = cuts.retry_at(turn, seq)
    except CutError:
        if turn[0].role == Role.USER:
            raise
        # A turn run without a message of its own (a regenerated or retried
        # branch's) failed in its first step: answer the log before it again.
        at_seq = turn[0].seq - 1
    return branch(tab, at_seq, action=Action.RETRY, run=True)


def continue_turn(tab: Tab, *, auto_approve: bool = False) -> QueuedMessage:
    """Continue the tab's last turn, which was cut short: a new turn whose message
    says what was interrupted and where. ValueError (for the user) when a turn
    runs or waits to start, or when the last turn finished normally."""
    with transaction.atomic():
        Tab.objects.select_for_update().filter(pk=tab.pk).values_list("pk").get()
        # A finishing turn's lease takes the message on as the next turn.
        if lease.running_turn(tab.pk) is not None:
            raise ValueError("A turn is running: wait for it to end, or stop it, first.")
        if QueuedMessage.objects.filter(tab_id=tab.pk).exists():
            raise ValueError("A message is already waiting to start the next turn.")
        last = (
            # Not a turn of notices alone (a compaction asked for after it).
            Chunk.objects.filter(tab_id=tab.pk, turn_id__isnull=False)
            .exclude(role=Role.SYSTEM)
            .order_by("-seq")
            .values_list("turn_id", flat=True)
            .first()
        )
        turn = (
            list(Chunk.objects.filter(tab_id=tab.pk, turn_id=last).order_by("seq")) if last else []
        )
        # Queued in the transaction that checked: two Continues at once queue one.
        text = resume.message(turn)
        _sending(tab, text)
        queued = _enqueue(tab, text)
    bus.request_run(tab.pk, auto_approve=auto_approve)
    return queued


def _check_cut(tab_id: uuid.UUID, at_seq: int) -> None:
    at = _chunk(tab_id, at_seq) if at_seq > 0 else None
    after = Chunk.objects.filter(tab_id=tab_id, seq__gt=at_seq).order_by("seq").first()
    turn = (
        list(
            Chunk.objects.filter(tab_id=tab_id, turn_id=at.turn_id, seq__lte=at_seq).order_by("seq")
        )
        if at is not None and at.turn_id is not None
        else []
    )
    running = lease.running_turn(tab_id)
    cuts.check(at_seq, at, after, turn, running_turn=running)


NOTHING_TO_ANSWER = (
    "There is nothing there to answer: a branch can run from right after one of your "
    "messages, or after a step's tool results."
)


def _check_answerable(tab_id: uuid.UUID, at_seq: int) -> None:
    """A branch that runs at once must end with the user's side (a message or tool
    results): after an answer, the model would only be asked the same again."""
    last = (
        Chunk.objects.filter(tab_id=tab_id, seq__lte=at_seq)
        .exclude(type__in=(Kind.SYSTEM, Kind.ERROR))
        .order_by("-seq")
        .values_list("role", "type")
        .first()
    )
    if last not in ((Role.USER, Kind.TEXT), (Role.TOOL, Kind.TOOL_RESULT)):
        raise CutError(NOTHING_TO_ANSWER)


def _content_until(tab: Tab, at_seq: int) -> int:
    """The last chunk at or before `at_seq` that is not a system notice (0 for none):
    versions cut after the same content are siblings, whatever notices follow it."""
    last = (
        Chunk.objects.filter(tab_id=tab.pk, seq__lte=at_seq)
        .exclude(type=Kind.SYSTEM)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    return last or 0


def _chunk(tab_id: uuid.UUID, seq: int) -> Chunk:
    chunk = Chunk.objects.filter(tab_id=tab_id, seq=seq).first()
    if chunk is None:
        raise CutError(cuts.NO_SUCH_CHUNK.format(seq=seq))
    return chunk


def _turn_of(tab_id: uuid.UUID, chunk: Chunk) -> list[Chunk]:
    if chunk.turn_id is None:
        raise CutError("That message is not part of an answer.")
    running = lease.running_turn(tab_id)
    if running == chunk.turn_id:
        raise cuts.TurnRunning(cuts.RUNNING)
    return list(Chunk.objects.filter(tab_id=tab_id, turn_id=chunk.turn_id).order_by("seq"))


def _recent_branch(tab: Tab, at_seq: int, action: str, run: bool) -> Tab | None:
    forked = (
        Chunk.objects.filter(
            tab__parent=tab,
            tab__owner_id=tab.owner_id,
            tab__fork_seq=at_seq,
            tab__created_at__gte=timezone.now() - REPEAT_WINDOW,
            seq=at_seq + 1,
            type=Kind.SYSTEM,
            data__action=action,
            data__run=run,
        )
        .select_related("tab")
        .order_by("-tab__created_at")
        .first()
    )
    return forked.tab if forked is not None else None
