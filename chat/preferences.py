"""Preferences: the Setting rows the app reads, typed, with their defaults and bounds.

The one place that knows the keys. A value written by hand in the admin may be
anything; it is read back bounded or as its default, so a page still renders
and a turn still runs. The forms write these keys (chat.forms).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from chat.models import Profile, Setting, Tab
from chat.providers import default_model
from chat.tools import workdir as workdirs
from chat.tools.base import ToolError

DEFAULT_SYSTEM_PROMPT = (
    "You are a careful assistant working in the user's workspace directory. "
    "Use the tools to look at files, change them and run commands there; check "
    "your work, and say plainly what you did and what you could not do."
)

# The page a tab opens on: enough for a long conversation, small enough to
# render in a few milliseconds whatever the tab's length.
PAGE_SIZE_DEFAULT = 200
# Fewer than this barely fills a screen, so scrolling up would load page after page.
PAGE_SIZE_MIN = 20
# A tab page renders in time independent of the tab's length only if the page is bounded.
PAGE_SIZE_MAX = 1000
# Enough for several pages of a long conversation; a browser keeps that many
# rich elements without strain.
DOM_WINDOW_DEFAULT = 600
DOM_WINDOW_MAX = 5000
# A step limit past this is a runaway loop, not a task.
MAX_STEPS_MAX = 10_000
# The workspace's instructions for agents (agents.md), read when a tab is made.
AGENTS_FILE = "AGENTS.md"
# AGENTS.md goes with every request of the tab: past this it is a manual, not
# instructions, and only its beginning is included (with a note saying so).
AGENTS_MAX_CHARS = 12_000
# Control characters taken out of AGENTS.md: all of C0 (but tab and line feed), DEL, C1.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")

KEYS = (
    "page_size",
    "dom_window",
    "expand_thinking",
    "approve_tools",
    "default_model",
    "fallback_model",
    "system_prompt",
    "max_steps",
)


@dataclass(frozen=True)
class Preferences:
    page_size: int
    dom_window: int
    expand_thinking: bool
    approve_tools: bool
    # As stored: "" means automatic (the default model) or none (the fallback).
    default_model: str
    fallback_model: str
    system_prompt: str
    max_steps: int

    @property
    def new_tab_model(self) -> str:
        return self.default_model or default_model()

    @property
    def new_tab_system_prompt(self) -> str:
        return self.system_prompt or DEFAULT_SYSTEM_PROMPT

    @property
    def effective_fallback_model(self) -> str:
        return self.fallback_model or settings.DISPATCH_FALLBACK_MODEL


def _int(value: Any, default: int, low: int, high: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return default
    return min(max(number, low), high)


def load() -> Preferences:
    """All preferences, in one query."""
    rows = dict(Setting.objects.filter(key__in=KEYS).values_list("key", "value"))
    page_size = _int(rows.get("page_size"), PAGE_SIZE_DEFAULT, PAGE_SIZE_MIN, PAGE_SIZE_MAX)
    return Preferences(
        page_size=page_size,
        dom_window=_int(rows.get("dom_window"), DOM_WINDOW_DEFAULT, page_size, DOM_WINDOW_MAX),
        expand_thinking=bool(rows.get("expand_thinking", False)),
        approve_tools=bool(rows.get("approve_tools", True)),
        default_model=str(rows.get("default_model") or ""),
        fallback_model=str(rows.get("fallback_model") or ""),
        system_prompt=str(rows.get("system_prompt") or ""),
        max_steps=_int(rows.get("max_steps"), settings.DISPATCH_MAX_STEPS, 1, MAX_STEPS_MAX),
    )


def new_tab(
    owner: Any,
    model: str = "",
    *,
    profile: Profile | None = None,
    workdir: str = "",
    title: str = "",
    system_prompt: str | None = None,
    **family: Any,
) -> Tab:
    """The one place tabs are made (a branch or an import copies one). Its model:
    `model`, else the profile's, else the Settings page's default, else the providers'
    default; its system prompt: `system_prompt`, else the profile's, else the Settings
    page's, and then the workspace's AGENTS.md (the working directory's, if it has
    one). A profile's allowed tools and rules are copied. All of it is frozen for the
    tab's whole life: editing the profile changes no existing tab, and a changing prompt
    would lose every prompt-cache hit. `workdir` (a subfolder of the workspace, made if
    missing) is checked first: workdirs.BadWorkdir, and nothing is made. `family`: a
    sub-agent's id, parent_tab, parent_call_id and profile_by_model (chat.turn.agents)."""
    prefs = load()
    workdir = workdirs.check(workdir)
    workspace = root = workdirs.user_workspace(getattr(owner, "pk", None))
    if workdir:
        try:
            root = workdirs.ensure(workspace, workdir)
        except ToolError as exc:
            raise workdirs.BadWorkdir(str(exc)) from exc
    if system_prompt is None:
        system_prompt = (profile and profile.system_prompt) or prefs.new_tab_system_prompt
    if instructions := agents_instructions(workspace, workdir, root):
        system_prompt = f"{system_prompt}\n\n{instructions}" if system_prompt else instructions
    return Tab.objects.create(
        owner=owner,
        title=title,
        model=model or (profile and profile.model) or prefs.new_tab_model,
        system_prompt=system_prompt,
        profile=profile,
        tool_allow=list(profile.tools) if profile else [],
        rules=[{"action": r.action, "pattern": r.pattern} for r in profile.rules.all()]
        if profile
        else [],
        workdir=workdir,
        **family,
    )


def profile_named(name: str) -> Profile:
    """The profile of that name, or a ValueError saying which there are."""
    profile = Profile.objects.filter(name=name).first()
    if profile is not None:
        return profile
    names = ", ".join(Profile.objects.values_list("name", flat=True)) or "none yet"
    raise ValueError(f"No profile named “{name}”. Profiles: {names}.")


def agents_instructions(workspace: Path, workdir: str, root: Path) -> str:
    """AGENTS.md of the tab's folder `root` (else of its owner's `workspace`) under a
    header naming it, cut at AGENTS_MAX_CHARS with a note; "" when there is none."""
    place = f"{workdir}/{AGENTS_FILE}" if workdir else AGENTS_FILE
    found = workdirs.read_text(root, AGENTS_FILE, AGENTS_MAX_CHARS + 1)
    if found is None and workdir:
        place = AGENTS_FILE
        found = workdirs.read_text(workspace, AGENTS_FILE, AGENTS_MAX_CHARS + 1)
    if found is None:
        return ""
    text, size = found
    if "\x00" in text:
        # A binary file, as git and grep tell them: no instructions. PostgreSQL refuses
        # NUL in text, so kept it would fail the making of every tab.
        return (
            f"[{place} in the workspace is not included: it holds NUL bytes, as binary files do.]"
        )
    # Other control characters (escape sequences, a form feed, CR) are noise to the
    # model and can hide text in the prompt view; lines and tabs stay.
    text = _CONTROL.sub("", text)
    if not text.strip():
        return ""
    note = ""
    if len(text) > AGENTS_MAX_CHARS:
        text = text[:AGENTS_MAX_CHARS]
        note = (
            f"\n\n[{place} is {size:,} bytes: only its first {AGENTS_MAX_CHARS:,} "
            "characters are included here.]"
        )
    return f"# Instructions from {place} in the workspace\n\n{text.strip()}{note}"
