"""Delta coalescing and checkpoint debouncing, on a clock made of plain numbers."""

from __future__ import annotations

import uuid

import pytest

from chat.pacing import Coalescer, Debouncer, Silence, check_silence

A, B = uuid.UUID(int=1), uuid.UUID(int=2)


def op(chunk, offset, text):
    return {"op": "delta", "chunk_id": str(chunk), "offset": offset, "text": text}


def test_deltas_of_one_chunk_wait_for_the_window_and_go_as_one():
    c = Coalescer(window=0.03, max_chars=100)
    assert c.add(A, 0, "Hel", now=10.0) == []
    assert c.due_at == pytest.approx(10.03)
    assert c.add(A, 3, "lo", now=10.02) == []
    assert c.due_at == pytest.approx(10.03), "the window counts from the first delta"
    assert c.take() == op(A, 0, "Hello")
    assert c.due_at is None and c.take() is None


def test_a_delta_of_another_chunk_sends_the_waiting_one_first():
    c = Coalescer(window=0.03, max_chars=100)
    c.add(A, 0, "a", now=0.0)
    assert c.add(B, 0, "b", now=0.01) == [op(A, 0, "a")]
    assert c.due_at == pytest.approx(0.04), "a new window for the new chunk"
    assert c.take() == op(B, 0, "b")


@pytest.mark.parametrize(
    ("deltas", "sent_at_once", "left"),
    [
        (["ab", "c"], [], "abc"),  # under the limit: all waits
        (["abcd", "e"], [op(A, 0, "abcd")], "e"),  # the limit reached: goes at once
        (["abcdefgh"], [op(A, 0, "abcdefgh")], None),  # one big delta is not split
        (["ab", "cdefgh", "i"], [op(A, 0, "abcdefgh")], "i"),
    ],
)
def test_waiting_text_goes_at_once_when_it_reaches_max_chars(deltas, sent_at_once, left):
    c = Coalescer(window=1.0, max_chars=4)
    sent, offset = [], 0
    for text in deltas:
        sent += c.add(A, offset, text, now=0.0)
        offset += len(text)
    assert sent == sent_at_once
    waiting = c.take()
    assert (waiting["text"] if waiting else None) == left
    if waiting:
        assert waiting["offset"] == offset - len(left), "the offset of the first waiting delta"


def test_discard_forgets_the_waiting_text():
    c = Coalescer()
    c.add(A, 0, "gone", now=0.0)
    c.discard()
    assert c.take() is None and c.due_at is None


def test_a_steady_stream_is_checkpointed_every_max_wait():
    d = Debouncer(idle=0.25, max_wait=1.0)
    assert d.touch(0.0) == 0.25, "the first change schedules a check"
    checkpoints, check_at, now = [], 0.25, 0.0
    while now < 3.0:
        now = round(now + 0.1, 3)
        assert d.touch(now) is None or check_at is None
        if check_at is not None and now >= check_at:
            check_at = d.check(now)
            if check_at is None:
                checkpoints.append(now)
                check_at = d.touch(now)  # the stream goes on
    assert checkpoints == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("touches", "check_now", "expected"),
    [
        ([0.0], 0.25, None),  # idle for `idle`: now
        ([0.0, 0.2], 0.25, 0.45),  # touched since: idle counts from the last change
        ([0.0, 0.2, 0.4, 0.6, 0.8, 0.95], 1.0, None),  # never idle: max_wait caps it
        ([0.0, 0.9], 1.0, None),  # max_wait reached before the idle time
        ([0.0, 0.1], 0.2, 0.35),  # early check: the time to check again
    ],
)
def test_debouncer_table(touches, check_now, expected):
    d = Debouncer(idle=0.25, max_wait=1.0)
    for t in touches:
        d.touch(t)
    result = d.check(check_now)
    assert result == (pytest.approx(expected) if expected is not None else None)


def test_after_a_checkpoint_or_a_reset_the_next_change_schedules_a_new_check():
    d = Debouncer(idle=0.25, max_wait=1.0)
    d.touch(0.0)
    assert d.check(0.3) is None
    assert d.touch(0.5) == 0.75
    d.reset()
    assert d.check(0.8) is None, "nothing to save after a reset (a seal saved it)"
    assert d.touch(0.9) == pytest.approx(1.15)


IDLE, AFTER, MAX = 60.0, 10.0, 600.0


def look(now, *, last=0.0, wait=0.0, alive=None, shown=False):
    return check_silence(
        now,
        last_event=last,
        wait_start=wait,
        alive_at=alive,
        idle=IDLE,
        waiting_shown=shown,
        waiting_after=AFTER,
        silent_max=MAX,
    )


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # Busy with what came: never silence; look again later.
        ({"now": 70.0, "wait": None}, Silence(70.0 + AFTER)),
        # Early: the next look is when the wait should show.
        ({"now": 1.0}, Silence(AFTER)),
        # The wait shows once, then the idle deadline is next.
        ({"now": 10.0}, Silence(IDLE, show_waiting=True)),
        ({"now": 11.0, "shown": True}, Silence(IDLE)),
        # Idle past the timeout with nothing on the wire: stalled.
        ({"now": 60.0, "shown": True}, Silence(None, stalled="nothing")),
        ({"now": 60.0, "alive": 0.0, "shown": True}, Silence(None, stalled="nothing")),
        ({"now": 60.0, "alive": 0.5, "shown": True}, Silence(60.5)),
        # Bytes came (a ping): alive until a timeout after them.
        ({"now": 60.0, "alive": 30.0, "shown": True}, Silence(90.0)),
        # ...but only keep-alives for silent_max is a stall too.
        (
            {"now": 600.0, "alive": 599.0, "shown": True},
            Silence(None, stalled="keep-alives"),
        ),
        ({"now": 580.0, "alive": 579.0, "shown": True}, Silence(600.0)),
        # The idle timeout counts from when the wait began, the status from the event.
        ({"now": 65.0, "last": 0.0, "wait": 30.0, "shown": True}, Silence(90.0)),
        # Stalled and never shown: the stall reports the wait too.
        ({"now": 60.0}, Silence(None, show_waiting=True, stalled="nothing")),
    ],
)
def test_check_silence_table(kwargs, expected):
    assert look(**kwargs) == expected
