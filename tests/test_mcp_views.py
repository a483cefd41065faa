"""MCP servers on the Settings page and in the admin: staff only, secrets encrypted and
masked, every bad input a message on the form, Test listing the tools or the error."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from chat.forms import SECRET_MASK
from chat.models import McpServer
from harness.servers import Proc, clean_env

TOKEN = "ghp_s3cret-token-value"
TOOLS = str(Path(__file__).parent / "mcp_servers" / "tools.py")


@pytest.fixture
def staff(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("sam", password="pw-sam-12345", is_staff=True))
    return client


@pytest.fixture
def root(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-root-12345"))
    return client


@pytest.fixture
def member(db) -> Client:
    client = Client()
    client.force_login(User.objects.create_user("meg", password="pw-meg-12345"))
    return client


def add(client: Client, **fields) -> object:
    data = {"action": "mcp", "transport": "stdio", "timeout": "30", "enabled": "on", **fields}
    return client.post(reverse("settings_section", args=["tools"]), data)


def test_superusers_add_a_stdio_server_whose_env_is_encrypted_and_masked(root):
    response = add(
        root, name="github", command="npx", args="-y\nserver-github", env=f"TOKEN={TOKEN}"
    )
    assert response.status_code == 302
    row = McpServer.objects.get(name="github")
    assert (row.command, row.args, row.get_env()) == (
        "npx",
        ["-y", "server-github"],
        {"TOKEN": TOKEN},
    )
    assert TOKEN not in row.env_encrypted
    page = root.get(reverse("settings_section", args=["tools"])).content.decode()
    assert f"TOKEN={SECRET_MASK}" in page
    assert TOKEN not in page
    edit = root.get(reverse("settings_section", args=["tools"]) + f"?mcp={row.pk}").content.decode()
    assert f"TOKEN={SECRET_MASK}" in edit
    assert TOKEN not in edit


def test_an_edit_keeps_a_masked_value_and_takes_new_ones(root):
    add(root, name="github", command="npx", env=f"TOKEN={TOKEN}")
    row = McpServer.objects.get(name="github")
    response = add(
        root,
        server=str(row.pk),
        name="gh",
        command="uvx",
        env=f"TOKEN={SECRET_MASK}\nMORE=x",
        enabled="",
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.name, row.command, row.enabled) == ("gh", "uvx", False)
    assert row.get_env() == {"TOKEN": TOKEN, "MORE": "x"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "bad name!", "command": "x"}, "Use letters, digits, _ and - only."),
        ({"name": "s", "command": ""}, "A stdio server needs a command."),
        ({"name": "s", "transport": "http"}, "An HTTP server needs its URL."),
        ({"name": "s", "transport": "http", "url": "ftp://x/"}, "Enter a valid URL."),
        ({"name": "s", "command": "x", "env": "no equals sign"}, "Line 1: write NAME=value"),
        ({"name": "s", "command": "x", "env": "A=1\nA=2"}, "Line 2: A is given twice."),
        ({"name": "s", "command": "x", "env": f"A={SECRET_MASK}"}, "type the value of A"),
        ({"name": "s", "command": "x", "timeout": "0"}, "greater than or equal to 1"),
        (
            {"name": "s", "command": "x", "url": "http://example.com/"},
            "A URL and headers are for HTTP",
        ),
        (
            {"name": "s", "transport": "http", "url": "http://example.com/", "command": "y"},
            "A command, arguments and environment are for stdio.",
        ),
        (
            {"name": "s", "transport": "http", "url": "http://x.test/", "mount_workspace": "on"},
            "Only a stdio server can mount the workspace.",
        ),
    ],
)
def test_bad_input_is_a_message_on_the_form(root, fields, message):
    response = add(root, **fields)
    assert response.status_code == 422
    assert message in response.content.decode()
    assert not McpServer.objects.exists()


def test_a_server_mounts_the_workspace_only_when_told_to_and_the_list_says_so(root):
    """Off by default (a stdio server sees no workspace); on, saved, kept by an edit
    that leaves it, and named in the list."""
    add(root, name="plain", command="x")
    add(root, name="files", command="y", mount_workspace="on")
    rows = dict(McpServer.objects.values_list("name", "mount_workspace"))
    assert rows == {"plain": False, "files": True}
    files = McpServer.objects.get(name="files")
    edit = root.get(
        reverse("settings_section", args=["tools"]) + f"?mcp={files.pk}"
    ).content.decode()
    assert re.search(r"<input[^>]*name=\"mount_workspace\"[^>]*checked", edit)
    page = root.get(reverse("settings_section", args=["tools"])).content.decode()
    assert page.count("mounts the workspace</span>") == 1
    add(root, server=str(files.pk), name="files", command="y")
    files.refresh_from_db()
    assert files.mount_workspace is False


def test_the_admin_sets_whether_a_server_mounts_the_workspace(root):
    fields = admin_form(transport="stdio", url="", headers="", command="sh")
    response = root.post(reverse("admin:chat_mcpserver_add"), {**fields, "mount_workspace": "on"})
    assert response.status_code == 302
    assert McpServer.objects.get(name="web").mount_workspace is True


def test_removing_a_server_removes_its_homes(root):
    """A server's homes hold what it kept (tokens, caches): removed with it, on Settings
    and by the admin's bulk delete, so a server added later with its id finds none."""
    for name in ("one", "two"):
        add(root, name=name, command="x")
    rows = list(McpServer.objects.order_by("name"))
    for row in rows:
        McpServer.homes(row.pk).joinpath("home").mkdir(parents=True, exist_ok=True)
        McpServer.homes(row.pk).joinpath("home", "token").write_text("t")
    root.post(reverse("mcp_delete", args=[rows[0].pk]))
    assert not McpServer.homes(rows[0].pk).exists()
    assert McpServer.homes(rows[1].pk).joinpath("home", "token").exists()
    bulk = {"action": "delete_selected", "_selected_action": [rows[1].pk], "post": "yes"}
    root.post(reverse("admin:chat_mcpserver_changelist"), bulk)
    assert not McpServer.objects.exists()
    assert not McpServer.homes(rows[1].pk).exists()


def test_a_second_server_of_the_same_name_is_refused(root):
    add(root, name="one", command="x")
    response = add(root, name="one", command="y")
    assert response.status_code == 422
    assert "There is already a server named one." in response.content.decode()


def test_non_staff_never_see_or_change_servers(member):
    row = McpServer.objects.create(name="web", transport="http", url="http://127.0.0.1:9/")
    assert member.get(reverse("settings_section", args=["tools"])).status_code == 403
    assert add(member, name="x", command="y").status_code == 403
    for name in ("mcp_delete", "mcp_test"):
        assert member.post(reverse(name, args=[row.pk])).status_code == 403
    assert McpServer.objects.count() == 1


def test_remove(root):
    row = McpServer.objects.create(name="web", transport="http", url="http://127.0.0.1:9/")
    response = root.post(reverse("mcp_delete", args=[row.pk]), follow=True)
    assert "Removed the MCP server web." in response.content.decode()
    assert not McpServer.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_test_shows_the_error_of_a_server_that_is_down(root):
    row = McpServer.objects.create(name="down", transport="http", url="http://127.0.0.1:9/mcp")
    response = root.post(reverse("mcp_test", args=[row.pk]), follow=True)
    assert "server down: not reachable (" in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_test_lists_the_tools_of_a_disabled_server(root, tmp_path):
    proc = Proc("mcp-web", [sys.executable, TOOLS, "http"], clean_env(), tmp_path / "log").start()
    try:
        url = f"http://127.0.0.1:{proc.listening().port}/mcp"
        row = McpServer.objects.create(name="web", transport="http", url=url, enabled=False)
        response = root.post(reverse("mcp_test", args=[row.pk]), follow=True)
    finally:
        proc.stop()
    said = [str(message) for message in response.context["messages"]]
    assert said == [
        "Server web offers 9 tools: echo, add, pixel, fail, slow, hang, crash, huge, grow."
    ]


def test_the_admin_stores_headers_encrypted_and_shows_them_masked(db):
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw-root-123"))
    response = client.post(
        reverse("admin:chat_mcpserver_add"),
        {
            "name": "web",
            "transport": "http",
            "args": "[]",
            "url": "https://example.com/mcp",
            "timeout": "60",
            "enabled": "on",
            "headers": f"Authorization=Bearer {TOKEN}",
        },
        follow=True,
    )
    assert response.status_code == 200
    row = McpServer.objects.get(name="web")
    assert row.get_headers() == {"Authorization": f"Bearer {TOKEN}"}
    assert TOKEN not in row.headers_encrypted
    for url in (
        reverse("admin:chat_mcpserver_changelist"),
        reverse("admin:chat_mcpserver_change", args=[row.pk]),
    ):
        html = client.get(url).content.decode()
        assert f"Authorization={SECRET_MASK}" in html
        assert TOKEN not in html


@pytest.mark.django_db(transaction=True)
def test_test_names_each_tool_left_out_and_why_and_lists_the_rest(root, settings):
    settings.DISPATCH_SHELL_UNSANDBOXED = True
    bare = str(Path(__file__).parent / "mcp_servers" / "bare.py")
    row = McpServer.objects.create(
        name="odd", transport="stdio", command=sys.executable, args=[bare, "broken"]
    )
    response = root.post(reverse("mcp_test", args=[row.pk]), follow=True)
    said = [str(message) for message in response.context["messages"]]
    assert said[0].startswith("server odd: tool 'broken' is left out: it is not valid MCP (")
    assert said[1].startswith(
        "server odd: tool 'typo' is left out: its input schema is not valid JSON Schema ("
    )
    assert said[2:] == ["Server odd offers 2 tools: where, fine."]


def admin_form(**fields) -> dict[str, str]:
    return {
        "name": "web",
        "transport": "http",
        "args": "[]",
        "url": "https://example.com/mcp",
        "timeout": "60",
        "enabled": "on",
        "headers": f"Authorization=Bearer {TOKEN}",
        **fields,
    }


def web_row() -> McpServer:
    row = McpServer(name="web", transport="http", url="https://example.com/mcp")
    row.set_headers({"Authorization": f"Bearer {TOKEN}"})
    row.save()
    return row


def test_only_superusers_add_change_or_remove_servers_in_the_admin(staff, root):
    """A stdio server is a program run on this machine: staff who are not superusers see
    the servers (secrets masked) and change none."""
    row = web_row()
    change = reverse("admin:chat_mcpserver_change", args=[row.pk])
    for url in (reverse("admin:chat_mcpserver_changelist"), change):
        response = staff.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        assert f"Authorization={SECRET_MASK}" in html
        assert TOKEN not in html
    assert 'name="url"' not in staff.get(change).content.decode()
    changed = admin_form(url="https://evil.example/mcp", headers="")
    assert staff.post(change, changed).status_code == 403
    assert staff.get(reverse("admin:chat_mcpserver_add")).status_code == 403
    added = admin_form(name="local", transport="stdio", url="", headers="", command="sh")
    assert staff.post(reverse("admin:chat_mcpserver_add"), added).status_code == 403
    delete = reverse("admin:chat_mcpserver_delete", args=[row.pk])
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    row.refresh_from_db()
    assert (McpServer.objects.count(), row.url) == (1, "https://example.com/mcp")
    assert root.post(change, changed).status_code == 302
    row.refresh_from_db()
    assert row.url == "https://evil.example/mcp"


def test_only_superusers_add_change_or_remove_servers_on_settings(staff, root):
    """The same on Settings: other staff see the list (secrets masked) and Test a
    server, with no form to add or change one, and a post is refused."""
    row = web_row()
    page = staff.get(reverse("settings_section", args=["tools"])).content.decode()
    assert f"Authorization={SECRET_MASK}" in page and TOKEN not in page
    assert "Only a superuser can add, change or remove MCP servers" in page
    assert 'name="action" value="mcp"' not in page
    assert reverse("mcp_delete", args=[row.pk]) not in page
    assert reverse("mcp_test", args=[row.pk]) in page
    assert add(staff, name="local", command="sh").status_code == 403
    assert (
        add(staff, server=str(row.pk), name="web", transport="stdio", command="sh").status_code
        == 403
    )
    assert staff.post(reverse("mcp_delete", args=[row.pk])).status_code == 403
    row.refresh_from_db()
    assert (McpServer.objects.count(), row.transport) == (1, "http")
    assert (
        'name="action" value="mcp"'
        in root.get(reverse("settings_section", args=["tools"])).content.decode()
    )
    assert add(root, name="local", command="sh").status_code == 302


@pytest.mark.parametrize("name", ["a__b", "a_"])
def test_a_new_server_name_that_tool_names_cannot_be_read_back_from_is_refused(root, name):
    response = add(root, name=name, command="x")
    assert response.status_code == 422
    assert "A server name cannot contain __ or end with _" in response.content.decode()
    response = root.post(reverse("admin:chat_mcpserver_add"), admin_form(name=name, headers=""))
    assert response.status_code == 200
    assert "A server name cannot contain __ or end with _" in response.content.decode()
    assert not McpServer.objects.exists()


def test_a_server_saved_with_such_a_name_keeps_it_on_an_edit(root):
    """Its tabs' tool names must not change: only a new name is refused."""
    row = McpServer.objects.create(name="a__b", transport="stdio", command="x")
    assert add(root, server=str(row.pk), name="a__b", command="y").status_code == 302
    response = root.post(
        reverse("admin:chat_mcpserver_change", args=[row.pk]),
        admin_form(name="a__b", transport="stdio", url="", headers="", command="z"),
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.name, row.command) == ("a__b", "z")


def test_staff_who_are_not_superusers_see_a_servers_url_without_its_secrets(staff, root):
    """A URL may carry a token (?token=) or a password: Settings' list and the admin's
    list and view-only page mask them; a superuser's form shows the URL whole."""
    row = McpServer.objects.create(
        name="web", transport="http", url="https://me:pw-9876@mcp.example/mcp?token=tok-4567"
    )
    shown = "https://me:•••@mcp.example/mcp?token=•••"
    pages = [
        staff.get(reverse("settings_section", args=["tools"])),
        staff.get(reverse("admin:chat_mcpserver_changelist")),
        staff.get(reverse("admin:chat_mcpserver_change", args=[row.pk])),
        root.get(reverse("settings_section", args=["tools"])),
    ]
    for response in pages:
        assert response.status_code == 200
        html = response.content.decode()
        assert shown in html
        assert "pw-9876" not in html and "tok-4567" not in html
    form = root.get(reverse("settings_section", args=["tools"]) + f"?mcp={row.pk}").content.decode()
    assert 'value="https://me:pw-9876@mcp.example/mcp?token=tok-4567"' in form


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"timeout": "0"}, "timeout", "Ensure this value is greater than or equal to 1.0."),
        ({"timeout": "99999"}, "timeout", "Ensure this value is less than or equal to 3600.0."),
        # The Settings form says both (its URL field's check, then the transport's).
        (
            {"url": "ftp://example.com/mcp"},
            "url",
            ["Enter a valid URL.", "An HTTP server needs its URL."],
        ),
        ({"url": "", "headers": ""}, "url", "An HTTP server needs its URL."),
        ({"command": "npx"}, "command", "A command, arguments and environment are for stdio."),
        (
            {"transport": "stdio", "command": "npx"},
            "url",
            "A URL and headers are for HTTP servers.",
        ),
        (
            {"transport": "stdio", "url": "", "headers": ""},
            "command",
            "A stdio server needs a command.",
        ),
        (
            {"args": '{"a": 1}'},
            "args",
            'Arguments are a JSON list of strings, e.g. ["-y", "server"].',
        ),
        ({"headers": "no equals sign"}, "headers", None),
        (
            {"mount_workspace": "on"},
            "mount_workspace",
            "Only a stdio server can mount the workspace.",
        ),
    ],
)
def test_the_admin_checks_a_server_as_settings_does(root, fields, field, message):
    """The admin's form runs the Settings form's checks (one place for them): each bad
    input is a message at its field, and nothing is saved."""
    response = root.post(reverse("admin:chat_mcpserver_add"), admin_form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    if message is not None:
        assert errors[field] == (message if isinstance(message, list) else [message])
    assert not McpServer.objects.exists()


def test_the_admin_says_a_name_is_taken_once(root):
    web_row()
    response = root.post(reverse("admin:chat_mcpserver_add"), admin_form())
    errors = response.context["adminform"].form.errors
    assert errors == {"name": ["There is already a server named web."]}
    assert McpServer.objects.count() == 1
