"""Tabs, the chunk log, the running-turn row, and the kept state.

Chat history (wiped by `wipe_history`): Tab, Chunk, RunningTurn, QueuedMessage,
Attachment and Blob (with the blobs' files).
Kept state (survives the wipe): Setting, ApiKey, ProviderEndpoint, UsageRecord, ApiToken,
Profile, PermissionRule, McpServer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import models

from chat import chunks

# What a tab without a title is called (until its first message names it).
UNTITLED = "New tab"


class Tab(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    # Frozen when the tab is created: a changing system prompt would change
    # the prefix of every request and lose every prompt-cache hit.
    system_prompt = models.TextField(blank=True)
    # The last seq handed out; the tab row is the lock for allocating the next.
    last_seq = models.BigIntegerField(default=0)
    # A branch: the tab it was copied from, and the last seq it copied. The
    # copy is the branch's own (deleting the parent leaves it whole).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="branches"
    )
    fork_seq = models.BigIntegerField(null=True, blank=True)
    # The conversation the tab is a version of: the sidebar shows one entry per
    # conversation. A root's is its own id (`save`); Edit, Regenerate and Retry keep the
    # parent's (a plain Branch starts a new one). Stored, not followed through `parent`,
    # so a deleted tab in the middle does not split a conversation.
    conversation = models.UUIDField()
    # Where the tab's log came from, oldest first: [[tab id, seq], ...], each entry the
    # tab whose chunks 1..seq a version copied (chat.render.versions). The same version
    # point (tab, seq) groups siblings for the page's "‹ 2 / 3 ›", whatever was deleted
    # since. [] for a conversation's root.
    lineage = models.JSONField(default=list, blank=True)
    # Text waiting in the composer: the old message of an edit, until it is sent.
    draft = models.TextField(blank=True)
    # How full the model's context window is: the provider's usage of the tab's last
    # request (chat.context.Size.as_dict), or an estimate after a compaction.
    context = models.JSONField(default=dict, blank=True)
    # The profile the tab was made with (its prompt, model, tools and rules are the
    # tab's own copy from then on: editing the profile changes no existing tab).
    profile = models.ForeignKey(
        "Profile", null=True, blank=True, on_delete=models.SET_NULL, related_name="tabs"
    )
    # The model chose `profile` (a sub-agent's, chat.turn.agents), not a person: its allow
    # rules never applied here, so nothing may make a tab with it as if a person had
    # (chat.tools.wake). Kept by branches, which outlive the sub-agent they came from.
    profile_by_model = models.BooleanField(default=False)
    # The tool set every request of the tab sends, frozen (sorted, sorted-key schemas):
    # [{name, description, input_schema, server?, tool?}]; None until its first turn.
    # Changed only at a turn boundary, with a config-reload chunk (a new list is a
    # cache miss of the whole conversation).
    tools = models.JSONField(null=True, blank=True)
    # Tool names (patterns) the tab may use, from its profile; empty: every tool.
    tool_allow = models.JSONField(default=list, blank=True)
    # The tab's own permission rules, [{action, pattern}] (chat.rules): its profile's,
    # copied at creation, and each "always allow" said on one of its approval cards. A
    # sub-agent's inherited ones also say their `source` (chat.turn.agents.inherited_rules).
    rules = models.JSONField(default=list, blank=True)
    # A subfolder of the workspace the tab's tools work in ("": the workspace itself),
    # so that parallel tabs do not trample each other.
    workdir = models.CharField(max_length=200, blank=True)
    # A sub-agent's tab: the tab whose `agent` tool call made it, and that call's id.
    # Its id is agent_child_id (below), so a parent that recovers after a crash finds the
    # child it made instead of spawning a second.
    parent_tab = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    parent_call_id = models.CharField(max_length=200, blank=True)
    # The external agent's ACP session of the tab ({agent, session_id}; chat.turn.acp):
    # after a restart, `session/load` restores the agent's context from it. Not copied to
    # a branch: the agent's session holds the whole tab, not the branch's prefix.
    acp_session = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [
            # The sidebar reads a conversation's tabs of one owner at every change of a
            # turn's state: with an index on either column alone, SQLite's planner took
            # the owner's (every tab the user has) for those reads.
            models.Index(fields=["conversation", "owner"], name="chat_tab_conversation_owner"),
        ]

    def __str__(self) -> str:
        return self.title or UNTITLED

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.conversation is None:
            self.conversation = self.id
        super().save(*args, **kwargs)


def _choices(values: Iterable[str]) -> list[tuple[str, str]]:
    """A field's choices for chat.chunks' constants, labelled as TextChoices labels them."""
    return [(value, value.replace("_", " ").title()) for value in values]


class Chunk(models.Model):
    """One sealed block of a tab's log. Rows are never updated: only chat.log writes them."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tab = models.ForeignKey(Tab, on_delete=models.CASCADE, related_name="chunks")
    seq = models.BigIntegerField()
    turn_id = models.UUIDField(null=True, blank=True, db_index=True)
    step = models.PositiveIntegerField(default=0)
    role = models.CharField(max_length=16, choices=_choices(chunks.Role.ALL))
    type = models.CharField(max_length=16, choices=_choices(chunks.Kind.ALL))
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tab", "seq"]
        constraints = [
            # Also the (tab, seq) index every page and tail query walks.
            models.UniqueConstraint(fields=["tab", "seq"], name="chunk_tab_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tab_id}#{self.seq} {self.role}/{self.type}"


class RunningTurn(models.Model):
    """One row per running turn: the tab's lease, and the checkpoint of its open block.

    The primary key on tab makes "one turn per tab" a database fact. The worker
    holding the lease refreshes `heartbeat_at`; a row whose heartbeat is stale
    belongs to a dead worker and is recovered (see chat.turns).
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        WAITING = "waiting", "waiting for approval"
        # The turn's end is in the log and its idle status sent; the lease goes
        # next (or, with a message queued, on to the next turn). Its log is final:
        # it may be branched and continued.
        FINISHING = "finishing"

    tab = models.OneToOneField(Tab, on_delete=models.CASCADE, primary_key=True)
    turn_id = models.UUIDField()
    worker = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    step = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    # The open block as last checkpointed, without its streamed body:
    # {id, role, type, step, data}. Its body is in CheckpointPiece rows;
    # chat.log.checkpointed() puts the two together.
    open_header = models.JSONField(null=True, blank=True)
    checkpointed_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    # Why, when not the user's own Stop (a sub-agent's parent stopped it): the heartbeat
    # may find the request before the control message that carries the same words.
    cancel_why = models.CharField(max_length=200, blank=True, default="")

    def __str__(self) -> str:
        return f"turn {self.turn_id} on {self.tab_id} ({self.status})"


class CheckpointPiece(models.Model):
    """Text the open block's body gained between two checkpoints.

    A checkpoint inserts only what streamed since the previous one, so what it
    writes does not grow with the block: rewriting the whole body each time
    cost quadratic bytes over a long answer. Only the open block's pieces are
    kept; they go with the checkpoint (chat.log).
    """

    running = models.ForeignKey(RunningTurn, on_delete=models.CASCADE, related_name="pieces")
    chunk_id = models.UUIDField()
    # Code points of the body before this text.
    offset = models.PositiveIntegerField()
    text = models.TextField()

    def __str__(self) -> str:
        return f"piece of {self.chunk_id} at {self.offset}"


class QueuedMessage(models.Model):
    """A user message sent while a turn runs, kept until the log takes it.

    A `rerun` row carries no message: it asks for a turn that answers the log as
    it stands (a regenerated or retried branch). A `compact` row asks for a
    compaction (its text: what the summary should focus on) through
    `compact_through` (None: the whole log). Both go through this table so that
    the request survives a restart exactly as a message does.
    """

    tab = models.ForeignKey(Tab, on_delete=models.CASCADE, related_name="queued")
    text = models.TextField(blank=True)
    rerun = models.BooleanField(default=False)
    compact = models.BooleanField(default=False)
    compact_through = models.BigIntegerField(null=True, blank=True)
    # The message's files: the references its user chunk will hold (chat.blobs.reference).
    attachments = models.JSONField(default=list, blank=True)
    # Who sent it when not the user at the composer: {kind: wake, wake_id,
    # scheduled_for} or {kind: agent, parent_tab, call_id}; its user chunk keeps it.
    origin = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"queued #{self.pk} for {self.tab_id}"

    def chunk_data(self) -> dict[str, Any]:
        """Its user chunk's data: the text, its files and who sent it (a wake, a parent
        agent) when it has them."""
        data = chunks.UserText(text=self.text)
        if self.attachments:
            data["attachments"] = self.attachments
        if self.origin:
            data["origin"] = self.origin
        return chunks.untyped(data)

    @property
    def label(self) -> str:
        """What the queue on the page shows: the message, or the compaction asked for."""
        if not self.compact:
            return self.text
        where = f"through chunk {self.compact_through}" if self.compact_through else "everything"
        focus = f"; focus: {self.text}" if self.text else ""
        return f"Compact the conversation ({where}{focus}) when the turn ends"


class Blob(models.Model):
    """The bytes of an attachment, stored once by their SHA-256 under the data directory
    (chat.blobs). Only what a message says of the file besides its name."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    mime = models.CharField(max_length=100)
    size = models.PositiveBigIntegerField()
    width = models.PositiveIntegerField(null=True, blank=True)
    height = models.PositiveIntegerField(null=True, blank=True)
    pages = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.sha256[:12]} {self.mime} {self.size} B"


class Attachment(models.Model):
    """A tab's use of a blob: uploaded to its composer (`sent` False until a message
    carries it), sent in one of its messages, read by one of its tools, or copied with a
    branch. The owner check of a blob, and its reference count: a blob no row uses is
    garbage (chat.blobs.collect)."""

    tab = models.ForeignKey(Tab, on_delete=models.CASCADE, related_name="attachments")
    # PROTECT: blobs go only through chat.blobs.collect, which removes their files too.
    blob = models.ForeignKey(Blob, on_delete=models.PROTECT, related_name="attachments")
    name = models.CharField(max_length=255)
    sent = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.blob_id[:12]}) in {self.tab_id}"


# --- Kept state ----------------------------------------------------------------


class Profile(models.Model):
    """A named agent setup, chosen when a tab is created and copied into it: system
    prompt, model, the tools it may use (name patterns; empty: all) and its
    permission rules (PermissionRule rows)."""

    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    model = models.CharField(max_length=200, blank=True)
    tools = models.JSONField(default=list, blank=True)
    # Its tabs may start sub-agents of their own when they are sub-agents themselves
    # (by default a child has no `agent` tool: no nesting).
    allow_nesting = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class PermissionRule(models.Model):
    """One rule deciding a tool call without asking (chat.rules): `allow`, `ask` or
    `deny` calls matching `pattern` (`shell(git status)`, `write_file(src/**)`,
    `mcp__github__*`). A user's (Settings) or a profile's: exactly one. A tab's own
    rules are its `rules` (history: they go with the tab)."""

    class Action(models.TextChoices):
        ALLOW = "allow"
        ASK = "ask"
        DENY = "deny"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="permission_rules",
    )
    profile = models.ForeignKey(
        Profile, null=True, blank=True, on_delete=models.CASCADE, related_name="rules"
    )
    action = models.CharField(max_length=8, choices=Action.choices)
    pattern = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                name="permissionrule_one_owner",
                condition=(
                    models.Q(user__isnull=False, profile__isnull=True)
                    | models.Q(user__isnull=True, profile__isnull=False)
                ),
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.pattern}"


class EncryptedEnv(models.Model):
    """A program's environment variables, encrypted at rest like API keys."""

    env_encrypted = models.TextField(blank=True)

    class Meta:
        abstract = True

    def get_env(self) -> dict[str, str] | None:
        """The variables (None when SECRET_KEY changed since they were saved)."""
        return _decrypt_json(self.env_encrypted)

    def set_env(self, env: dict[str, str]) -> None:
        self.env_encrypted = _encrypt_json(env)


class AcpAgent(EncryptedEnv):
    """An external agent configured on Settings (chat.acp): `acp/<name>` in the model
    picker. Its command is a program run on this machine (in the sandbox), so only
    superusers change it; its variables are encrypted at rest like API keys. An agent of
    the same name in DISPATCH_ACP_AGENTS wins (the operator's deployment)."""

    class Credentials(models.TextChoices):
        NONE = "", "none (it brings its own)"
        ANTHROPIC = "anthropic", "Anthropic's key and endpoint (Claude Code)"
        OPENAI = "openai", "OpenAI's key and endpoint (Codex)"

    # The model id's second half: acp/<name>.
    name = models.SlugField(max_length=40, unique=True)
    # The program and its arguments (argv), the first found on PATH when not absolute.
    command = models.JSONField(default=list)
    # Whose key and base URL Dispatch hands it.
    provider = models.CharField(max_length=16, blank=True, choices=Credentials.choices)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class McpServer(EncryptedEnv):
    """An MCP server whose tools tabs may use (chat.mcp). Staff only: a stdio server
    is a program run on this machine (inside the shell's sandbox, with a home of its own
    and no workspace unless `mount_workspace`). Secrets in `env` and `headers` are
    encrypted at rest like API keys."""

    class Transport(models.TextChoices):
        STDIO = "stdio"
        HTTP = "http", "streamable HTTP"

    # Part of every tool's name (mcp__<name>__<tool>): letters, digits, _ and -.
    name = models.SlugField(max_length=40, unique=True)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    command = models.CharField(max_length=500, blank=True)
    args = models.JSONField(default=list, blank=True)
    url = models.URLField(max_length=500, blank=True)
    headers_encrypted = models.TextField(blank=True)
    # Seconds a call (and the connection) may take before it is given up.
    timeout = models.FloatField(default=60.0)
    enabled = models.BooleanField(default=True)
    # stdio: the tab owner's workspace is mounted (writable, at chat.tools.mcp's
    # MCP_WORKSPACE), so the server runs once per user; off, it sees no workspace at all.
    mount_workspace = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_headers(self) -> dict[str, str] | None:
        return _decrypt_json(self.headers_encrypted)

    def set_headers(self, headers: dict[str, str]) -> None:
        self.headers_encrypted = _encrypt_json(headers)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        server_id = self.pk
        deleted = super().delete(*args, **kwargs)
        # Its homes hold what it kept (tokens, caches); a server added later may get its
        # id (SQLite reuses the highest) and must not find them.
        shutil.rmtree(self.homes(server_id), ignore_errors=True)
        return deleted

    @staticmethod
    def homes(server_id: int) -> Path:
        """Where the stdio processes of the server with this id have their $HOME
        (chat.tools.mcp.home_of): outside every workspace, closed to other users."""
        return Path(settings.DATA_DIR) / "mcp" / str(server_id)


def _encrypt_json(value: dict[str, str]) -> str:
    return _fernet().encrypt(json.dumps(value, sort_keys=True).encode()).decode() if value else ""


def _decrypt_json(token: str) -> dict[str, str] | None:
    if not token:
        return {}
    try:
        return json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken:
        return None


class Wake(models.Model):
    """A scheduled prompt (ARCHITECTURE.md, Wakes): at each due time its prompt is submitted to
    `tab` (or to a new tab each time) as if its owner sent it. Kept state:
    `wipe_history` keeps it. `next_run_at` (UTC) is the claim: a worker fires a time
    by moving it on in the same transaction that inserts that time's WakeRun (chat.wakes)."""

    class Kind(models.TextChoices):
        CRON = "cron"
        INTERVAL = "interval"
        ONCE = "once"

    class Overlap(models.TextChoices):
        QUEUE = "queue"  # behind the tab's running turn, as a message sent meanwhile
        SKIP = "skip"  # recorded as skipped, with the reason

    class CatchUp(models.TextChoices):
        SKIP = "skip"  # slots missed while no worker ran are recorded as skipped
        LATEST = "latest"  # the latest missed slot runs once, the others are skipped

    class Approval(models.TextChoices):
        WAIT = "wait"  # a call that needs approval parks the turn as waiting
        DENY = "deny"  # it is answered "not approved" and the turn goes on

    class Creator(models.TextChoices):
        USER = "user"
        AGENT = "agent"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="wakes"
    )
    name = models.CharField(max_length=200, blank=True)
    tab = models.ForeignKey(
        Tab, null=True, blank=True, on_delete=models.SET_NULL, related_name="wakes"
    )
    # Each firing starts a new tab (then `tab` is None). A wake with neither lost its
    # tab (deleted): it fails its runs with that reason, it does not start new tabs.
    new_tab = models.BooleanField(default=False)
    prompt = models.TextField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    cron = models.CharField(max_length=200, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    once_at = models.DateTimeField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    overlap = models.CharField(max_length=8, choices=Overlap.choices, default=Overlap.QUEUE)
    catch_up = models.CharField(max_length=8, choices=CatchUp.choices, default=CatchUp.LATEST)
    profile = models.ForeignKey(
        Profile, null=True, blank=True, on_delete=models.SET_NULL, related_name="wakes"
    )
    model = models.CharField(max_length=200, blank=True)
    approval = models.CharField(max_length=8, choices=Approval.choices, default=Approval.WAIT)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=8, choices=Creator.choices, default=Creator.USER)
    # The next due time in UTC; None when it will not fire again (disabled, expired, done).
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.name or f"wake {self.pk}"


class WakeRun(models.Model):
    """One scheduled time of a wake: inserted with the claim (unique on wake and time:
    exactly one firing), then completed. A `pending` run is one a crash interrupted
    between claim and submit; recovery completes it."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SUBMITTED = "submitted"
        SKIPPED = "skipped"
        FAILED = "failed"

    wake = models.ForeignKey(Wake, on_delete=models.CASCADE, related_name="runs")
    scheduled_for = models.DateTimeField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    reason = models.TextField(blank=True)
    tab = models.ForeignKey(
        Tab, null=True, blank=True, on_delete=models.SET_NULL, related_name="wake_runs"
    )
    queued_id = models.BigIntegerField(null=True, blank=True)
    # Firings started (the claim's, then each recovery's take): past
    # chat.wakes.MAX_FIRE_ATTEMPTS the run fails with the last error as its reason.
    attempts = models.PositiveSmallIntegerField(default=0)
    # When it was claimed or last taken by a recovery: a pending run this old is stale.
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-scheduled_for"]
        constraints = [
            models.UniqueConstraint(fields=["wake", "scheduled_for"], name="wakerun_once")
        ]

    def __str__(self) -> str:
        return f"{self.wake} at {self.scheduled_for:%Y-%m-%d %H:%M}"


class Setting(models.Model):
    key = models.CharField(max_length=100, unique=True)
    value = models.JSONField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.key


def get_setting(key: str, default: Any) -> Any:
    value = Setting.objects.filter(key=key).values_list("value", flat=True).first()
    return default if value is None else value


def set_setting(key: str, value: Any) -> None:
    Setting.objects.update_or_create(key=key, defaults={"value": value})


def _fernet() -> Fernet:
    digest = hashlib.sha256(b"dispatch-api-keys:" + settings.SECRET_KEY.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


class ApiKey(models.Model):
    """A provider API key, encrypted at rest with a key derived from SECRET_KEY.

    `endpoint` is where it was saved to be sent (the registry's `key_endpoint` of the
    URL then in effect): the registry sends it nowhere else, so whoever changes an
    endpoint without knowing the key cannot have it sent to a host of their choosing.
    """

    provider = models.CharField(max_length=50, unique=True)
    encrypted = models.TextField()
    # Enough to recognise the key on a page without showing it.
    last4 = models.CharField(max_length=4)
    endpoint = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.provider} key {self.masked}"

    @property
    def masked(self) -> str:
        return f"…{self.last4}"

    def set_key(self, key: str, *, endpoint: str) -> None:
        """Store `key`, bound to `endpoint` (the registry's `endpoint_now`)."""
        self.encrypted = _fernet().encrypt(key.encode()).decode()
        self.last4 = key[-4:]
        self.endpoint = endpoint

    def get_key(self) -> str | None:
        """The key, or None when SECRET_KEY changed since it was stored."""
        try:
            return _fernet().decrypt(self.encrypted.encode()).decode()
        except InvalidToken:
            return None


class ProviderEndpoint(models.Model):
    class ApiStyle(models.TextChoices):
        # Which API an OpenAI-adapter provider speaks there (registry.api_style; the
        # values are envcheck.API_STYLES, which models may not import).
        AUTO = "", "Automatic (Responses at api.openai.com, else Chat Completions)"
        RESPONSES = "responses", "Responses API"
        CHAT = "chat", "Chat Completions"

    provider = models.CharField(max_length=50, unique=True)
    base_url = models.URLField(max_length=500)
    api_style = models.CharField(
        max_length=16, choices=ApiStyle.choices, default=ApiStyle.AUTO, blank=True
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.provider}: {self.base_url}"


class UsageRecord(models.Model):
    """Tokens of one request. Plain ids, no foreign keys: usage outlives the history wipe."""

    class Kind(models.TextChoices):
        STEP = "step"
        # The request that wrote a compaction's summary (chat.context).
        SUMMARY = "summary"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    tab_id = models.UUIDField(db_index=True)
    turn_id = models.UUIDField(db_index=True)
    step = models.PositiveIntegerField()
    model = models.CharField(max_length=200)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    # Of output_tokens, those spent reasoning (OpenAI's Responses API says), shown apart.
    reasoning_tokens = models.PositiveIntegerField(default=0)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.STEP)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.model} step {self.step}: {self.input_tokens}/{self.output_tokens}"


# What a token starts with: recognisable in a leaked log or a secret scanner.
API_TOKEN_MARK = "dsp_"
# The part of a token kept in clear to tell tokens apart on a page: the mark and
# 8 random characters (48 bits), not enough to guess the remaining 256.
API_TOKEN_PREFIX_CHARS = len(API_TOKEN_MARK) + 8


class ApiToken(models.Model):
    """A personal API token, sent as `Authorization: Bearer <token>`.

    Only a SHA-256 of the token is stored: the token is 32 random bytes, so a
    slow password hash would add nothing but a cost on every request. The
    plain token exists once, when it is issued. Revoking deletes the row.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=API_TOKEN_PREFIX_CHARS)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    # A read-only token may read tabs and chunks; it cannot create, send, stop or approve.
    read_only = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name or 'token'} ({self.prefix}…)"

    @staticmethod
    def hash(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    @classmethod
    def issue(cls, user: Any, *, name: str = "", read_only: bool = False) -> tuple[ApiToken, str]:
        """A new token for `user`: the row, and the plain token to show once."""
        token = API_TOKEN_MARK + secrets.token_urlsafe(32)
        row = cls.objects.create(
            user=user,
            name=name,
            prefix=token[:API_TOKEN_PREFIX_CHARS],
            token_hash=cls.hash(token),
            read_only=read_only,
        )
        return row, token


def agent_child_id(parent_id: uuid.UUID | str, call_id: str, call_seq: int) -> uuid.UUID:
    """The id of the child tab the `agent` call at `call_seq` in the parent's log makes:
    the same on every try (a resumed turn finds it), and another for each call even where
    a provider repeats call ids (the OpenAI adapter names id-less calls `call_{index}`, so
    every step can have a `call_0`)."""
    return uuid.uuid5(uuid.UUID(str(parent_id)), f"{call_id}@{call_seq}")


def _legacy_agent_child_id(parent_id: uuid.UUID | str, call_id: str) -> uuid.UUID:
    # Before calls were keyed on their seq: uuid5(parent, call id).
    return uuid.uuid5(uuid.UUID(str(parent_id)), call_id)


def agent_children(
    parent_id: uuid.UUID | str, calls: list[tuple[str, int]]
) -> dict[tuple[str, int], uuid.UUID]:
    """The child tab each of these `agent` calls (call id, seq of its chunk) of the parent
    made, for those that made one. A child made before calls were keyed on their seq has
    the id uuid5(parent, call id), and was made by the first `agent` call of that id in
    the parent's log (later calls of the same id were wrongly given it): only that call
    finds it, so a tab that crossed the upgrade keeps its children's results and usage."""
    made = {agent_child_id(parent_id, call_id, seq): (call_id, seq) for call_id, seq in calls}
    legacy = {_legacy_agent_child_id(parent_id, call_id): call_id for call_id, _ in calls}
    found = set(Tab.objects.filter(pk__in=[*made, *legacy]).values_list("pk", flat=True))
    children = {made[pk]: pk for pk in found if pk in made}
    old = {legacy[pk]: pk for pk in found if pk in legacy}
    if old:
        first: dict[str, int] = {}
        rows = Chunk.objects.filter(
            tab_id=parent_id,
            type=chunks.Kind.TOOL_CALL,
            data__name="agent",
            data__call_id__in=list(old),
        ).values_list("data__call_id", "seq")
        for call_id, seq in rows:
            first[call_id] = min(seq, first.get(call_id, seq))
        for call_id, seq in calls:
            if call_id in old and (call_id, seq) not in children and first.get(call_id) == seq:
                children[call_id, seq] = old[call_id]
    return children
