"""The Django admin as the operator sees it: lists, the read-only log, masked keys."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import path, reverse
from django.utils.http import urlencode

from chat import log, turns
from chat.admin import CHUNK_COUNT_CAP, HIGHLIGHT_MAX_CHARS, payload_preview
from chat.models import ApiKey, Chunk, Setting, Tab
from chat.stream import Block
from chat.turn import lease
from tests import opsdata

pytestmark = pytest.mark.django_db

# A chunk list page costs a session, the user, the tab filter's choices, the
# count and the page: about six queries. Ten leaves room for admin internals
# and still fails long before a query per row (a page has 100 rows).
MAX_LIST_QUERIES = 10
# Past the filtered list's count cap twice over; the queries must not depend on it.
LONG_TAB_CHUNKS = 2 * CHUNK_COUNT_CAP
# Rows per INSERT when building the long tab: under PostgreSQL's 65,535
# parameters per statement at 9 columns a row.
BULK_BATCH = 5_000


@pytest.fixture
def staff(client):
    user = User.objects.create_superuser("root", "root@example.com", "pw-root-123")
    client.force_login(user)
    return user


@pytest.fixture
def history(staff):
    return opsdata.fill_history(staff, tabs=2)


def _chunk_list(**params: str) -> str:
    url = reverse("admin:chat_chunk_changelist")
    return f"{url}?{urlencode(params)}" if params else url


def test_it_shows_staff_the_tab_list_with_counts_state_and_links(client, history):
    """The tab list shows owner, title, chunk and turn counts, running state and links."""
    running_tab = history[0]
    opsdata.start_turn(running_tab)

    response = client.get(reverse("admin:chat_tab_changelist"))

    assert response.status_code == 200
    html = response.content.decode()
    assert "History tab 0" in html and "History tab 1" in html
    assert "root" in html
    rows = {tab.title: _row_of(html, tab.title) for tab in history}
    assert '<td class="field-chunk_count">8</td>' in rows["History tab 0"]
    assert '<td class="field-turn_count">1</td>' in rows["History tab 0"]
    assert "running, step 2" in rows["History tab 0"]
    assert "idle" in rows["History tab 1"]
    assert f'href="{_chunk_list(tab__id__exact=str(running_tab.pk))}"' in html


def test_it_marks_a_tab_whose_lease_is_stale(client, history):
    """A running turn whose heartbeat stopped is shown as a stale lease, not as running fine."""
    opsdata.start_turn(history[1], stale=True)

    html = client.get(reverse("admin:chat_tab_changelist")).content.decode()

    assert "(stale lease)" in _row_of(html, "History tab 1")
    assert "(stale lease)" not in _row_of(html, "History tab 0")


def test_it_says_why_a_stop_was_asked_when_not_by_the_user(client, history):
    """A Stop recorded on the lease shows, with its reason when a sub-agent's parent asked."""
    opsdata.start_turn(history[0])
    opsdata.start_turn(history[1])
    lease.request_cancel(history[0].pk)
    lease.request_cancel(history[1].pk, why="its parent was stopped")

    html = client.get(reverse("admin:chat_tab_changelist")).content.decode()

    assert "running, step 2, cancel requested<" in _row_of(html, "History tab 0")
    assert "cancel requested (its parent was stopped)" in _row_of(html, "History tab 1")


def test_it_searches_tabs_by_title(client, history):
    """The tab list's search box matches titles."""
    html = client.get(reverse("admin:chat_tab_changelist") + "?q=tab+1").content.decode()

    assert "History tab 1" in html
    assert "History tab 0" not in html


class _WithTabRoute:
    """A URLconf where the app has its tab page (ROOT_URLCONF may be any object)."""

    urlpatterns = [
        path("admin/", admin.site.urls),
        path("tabs/<uuid:tab_id>/", lambda request, tab_id: None, name="tab"),
    ]


class _WithoutTabRoute:
    urlpatterns = [path("admin/", admin.site.urls)]


def test_it_links_the_tab_page_when_the_app_has_one(client, history):
    """With a URL named "tab", each tab row links to its page."""
    with override_settings(ROOT_URLCONF=_WithTabRoute):
        html = client.get(reverse("admin:chat_tab_changelist")).content.decode()

    assert f'href="/tabs/{history[0].pk}/"' in html


def test_it_shows_no_tab_page_link_without_the_route(client, history):
    """Without a URL named "tab" the list still renders, with the chunks link only."""
    with override_settings(ROOT_URLCONF=_WithoutTabRoute):
        response = client.get(reverse("admin:chat_tab_changelist"))

    html = response.content.decode()
    assert response.status_code == 200
    assert "open tab" not in html
    assert "tab__id__exact" in html


def test_it_shows_staff_the_chunk_list_with_previews(client, history):
    """Chunks are listed by tab then seq, with turn, step, role, type and a one-line preview."""
    tab = history[0]
    turn_id = Chunk.objects.filter(tab=tab).values_list("turn_id", flat=True).first()

    response = client.get(_chunk_list(tab__id__exact=str(tab.pk)))

    html = response.content.decode()
    assert response.status_code == 200
    seqs = [int(seq) for seq in re.findall(r'class="field-seq"><a [^>]*>(\d+)</a>', html)]
    assert seqs == list(range(1, 9))
    assert str(turn_id)[:8] in html
    assert reverse("admin:chat_chunk_turn", kwargs={"turn_id": turn_id}) in html
    assert "list_files({&quot;path&quot;:&quot;.&quot;})" in html
    assert "list_files → a.txt b.txt" in html
    assert "[529] Overloaded" in html
    assert "notice: Retried once." in html
    assert "8 chunks" in html


def test_it_orders_chunks_by_tab_then_seq(client, history):
    """Without a filter, all chunks of one tab come together, in seq order."""
    html = client.get(_chunk_list()).content.decode()

    tabs = re.findall(r'class="field-tab[^"]*">(?:<a [^>]*>)?(History tab \d)', html)
    seqs = [int(seq) for seq in re.findall(r'class="field-seq"><a [^>]*>(\d+)</a>', html)]
    first, second = sorted({"History tab 0", "History tab 1"}, key=tabs.index)
    assert tabs == [first] * 8 + [second] * 8
    assert seqs == list(range(1, 9)) * 2
    assert "16 chunks" in html


def test_it_filters_chunks_by_type_role_and_date(client, history):
    """The type, role and date filters narrow the list."""
    by_type = client.get(_chunk_list(type__exact="tool_call")).content.decode()
    by_role = client.get(_chunk_list(role__exact="system")).content.decode()
    # The parameters the date filter's own links carry.
    since = {"created_at__gte": "2000-01-01 00:00:00+00:00"}
    recent = client.get(_chunk_list(**since)).content.decode()
    future = client.get(_chunk_list(created_at__gte="2999-01-01 00:00:00+00:00")).content.decode()

    assert by_type.count('class="field-type">Tool Call<') == 2
    assert 'class="field-type">Text<' not in by_type
    assert by_role.count('class="field-role">System<') == 2
    assert 'class="field-role">Assistant<' not in by_role
    assert "16 chunks" in recent
    assert "0 chunks" in future


def test_it_searches_inside_the_payload_text(client, staff):
    """Search matches the decoded payload strings, non-ASCII included, and a pasted turn id."""
    tab = opsdata.make_tab(staff, "Search")
    turn_id = uuid.uuid4()
    log.append(
        tab.pk,
        [
            opsdata.block(turn_id, 0, "user", "text", {"text": "Un café, s'il vous plaît"}),
            opsdata.block(turn_id, 0, "assistant", "text", {"text": "Tea instead"}),
            opsdata.block(
                turn_id,
                0,
                "tool",
                "tool_result",
                {"call_id": "c", "name": "shell", "result": "needle found", "is_error": False},
            ),
        ],
    )
    other = opsdata.make_tab(staff, "Other")
    log.append(other.pk, [opsdata.block(uuid.uuid4(), 0, "user", "text", {"text": "café"})])

    # "Café": SQLite folds the case of ASCII letters only.
    cafe = client.get(_chunk_list(q="Café")).content.decode()
    needle = client.get(_chunk_list(q="needle")).content.decode()
    by_turn = client.get(_chunk_list(q=str(turn_id))).content.decode()

    assert cafe.count('class="field-preview"') == 2
    assert needle.count('class="field-preview"') == 1 and "needle found" in needle
    assert by_turn.count('class="field-preview"') == 3


def test_it_shows_a_chunks_payload_as_coloured_escaped_json(client, staff):
    """The detail page shows the payload pretty-printed and highlighted, with HTML escaped."""
    tab = opsdata.make_tab(staff, "Detail")
    turn_id = uuid.uuid4()
    [chunk] = log.append(
        tab.pk,
        [
            opsdata.block(
                turn_id,
                0,
                "assistant",
                "tool_call",
                {
                    "call_id": "c1",
                    "name": "write_file",
                    "arguments": {"path": "x.html", "content": "<script>alert(1)</script>"},
                },
            )
        ],
    )

    response = client.get(reverse("admin:chat_chunk_change", args=[chunk.pk]))

    html = response.content.decode()
    assert response.status_code == 200
    assert '<div class="chunk-json">' in html
    # Pygments marks keys and strings with its token classes.
    assert '<span class="nt">"arguments"</span>' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert(1)</script>" not in html
    assert '\n<span class="w">  </span><span class="nt">"call_id"</span>' in html
    assert reverse("admin:chat_chunk_turn", kwargs={"turn_id": turn_id}) in html


def test_it_shows_a_huge_payload_plain_but_escaped(client, staff):
    """Past the highlighting bound the payload is still shown whole, escaped, without colours."""
    tab = opsdata.make_tab(staff, "Huge")
    text = "<b>bold</b> " + "z" * HIGHLIGHT_MAX_CHARS
    [chunk] = log.append(tab.pk, [opsdata.block(uuid.uuid4(), 0, "tool", "text", {"text": text})])

    html = client.get(reverse("admin:chat_chunk_change", args=[chunk.pk])).content.decode()

    assert "shown without colours" in html
    assert "&lt;b&gt;bold&lt;/b&gt; " + "z" * HIGHLIGHT_MAX_CHARS in html
    assert "<b>bold</b>" not in html


def test_it_refuses_to_add_change_or_delete_chunks(client, history):
    """The log is append-only: add, change and delete are refused and not offered."""
    chunk = Chunk.objects.filter(tab=history[0]).first()
    change_url = reverse("admin:chat_chunk_change", args=[chunk.pk])

    add = client.get(reverse("admin:chat_chunk_add"))
    change = client.post(change_url, {"role": "user", "type": "text", "data": "{}"})
    delete_page = client.get(reverse("admin:chat_chunk_delete", args=[chunk.pk]))
    delete = client.post(reverse("admin:chat_chunk_delete", args=[chunk.pk]), {"post": "yes"})
    bulk = client.post(
        _chunk_list(), {"action": "delete_selected", "_selected_action": [chunk.pk], "post": "yes"}
    )
    listing = client.get(_chunk_list()).content.decode()
    detail = client.get(change_url).content.decode()

    assert (add.status_code, change.status_code) == (403, 403)
    assert (delete_page.status_code, delete.status_code) == (403, 403)
    assert bulk.status_code in (200, 302)
    assert Chunk.objects.filter(pk=chunk.pk).exists()
    chunk.refresh_from_db()
    assert chunk.role == "user" and chunk.data == {"text": "List the files, please."}
    assert "delete_selected" not in listing
    assert reverse("admin:chat_chunk_add") not in listing
    assert 'name="_save"' not in detail
    assert reverse("admin:chat_chunk_delete", args=[chunk.pk]) not in detail


def test_it_does_not_offer_to_add_or_delete_tabs(client, history):
    """Tabs are made by the app and deleted with their history, not from the admin."""
    tab = history[0]

    assert client.get(reverse("admin:chat_tab_add")).status_code == 403
    assert client.get(reverse("admin:chat_tab_delete", args=[tab.pk])).status_code == 403
    assert Tab.objects.filter(pk=tab.pk).exists()


def test_it_lets_staff_rename_a_tab_but_not_touch_its_prompt(client, history):
    """Title and owner are editable; model and the frozen system prompt are not."""
    tab = history[0]
    Tab.objects.filter(pk=tab.pk).update(system_prompt="Frozen.")

    response = client.post(
        reverse("admin:chat_tab_change", args=[tab.pk]),
        {"title": "Renamed", "owner": "", "system_prompt": "Changed!", "model": "x/y"},
    )

    assert response.status_code == 302
    tab.refresh_from_db()
    assert (tab.title, tab.owner, tab.system_prompt, tab.model) == (
        "Renamed",
        None,
        "Frozen.",
        "offline/demo",
    )


def test_it_gives_non_staff_users_no_admin(client, history):
    """A logged-in user without is_staff, and an anonymous one, are sent to the admin login."""
    chunk = Chunk.objects.filter(tab=history[0]).first()
    urls = [
        reverse("admin:index"),
        _chunk_list(),
        reverse("admin:chat_chunk_change", args=[chunk.pk]),
        reverse("admin:chat_chunk_turn", kwargs={"turn_id": chunk.turn_id}),
        reverse("admin:chat_apikey_changelist"),
    ]
    client.logout()
    anonymous = [client.get(url) for url in urls]
    client.force_login(User.objects.create_user("bob", "bob@example.com", "pw-bob-12345"))
    plain_user = [client.get(url) for url in urls]

    for response in anonymous + plain_user:
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_it_refuses_staff_without_view_permission(client, history):
    """Staff status alone does not open the chunk log or the turn view."""
    chunk = Chunk.objects.filter(tab=history[0]).first()
    eve = User.objects.create_user("eve", "e@example.com", "pw-eve-12345", is_staff=True)
    client.force_login(eve)

    assert client.get(_chunk_list()).status_code == 403
    turn = client.get(reverse("admin:chat_chunk_turn", kwargs={"turn_id": chunk.turn_id}))
    assert turn.status_code == 403


def test_it_shows_a_turn_grouped_by_step_with_usage(client, history):
    """The turn view lists the turn's chunks in order, per step, with that step's tokens."""
    tab = history[0]
    turn_id = Chunk.objects.filter(tab=tab).values_list("turn_id", flat=True).first()

    response = client.get(reverse("admin:chat_chunk_turn", kwargs={"turn_id": turn_id}))

    html = response.content.decode()
    assert response.status_code == 200
    step0, step1 = html.index('id="step-0"'), html.index('id="step-1"')
    assert step0 < step1
    assert "120 input, 30 output, 100 cache read, 20 cache write" in html[step0:step1]
    assert "160 input, 12 output, 150 cache read, 0 cache write" in html[step1:]
    assert "Total: 280 input, 42 output, 250 cache read, 20 cache write" in html
    previews = re.findall(r"<summary>(.*?)</summary>", html)
    assert previews == [
        payload_preview(chunk.type, chunk.data)
        .replace("&", "&amp;")
        .replace('"', "&quot;")
        .replace("'", "&#x27;")
        for chunk in Chunk.objects.filter(tab=tab).order_by("seq")
    ]
    assert '<div class="chunk-json">' in html
    assert f'href="{_chunk_list(tab__id__exact=str(tab.pk))}"' in html


def test_it_shows_the_running_step_of_a_turn(client, staff):
    """A turn still running shows its state and the checkpointed open block."""
    tab = opsdata.make_tab(staff, "Live")
    running = opsdata.start_turn(tab)

    html = client.get(
        reverse("admin:chat_chunk_turn", kwargs={"turn_id": running.turn_id})
    ).content.decode()

    assert "Running: running, step 2" in html
    assert "Open block: Half of an answ" in html
    assert "No chunk of this turn is in the log yet." in html


def test_it_answers_404_for_an_unknown_turn(client, staff):
    """A turn id with no chunk and no running turn is not found."""
    response = client.get(reverse("admin:chat_chunk_turn", kwargs={"turn_id": uuid.uuid4()}))

    assert response.status_code == 404


def test_it_lists_a_long_tab_with_bounded_queries(client, staff, django_assert_max_num_queries):
    """First page, last page, unfiltered and filtered lists of a huge tab cost a few queries."""
    tab = opsdata.make_tab(staff, "Long")
    turn_id = uuid.uuid4()
    Chunk.objects.bulk_create(
        (
            Chunk(
                tab_id=tab.pk,
                seq=seq,
                turn_id=turn_id,
                step=seq % 7,
                role="assistant",
                type="text",
                data={"text": f"line {seq}"},
            )
            for seq in range(1, LONG_TAB_CHUNKS + 1)
        ),
        batch_size=BULK_BATCH,
    )
    # What chat.log.append keeps up to date with every append.
    Tab.objects.filter(pk=tab.pk).update(last_seq=LONG_TAB_CHUNKS)
    tab_only = _chunk_list(tab__id__exact=str(tab.pk))
    last_page = LONG_TAB_CHUNKS // 100

    with django_assert_max_num_queries(MAX_LIST_QUERIES):
        first = client.get(tab_only)
    with django_assert_max_num_queries(MAX_LIST_QUERIES):
        last = client.get(f"{tab_only}&p={last_page}")
    with django_assert_max_num_queries(MAX_LIST_QUERIES):
        everything = client.get(_chunk_list())
    with django_assert_max_num_queries(MAX_LIST_QUERIES):
        filtered = client.get(f"{tab_only}&type__exact=text")

    assert [r.status_code for r in (first, last, everything, filtered)] == [200] * 4
    assert f"{LONG_TAB_CHUNKS} chunks" in first.content.decode()
    assert "line 1<" in first.content.decode()
    assert f"line {LONG_TAB_CHUNKS}<" in last.content.decode()
    assert f"{LONG_TAB_CHUNKS} chunks" in everything.content.decode()
    assert f"More than {CHUNK_COUNT_CAP} chunks" in filtered.content.decode()


def test_it_never_shows_an_api_key_in_full_or_its_ciphertext(client, staff):
    """Every admin page of a stored key shows only its mask."""
    api_key = ApiKey(provider="anthropic")
    api_key.set_key(opsdata.SECRET_KEY_TEXT, endpoint="https://api.anthropic.com")
    api_key.save()
    pages = [
        reverse("admin:chat_apikey_changelist"),
        reverse("admin:chat_apikey_change", args=[api_key.pk]),
        reverse("admin:chat_apikey_delete", args=[api_key.pk]),
        reverse("admin:chat_apikey_history", args=[api_key.pk]),
        reverse("admin:index"),
    ]

    for url in pages:
        html = client.get(url).content.decode()
        assert opsdata.SECRET_KEY_TEXT not in html, url
        assert api_key.encrypted not in html, url
        assert opsdata.SECRET_KEY_TEXT[:-4] not in html, url
    change = client.get(pages[1]).content.decode()
    assert "…WXYZ" in change


def test_it_stores_a_key_added_in_the_admin_encrypted(client, staff):
    """The add form takes the key in plain text and stores it only encrypted."""
    response = client.post(
        reverse("admin:chat_apikey_add"),
        {"provider": "openai", "key": opsdata.SECRET_KEY_TEXT},
        follow=True,
    )

    assert response.status_code == 200
    stored = ApiKey.objects.get(provider="openai")
    assert stored.get_key() == opsdata.SECRET_KEY_TEXT
    assert opsdata.SECRET_KEY_TEXT not in stored.encrypted
    assert stored.last4 == "WXYZ"
    assert opsdata.SECRET_KEY_TEXT not in response.content.decode()


def test_it_keeps_the_stored_key_when_the_field_is_left_empty(client, staff):
    """Saving a key's page without typing a key leaves the stored key alone."""
    api_key = ApiKey(provider="anthropic")
    api_key.set_key(opsdata.SECRET_KEY_TEXT, endpoint="https://api.anthropic.com")
    api_key.save()

    response = client.post(
        reverse("admin:chat_apikey_change", args=[api_key.pk]),
        {"provider": "anthropic", "key": ""},
    )

    assert response.status_code == 302
    api_key.refresh_from_db()
    assert api_key.get_key() == opsdata.SECRET_KEY_TEXT


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "Enter the API key."),
        ("sk-ant-api03-split key-0123456789", "An API key has no spaces or line breaks"),
        ("sk-short", "This is too short for an API key"),
    ],
)
def test_it_rejects_a_bad_key_without_echoing_it(client, staff, key, message):
    """A missing, pasted-with-a-space or too short key is refused with a clear error."""
    response = client.post(reverse("admin:chat_apikey_add"), {"provider": "openai", "key": key})

    html = response.content.decode()
    assert response.status_code == 200
    assert message in html
    if key:
        assert key not in html
    assert not ApiKey.objects.exists()


def test_it_shows_the_kept_state_tables(client, staff):
    """Settings, endpoints and usage records have their admin lists; usage is read-only."""
    kept = opsdata.fill_kept_state()
    record_url = reverse("admin:chat_usagerecord_changelist")

    for url in [
        reverse("admin:chat_setting_changelist"),
        reverse("admin:chat_providerendpoint_changelist"),
        record_url,
    ]:
        assert client.get(url).status_code == 200, url
    assert "system_prompt" in client.get(reverse("admin:chat_setting_changelist")).content.decode()
    assert client.get(reverse("admin:chat_usagerecord_add")).status_code == 403
    assert kept["api_key"].pk
    assert Setting.objects.count() == 2


def _row_of(html: str, title: str) -> str:
    """The <tr> of the tab list that names `title`."""
    for row in re.findall(r"<tr>.*?</tr>", html, flags=re.S):
        if f">{title}<" in row:
            return row
    raise AssertionError(f"no row for {title!r}")


def test_it_shows_a_branchs_parent_and_filters_branches(client, staff):
    """A branch names its parent and cut, read-only; the list filters branched tabs."""
    parent = Tab.objects.create(owner=staff, title="Parent")
    log.append(parent.pk, [Block(uuid.uuid4(), uuid.uuid4(), 0, "user", "text", {"text": "hi"})])
    branch = turns.branch(parent, 1).tab

    page = client.get(reverse("admin:chat_tab_change", args=[branch.pk])).content.decode()
    assert reverse("admin:chat_tab_change", args=[parent.pk]) in page
    assert "Fork seq" in page
    branched = client.get(reverse("admin:chat_tab_changelist") + "?fork_seq__isempty=0")
    assert [t.pk for t in branched.context["cl"].result_list] == [branch.pk]
    # Read-only: a post cannot move a branch to another parent.
    client.post(
        reverse("admin:chat_tab_change", args=[branch.pk]),
        {"title": "B", "owner": "", "parent": "", "fork_seq": "0"},
    )
    branch.refresh_from_db()
    assert (branch.parent_id, branch.fork_seq) == (parent.pk, 1)


def test_the_payload_json_has_dark_colours_and_the_list_wraps_long_previews(client, staff):
    """The admin's dark theme (its toggle, or the system's on auto) gets dark JSON, not a
    white box; a long unbroken preview wraps instead of widening the list."""
    tab = Tab.objects.create(owner=staff, title="T")
    [chunk] = log.append(tab.pk, [Block(uuid.uuid4(), None, 0, "user", "text", {"text": "x"})])
    page = client.get(reverse("admin:chat_chunk_change", args=[chunk.pk])).content.decode()
    assert 'html[data-theme="dark"] .chunk-json' in page
    assert "@media (prefers-color-scheme: dark)" in page
    assert "var(--darkened-bg)" in page
    listing = client.get(_chunk_list()).content.decode()
    assert "td.field-preview { overflow-wrap: anywhere" in listing
