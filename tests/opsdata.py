"""Test data for the operator tools: chat history of every kind, and every kept table.

Plain functions over the ORM (no factories), shared by test_admin, test_wipe and
test_status_command.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.contrib.admin.models import ADDITION, LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.sessions.backends.db import SessionStore
from django.utils import timezone

from chat import log
from chat.models import (
    ApiKey,
    CheckpointPiece,
    Chunk,
    ProviderEndpoint,
    QueuedMessage,
    RunningTurn,
    Setting,
    Tab,
    UsageRecord,
)
from chat.stream import Block

SECRET_KEY_TEXT = "sk-ant-api03-THISISTHEWHOLEKEY-do-not-show-0123456789abcdefWXYZ"


def block(turn_id: uuid.UUID, step: int, role: str, type_: str, data: dict[str, Any]) -> Block:
    return Block(uuid.uuid4(), turn_id, step, role, type_, data)


def one_turn_blocks(turn_id: uuid.UUID) -> list[Block]:
    """A two-step turn holding a chunk of every type (and every role)."""
    return [
        block(turn_id, 0, "user", "text", {"text": "List the files, please."}),
        block(
            turn_id,
            0,
            "assistant",
            "thinking",
            {"text": "I should call list_files.", "signature": "c2lnbmF0dXJl"},
        ),
        block(turn_id, 0, "assistant", "text", {"text": "Looking at the workspace."}),
        block(
            turn_id,
            0,
            "assistant",
            "tool_call",
            {"call_id": "call_1", "name": "list_files", "arguments": {"path": "."}},
        ),
        block(
            turn_id,
            0,
            "tool",
            "tool_result",
            {
                "call_id": "call_1",
                "name": "list_files",
                "result": "a.txt\nb.txt",
                "is_error": False,
            },
        ),
        block(turn_id, 1, "assistant", "text", {"text": "There are two files: a.txt and b.txt."}),
        block(turn_id, 1, "assistant", "error", {"message": "Overloaded", "status_code": 529}),
        block(turn_id, 1, "system", "system", {"kind": "notice", "text": "Retried once."}),
    ]


def make_tab(owner: User | None, title: str) -> Tab:
    return Tab.objects.create(owner=owner, title=title, model="offline/demo")


def fill_history(owner: User, *, tabs: int = 2) -> list[Tab]:
    """Tabs with a turn of every chunk type each, through chat.log like the app writes them."""
    made = []
    for n in range(tabs):
        tab = make_tab(owner, f"History tab {n}")
        turn_id = uuid.uuid4()
        log.append(tab.pk, one_turn_blocks(turn_id))
        UsageRecord.objects.create(
            user=owner,
            tab_id=tab.pk,
            turn_id=turn_id,
            step=0,
            model="offline/demo",
            input_tokens=120,
            output_tokens=30,
            cache_read_tokens=100,
            cache_write_tokens=20,
        )
        UsageRecord.objects.create(
            user=owner,
            tab_id=tab.pk,
            turn_id=turn_id,
            step=1,
            model="offline/demo",
            input_tokens=160,
            output_tokens=12,
            cache_read_tokens=150,
            cache_write_tokens=0,
        )
        made.append(tab)
    return made


def start_turn(tab: Tab, *, stale: bool = False, with_checkpoint: bool = True) -> RunningTurn:
    """A RunningTurn as a worker holds it: a lease, and a checkpointed open block."""
    age = timedelta(minutes=10) if stale else timedelta(0)
    turn_id = uuid.uuid4()
    running = RunningTurn.objects.create(
        tab=tab,
        turn_id=turn_id,
        worker="test-worker",
        step=2,
        heartbeat_at=timezone.now() - age,
    )
    if with_checkpoint:
        log.checkpoint(
            tab.pk, block(turn_id, 2, "assistant", "text", {"text": "Half of an answ"}), None
        )
        # checkpoint() refreshes the heartbeat, as a live worker's does.
        RunningTurn.objects.filter(pk=tab.pk).update(heartbeat_at=timezone.now() - age)
    running.refresh_from_db()
    return running


def queue(tab: Tab, *texts: str) -> list[QueuedMessage]:
    return [QueuedMessage.objects.create(tab=tab, text=text) for text in texts]


def fill_kept_state() -> dict[str, Any]:
    """A row (or more) in every table the wipe must keep."""
    admin = User.objects.create_superuser("owner", "owner@example.com", "pw-owner-123")
    user = User.objects.create_user("alice", "alice@example.com", "pw-alice-123")
    group = Group.objects.create(name="operators")
    group.permissions.add(Permission.objects.get(codename="view_chunk"))
    user.groups.add(group)
    session = SessionStore()
    session["_auth_user_id"] = str(user.pk)
    session.create()
    Setting.objects.create(key="system_prompt", value="Be brief.")
    Setting.objects.create(key="approve_shell", value={"always": False})
    api_key = ApiKey(provider="anthropic")
    api_key.set_key(SECRET_KEY_TEXT, endpoint="https://api.anthropic.com")
    api_key.save()
    ProviderEndpoint.objects.create(provider="openai", base_url="http://127.0.0.1:9/v1")
    UsageRecord.objects.create(
        user=user,
        tab_id=uuid.uuid4(),
        turn_id=uuid.uuid4(),
        step=0,
        model="old/model",
        input_tokens=1,
        output_tokens=2,
    )
    LogEntry.objects.create(
        user=admin,
        content_type=ContentType.objects.get_for_model(Setting),
        object_id="1",
        object_repr="system_prompt",
        action_flag=ADDITION,
    )
    return {"admin": admin, "user": user, "api_key": api_key}


def history_counts() -> dict[str, int]:
    return {
        "chunks": Chunk.objects.count(),
        "tabs": Tab.objects.count(),
        "running": RunningTurn.objects.count(),
        "pieces": CheckpointPiece.objects.count(),
        "queued": QueuedMessage.objects.count(),
    }
