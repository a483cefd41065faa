"""A first run that works (issue 31): a new workspace starts with the sample project (a
README, a notes file, a script), once, never over a file that is there, and never where a
shared workspace waits to be adopted; every suggestion of the offline demo model works on
it through the real runner; an empty tab offers those suggestions as starter prompts that
send when clicked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from chat.models import Tab
from chat.providers.offline import SUGGESTIONS
from chat.tools import workdir
from chat.tools.workdir import SAMPLE, seed_sample, user_workspace
from tests.engine import Watcher, chunks, make_tab, running_worker, submit
from tests.ui_helpers import parse

SAMPLE_NAMES = sorted(p.name for p in SAMPLE.iterdir())


@pytest.fixture
def sample_on(settings, tmp_path) -> Path:
    settings.DISPATCH_SAMPLE_PROJECT = True
    settings.DISPATCH_WORKSPACE = tmp_path / "workspace"
    return settings.DISPATCH_WORKSPACE


def test_the_sample_is_a_readme_a_notes_file_and_a_script():
    assert SAMPLE_NAMES == ["README.md", "hello.py", "notes.md"]


def test_a_new_workspace_gets_the_sample_once_and_it_is_never_written_again(sample_on):
    path = user_workspace(7)
    assert sorted(os.listdir(path)) == SAMPLE_NAMES
    for name in SAMPLE_NAMES:
        assert (path / name).read_bytes() == (SAMPLE / name).read_bytes()
    # The user changes one, deletes another: asking again restores nothing.
    (path / "README.md").write_text("mine\n")
    (path / "notes.md").unlink()
    assert user_workspace(7) == path
    assert (path / "README.md").read_text() == "mine\n"
    assert sorted(os.listdir(path)) == ["README.md", "hello.py"]


def test_an_existing_workspace_gets_nothing(sample_on):
    path = sample_on / workdir.USERS / "8"
    path.mkdir(parents=True)
    (path / "mine.txt").write_text("x")
    assert user_workspace(8) == path
    assert os.listdir(path) == ["mine.txt"]


def test_off_a_new_workspace_starts_empty(sample_on, settings):
    settings.DISPATCH_SAMPLE_PROJECT = False
    assert os.listdir(user_workspace(9)) == []


def test_no_sample_while_a_shared_workspace_waits_to_be_adopted(sample_on):
    """adopt_shared would find the sample's names taken and move nothing."""
    sample_on.mkdir(parents=True)
    (sample_on / "README.md").write_text("the shared workspace's\n")
    assert os.listdir(user_workspace(10)) == []
    assert workdir.adopt_shared(10) == ["README.md"]
    assert (user_workspace(10) / "README.md").read_text() == "the shared workspace's\n"


def test_seeding_never_overwrites_nor_follows_a_link(tmp_path):
    (tmp_path / "README.md").write_text("mine\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("outside\n")
    (tmp_path / "notes.md").symlink_to(outside)
    assert seed_sample(tmp_path) == ["hello.py"]
    assert (tmp_path / "README.md").read_text() == "mine\n"
    assert outside.read_text() == "outside\n"
    assert seed_sample(tmp_path) == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("suggestion", SUGGESTIONS)
async def test_each_suggestion_of_the_offline_demo_works_on_a_new_workspace(sample_on, suggestion):
    tab = await make_tab("offline/demo")
    async with running_worker(), Watcher(tab.pk) as watcher:
        await submit(tab, suggestion)
        await watcher.until_idle()
    rows = await chunks(tab.pk)
    results = [r.data for r in rows if r.type == "tool_result"]
    assert len(results) == 1, [r.type for r in rows]
    [result] = results
    assert result["is_error"] is False, result
    shown = result.get("shell_output") or result["result"]
    expected = {
        "list the files": "hello.py",
        "read README.md": "# Sample project",
        "run `python3 hello.py`": "Hello, world! This ran in your workspace.",
        "run `ls -la`": "notes.md",
    }[suggestion]
    assert expected in shown
    answer = [r.data["text"] for r in rows if r.type == "text" and r.role == "assistant"][-1]
    assert "failed" not in answer and "empty" not in answer


@pytest.mark.django_db
def test_an_empty_tab_offers_the_suggestions_and_one_click_sends():
    user = get_user_model().objects.create_user("owner", password="pw-for-tests-only")
    tab = Tab.objects.create(owner=user, model="offline/demo")
    client = Client()
    client.force_login(user)
    page = parse(client.get(reverse("tab", args=[tab.id])).content.decode())
    starters = page.by_id("starters")
    forms = [n for n in starters.iter() if n.tag == "form"]
    assert [f.find_all(lambda n: n.tag == "button")[0].text for f in forms] == list(SUGGESTIONS)
    for form in forms:
        assert form.get("action") == reverse("tab_send", args=[tab.id])
        [text] = form.find_all(lambda n: n.get("name") == "text")
        assert text.get("type") == "hidden"
    # What a click posts: its text, sent as a message.
    response = client.post(reverse("tab_send", args=[tab.id]), {"text": SUGGESTIONS[0]})
    assert response.status_code == 302
    assert tab.queued.get().text == SUGGESTIONS[0]
