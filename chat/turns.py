"""What pages, commands and the API do to a tab's turns: submit, cancel, approve, notice.

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

from django.db import transaction

from chat import bus, lease, log
from chat.models import QueuedMessage, RunningTurn, Tab
from chat.stream import Block, Kind, Role

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


def submit(tab: Tab, text: str, *, auto_approve: bool = False) -> QueuedMessage:
    """Accept a user message: persist it, show it as queued, and make sure a turn takes it."""
    text = text.strip()
    if not visible(text):
        raise ValueError("The message is empty.")
    with transaction.atomic():
        Tab.objects.select_for_update().filter(pk=tab.pk).values_list("pk").get()
        queued = QueuedMessage.objects.create(tab=tab, text=text)
        if not tab.title:
            tab.title = _title_from(text)
            Tab.objects.filter(pk=tab.pk).update(title=tab.title)
        # Before the commit: a runner cannot take the row (and send "taken")
        # until then, so "queued" always reaches the pages first.
        bus.publish(tab.pk, {"op": "queued", "id": queued.pk, "text": queued.text})
    bus.request_run(tab.pk, auto_approve=auto_approve)
    return queued


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
        return False
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


def approve(tab_id: uuid.UUID, call_id: str, approved: bool) -> None:
    """Answer the approval the running turn waits for on `call_id`."""
    bus.group_send(
        bus.control_group(tab_id),
        {"type": "turn.approve", "tab_id": str(tab_id), "call_id": call_id, "approved": approved},
    )
