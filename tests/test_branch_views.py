"""The chat page's branches, edit, regenerate, retry and continue (issue 14): the five
POST actions, the draft in an edit's composer, the `forked` notice, the "branches"
controls on the parent, and which message actions a page and a live fragment offer.

The core they call (chat.turns, chat.cuts, chat.resume) has its own tests:
tests/test_branches.py, tests/test_cuts.py, tests/test_resume.py.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from chat import cuts, log, render, resume, turns
from chat.models import Chunk, QueuedMessage, RunningTurn, Tab
from chat.stream import Block, Kind, Role
from chat.views import common
from tests.ui_helpers import parse, top

pytestmark = pytest.mark.django_db

User = get_user_model()
T1, T2, T3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
ACTIONS = ("tab_branch", "tab_edit", "tab_regenerate", "tab_retry", "tab_continue")
HTMX = {"HTTP_HX_REQUEST": "true"}


def block(turn, step, role, type, **data) -> Block:
    return Block(uuid.uuid4(), turn, step, role, type, data)


def answered(turn=T1) -> list[Block]:
    """A question, a step with a shell call and its result, the answer (seqs 1..5)."""
    return [
        block(turn, 0, Role.USER, Kind.TEXT, text="list the *files*"),
        block(turn, 1, Role.ASSISTANT, Kind.THINKING, text="ls will do", signature="sig-1"),
        block(turn, 1, Role.ASSISTANT, Kind.TOOL_CALL, call_id="c1", name="shell",
              arguments={"command": "ls"}),
        block(turn, 1, Role.TOOL, Kind.TOOL_RESULT, call_id="c1", name="shell",
              result="exit 0", is_error=False, shell_output="a.txt\nb.txt\n"),
        block(turn, 2, Role.ASSISTANT, Kind.TEXT,
              text="Two files:\n\n```sh\na.txt\nb.txt\n```\n"),
    ]  # fmt: skip


def failed(turn=T2) -> list[Block]:
    """A second question whose answer stopped on an error (seqs 6..8 after `answered`)."""
    return [
        block(turn, 0, Role.USER, Kind.TEXT, text="and their sizes?"),
        block(turn, 1, Role.ASSISTANT, Kind.TEXT, text="Let me"),
        block(turn, 1, Role.ASSISTANT, Kind.ERROR, message="Overloaded", status_code=529),
    ]


@pytest.fixture
def alice(db):
    return User.objects.create_user("alice", password="pw")


@pytest.fixture
def bob(db):
    return User.objects.create_user("bob", password="pw")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def tab(alice) -> Tab:
    """Files: an answered turn (seqs 1..5), then one that stopped on an error (6..8)."""
    tab = Tab.objects.create(owner=alice, title="Files", model="offline/demo")
    log.append(tab.pk, [*answered(), *failed()])
    return tab


def post(client: Client, name: str, tab: Tab, seq: int | str | None = None, **extra):
    data = {} if seq is None else {"seq": seq}
    return client.post(reverse(name, args=[tab.id]), data, **extra)


def chunk_at(tree, seq: int):
    return next(n for n in tree.iter() if n.get("data-seq") == str(seq) and "chunk" in n.classes)


def buttons(node, form: str) -> list:
    return node.find_all(lambda n: n.tag == "button" and n.get("form") == form)


def own_acts(node):
    """The chunk's action row: its child, or its error card's (never a result's in its card)."""
    for child in node.children:
        if "acts" in child.classes:
            return child
        if "error" in child.classes:
            return next((c for c in child.children if "acts" in c.classes), None)
    return None


def offered(tree, form: str, *, if_end: bool = False) -> list[int]:
    """The seqs whose chunks carry a button for `form`, in page order: the page's own,
    or (`if_end`) those CSS shows only where the chunk ends a finished turn."""
    return [
        int(b.get("value") or 0) for b in buttons(tree, form) if ("if-end" in b.classes) == if_end
    ]


def tab_page(client: Client, tab: Tab):
    response = client.get(reverse("tab", args=[tab.id]))
    assert response.status_code == 200
    return parse(response.content.decode())


def branches_of(tab: Tab) -> list[Tab]:
    return list(Tab.objects.filter(parent=tab).order_by("created_at"))


def composer_error(response) -> str:
    node = parse(response.content.decode()).by_id("composer-error")
    assert node is not None and node.get("hx-swap-oob") == "true"
    return node.text


# --- The actions: success --------------------------------------------------------------------


def test_branch_goes_to_the_new_tab_by_htmx_redirect_or_a_plain_redirect(client, tab):
    """Branch from here: a new tab copying the log up to the seq; an htmx request gets
    HX-Redirect to it, a plain form post a redirect."""
    response = post(client, "tab_branch", tab, 5, **HTMX)
    [branch] = branches_of(tab)
    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("tab", args=[branch.id])
    assert (branch.fork_seq, branch.last_seq) == (5, 6)
    assert [c.type for c in log.tail(branch.id)][-1] == Kind.SYSTEM

    response = post(client, "tab_branch", tab, 1)
    assert len(branches_of(tab)) == 2
    assert response.status_code == 302
    assert response.url == reverse("tab", args=[branches_of(tab)[1].id])
    assert not QueuedMessage.objects.exists(), "a plain branch runs nothing"


def test_edit_opens_a_branch_before_the_message_with_its_text_in_the_composer(client, tab):
    """Edit: a branch right before the message, its old text in the new tab's composer
    (the first line kept, though the textarea's parser drops a leading newline)."""
    response = post(client, "tab_edit", tab, 6, **HTMX)
    [branch] = branches_of(tab)
    assert response["HX-Redirect"] == reverse("tab", args=[branch.id])
    assert (branch.fork_seq, branch.draft) == (5, "and their sizes?")
    textarea = tab_page(client, branch).by_id("composer-text")
    assert textarea.text.removeprefix("\n") == "and their sizes?"

    Tab.objects.filter(pk=branch.pk).update(draft="\nfirst line was empty")
    textarea = tab_page(client, branch).by_id("composer-text")
    assert textarea.text == "\n\nfirst line was empty", "the parser eats one newline only"


def test_sending_from_the_edit_clears_the_draft(client, tab):
    """The edited text is sent as the new tab's message; the draft is gone from the page."""
    post(client, "tab_edit", tab, 6)
    [branch] = branches_of(tab)
    client.post(reverse("tab_send", args=[branch.id]), {"text": "and their dates?"}, **HTMX)
    branch.refresh_from_db()
    assert branch.draft == ""
    assert QueuedMessage.objects.get(tab=branch).text == "and their dates?"
    assert tab_page(client, branch).by_id("composer-text").text.strip() == ""


def test_regenerate_runs_a_branch_after_the_question(client, tab):
    """Regenerate (any chunk of the turn): a branch right after the user's message, run."""
    response = post(client, "tab_regenerate", tab, 5, **HTMX)
    [branch] = branches_of(tab)
    assert response["HX-Redirect"] == reverse("tab", args=[branch.id])
    assert branch.fork_seq == 1
    assert QueuedMessage.objects.get(tab=branch).rerun


def test_an_answer_run_without_a_message_of_its_own_regenerates_from_before_it(client, alice):
    """A regenerated branch's answer is a turn with no user message (the question is
    before the branch's notice): Regenerate offers it, and answers the same log again."""
    tab = Tab.objects.create(owner=alice, title="Again")
    log.append(tab.pk, answered())
    log.append(tab.pk, [block(T2, 0, Role.USER, Kind.TEXT, text="and sizes?")])  # 6
    log.append(tab.pk, [block(None, 0, Role.SYSTEM, Kind.SYSTEM, kind="forked", text="x")])
    log.append(tab.pk, [block(T3, 1, Role.ASSISTANT, Kind.TEXT, text="Sizes: 1, 2.")])  # 8
    assert offered(tab_page(client, tab), "regenerate-form") == [8]
    post(client, "tab_regenerate", tab, 8, **HTMX)
    [branch] = branches_of(tab)
    assert branch.fork_seq == 7
    assert QueuedMessage.objects.get(tab=branch).rerun


def test_retry_runs_a_branch_from_before_the_error(client, tab):
    """Retry on an error card: a branch at the last cut before the error, run at once."""
    post(client, "tab_retry", tab, 8, **HTMX)
    [branch] = branches_of(tab)
    assert branch.fork_seq == cuts.retry_at(list(Chunk.objects.filter(tab=tab, turn_id=T2)), 8)
    assert QueuedMessage.objects.get(tab=branch).rerun
    assert not QueuedMessage.objects.filter(tab=tab).exists(), "the parent never changes"


def test_continue_starts_a_turn_on_the_same_tab(client, tab):
    """Continue stays on the tab: the message saying what stopped is queued there, and the
    htmx response only clears the composer's error."""
    response = post(client, "tab_continue", tab, **HTMX)
    assert response.status_code == 200
    assert composer_error(response) == ""
    queued = QueuedMessage.objects.get(tab=tab)
    assert queued.text.startswith("Your previous reply stopped on an error: Overloaded.")
    assert not branches_of(tab)

    QueuedMessage.objects.all().delete()
    response = post(client, "tab_continue", tab)
    assert (response.status_code, response.url) == (302, reverse("tab", args=[tab.id]))


def test_a_double_click_goes_to_the_branch_made_the_first_time(client, tab):
    """Within turns.REPEAT_WINDOW the same action at the same point is the same branch."""
    first = post(client, "tab_regenerate", tab, 7, **HTMX)
    second = post(client, "tab_regenerate", tab, 7, **HTMX)
    assert first["HX-Redirect"] == second["HX-Redirect"]
    assert len(branches_of(tab)) == 1
    assert QueuedMessage.objects.count() == 1


# --- The actions: bad input ------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIONS)
def test_another_users_tab_is_not_found_and_nothing_changes(client, bob, name):
    """Every action on a tab of another user is a 404, as for a tab that does not exist."""
    theirs = Tab.objects.create(owner=bob, title="Bob's")
    log.append(theirs.pk, [*answered(), *failed()])
    response = post(client, name, theirs, 6, **HTMX)
    assert response.status_code == 404
    assert Tab.objects.count() == 1
    assert not QueuedMessage.objects.exists()


@pytest.mark.parametrize("name", ACTIONS)
def test_the_actions_need_a_login_and_a_post(tab, name):
    assert Client().post(reverse(name, args=[tab.id]), {"seq": 5}).status_code == 302
    logged_in = Client()
    logged_in.force_login(tab.owner)
    assert logged_in.get(reverse(name, args=[tab.id]), {"seq": 5}).status_code == 405
    assert Tab.objects.count() == 1 and not QueuedMessage.objects.exists()


@pytest.mark.parametrize("name", ACTIONS[:4])
@pytest.mark.parametrize("seq", ["", "five", "1.5"])
def test_a_seq_that_is_not_a_number_is_a_bad_request(client, tab, name, seq):
    response = post(client, name, tab, seq, **HTMX)
    assert response.status_code == 400
    assert b"whole number" in response.content
    assert Tab.objects.count() == 1


@pytest.mark.parametrize(
    "name, seq, message",
    [
        ("tab_branch", 99, cuts.NO_SUCH_CHUNK.format(seq=99)),
        ("tab_branch", -1, cuts.NO_SUCH_CHUNK.format(seq=-1)),
        ("tab_branch", 2, cuts.MID_STEP),
        ("tab_branch", 3, cuts.MID_STEP),
        ("tab_edit", 99, cuts.NO_SUCH_CHUNK.format(seq=99)),
        ("tab_edit", 5, "Only your own messages can be edited."),
        ("tab_regenerate", 99, cuts.NO_SUCH_CHUNK.format(seq=99)),
        ("tab_retry", 7, "Only an error can be retried."),
        ("tab_retry", 99, cuts.NO_SUCH_CHUNK.format(seq=99)),
    ],
)
def test_an_invalid_cut_says_why_in_the_composer_and_changes_nothing(
    client, tab, name, seq, message
):
    """htmx: the composer's error line says it (422, swapped like an empty message's);
    a plain post: the tab again, with the message at the top."""
    response = post(client, name, tab, seq, **HTMX)
    assert response.status_code == 422
    assert composer_error(response) == message
    response = post(client, name, tab, seq, follow=True)
    assert response.redirect_chain == [(reverse("tab", args=[tab.id]), 302)]
    [shown] = parse(response.content.decode()).find_all(lambda n: "msg" in n.classes)
    assert shown.text == message
    assert Tab.objects.count() == 1 and not QueuedMessage.objects.exists()


def test_a_cut_in_the_running_turn_is_refused(client, tab):
    """The running turn's chunks are no place to branch from, nor its error to retry."""
    RunningTurn.objects.create(tab=tab, turn_id=T2, worker="w", heartbeat_at=timezone.now())
    for name, seq in (("tab_branch", 8), ("tab_regenerate", 7), ("tab_retry", 8)):
        response = post(client, name, tab, seq, **HTMX)
        assert response.status_code == 422
        assert composer_error(response) == cuts.RUNNING
    response = post(client, "tab_continue", tab, **HTMX)
    assert composer_error(response) == "A turn is running: wait for it to end, or stop it, first."
    assert Tab.objects.count() == 1 and not QueuedMessage.objects.exists()


def test_continue_with_nothing_interrupted_says_so(client, alice):
    finished = Tab.objects.create(owner=alice, title="Done")
    log.append(finished.pk, answered())
    response = post(client, "tab_continue", finished, **HTMX)
    assert response.status_code == 422
    assert composer_error(response) == resume.NOTHING
    empty = Tab.objects.create(owner=alice)
    assert composer_error(post(client, "tab_continue", empty, **HTMX)) == resume.EMPTY
    assert not QueuedMessage.objects.exists()


# --- The forked notice, the branches controls ------------------------------------------------


def test_a_branch_says_where_it_came_from_with_a_link_to_the_point(client, tab):
    """The `forked` notice links the parent's title to the parent at the cut; once the
    parent is deleted it says so, with no link."""
    post(client, "tab_edit", tab, 6)
    [branch] = branches_of(tab)
    tree = tab_page(client, branch)
    notice = chunk_at(tree, 6)
    assert {"t-system", "kind-forked"} <= notice.classes
    assert notice.find_all(lambda n: "sys-kind" in n.classes)[0].text == "Branch"
    text = notice.find_all(lambda n: "sys-text" in n.classes)[0]
    assert text.text == "Branched from “Files” to edit a message."
    [link] = text.find_all(lambda n: n.tag == "a")
    assert (link.text, link.get("href")) == ("“Files”", f"/t/{tab.id}/?seq=5")
    assert own_acts(notice) is None, "a notice outside any turn offers nothing"
    [head] = tree.find_all(lambda n: "tab-head" in n.classes)
    [parent] = head.find_all(lambda n: "menu-note" in n.classes)
    assert parent.text == "Branched from Files"
    assert parent.find_all(lambda n: n.tag == "a")[0].get("href") == f"/t/{tab.id}/?seq=5"

    tab.delete()
    tree = tab_page(client, branch)
    notice = chunk_at(tree, 6)
    assert not notice.find_all(lambda n: n.tag == "a")
    assert "That tab has since been deleted." in notice.text
    [head] = tree.find_all(lambda n: "tab-head" in n.classes)
    assert "Branched from a tab that has since been deleted." in head.text


def test_a_branch_before_the_first_message_links_to_that_message(client, tab):
    post(client, "tab_edit", tab, 1)
    [branch] = branches_of(tab)
    [link] = chunk_at(tab_page(client, branch), 1).find_all(lambda n: n.tag == "a")
    assert link.get("href") == f"/t/{tab.id}/?seq=1"


def test_the_parent_shows_its_branches_where_they_diverge(client, tab):
    """Versions (Edit, Regenerate) get a "‹ 1 / 2 ›" under the message where they diverge
    (chat.render.versions, tests/test_versions*.py); a plain branch keeps its "⑂ 1
    branch" control right after the chunk it copied last (on the page and on an older
    page), is listed in the tab menu, and has a sidebar entry of its own, marked."""
    post(client, "tab_edit", tab, 6)  # fork_seq 5
    post(client, "tab_regenerate", tab, 7)  # fork_seq 6
    post(client, "tab_branch", tab, 6)  # fork_seq 6, a plain branch there
    post(client, "tab_edit", tab, 1)  # fork_seq 0: before the first chunk
    edit, regen, plain, first = branches_of(tab)
    tree = tab_page(client, tab)
    log_node = tree.by_id("log")

    def shown(n):
        if "forks" in n.classes:
            return ("forks", [a.get("href") for a in n.find_all(lambda a: a.tag == "a")])
        if "versions" in n.classes:
            return ("versions", [a.get("href") for a in n.find_all(lambda a: a.tag == "a")])
        return ("chunk", n.get("data-seq"))

    order = [shown(n) for n in log_node.children]
    url = lambda t: reverse("tab", args=[t.id])  # noqa: E731
    assert order == [
        ("chunk", "1"),
        ("versions", [url(first)]),
        ("chunk", "2"),
        ("chunk", "3"),
        ("chunk", "5"),
        ("chunk", "6"),
        ("versions", [url(edit)]),
        ("forks", [url(plain)]),
        ("chunk", "7"),
        ("chunk", "8"),
        ("versions", [url(regen)]),
    ]
    controls = log_node.find_all(lambda n: "forks" in n.classes)
    summaries = [c.children[0] for c in controls]
    assert [s.text.strip() for s in summaries] == ["1 branch"]
    assert all(s.find_all(lambda n: n.tag == "svg") for s in summaries)
    [head] = tree.find_all(lambda n: "tab-head" in n.classes)
    [listed] = head.find_all(lambda n: "fork-list" in n.classes)
    links = listed.find_all(lambda n: n.tag == "a")
    assert [a.get("href") for a in links] == [url(plain)]
    assert "at #6" in listed.text
    # The sidebar: one entry for the conversation (its latest version), one for the plain
    # branch, which alone is marked a branch.
    entries = tree.find_all(lambda n: "tab-link" in n.classes)
    assert {n.get("data-tab") for n in entries} == {str(first.id), str(plain.id)}
    marked = [
        n.get("data-tab") for n in entries if n.find_all(lambda m: "branch-mark" in m.classes)
    ]
    assert marked == [str(plain.id)]

    # An older page (the chunks before seq 7) carries the controls within it too.
    response = client.get(reverse("tab_older", args=[tab.id]), {"before": 7})
    older = parse(response.content.decode())
    assert [
        n.get("data-seq") or ("versions" if "versions" in n.classes else "forks")
        for n in older.children
        if n.tag in ("div", "details", "nav")
    ] == ["1", "versions", "2", "3", "5", "6", "versions", "forks"]


def test_a_tab_without_branches_shows_no_control(client, tab):
    tree = tab_page(client, tab)
    assert not tree.find_all(lambda n: "forks" in n.classes or "branch-mark" in n.classes)
    assert "Branches of this tab" not in tree.text


# --- Which actions where ---------------------------------------------------------------------


def test_a_page_offers_each_action_where_it_applies(client, tab):
    """Copy on every message and tool output, a copy button on every code block; Edit on
    the user's messages; Branch on the valid cuts but an error card; Regenerate and Continue on the
    last turn's end only (an error card: Retry and Continue); nothing on thinking or a tool call."""
    tree = tab_page(client, tab)
    chunks = list(Chunk.objects.filter(tab=tab).order_by("seq"))
    # Seq 0 (before the first message) is a valid cut too, offered as that message's Edit;
    # right after a question (1, 6) is Regenerate's cut: a plain branch there would end on
    # a question nothing answers.
    user = {c.seq for c in chunks if c.role == Role.USER}
    # An error card (8) offers Retry, not a branch that keeps the error nor Regenerate.
    assert offered(tree, "branch-form") == sorted(cuts.valid_cuts(chunks) - {0} - user - {8})
    assert offered(tree, "branch-form") == [4, 5]
    assert offered(tree, "edit-form") == [1, 6]
    assert offered(tree, "regenerate-form") == []
    assert offered(tree, "retry-form") == [8]
    assert len(buttons(tree, "continue-form")) == 1
    assert own_acts(chunk_at(tree, 8)) is not None and buttons(chunk_at(tree, 8), "continue-form")
    copies = tree.find_all(lambda n: n.tag == "button" and n.get("data-copy"))
    assert sorted(b.get("data-copy") for b in copies) == ["code", "md", "md", "md", "md", "out"]
    assert own_acts(chunk_at(tree, 2)) is None, "thinking"
    assert own_acts(chunk_at(tree, 3)) is None, "a tool call's card"
    # A message's copy takes its markdown, kept verbatim next to the rendering.
    [src] = chunk_at(tree, 1).find_all(lambda n: n.tag == "template")
    assert src.text == "list the *files*"
    # Every button submits one of the page's forms (the htmx ones, with the CSRF token).
    for form in ("branch-form", "edit-form", "regenerate-form", "retry-form", "continue-form"):
        node = tree.by_id(form)
        assert node.get("hx-post") == node.get("action")
        assert node.find_all(lambda n: n.get("name") == "csrfmiddlewaretoken")


def test_while_a_turn_runs_its_chunks_offer_cuts_only_where_it_ends(client, tab):
    """The running turn's chunks are rendered as live ones: no cut of their own, only
    the end-of-turn actions CSS shows once the turn is over (where it ended); the
    chunks before it offer theirs."""
    RunningTurn.objects.create(tab=tab, turn_id=T2, worker="w", heartbeat_at=timezone.now())
    tree = tab_page(client, tab)
    assert offered(tree, "branch-form") == [4, 5]
    assert offered(tree, "branch-form", if_end=True) == [7]
    assert offered(tree, "regenerate-form") == []
    assert offered(tree, "regenerate-form", if_end=True) == [7]
    assert offered(tree, "edit-form") == [1, 6]


def test_continue_is_offered_on_the_last_notice_of_an_interrupted_turn_only(client, alice):
    """A crash's `interrupted` notice at the end gets Continue; the same notice in an
    earlier turn does not; a turn that finished normally has none."""
    tab = Tab.objects.create(owner=alice, title="Crashy")
    crashed = [
        block(T1, 0, Role.USER, Kind.TEXT, text="write a poem"),
        block(T1, 1, Role.ASSISTANT, Kind.TEXT, text="Roses", interrupted=True),
        block(T1, 1, Role.SYSTEM, Kind.SYSTEM, kind="interrupted", text="The server stopped."),
    ]
    log.append(tab.pk, crashed)
    tree = tab_page(client, tab)
    [button] = buttons(tree, "continue-form")
    assert buttons(chunk_at(tree, 3), "continue-form") == [button]
    assert offered(tree, "regenerate-form") == [3]

    log.append(tab.pk, answered(T3))
    tree = tab_page(client, tab)
    assert buttons(tree, "continue-form") == []
    assert offered(tree, "regenerate-form") == [8]


def test_live_fragments_offer_what_they_can_know(tab):
    """A fragment has no log around it: a user message offers Edit, an error Retry and
    Continue, and a chunk that may end its turn Regenerate and Branch marked "if-end" (CSS
    shows them where it does end one); thinking and cards offer nothing."""

    def acts(b: Block) -> list[str]:
        [wrapper] = top(render.fragment_seal(b))
        row = own_acts(wrapper.children[0])
        if row is None:
            return []
        return [
            f"{n.get('form') or n.get('data-copy')}{' if-end' if 'if-end' in n.classes else ''}"
            for n in row.children
        ]

    user, thinking, call, result, text = (
        replace(b, seq=n) for n, b in enumerate(answered(), start=1)
    )
    assert acts(user) == ["md", "edit-form"]
    assert acts(thinking) == [] and acts(call) == []
    assert acts(result) == ["out"]
    assert acts(text) == [
        "md",
        "regenerate-form if-end",
        "branch-form if-end",
        "compact-form if-end",
    ]
    error = replace(failed()[2], seq=8)
    assert acts(error) == ["retry-form", "continue-form"]
    notice = block(T1, 1, Role.SYSTEM, Kind.SYSTEM, kind="config-reload", text="Reloaded.")
    assert acts(replace(notice, seq=9)) == ["regenerate-form if-end", "branch-form if-end"]
    stop = block(T1, 1, Role.SYSTEM, Kind.SYSTEM, kind="cancelled", text="Stopped.")
    assert "continue-form" in acts(replace(stop, seq=9))
    lone = block(None, 0, Role.SYSTEM, Kind.SYSTEM, kind="model-changed", text="Now x.")
    assert acts(replace(lone, seq=9)) == []
    # An open chunk has nothing to copy or cut yet.
    [wrapper] = top(render.fragment_open(failed()[1]))
    assert own_acts(wrapper.children[0]) is None


def test_render_knows_every_ending_continue_applies_to():
    """render cannot import resume (one layer): its list of endings must be resume's."""
    endings = set(resume.ENDINGS) - {"error"}
    assert endings == render.ENDING_KINDS
    assert {"forked", "step-limit"} <= set(render.SYSTEM_LABELS)


def test_a_code_block_copy_button_adds_no_text_to_the_message():
    """Its label is CSS: the message's text in the page is its markdown's text."""
    html = str(render.markdown("```\nx = 1\n```"))
    tree = parse(html)
    [button] = tree.find_all(lambda n: n.tag == "button")
    assert (button.get("data-copy"), button.text) == ("code", "")
    assert tree.text.strip() == "x = 1"


def test_the_menu_names_the_parent_only_while_it_is_the_users(client, tab, bob):
    """The admin may give a tab to someone else: its title is then not shown."""
    branch = turns.branch(tab, 5).tab
    page = client.get(reverse("tab", args=[branch.id])).content.decode()
    assert f'href="{reverse("tab", args=[tab.id])}?seq=5"' in page
    Tab.objects.filter(pk=tab.pk).update(owner=bob, title="Bob's secret plans")
    page = client.get(reverse("tab", args=[branch.id])).content.decode()
    assert "Bob&#x27;s secret plans" not in page and "Bob's secret plans" not in page
    assert f'href="{reverse("tab", args=[tab.id])}' not in page


@pytest.mark.parametrize("name", ["tab_branch", "tab_continue", "tab_send"])
def test_a_tab_deleted_while_the_request_runs_is_a_404_not_a_500(client, tab, name, monkeypatch):
    """Found by the view, gone when turns locks it (a delete in another request). (Edit,
    Regenerate and Retry read the chunk first: theirs says the message is not there.)"""
    found = common.tab_for_user

    def found_then_deleted(request, tab_id):
        tab = found(request, tab_id)
        Tab.objects.filter(pk=tab_id).delete()
        return tab

    monkeypatch.setattr(common, "tab_for_user", found_then_deleted)
    response = client.post(reverse(name, args=[tab.id]), {"seq": 1, "text": "hi"})
    assert response.status_code == 404
