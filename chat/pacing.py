"""When a running turn sends and saves: delta coalescing and checkpoint debouncing.

Pure state machines on a clock the caller passes in (the event loop's time in
the runner, plain numbers in tests); the runner owns the timers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

# Deltas are merged for this long before they are broadcast: a fast model then
# costs a few dozen frames a second per tab, not one per token.
COALESCE_SECONDS = 0.03
# ...or earlier once this much text is waiting, so big deltas are not held back.
COALESCE_MAX_CHARS = 4096
# Checkpoint debounce (ARCHITECTURE.md, One turn, step 3): save the open block after
# this much idle...
CHECKPOINT_IDLE = 0.25
# ...and never later than this after its first unsaved delta: a crash loses at
# most about a second of streamed text.
CHECKPOINT_MAX = 1.0


@dataclass
class Coalescer:
    """Merges consecutive deltas of one chunk into one "delta" op: sent `window`
    seconds after its first delta (`due_at`), as soon as `max_chars` are
    waiting, or before a delta of another chunk (ops stay in order)."""

    window: float = COALESCE_SECONDS
    max_chars: int = COALESCE_MAX_CHARS
    # When the waiting text must go; None when nothing waits.
    due_at: float | None = None
    _chunk_id: uuid.UUID | None = None
    _offset: int = 0
    _texts: list[str] = field(default_factory=list)
    _chars: int = 0

    def add(self, chunk_id: uuid.UUID, offset: int, text: str, now: float) -> list[dict[str, Any]]:
        """Take a delta; returns the ops to send now, in order (often none)."""
        ready: list[dict[str, Any]] = []
        if self._texts and chunk_id != self._chunk_id:
            ready.append(self._take_waiting())
        if not self._texts:
            self._chunk_id, self._offset, self.due_at = chunk_id, offset, now + self.window
        self._texts.append(text)
        self._chars += len(text)
        if self._chars >= self.max_chars:
            ready.append(self._take_waiting())
        return ready

    def take(self) -> dict[str, Any] | None:
        """Everything waiting as one op (None when nothing waits)."""
        return self._take_waiting() if self._texts else None

    def _take_waiting(self) -> dict[str, Any]:
        op = {
            "op": "delta",
            "chunk_id": str(self._chunk_id),
            "offset": self._offset,
            "text": "".join(self._texts),
        }
        self.discard()
        return op

    def discard(self) -> None:
        self._chunk_id, self._texts, self._chars, self.due_at = None, [], 0, None


@dataclass
class Debouncer:
    """Says when to checkpoint: `idle` seconds after the last change, and never
    later than `max_wait` after the first change since the last checkpoint."""

    idle: float = CHECKPOINT_IDLE
    max_wait: float = CHECKPOINT_MAX
    _first: float | None = None
    _last: float = 0.0

    def touch(self, now: float) -> float | None:
        """A change. Returns when to check, if the caller has no check scheduled yet."""
        self._last = now
        if self._first is not None:
            return None
        self._first = now
        return now + self.idle

    def check(self, now: float) -> float | None:
        """None: checkpoint now (and the debouncer starts over). Else when to check again."""
        if self._first is None:
            return None
        due = min(self._last + self.idle, self._first + self.max_wait)
        if now < due:
            return due
        self._first = None
        return None

    def reset(self) -> None:
        self._first = None


@dataclass(frozen=True)
class Silence:
    """What the idle watchdog of a stream decides when it looks."""

    # Look again then; None once the attempt has stalled.
    wake_at: float | None
    # The status line should start saying since when the model is silent.
    show_waiting: bool = False
    # The attempt failed: "nothing" came at all, or only "keep-alives".
    stalled: str | None = None


def check_silence(
    now: float,
    *,
    last_event: float,
    wait_start: float | None,
    alive_at: float | None,
    idle: float,
    waiting_shown: bool,
    waiting_after: float,
    silent_max: float,
) -> Silence:
    """The watchdog of one stream, looked at `now` (a timer, not a timeout per event).

    `last_event`: when the last event came; `wait_start`: when the runner began
    waiting for the next one (None while it is busy with what came, which is
    never silence); `alive_at`: when bytes last came on the wire (None if the
    provider cannot tell). After `waiting_after` without an event the status
    shows the wait; after `idle` with neither an event nor a byte the attempt
    stalls. Bytes without events (pings, a tool call's arguments) keep it
    alive, but not for longer than `silent_max` without a single event.
    """
    if wait_start is None:
        return Silence(now + min(idle, waiting_after))
    show = not waiting_shown and now >= last_event + waiting_after
    wakes = [] if waiting_shown or show else [last_event + waiting_after]
    deadline = wait_start + idle
    if now >= deadline:
        if alive_at is None or alive_at + idle <= now:
            return Silence(None, show, "nothing")
        if now - last_event >= silent_max:
            return Silence(None, show, "keep-alives")
        deadline = min(alive_at + idle, last_event + silent_max)
    return Silence(min([deadline, *wakes]), show)
