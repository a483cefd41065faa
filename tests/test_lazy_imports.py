"""A Django process of the app loads the MCP SDK, pypdf, bashlex, the ACP SDK and the
providers' SDKs only when it uses them.

Importing them takes a large share of a process's start, and most processes (the test
suite starts a hundred and more) never reach an MCP server, parse a PDF (chat/pdftext.py
does, in a process of its own) or check a shell command against rules. Each is imported
by the code that needs it; this checks, in a fresh interpreter, that nothing imports them
at startup, and that the code that needs them still gets them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.servers import ROOT

LAZY = (
    "mcp", "mcp_types", "anyio", "starlette", "jsonschema", "pypdf", "bashlex", "acp",
    "anthropic", "openai",
)  # fmt: skip

SCRIPT = f"""
import json, sys
import django
django.setup()
import chat.admin, chat.blobs, chat.consumers, chat.rules, chat.tools, chat.views
import chat.urls, chat.api
import chat.wakes, chat.worker
from chat.tools import mcp

def loaded():
    return sorted(name for name in {LAZY!r} if name in sys.modules)

at_start = loaded()
chat.rules.read_shell("ls -l")
mcp._message(b'{{"jsonrpc": "2.0", "id": 1, "result": {{}}}}')
print(json.dumps([at_start, loaded()]))
"""


def test_a_process_loads_the_mcp_sdk_pypdf_and_bashlex_only_when_used(tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DISPATCH_DATA_DIR": str(tmp_path),
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    ).stdout
    at_start, after_use = json.loads(out)
    assert at_start == []
    # Reading a shell command and an MCP message load what they need.
    assert {"bashlex", "mcp", "mcp_types"} <= set(after_use)
