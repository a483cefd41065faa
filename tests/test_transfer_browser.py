"""Export and import in Chromium against a live server: the tab menu's downloads (served
by daphne, the streamed ASGI path), and the import page with a bad file and a good one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from chat import log
from chat.models import Tab
from harness.login import session_for
from tests.live import make_user, open_page
from tests.test_transfer import make_tab, request_json, rich_log

pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio(loop_scope="session"),
]


async def download(page, name: str, tmp_path: Path) -> tuple[str, bytes]:
    await page.click("summary[title='Tab menu']")
    async with page.expect_download() as info:
        await page.click(f"text={name}")
    got = await info.value
    path = tmp_path / got.suggested_filename
    await got.save_as(path)
    return got.suggested_filename, path.read_bytes()


async def test_a_tab_exported_from_its_menu_imports_as_an_identical_tab(browser, serve, tmp_path):
    server = await serve()
    user = await sync_to_async(make_user)()
    original = await sync_to_async(make_tab)(user, rich_log())
    session = await sync_to_async(session_for)(user)
    live = await open_page(browser, server, f"/t/{original.id}/", session=session)
    page = live.page

    name, jsonl = await download(page, "Export (JSONL)", tmp_path)
    assert name.startswith("files-") and name.endswith(".jsonl")
    lines = jsonl.decode().splitlines()
    assert json.loads(lines[0])["format"] == "dispatch-tab"
    assert len(lines) == 1 + len(rich_log())
    await page.keyboard.press("Escape")
    name, markdown = await download(page, "Export (Markdown)", tmp_path)
    assert name.endswith(".md") and markdown.startswith(b"# Files\n")

    await page.click("a.foot-link:text('Import a tab')")
    await page.wait_for_url(f"{server.url}/t/import/")
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(b"\n".join([lines[0].encode(), lines[1].encode()[:-5], b""]))
    await page.set_input_files("#import-file", broken)
    await page.click("button:text('Import')")
    error = await page.text_content("#import-error")
    assert error.startswith("Not imported: line 2: not valid JSON:")
    assert await sync_to_async(Tab.objects.count)() == 1

    good = tmp_path / "good.jsonl"
    good.write_bytes(jsonl)
    await page.set_input_files("#import-file", good)
    await page.click("button:text('Import')")
    await page.wait_for_url(f"{server.url}/t/*/")
    copy = await sync_to_async(Tab.objects.exclude(pk=original.pk).get)()
    assert page.url == f"{server.url}/t/{copy.id}/"
    assert "Imported good.jsonl as a new tab." in await page.text_content(".messages")
    assert await sync_to_async(log.count)(copy.pk) == len(rich_log())
    assert await sync_to_async(request_json)(copy) == await sync_to_async(request_json)(original)
    assert not live.errors
