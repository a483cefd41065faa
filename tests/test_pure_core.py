"""The pure core loads no Django, database, channel layer or network client when imported.

.importlinter's `pure` contracts check the modules' imports; this checks what importing
them runs, which the linter's graph does not see: a package's __init__ (chat.providers'),
and the lazy imports of chat.providers.registry, which chat.context reads.
"""

from __future__ import annotations

import json
import subprocess
import sys

from harness.servers import ROOT

PURE = (
    "chat.chunks",
    "chat.stream",
    "chat.history",
    "chat.cuts",
    "chat.context",
    "chat.resume",
    "chat.schedule",
    "chat.rules",
    "chat.pacing",
    "chat.retry",
    "chat.envcheck",
    "chat.providers.base",
    "chat.acp.updates",
)
IMPURE = ("django", "channels", "daphne", "twisted", "asgiref", "redis", "psycopg", "httpx2")
IMPURE += ("anthropic", "openai", "mcp", "chat.models", "chat.log", "chat.bus")

SCRIPT = f"""
import json, sys
for name in {PURE!r}:
    __import__(name)
print(json.dumps(sorted(name for name in sys.modules
                        if any(name == i or name.startswith(i + ".") for i in {IMPURE!r}))))
"""


def test_importing_the_pure_core_loads_nothing_impure():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
    ).stdout
    assert json.loads(out) == []
