"""Versions in place, the pure part (chat.render.versions): a new version's lineage, the
version points a tab's page shows, and where each switcher goes among the page's items.
No database: tabs are Rows, items are stand-ins with what `mark` reads."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chat.render.versions import Point, Row, lineage_for, mark, points, switcher

T0 = datetime(2026, 1, 1, tzinfo=UTC)
R, A, B, C, D = (uuid.UUID(int=n) for n in range(1, 6))


def row(tab: uuid.UUID, lineage: list, minute: int) -> Row:
    return Row(tab, lineage, T0 + timedelta(minutes=minute))


# --- lineage_for ---------------------------------------------------------------------------

LINEAGES = [
    # (the parent's lineage, the parent, the cut, the new version's lineage)
    pytest.param([], R, 3, [[str(R), 3]], id="a root's version: after its chunk 3"),
    pytest.param([], R, 0, [[str(R), 0]], id="a fork at the first message: before it all"),
    pytest.param(
        [[str(R), 3]], A, 3, [[str(R), 3]], id="regenerated again: the same point, not A's"
    ),
    pytest.param([[str(R), 3]], A, 1, [[str(R), 1]], id="a cut inside what A copied is R's point"),
    pytest.param(
        [[str(R), 3]], A, 7, [[str(R), 3], [str(A), 7]], id="a cut in A's own answer is A's"
    ),
    pytest.param(
        [[str(R), 5], [str(A), 3]],
        B,
        3,
        [[str(R), 3]],
        id="B holds R's 1..3 only (A's cut), so R's point at 3",
    ),
    pytest.param(
        [[str(R), 5], [str(A), 3]],
        B,
        4,
        [[str(R), 5], [str(A), 3], [str(B), 4]],
        id="past what B copied: B's own point",
    ),
    pytest.param(
        [["not a uuid", 2], [str(R), "x"], "junk"],
        A,
        2,
        [[str(A), 2]],
        id="a lineage that is not [[id, seq], ...] is read as empty",
    ),
]


@pytest.mark.parametrize(("parent", "parent_id", "cut", "expected"), LINEAGES)
def test_a_new_versions_lineage(parent, parent_id, cut, expected):
    assert lineage_for(parent, parent_id, cut) == expected


# --- points ----------------------------------------------------------------------------------


def test_a_tab_without_versions_shows_no_point():
    assert points(row(R, [], 0), [row(R, [], 0)]) == []


def test_three_answers_to_one_question_are_one_point_on_each():
    """R answered, regenerated (A), and A regenerated (B, normalised to R's point)."""
    rows = [row(R, [], 0), row(A, [[str(R), 3]], 1), row(B, [[str(R), 3]], 2)]
    slots = (R, A, B)
    assert points(rows[0], rows) == [Point(3, slots, 0)]
    assert points(rows[1], rows) == [Point(3, slots, 1)]
    assert points(rows[2], rows) == [Point(3, slots, 2)]


def test_a_page_shows_the_points_of_every_tab_it_descends_from():
    """B continues A (a version of R's answer at 3) with a version of A's answer at 7,
    and its own later answer was regenerated (C, at B's 9): B's page has all three
    points; so has C's, standing in for A at the first and for B at the second (C holds
    B's copy of A's answer)."""
    rows = [
        row(R, [], 0),
        row(A, [[str(R), 3]], 1),
        row(B, [[str(R), 3], [str(A), 7]], 2),
        row(C, [[str(R), 3], [str(A), 7], [str(B), 9]], 3),
        row(D, [[str(R), 3], [str(A), 7]], 4),
    ]
    # A's answer was regenerated at 7 twice (B, D); R's at 3 once (A); B's at 9 (C).
    assert points(rows[2], rows) == [
        Point(3, (R, A), 1),
        Point(7, (A, B, D), 1),
        Point(9, (B, C), 0),
    ]
    assert points(rows[3], rows) == [
        Point(3, (R, A), 1),
        Point(7, (A, B, D), 1),
        Point(9, (B, C), 1),
    ]
    # R's page: only its own point (what A did later is A's page's business).
    assert points(rows[0], rows) == [Point(3, (R, A), 0)]
    # A's page: R's point, and its own point at 7 with A first.
    assert points(rows[1], rows) == [Point(3, (R, A), 1), Point(7, (A, B, D), 0)]


def test_a_cut_past_what_a_page_holds_is_not_its_point():
    """B copied A only up to 7: A's point at 8 is after where B left A."""
    rows = [row(A, [], 0), row(B, [[str(A), 7]], 1), row(C, [[str(A), 8]], 2)]
    assert points(rows[1], rows) == [Point(7, (A, B), 1)]


def test_a_deleted_base_leaves_its_versions_grouped():
    """R deleted (its row gone, its id in the lineages): A and B are still "1 / 2",
    "2 / 2" of the same answer."""
    rows = [row(A, [[str(R), 3]], 1), row(B, [[str(R), 3]], 2)]
    assert points(rows[0], rows) == [Point(3, (A, B), 0)]
    assert points(rows[1], rows) == [Point(3, (A, B), 1)]


def test_a_deleted_version_in_the_middle_is_stood_in_for_by_the_page_that_holds_it():
    """A (a version of R at 3) deleted; B continued A and is still "2 / 2" there, its
    link slot A's (never shown: it is the current one)."""
    rows = [row(R, [], 0), row(B, [[str(R), 3], [str(A), 7]], 2)]
    assert points(rows[1], rows) == [Point(3, (R, A), 1)]
    # R's page does not know B (B is not a version of R's point) and shows nothing.
    assert points(rows[0], rows) == []


def test_the_only_version_left_shows_no_switcher():
    rows = [row(A, [[str(R), 3]], 1)]
    assert points(rows[0], rows) == []


def test_a_page_not_among_its_rows_still_counts():
    tab = row(A, [[str(R), 3]], 1)
    assert points(tab, [row(R, [], 0)]) == [Point(3, (R, A), 1)]


SWITCHERS = [
    (Point(3, (R, A, B), 0), (1, 3, None, A)),
    (Point(3, (R, A, B), 1), (2, 3, R, B)),
    (Point(3, (R, A, B), 2), (3, 3, A, None)),
]


@pytest.mark.parametrize(("point", "expected"), SWITCHERS)
def test_a_switcher_links_its_neighbours(point, expected):
    control = switcher(point)
    assert (control.index, control.total, control.previous, control.next) == expected
    assert control.label == f"Version {expected[0]} of {expected[1]}"


# --- mark: where the switcher goes ------------------------------------------------------------


@dataclass
class It:
    seq: int | None
    role: str
    turn_id: str | None
    kind_is_notice: bool = False
    versions: list[Any] = field(default_factory=list)


def page() -> list[It]:
    """1 question, 2-3 answer (turn t1); 4 a `forked` notice; 5 question, 6-7 answer (t2)."""
    return [
        It(1, "user", "t1"),
        It(2, "assistant", "t1"),
        It(3, "assistant", "t1"),
        It(4, "system", None, kind_is_notice=True),
        It(5, "user", "t2"),
        It(6, "assistant", "t2"),
        It(7, "assistant", "t2"),
    ]


MARKS = [
    pytest.param(1, True, 2, False, id="an answer's versions: under the answer's last chunk"),
    pytest.param(0, True, 0, True, id="a first message's versions: under that message"),
    pytest.param(3, True, 4, True, id="past a notice: under the next message"),
    pytest.param(5, True, 6, False, id="under the answer that follows"),
    pytest.param(7, True, None, False, id="nothing after the point, nothing of its own: no place"),
]


@pytest.mark.parametrize(("after", "at_end", "index", "user"), MARKS)
def test_the_switcher_goes_under_the_message_where_versions_diverge(after, at_end, index, user):
    items = page()
    mark(items, [Point(after, (R, A), 1)], at_end=at_end)
    placed = [n for n, item in enumerate(items) if item.versions]
    assert placed == ([] if index is None else [index])
    if index is not None:
        assert items[index].versions[0].user is user


def test_a_version_with_nothing_of_its_own_yet_has_it_under_its_last_chunk():
    """An edit not sent yet: the page ends on the `forked` notice."""
    items = page()[:4]
    mark(items, [Point(3, (R, A), 1)], at_end=True)
    assert [bool(item.versions) for item in items] == [False, False, False, True]
    # The same log as an older page (not the live end): the place is not on it.
    items = page()[:4]
    mark(items, [Point(3, (R, A), 1)], at_end=False)
    assert not any(item.versions for item in items)
