"""Shared fixtures: a clean channel layer for every test, and the harness's servers, fake
providers and Chromium under the names the tests ask for."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from channels.layers import channel_layers, get_channel_layer
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connections
from django.test import TransactionTestCase
from xdist.scheduler import LoadGroupScheduling

from chat.providers.replay import ScriptedProvider
from chat.turn import step
from harness import chromium
from harness.fakeprovider import FakeProviderServer
from harness.servers import Servers
from tests.procs import Cluster, scaled_cluster

# --- A transactional test's flush ----------------------------------------------------
#
# After a transactional test Django empties every table, then its post_migrate handlers
# make the content types and permissions again, model by model: twenty times the cost of
# the flush itself, paid by some 800 tests. The flush here skips those handlers and puts
# back the very rows the migrated test database had (same ids), in two inserts.

_POST_MIGRATE_ROWS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database, and the rows its post_migrate handlers made."""
    with django_db_blocker.unblock():
        for alias in connections:
            _POST_MIGRATE_ROWS[alias] = (
                list(ContentType.objects.using(alias).values()),
                list(Permission.objects.using(alias).values()),
            )
    yield
    # The test database cannot be dropped while a connection to it is open (pytest-django's
    # teardown runs after this): PostgreSQL's pool keeps its idle ones, and a test's worker
    # thread (sync_to_async) may still hold one it took from the pool.
    with django_db_blocker.unblock():
        for connection in connections.all():
            if getattr(connection, "pool", None) is None:
                continue
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            connection.close()
            connection.close_pool()


def _flush_keeping_post_migrate_rows(self: TransactionTestCase) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _django_fixture_teardown(self)
        return
    for alias in self._databases_names(include_mirrors=False):
        call_command(
            "flush",
            verbosity=0,
            interactive=False,
            database=alias,
            reset_sequences=False,
            allow_cascade=False,
            inhibit_post_migrate=True,
        )
        content_types, permissions = _POST_MIGRATE_ROWS[alias]
        ContentType.objects.using(alias).bulk_create(ContentType(**row) for row in content_types)
        Permission.objects.using(alias).bulk_create(Permission(**row) for row in permissions)
    ContentType.objects.clear_cache()


_django_fixture_teardown = TransactionTestCase._fixture_teardown
TransactionTestCase._fixture_teardown = _flush_keeping_post_migrate_rows


@pytest.fixture(autouse=True)
async def _clean_channel_layer():
    """Each test starts with a new, empty channel layer: no groups, no messages.

    A new instance, not only a flush: the Redis layer binds its receive state
    to the event loop it first ran on, and each test has its own loop.
    """
    channel_layers.backends.clear()
    await get_channel_layer().flush()
    yield


@pytest.fixture
def script(monkeypatch) -> Callable[..., ScriptedProvider]:
    """Install a ScriptedProvider (each argument one step's events) as every model's
    provider, or, for the models `models` names, the provider given there; returns it."""

    def install(
        *steps: Any, delay: float = 0.0, models: dict[str, Any] | None = None
    ) -> ScriptedProvider:
        provider = ScriptedProvider(list(steps), delay=delay)
        by_model = models or {}

        async def provider_for(model: str):
            return by_model.get(model, provider)

        monkeypatch.setattr(step, "provider_for", provider_for)
        return provider

    return install


@pytest.fixture
def fake_server_factory() -> Iterator[Callable[[], FakeProviderServer]]:
    """A function starting a new fake provider server; all are stopped after the test."""
    servers: list[FakeProviderServer] = []

    def make() -> FakeProviderServer:
        server = FakeProviderServer().start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def fake_server(fake_server_factory: Callable[[], FakeProviderServer]) -> FakeProviderServer:
    """A running fake provider server."""
    return fake_server_factory()


@pytest.fixture
def serve(transactional_db, tmp_path) -> Iterator[Servers]:
    """`await serve(**env)`: a live `manage.py serve` on the test database; every one is
    stopped after the test, pass or fail, and its log is printed when the test fails.

    Stopped with SIGKILL: the test is over, so a graceful drain (interrupting what it left
    running, closing connections, a second or more per server) would serve nobody. The
    tests of stopping itself (test_serve_drain, test_sandbox) signal their servers in the
    test; a killed server's children die with it as they do in production."""
    servers = Servers(tmp_path)
    try:
        yield servers
    finally:
        for server in servers.started:
            server.kill()
        servers.stop_all()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test using `browser` runs on the session's event loop, where the worker's one
    Chromium lives (Playwright's objects belong to the loop that made them)."""
    for item in items:
        if "browser" not in getattr(item, "fixturenames", ()):
            continue
        marker = item.get_closest_marker("asyncio")
        if marker is None or marker.kwargs.get("loop_scope") != "session":
            raise pytest.UsageError(
                f'{item.nodeid} uses `browser`: mark it `pytest.mark.asyncio(loop_scope="session")`'
            )


class WorkerChromium:
    """One Chromium for all the browser tests of this worker: launching one (and
    Playwright's driver) costs seconds of CPU. Launched at first use, and again if it
    died, so one crash fails one test."""

    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self._stack = stack
        self._launched: Any = None

    async def get(self) -> Any:
        if self._launched is None or not self._launched.is_connected():
            self._launched = await self._stack.enter_async_context(chromium.browser())
        return self._launched


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def _worker_chromium() -> AsyncIterator[WorkerChromium]:
    async with contextlib.AsyncExitStack() as stack:
        yield WorkerChromium(stack)


class OneTestsBrowser:
    """The worker's Chromium as one test sees it: the contexts it opens are closed when the
    test ends, so nothing (cookies, storage, pages, sockets) outlives the test."""

    def __init__(self, launched: Any) -> None:
        self._launched = launched
        self._contexts: list[Any] = []

    async def new_context(self, **options: Any) -> Any:
        context = await self._launched.new_context(**options)
        self._contexts.append(context)
        return context

    async def close_contexts(self) -> None:
        for context in self._contexts:
            await context.close()
        self._contexts.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._launched, name)


@pytest_asyncio.fixture(loop_scope="session")
async def browser(serve, _worker_chromium) -> AsyncIterator[OneTestsBrowser]:
    """Chromium through Playwright; the test's contexts are closed before the servers stop
    (daphne would wait for their open sockets). A missing Chromium fails the test: browser
    tests never skip."""
    missing = ""
    try:
        chromium.executable()
    except chromium.ChromiumMissing as exc:
        missing = str(exc)
    if missing:  # outside the except: the message alone, no chained traceback
        pytest.fail(missing, pytrace=False)
    shared = OneTestsBrowser(await _worker_chromium.get())
    try:
        yield shared
    finally:
        await shared.close_contexts()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The scaled deployment of tests/test_scaled.py and test_scaled_events.py, started
    once for both (seconds of CPU: migrations and four processes); a test that kills a
    process has it restarted by their `live` fixture."""
    with scaled_cluster(tmp_path_factory.mktemp("scaled")) as started:
        yield started


# Test modules whose tests run on one xdist worker, by group: they share what that worker
# starts once (a session fixture). Not xdist_group marks: pytest 9 keeps a node's id
# where xdist 3.8's loadgroup cannot append the group to it, so the marks do nothing.
ONE_WORKER = {
    "tests/test_scaled.py": "scaled-cluster",
    "tests/test_scaled_events.py": "scaled-cluster",
}


class _GroupedByModule(LoadGroupScheduling):
    def _split_scope(self, nodeid: str) -> str:
        group = ONE_WORKER.get(nodeid.partition("::")[0])
        return group if group is not None else super()._split_scope(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (make test) with ONE_WORKER's groups."""
    if config.getvalue("dist") == "loadgroup":
        return _GroupedByModule(config, log)
    return None
