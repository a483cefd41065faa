"""Chromium: Debian's, with one set of flags, for the tests and the benchmarks alike.

One policy: Chromium is installed (`make test` and `make bench` run `make chromium`,
which installs it), and a missing one is an error that says so. Nothing skips.

    async with chromium.browser() as browser:        # Playwright
        ...
    subprocess.Popen(chromium.command(url, ...))     # a Chromium with no automation
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from playwright.async_api import async_playwright

EXECUTABLE = "/usr/bin/chromium"
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Starting Chromium on a loaded two-core machine takes seconds; past this it is stuck.
LAUNCH_TIMEOUT = 30.0


class ChromiumMissing(RuntimeError):
    """Chromium is not installed where the tests and benchmarks look for it."""


def executable() -> str:
    """The path of Chromium; ChromiumMissing, saying how to install it, when it is not there."""
    if not os.access(EXECUTABLE, os.X_OK):
        raise ChromiumMissing(
            f"Chromium is not installed at {EXECUTABLE}: the browser tests and benchmarks "
            "need it. Run `make chromium` (as root it installs it; otherwise "
            "`sudo apt-get install chromium`)."
        )
    return EXECUTABLE


def command(*extra: str) -> list[str]:
    """The command line of a Chromium with no automation attached: the flags, then `extra`
    (a profile directory, a window size, the URL)."""
    return [executable(), *ARGS, *extra]


@contextlib.asynccontextmanager
async def browser(timeout: float = LAUNCH_TIMEOUT) -> AsyncIterator[Any]:
    """A Playwright `Browser` on Chromium, closed (with Playwright) on the way out."""
    path = executable()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=path, args=list(ARGS), timeout=timeout * 1000
        )
        try:
            yield launched
        finally:
            await launched.close()
