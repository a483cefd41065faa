"""Live streams end when the credential they were opened with stops being valid.

A page's socket (consumers) and an API client's server-sent events (api) are checked
once, when they open; they then run for hours. Each registers here with its
`Credential`: the session it was opened in (and the password hash its user had then)
or the API token, and the tab it follows. Two things end it:

- A periodic check, one per process and event loop, of every stream it serves at once:
  at most four indexed queries (sessions, users, tokens, tabs) however many streams
  are open, every `settings.STREAM_RECHECK_SECONDS`. This catches every change, made
  anywhere: the admin, a management command in another process, a raw database edit.
- A nudge, for immediacy: a signal receiver (a session deleted, a token deleted, a user
  saved or deleted, a tab deleted) sends "access.check" to the user's group
  (`bus.access_group`), where every process with a stream of that user listens; it
  runs its check at once. The nudge is a hint and carries no verdict: the check
  decides, from the database, so a lost nudge costs at most one interval.

A stream that fails the check is told why (`Ended`) and closes itself.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from chat import bus
from chat.models import ApiToken, Tab

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ended:
    """Why a stream ended: a stable code for programs and a sentence for people."""

    reason: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message}


TOKEN_REVOKED = Ended("token_revoked", "The API token this stream was opened with was revoked.")
DEACTIVATED = Ended("deactivated", "The account was deactivated or deleted.")
PASSWORD_CHANGED = Ended("password_changed", "The account's password was changed: sign in again.")
SIGNED_OUT = Ended("signed_out", "The session ended (signed out, or expired): sign in again.")
TAB_DELETED = Ended("tab_deleted", "The tab was deleted.")
TAB_NOT_YOURS = Ended("tab_not_yours", "The tab was given to another account.")


@dataclass(frozen=True)
class Credential:
    """What a stream was opened with. A session stream keeps its user's password hash
    as it was: a changed password ends the session, as Django's own check on the next
    request would (changing one's own password cycles the session key, so that session
    ends too, and its page signs in again by reloading)."""

    user_id: int
    session_key: str | None = None
    password: str | None = None
    token_id: int | None = None
    tab_id: uuid.UUID | None = None

    @classmethod
    def of_session(cls, session: Any, user: Any, tab_id: uuid.UUID | None = None) -> Credential:
        # No session: a test's stack that put a user into the scope by hand.
        key = session.session_key if session is not None else None
        return cls(user_id=user.pk, session_key=key, password=user.password, tab_id=tab_id)

    @classmethod
    def of_token(cls, token: ApiToken, tab_id: uuid.UUID | None = None) -> Credential:
        return cls(user_id=token.user_id, token_id=token.pk, tab_id=tab_id)


def _session_model() -> Any:
    # The database-backed engines (Django's default, which Dispatch uses) keep a
    # session as a row: one query answers for every stream's session.
    return import_module(settings.SESSION_ENGINE).SessionStore.get_model_class()


def check(credentials: list[Credential]) -> list[Ended | None]:
    """For each credential, why it is no longer valid, or None. Sync (the ORM); one query
    per kind of thing the credentials name, whatever their number."""
    if not credentials:
        return []
    keys = {c.session_key for c in credentials if c.session_key is not None}
    sessions: set[str] = set()
    if keys:
        rows = _session_model().objects.filter(session_key__in=keys, expire_date__gt=timezone.now())
        sessions = set(rows.values_list("session_key", flat=True))
    users = {
        pk: (active, password)
        for pk, active, password in get_user_model()
        .objects.filter(pk__in={c.user_id for c in credentials})
        .values_list("pk", "is_active", "password")
    }
    token_ids = {c.token_id for c in credentials if c.token_id is not None}
    tokens = set()
    if token_ids:
        tokens = set(ApiToken.objects.filter(pk__in=token_ids).values_list("pk", flat=True))
    tab_ids = {c.tab_id for c in credentials if c.tab_id is not None}
    tabs: dict[uuid.UUID, int | None] = {}
    if tab_ids:
        tabs = dict(Tab.objects.filter(pk__in=tab_ids).values_list("pk", "owner_id"))
    return [_why(c, sessions, users, tokens, tabs) for c in credentials]


def _why(
    credential: Credential,
    sessions: set[str],
    users: dict[int, tuple[bool, str]],
    tokens: set[int],
    tabs: dict[uuid.UUID, int | None],
) -> Ended | None:
    if credential.token_id is not None and credential.token_id not in tokens:
        return TOKEN_REVOKED
    active, password = users.get(credential.user_id, (False, ""))
    if not active:
        return DEACTIVATED
    if credential.password is not None and password != credential.password:
        return PASSWORD_CHANGED
    if credential.session_key is not None and credential.session_key not in sessions:
        return SIGNED_OUT
    if credential.tab_id is not None:
        if credential.tab_id not in tabs:
            return TAB_DELETED
        # The admin can hand a tab to another account: its stream was the old owner's.
        if tabs[credential.tab_id] != credential.user_id:
            return TAB_NOT_YOURS
    return None


OnEnd = Callable[[Ended], Awaitable[None]]


class Stream:
    """One live stream under watch: its credential and how to end it."""

    def __init__(self, credential: Credential, end: OnEnd, watch: _Watch) -> None:
        self.credential = credential
        self.end = end
        self.watch = watch


class _Watch:
    """This process's watch over its streams (per event loop and channel layer): one
    task checks them all, every interval or when a nudge arrives on its channel, which
    is in the group of each user it has a stream of."""

    def __init__(self, key: tuple[Any, ...], layer: Any) -> None:
        self.key, self.layer = key, layer
        self.streams: set[Stream] = set()
        # By user: their group joined (a task: the join may still be under way).
        self.joined: dict[int, asyncio.Task[None]] = {}
        self.nudged = asyncio.Event()
        self.channel = ""
        self.ready = asyncio.ensure_future(self._open())
        self.tasks: list[asyncio.Task[None]] = []

    async def _open(self) -> None:
        self.channel = await self.layer.new_channel()
        self.tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._run())]

    async def _listen(self) -> None:
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except Exception:
                # Redis away: the periodic check goes on; nudges come back with Redis.
                logger.warning("live streams: no nudges for now", exc_info=True)
                await asyncio.sleep(settings.STREAM_RECHECK_SECONDS)
                continue
            if message.get("type") == "access.check":
                self.nudged.set()

    async def _run(self) -> None:
        while True:
            # Read each time: tests shorten it, and a change applies at the next wait.
            with suppress(TimeoutError):
                await asyncio.wait_for(self.nudged.wait(), settings.STREAM_RECHECK_SECONDS)
            self.nudged.clear()
            await self.check()

    async def check(self) -> None:
        streams = list(self.streams)
        if not streams:
            return
        try:
            verdicts = await database_sync_to_async(check)([s.credential for s in streams])
        except Exception:
            # The database is unreachable: the streams' own reads fail too. The task
            # must live on to check again, not die and leave every stream unchecked.
            logger.exception("could not check the credentials of %d live streams", len(streams))
            return
        for stream, ended in zip(streams, verdicts, strict=True):
            if ended is None or stream not in self.streams:
                continue
            self.streams.discard(stream)
            try:
                await stream.end(ended)
            except Exception:
                logger.exception("could not end a live stream (%s)", ended.reason)

    async def join(self, user_id: int) -> None:
        joining = self.joined.get(user_id)
        if joining is None:
            joining = self.joined[user_id] = asyncio.create_task(self._join(user_id))
        await asyncio.shield(joining)

    async def _join(self, user_id: int) -> None:
        await asyncio.shield(self.ready)
        await self.layer.group_add(bus.access_group(user_id), self.channel)

    async def leave(self, user_id: int) -> None:
        if any(s.credential.user_id == user_id for s in self.streams):
            return
        joining = self.joined.pop(user_id, None)
        if joining is None:
            return
        with suppress(Exception):
            await joining
            await self.layer.group_discard(bus.access_group(user_id), self.channel)

    async def stop(self) -> None:
        await asyncio.wait([self.ready])
        for task in self.tasks:
            task.cancel()
        for user_id in list(self.joined):
            await self.leave(user_id)


# By event loop and channel layer: a test's loop or layer never serves another's.
_watches: dict[tuple[Any, ...], _Watch] = {}


async def watch(credential: Credential, end: OnEnd) -> Stream:
    """Put a stream under watch: `end` is awaited once, with why, when its credential
    stops being valid. Returns once nudges for its user reach this process."""
    # Every access group's: nudges are all this process's watch listens to.
    layer = bus.layer_for(bus.access_group(credential.user_id))
    key = (asyncio.get_running_loop(), layer)
    current = _watches.get(key)
    if current is None:
        current = _watches[key] = _Watch(key, layer)
    stream = Stream(credential, end, current)
    current.streams.add(stream)
    try:
        await current.join(credential.user_id)
    except BaseException:
        await unwatch(stream)
        raise
    return stream


async def unwatch(stream: Stream) -> None:
    current = stream.watch
    current.streams.discard(stream)
    if not current.streams and _watches.get(current.key) is current:
        del _watches[current.key]
        await current.stop()
        return
    await current.leave(stream.credential.user_id)


@asynccontextmanager
async def watching(credential: Credential) -> AsyncIterator[asyncio.Future[Ended]]:
    """A future that resolves, with why, when `credential` stops being valid."""
    ended: asyncio.Future[Ended] = asyncio.get_running_loop().create_future()

    async def end(why: Ended) -> None:
        if not ended.done():
            ended.set_result(why)

    stream = await watch(credential, end)
    try:
        yield ended
    finally:
        await unwatch(stream)


# --- Nudges ---------------------------------------------------------------------------------


def nudge(user_id: int | None) -> None:
    """Ask every process with a stream of this user to check now, once the change is
    committed (the check must see it). Sync: for signal receivers."""
    if user_id is None:
        return
    transaction.on_commit(lambda: _send_nudge(user_id))


def _send_nudge(user_id: int) -> None:
    try:
        bus.group_send(bus.access_group(user_id), {"type": "access.check"})
    except Exception:
        # Redis away or a channel full: the periodic check still ends the stream. A
        # sign-out or a revocation must not fail because a hint could not be sent.
        logger.warning("could not nudge user %s's live streams", user_id, exc_info=True)


def _on_session_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    # Not user_logged_out: Django sends that before it deletes the session, and a check
    # the nudge starts in another process at once still finds the session valid. This
    # also covers a session deleted in the admin or by clearsessions.
    user_id = instance.get_decoded().get(SESSION_KEY)
    if user_id is not None:
        nudge(get_user_model()._meta.pk.to_python(user_id))


def _on_user_saved(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    # Every sign-in saves last_login alone: no credential changes with it.
    if update_fields is not None and set(update_fields) <= {"last_login"}:
        return
    nudge(instance.pk)


def _on_token_deleted(sender: Any, instance: ApiToken, **kwargs: Any) -> None:
    nudge(instance.user_id)


def _on_tab_deleted(sender: Any, instance: Tab, **kwargs: Any) -> None:
    nudge(instance.owner_id)


def _on_user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    nudge(instance.pk)


def connect_signals() -> None:
    user = get_user_model()
    post_delete.connect(
        _on_session_deleted, sender=_session_model(), dispatch_uid="revocation.session"
    )
    post_save.connect(_on_user_saved, sender=user, dispatch_uid="revocation.user_saved")
    post_delete.connect(_on_user_deleted, sender=user, dispatch_uid="revocation.user_deleted")
    post_delete.connect(_on_token_deleted, sender=ApiToken, dispatch_uid="revocation.token")
    post_delete.connect(_on_tab_deleted, sender=Tab, dispatch_uid="revocation.tab")
