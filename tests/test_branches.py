"""Branches, edit, regenerate, retry and continue on the database (chat.turns, chat.log.copy).

Where a cut may be made is tests/test_cuts.py (pure); what Continue says is
tests/test_resume.py; the requests a branch sends are tests/test_branch_prefix.py.
"""

from __future__ import annotations

import io
import threading
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from chat import log, search, turns
from chat.cuts import CutError
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from chat.stream import Block, Kind, Role
from chat.turn import lease

pytestmark = pytest.mark.django_db(transaction=True)

T1, T2 = uuid.uuid4(), uuid.uuid4()


def block(turn, step, role, type, **data) -> Block:
    return Block(uuid.uuid4(), turn, step, role, type, data)


def conversation(turn=T1) -> list[Block]:
    """A question, a step with a call and its result, the answer (seqs 1..5)."""
    return [
        block(turn, 0, Role.USER, Kind.TEXT, text="list the files"),
        block(turn, 1, Role.ASSISTANT, Kind.THINKING, text="ls will do", signature="sig-1"),
        block(turn, 1, Role.ASSISTANT, Kind.TOOL_CALL, call_id="c1", name="shell",
              arguments={"command": "ls", "timeout": 5}),
        block(turn, 1, Role.TOOL, Kind.TOOL_RESULT, call_id="c1", name="shell",
              result="a.txt\nb.txt", is_error=False, shell_output="a.txt\nb.txt"),
        block(turn, 2, Role.ASSISTANT, Kind.TEXT, text="There are two files: **a** and b."),
    ]  # fmt: skip


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def tab(alice) -> Tab:
    tab = Tab.objects.create(
        owner=alice, title="Files", model="offline/demo", system_prompt="Be brief."
    )
    log.append(tab.pk, conversation())
    return tab


def rows(tab: Tab) -> list[Chunk]:
    return list(Chunk.objects.filter(tab=tab).order_by("seq"))


FIELDS = ("seq", "turn_id", "step", "role", "type", "data", "created_at")


def test_a_branch_is_a_verbatim_copy_up_to_the_cut_and_a_forked_notice(tab):
    before = [(c.id, *(getattr(c, f) for f in FIELDS)) for c in rows(tab)]
    result = turns.branch(tab, 4)
    branch = result.tab
    assert result.created
    copied = rows(branch)
    assert [tuple(getattr(c, f) for f in FIELDS) for c in copied[:4]] == [
        row[1:] for row in before[:4]
    ]
    # Own rows (the page addresses chunks by id), nothing shared with the parent.
    assert not {c.id for c in copied} & {row[0] for row in before}
    forked = copied[4]
    assert (forked.seq, forked.role, forked.type, forked.turn_id) == (5, "system", "system", None)
    assert forked.data == {
        "kind": "forked",
        "text": "Branched from “Files”.",
        "from_tab": str(tab.pk),
        "at_seq": 4,
        "action": "branch",
        "run": False,
    }
    assert len(copied) == 5
    # Frozen per tab: the same system prompt and model, so the same request bytes.
    assert (branch.owner, branch.title, branch.model, branch.system_prompt) == (
        tab.owner,
        "Files",
        "offline/demo",
        "Be brief.",
    )
    assert (branch.parent, branch.fork_seq, branch.last_seq) == (tab, 4, 5)
    # The parent is never changed.
    assert [(c.id, *(getattr(c, f) for f in FIELDS)) for c in rows(tab)] == before
    tab.refresh_from_db()
    assert tab.last_seq == 5 and list(tab.branches.all()) == [branch]


def test_a_branch_is_found_by_search_and_deleting_it_leaves_the_parents_index(tab, alice):
    branch = turns.branch(tab, 4).tab
    hits = search.search(alice, "list")
    assert {(h.tab_id, h.seq) for h in hits} == {(tab.pk, 1), (branch.pk, 1)}
    # Each hit names its own tab's chunk.
    assert {h.chunk_id for h in hits} == {Chunk.objects.get(tab=t, seq=1).id for t in (tab, branch)}
    # Past the cut: the parent's alone.
    assert [h.tab_id for h in search.search(alice, "two files")] == [tab.pk]
    branch.delete()
    assert [(h.tab_id, h.seq) for h in search.search(alice, "list")] == [(tab.pk, 1)]


def test_deleting_the_parent_leaves_the_branch_whole(tab):
    branch = turns.branch(tab, 5).tab
    tab.delete()
    branch.refresh_from_db()
    assert branch.parent is None and branch.fork_seq == 5
    assert [c.seq for c in rows(branch)] == [1, 2, 3, 4, 5, 6]


def test_a_branch_of_a_branch(tab):
    first = turns.branch(tab, 5).tab
    log.append(first.pk, conversation(T2))  # seqs 7..11
    second = turns.branch(first, 7).tab
    assert [c.seq for c in rows(second)] == list(range(1, 9))
    assert second.parent == first and rows(second)[-1].data["from_tab"] == str(first.pk)


def test_the_same_branch_asked_twice_at_once_is_made_once(tab):
    first = turns.branch(tab, 4)
    again = turns.branch(tab, 4)
    assert first.created and not again.created and again.tab.pk == first.tab.pk
    assert Tab.objects.filter(parent=tab).count() == 1
    # Another action at the same point is another branch.
    assert turns.branch(tab, 4, action=turns.Action.RETRY, run=True).created
    assert Tab.objects.filter(parent=tab).count() == 2


def test_after_the_repeat_window_the_same_cut_is_a_new_branch(tab):
    first = turns.branch(tab, 4).tab
    Tab.objects.filter(pk=first.pk).update(
        created_at=timezone.now() - turns.REPEAT_WINDOW - timedelta(seconds=1)
    )
    assert turns.branch(tab, 4).created
    assert Tab.objects.filter(parent=tab).count() == 2


BAD_CUTS = {
    "no such seq": (99, "There is no message 99"),
    "negative": (-1, "There is no message -1"),
    "inside a step": (2, "not in the middle of a step"),
    "between a call and its result": (3, "not in the middle of a step"),
}


@pytest.mark.parametrize("at_seq, message", BAD_CUTS.values(), ids=BAD_CUTS.keys())
def test_a_bad_cut_is_refused_with_a_message_and_changes_nothing(tab, at_seq, message):
    with pytest.raises(CutError, match=message):
        turns.branch(tab, at_seq)
    assert Tab.objects.count() == 1 and Chunk.objects.count() == 5


def test_a_cut_inside_the_running_turn_is_refused_but_one_before_it_is_not(tab):
    log.append(tab.pk, [block(T2, 0, Role.USER, Kind.TEXT, text="and now?")])  # seq 6
    RunningTurn.objects.create(tab=tab, turn_id=T2, worker="test", heartbeat_at=timezone.now())
    with pytest.raises(CutError, match="running"):
        turns.branch(tab, 6)
    with pytest.raises(CutError, match="running"):
        turns.regenerate(tab, 6)
    assert Tab.objects.count() == 1
    assert turns.branch(tab, 5).tab.last_seq == 6


def test_edit_branches_before_the_message_with_its_text_in_the_composer(tab):
    branch = turns.edit(tab, 1).tab
    assert branch.fork_seq == 0 and branch.draft == "list the files"
    assert [(c.seq, c.data["kind"]) for c in rows(branch)] == [(1, "forked")]
    assert rows(branch)[0].data["action"] == "edit"
    # Sending clears the draft.
    turns.submit(branch, "list the files, hidden ones too")
    branch.refresh_from_db()
    assert branch.draft == ""


def test_only_the_users_messages_can_be_edited(tab):
    with pytest.raises(CutError, match="Only your own messages"):
        turns.edit(tab, 5)
    assert Tab.objects.count() == 1


def test_regenerate_branches_after_the_question_and_asks_for_a_run(tab):
    branch = turns.regenerate(tab, 5).tab
    assert branch.fork_seq == 1
    assert [c.type for c in rows(branch)] == ["text", "system"]
    queued = QueuedMessage.objects.get(tab=branch)
    assert queued.rerun and queued.text == ""
    # A rerun is no message: nothing shows as queued.
    assert lease.status(branch.pk)["queued"] == []
    # A double click: the same branch, one run.
    assert not turns.regenerate(tab, 5).created
    assert QueuedMessage.objects.filter(tab=branch).count() == 1


def test_retry_keeps_the_finished_steps_before_the_error(tab):
    log.append(
        tab.pk,
        [
            block(T2, 0, Role.USER, Kind.TEXT, text="now read a.txt"),  # 6
            block(T2, 1, Role.ASSISTANT, Kind.TOOL_CALL, call_id="c2", name="read_file",
                  arguments={"path": "a.txt"}),  # 7
            block(T2, 1, Role.TOOL, Kind.TOOL_RESULT, call_id="c2", name="read_file",
                  result="hello", is_error=False),  # 8
            block(T2, 2, Role.ASSISTANT, Kind.TEXT, text="It says", interrupted=True),  # 9
            block(T2, 2, Role.ASSISTANT, Kind.ERROR, message="Overloaded", status_code=529),  # 10
        ],
    )  # fmt: skip
    branch = turns.retry(tab, 10).tab
    assert branch.fork_seq == 8
    assert QueuedMessage.objects.get(tab=branch).rerun
    with pytest.raises(CutError, match="Only an error"):
        turns.retry(tab, 9)


def test_a_run_needs_something_to_answer(tab):
    with pytest.raises(CutError, match="nothing there to answer"):
        turns.branch(tab, 5, run=True)
    assert Tab.objects.count() == 1 and not QueuedMessage.objects.exists()


def test_continue_queues_the_message_that_says_what_was_cut(tab):
    log.append(
        tab.pk,
        [
            block(T2, 0, Role.USER, Kind.TEXT, text="write it all"),
            block(T2, 1, Role.ASSISTANT, Kind.TEXT, text="Part one…"),
            block(T2, 1, Role.SYSTEM, Kind.SYSTEM, kind="output-limit", text="cut"),
        ],
    )
    queued = turns.continue_turn(tab)
    assert queued.text.startswith("Your previous reply was cut off at the output limit.")
    assert "ends with: “Part one…”" in queued.text
    # A second click while that message waits: refused, nothing more queued.
    with pytest.raises(ValueError, match="already waiting"):
        turns.continue_turn(tab)
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_continue_is_refused_when_nothing_was_cut_or_a_turn_runs(tab, alice):
    with pytest.raises(ValueError, match="finished normally"):
        turns.continue_turn(tab)
    empty = Tab.objects.create(owner=alice)
    with pytest.raises(ValueError, match="no turn yet"):
        turns.continue_turn(empty)
    RunningTurn.objects.create(tab=tab, turn_id=T2, worker="w", heartbeat_at=timezone.now())
    with pytest.raises(ValueError, match="A turn is running"):
        turns.continue_turn(tab)
    assert not QueuedMessage.objects.exists()


def test_branching_costs_the_same_queries_however_long_the_log(alice):
    """One INSERT ... SELECT copies the chunks (and one their index rows): the
    statements do not grow with the log, so a 100,000-chunk parent is one copy
    in the database (bench/branch.py times that)."""

    def queries_to_branch(turns_count: int) -> list[str]:
        tab = Tab.objects.create(owner=alice, title="long")
        for _ in range(turns_count):
            log.append(tab.pk, conversation(uuid.uuid4()))
        with CaptureQueriesContext(connection) as captured:
            turns.branch(tab, tab.last_seq)
        assert Chunk.objects.filter(tab__parent=tab).count() == tab.last_seq + 1
        return [q["sql"].split()[0] for q in captured.captured_queries]

    assert queries_to_branch(1) == queries_to_branch(200)
    copies = [q for q in queries_to_branch(3) if q == "INSERT"]
    # The tab, its chunks, their index entries (and FTS rows on SQLite), the forked chunk.
    assert len(copies) <= 7


def test_wipe_history_deletes_branches_with_their_parents(tab):
    turns.branch(tab, 5)
    call_command("wipe_history", "--yes", stdout=io.StringIO())
    assert not Tab.objects.exists() and not Chunk.objects.exists()


def test_two_continues_at_once_queue_one_message(tab):
    """The check and the queueing are one transaction under the tab lock."""
    log.append(
        tab.pk,
        [
            block(T2, 0, Role.USER, Kind.TEXT, text="go"),
            block(T2, 1, Role.SYSTEM, Kind.SYSTEM, kind="cancelled", text="Stopped."),
        ],
    )
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def click() -> None:
        start.wait()
        try:
            turns.continue_turn(Tab.objects.get(pk=tab.pk))
            outcomes.append("queued")
        except ValueError as exc:
            outcomes.append(str(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == [
        "A message is already waiting to start the next turn.",
        "queued",
    ]
    assert QueuedMessage.objects.filter(tab=tab).count() == 1


def test_a_finishing_turn_may_be_branched_and_continued_at_once(tab):
    """Idle goes out before the lease is released; a click in between must work."""
    log.append(
        tab.pk,
        [
            block(T2, 0, Role.USER, Kind.TEXT, text="go"),
            block(T2, 1, Role.SYSTEM, Kind.SYSTEM, kind="cancelled", text="Stopped."),
        ],
    )
    running = RunningTurn.objects.create(
        tab=tab, turn_id=T2, worker="w", heartbeat_at=timezone.now()
    )
    with pytest.raises(CutError, match="running"):
        turns.branch(tab, 7)
    lease.set_finishing(tab.pk, T2)
    assert lease.status(tab.pk)["state"] == "idle"
    assert turns.branch(tab, 7).created
    turns.continue_turn(tab)
    # The finishing runner's release finds the message and goes on with it.
    assert lease.release_or_continue(tab.pk, T2) is not None
    running.refresh_from_db()
    assert running.status == RunningTurn.Status.RUNNING


def test_recovering_a_finishing_lease_adds_nothing_to_the_finished_turn(tab):
    """A worker that died between the turn's end and the release: only the lease goes
    (no 'interrupted' notice, which would offer Continue on a complete answer)."""
    RunningTurn.objects.create(
        tab=tab,
        turn_id=T1,
        worker="w",
        heartbeat_at=timezone.now(),
        status=RunningTurn.Status.FINISHING,
    )
    assert lease.recover_stale(everything=True) == [tab.pk]
    assert not RunningTurn.objects.exists()
    assert [c.seq for c in rows(tab)] == [1, 2, 3, 4, 5]


def test_a_double_click_from_two_requests_at_once_makes_one_branch(tab):
    """The parent's row lock orders the two; the second finds the first's branch."""
    made: list[bool] = []
    start = threading.Barrier(2)

    def click() -> None:
        start.wait()
        try:
            made.append(turns.regenerate(Tab.objects.get(pk=tab.pk), 5).created)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(made) == [False, True]
    assert Tab.objects.filter(parent=tab).count() == 1
    assert QueuedMessage.objects.count() == 1


def test_retry_of_an_error_in_a_reruns_first_step_answers_the_log_before_it_again(tab):
    """A regenerated branch's turn has no message of its own; overloaded again at its
    first step, its Retry branches right before that turn (not refused)."""
    branch = turns.regenerate(tab, 5).tab  # seqs 1 (question), 2 (forked)
    QueuedMessage.objects.filter(tab=branch).delete()
    T3 = uuid.uuid4()
    log.append(
        branch.pk,
        [
            block(T3, 1, Role.ASSISTANT, Kind.TEXT, text="The fi", interrupted=True),  # 3
            block(T3, 1, Role.ASSISTANT, Kind.ERROR, message="Overloaded"),  # 4
        ],
    )
    retried = turns.retry(branch, 4).tab
    assert retried.fork_seq == 2
    assert [c.type for c in rows(retried)] == ["text", "system", "system"]
    assert QueuedMessage.objects.get(tab=retried).rerun


def test_a_repeat_must_ask_for_the_same_run(tab):
    """A plain branch then a run at the same cut within the window: the run is its own
    branch (returning the plain one would start no turn)."""
    plain = turns.branch(tab, 5 - 4)  # right after the question
    run = turns.branch(tab, 1, run=True)
    assert plain.created and run.created and run.tab.pk != plain.tab.pk
    assert QueuedMessage.objects.get().tab_id == run.tab.pk
