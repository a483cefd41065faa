"""When a running turn sends and saves: delta coalescing and checkpoint debouncing.

Pure state machines on a clock the caller passes in (the event loop's time in
the runner, plain numbers in tests); the runner owns the timers.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

# Deltas are merged for this long before they are broadcast: a fast model then
# costs a few dozen frames a second per tab, not one per token.
COALESCE_SECONDS = 0.03
# ...or earlier once this much text is waiting, so big deltas are not held back.
COALESCE_MAX_CHARS = 4096
# Checkpoint debounce (DESIGN §2): save the open block after this much idle...
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

    def add(self, chunk_id: uuid.UUID, offset: int, text: str, now: float) -> list[dict]:
        """Take a delta; returns the ops to send now, in order (often none)."""
        ready = []
        if self._texts and chunk_id != self._chunk_id:
            ready.append(self.take())
        if not self._texts:
            self._chunk_id, self._offset, self.due_at = chunk_id, offset, now + self.window
        self._texts.append(text)
        self._chars += len(text)
        if self._chars >= self.max_chars:
            ready.append(self.take())
        return ready

    def take(self) -> dict | None:
        """Everything waiting as one op (None when nothing waits)."""
        if not self._texts:
            return None
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
