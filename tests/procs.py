"""Process helpers for the scaled-mode tests (tests/test_scaled.py).

- The services (harness.services): skip, or fail under CI, when PostgreSQL or Redis
  is not reachable.
- `Cluster`: web (`manage.py serve`) and worker (`manage.py runworker`)
  processes on one database and one Redis, started from the Procfile's
  commands by the harness's launcher, plus the HTTP calls a browser makes.
- `Page` / `PageSocket`: a browser tab's view of the log, rebuilt from the
  socket's htmx frames the way static/chat/app.js and htmx apply them, which
  says what it holds on every (re)connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import secrets
import subprocess
import sys
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chat import log
from harness.login import cookie_header
from harness.servers import ROOT, Proc, clean_env, procfile_argv, stop_all
from harness.services import CHANNEL_LAYER_PREFIX as CHANNEL_LAYER_PREFIX
from harness.services import scratch_database, scratch_redis, unreachable_services

# Set (CI does) to fail instead of skip when a service is not reachable.
REQUIRE_SERVICES = os.environ.get("DISPATCH_REQUIRE_SERVICES", "").strip() not in ("", "0")

# Django start-up plus migrations on two busy cores take a few seconds; past this
# a command is stuck, and its output says why.
STARTUP_TIMEOUT = 40.0
# One HTTP request to a local web process.
HTTP_TIMEOUT = 15.0
# Frames arrive within this while anything happens on the tab.
FRAME_TIMEOUT = 15.0


# --- Services -----------------------------------------------------------------------


def require_services() -> None:
    """Skip (or, with DISPATCH_REQUIRE_SERVICES=1, fail) unless both services answer."""
    missing = unreachable_services()
    if not missing:
        return
    why = "; ".join(missing) + (
        ". Scaled-mode tests need both (set DISPATCH_TEST_POSTGRES_URL / "
        "DISPATCH_TEST_REDIS_URL to point elsewhere)."
    )
    if REQUIRE_SERVICES:
        pytest.fail(why + " DISPATCH_REQUIRE_SERVICES is set, so this is a failure.")
    pytest.skip(why)


# --- Processes ------------------------------------------------------------------------


@dataclass
class Cluster:
    """Web and worker processes of one scaled deployment, on 127.0.0.1."""

    database_url: str
    redis_url: str
    workdir: Path
    pace: float
    procs: dict[str, Proc] = field(default_factory=dict)
    # Every process ever started, so the last stop misses none (restarts included).
    started: list[Proc] = field(default_factory=list)
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(40))
    session_key: str = ""
    csrf: str = field(default_factory=lambda: secrets.token_hex(16))

    def __post_init__(self) -> None:
        (self.workdir / "workspace").mkdir(parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        self.env = clean_env(
            DJANGO_SETTINGS_MODULE="dispatch.settings",
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            # One key for all processes: sessions and stored API keys depend on it.
            SECRET_KEY=self.secret_key,
            DISPATCH_DATA_DIR=str(self.workdir / "data"),
            DISPATCH_WORKSPACE=str(self.workdir / "workspace"),
            DISPATCH_MODEL="offline/demo",
            DISPATCH_OFFLINE_PACE=str(self.pace),
            ALLOWED_HOSTS="127.0.0.1,localhost",
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )

    # Processes ----------------------------------------------------------------------

    def manage(self, *args: str, timeout: float = STARTUP_TIMEOUT, **env: str) -> str:
        """Run a management command to its end; its stdout. `env` overrides variables."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def shell_together(self, scripts: list[str], timeout: float = STARTUP_TIMEOUT) -> list[str]:
        """Run each script in its own `manage.py shell` process, all at once; their stdouts."""
        procs = [
            self._proc(f"shell{i}", [sys.executable, "manage.py", "shell", "-c", code])
            for i, code in enumerate(scripts)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            code = proc.reap(timeout)
            assert code == 0, f"{proc.name} exited {code}:\n{proc.log()[-3000:]}"
        return [proc.log() for proc in procs]

    def _proc(self, name: str, argv: list[str]) -> Proc:
        proc = Proc(name, argv, self.env, self.workdir / f"{name}-{len(self.started)}.log")
        self.started.append(proc)
        return proc

    def _spawn(self, name: str, kind: str) -> Proc:
        proc = self._proc(name, procfile_argv(kind)).start()
        self.procs[name] = proc
        return proc

    def start_web(self, name: str) -> Proc:
        return self._spawn(name, "web")

    def start_worker(self, name: str) -> Proc:
        return self._spawn(name, "worker")

    def wait_ready(self) -> None:
        for proc in self.procs.values():
            if "runworker" in proc.argv:
                proc.wait_for(r"Turn worker started")
            elif not proc.port:
                proc.listening()

    def ensure_running(self) -> None:
        """Restart whatever an earlier test killed or stopped (a web process on a new port)."""
        for name, proc in list(self.procs.items()):
            if not proc.alive:
                kind = "worker" if "runworker" in proc.argv else "web"
                self._spawn(name, kind)
        self.wait_ready()

    def stop(self) -> None:
        """Stop every process this cluster ever started, each by its PID."""
        stop_all(self.started)

    def outputs(self, tail: int = 3000) -> str:
        """The end of every process's output, for a failure report."""
        return "\n".join(
            f"--- {p.name} (pid {p.pid}, {'running' if p.alive else f'exit {p.proc.returncode}'})"
            f" ---\n{p.log()[-tail:]}"
            for p in self.started
            if p.proc is not None
        )

    def workers(self) -> dict[str, Proc]:
        return {n: p for n, p in self.procs.items() if "runworker" in p.argv}

    def worker_by_id(self, worker_id: str) -> str:
        """The name of the worker whose id (host:pid:channel) this is."""
        pid = int(worker_id.split(":")[1])
        names = [n for n, p in self.workers().items() if p.pid == pid]
        assert names, f"{worker_id} is not one of the worker processes {self.workers()}"
        return names[0]

    # The database, read directly --------------------------------------------------------

    def sql(self, query: str, *params: Any) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def log(self, tab_id: str) -> list[dict[str, Any]]:
        rows = self.sql(
            "SELECT id, seq, turn_id, step, role, type, data FROM chat_chunk"
            " WHERE tab_id = %s ORDER BY seq",
            tab_id,
        )
        keys = ("id", "seq", "turn_id", "step", "role", "type", "data")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def running(self, tab_id: str) -> dict[str, Any] | None:
        """The tab's lease: its turn, worker and open block as last checkpointed (a dict)."""
        rows = self.sql(
            'SELECT r.turn_id, r.worker, r.open_header, p.chunk_id, p."offset", p.text'
            " FROM chat_runningturn r LEFT JOIN chat_checkpointpiece p ON p.running_id = r.tab_id"
            ' WHERE r.tab_id = %s ORDER BY p."offset"',
            tab_id,
        )
        if not rows:
            return None
        block = log.open_block(row[2:] for row in rows if row[2] is not None)
        return {
            "turn_id": rows[0][0],
            "worker": rows[0][1],
            "open_chunk": block.to_dict() if block is not None else None,
        }

    def queued(self, tab_id: str) -> list[str]:
        return [
            r[0]
            for r in self.sql(
                "SELECT text FROM chat_queuedmessage WHERE tab_id = %s ORDER BY id", tab_id
            )
        ]

    # A browser's HTTP calls ----------------------------------------------------------

    def login(self) -> None:
        """Create a user and a session for it in the database; requests carry its cookie."""
        self.session_key = self.manage(
            "shell",
            "-c",
            "from harness.login import session_for_new_user\n"
            "print(session_for_new_user('scaled'))\n",
        ).split()[-1]

    def user_workspace(self) -> Path:
        """The workspace of the user login() made (chat.tools.workdir.user_workspace)."""
        return Path(
            self.manage(
                "shell",
                "-c",
                "from django.contrib.auth import get_user_model\n"
                "from chat.tools.workdir import user_workspace\n"
                "print(user_workspace(get_user_model().objects.get(username='scaled').pk))\n",
            ).split()[-1]
        )

    @property
    def cookie(self) -> str:
        return f"{cookie_header(self.session_key)}; csrftoken={self.csrf}"

    def origin(self, web: str) -> str:
        return f"http://127.0.0.1:{self.procs[web].port}"

    def post(self, web: str, path: str, form: dict[str, str] | None = None) -> tuple[int, str]:
        """POST a form as the logged-in browser; returns (status, Location or body)."""
        body = urllib.parse.urlencode({**(form or {}), "csrfmiddlewaretoken": self.csrf})
        conn = http.client.HTTPConnection("127.0.0.1", self.procs[web].port, timeout=HTTP_TIMEOUT)
        try:
            conn.request(
                "POST",
                path,
                body=body,
                headers={
                    "Cookie": self.cookie,
                    "Content-Type": "application/x-www-form-urlencoded",
                },
            )
            response = conn.getresponse()
            text = response.getheader("Location") or response.read().decode(errors="replace")
            return response.status, text
        finally:
            conn.close()

    def new_tab(self, web: str) -> str:
        status, location = self.post(web, "/t/new/")
        assert status == 302, (status, location)
        return re.fullmatch(r"/t/([0-9a-f-]{36})/", location).group(1)

    def send(self, web: str, tab_id: str, text: str) -> None:
        status, body = self.post(web, f"/t/{tab_id}/send/", {"text": text})
        assert status == 302, (status, body)

    async def asend(self, web: str, tab_id: str, text: str) -> None:
        await asyncio.to_thread(self.send, web, tab_id, text)

    async def apost(self, web: str, path: str, form: dict[str, str] | None = None):
        return await asyncio.to_thread(self.post, web, path, form)


# --- The page, rebuilt from frames ----------------------------------------------------


@dataclass
class PageChunk:
    id: str
    seq: int | None
    open: bool
    # The element's text as the reader sees it (sealed: rendered markdown).
    text: str = ""
    # Thinking is a <details>, every other chunk a <div>.
    tag: str = "div"


@dataclass
class Page:
    """A tab page's state, changed by frames as htmx and static/chat/app.js change it.

    `streamed` keeps, per chunk, the text the page showed while the chunk was
    open (the open fragment's body plus every delta), to compare with the log.
    """

    chunks: dict[str, PageChunk] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    streamed: dict[str, str] = field(default_factory=dict)
    # Open text chunks streamed as live Markdown (chat.render.LiveText): `streamed` keeps
    # the text they show (rendered), from these parts: stable, tail, text appended to it.
    live: dict[str, list[str]] = field(default_factory=dict)
    state: str = ""
    queued: set[str] = field(default_factory=set)
    approval: str | None = None
    # Frames the protocol promises never to send: a delta with no open chunk for
    # it, a sealed chunk sent again.
    problems: list[str] = field(default_factory=list)

    def apply(self, frame: str) -> None:
        from tests.ui_helpers import top

        for node in top(frame):
            oob = node.get("hx-swap-oob") or ""
            part = oob.removeprefix("beforeend:#") if oob.startswith("beforeend:#") else ""
            part = part or (node.get("id") if oob == "true" else "") or ""
            if part.startswith("body-") and part.endswith(("-s", "-t", "-r")):
                self._live(part.removeprefix("body-")[:-2], part[-1], node.text)
            elif oob.startswith("beforeend:#body-"):
                self._delta(oob.removeprefix("beforeend:#body-"), node.text)
            elif oob.startswith("beforeend:#queued"):
                self.queued.update(li.get("id") for li in node.children)
            elif oob.startswith("beforeend:"):
                for el in node.find_all(lambda n: (n.get("id") or "").startswith("chunk-")):
                    self._upsert(el)
            elif oob == "delete":
                self.queued.discard(node.get("id"))
            elif node.get("id") == "status":
                self.state = node.get("data-state") or ""
            elif node.get("id") == "queued":
                self.queued = {li.get("id") for li in node.children}
            elif node.get("id") == "approval":
                buttons = node.find_all(lambda n: n.get("name") == "approve")
                self.approval = buttons[0].get("value") if buttons else None

    def _upsert(self, el) -> None:
        chunk_id = el.get("id").removeprefix("chunk-")
        seq = int(el.get("data-seq")) if el.get("data-seq") else None
        body = el.by_id(f"body-{chunk_id}")
        old = self.chunks.get(chunk_id)
        if old is not None and not old.open and seq is not None:
            self.problems.append(f"chunk {chunk_id} (seq {seq}) sent sealed twice")
        if old is None:
            self.order.append(chunk_id)
        chunk = PageChunk(chunk_id, seq, body is not None, el.text, el.tag)
        self.chunks[chunk_id] = chunk
        if body is not None:
            self.streamed[chunk_id] = body.text
            if "live-md" in body.classes:
                self.live[chunk_id] = [body.text, "", ""]

    def _live(self, chunk_id: str, part: str, text: str) -> None:
        chunk = self.chunks.get(chunk_id)
        if chunk is None or not chunk.open or chunk_id not in self.live:
            self.problems.append(f"live Markdown for chunk {chunk_id}, which is not open")
            return
        parts = self.live[chunk_id]
        if part == "s":
            parts[0] += text
        elif part == "t":
            parts[1:] = [text, ""]
        else:
            parts[2] += text
        self.streamed[chunk_id] = "".join(parts)

    def _delta(self, chunk_id: str, text: str) -> None:
        chunk = self.chunks.get(chunk_id)
        if chunk is None or not chunk.open:
            self.problems.append(f"delta {text!r} for chunk {chunk_id}, which is not open")
            return
        self.streamed[chunk_id] += text

    @property
    def open_chunk(self) -> PageChunk | None:
        open_ = [self.chunks[i] for i in self.order if self.chunks[i].open]
        return open_[-1] if open_ else None

    def sealed(self) -> list[tuple[str, int]]:
        return [(i, self.chunks[i].seq) for i in self.order if not self.chunks[i].open]

    def hello(self) -> dict[str, Any]:
        """What the page's JS sends on every (re)connect."""
        seqs = [c.seq for c in self.chunks.values() if c.seq is not None]
        open_ = self.open_chunk
        return {
            "type": "hello",
            "last_seq": max(seqs, default=0),
            "open_id": open_.id if open_ else "",
            "open_len": len(self.streamed[open_.id]) if open_ else 0,
        }


class PageSocket:
    """One browser tab's socket: connects to a web process, says hello, applies frames."""

    def __init__(self, cluster: Cluster, tab_id: str, page: Page | None = None) -> None:
        self.cluster, self.tab_id = cluster, tab_id
        self.page = page or Page()
        self.frames: list[str] = []
        self.ws = None
        self.web = ""

    async def connect(self, web: str) -> PageSocket:
        """(Re)connect through `web`, sending what the page holds now, and sync."""
        from websockets.asyncio.client import connect

        self.web = web
        port = self.cluster.procs[web].port
        self.ws = await connect(
            f"ws://127.0.0.1:{port}/ws/tabs/{self.tab_id}/",
            additional_headers={
                "Cookie": self.cluster.cookie,
                "Origin": self.cluster.origin(web),
            },
            open_timeout=HTTP_TIMEOUT,
            close_timeout=2,
        )
        await self.ws.send(json.dumps(self.page.hello()))
        # The catch-up always ends with a status frame.
        await self.until(lambda frame: 'id="status"' in frame)
        return self

    async def next(self, timeout: float = FRAME_TIMEOUT) -> str:
        frame = await asyncio.wait_for(self.ws.recv(), timeout)
        self.frames.append(frame)
        self.page.apply(frame)
        return frame

    async def until(self, predicate: Callable[[str], bool], timeout: float = FRAME_TIMEOUT) -> str:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.next()
                if predicate(frame):
                    return frame

    async def until_page(self, predicate: Callable[[Page], bool], timeout: float = FRAME_TIMEOUT):
        async with asyncio.timeout(timeout):
            while not predicate(self.page):
                await self.next()

    async def settle(self, timeout: float = FRAME_TIMEOUT * 2) -> None:
        """Read frames until the page shows the whole log, idle, with nothing running or queued."""

        def done() -> bool:
            if self.page.state != "idle" or self.page.open_chunk is not None:
                return False
            if self.cluster.running(self.tab_id) or self.cluster.queued(self.tab_id):
                return False
            log = [(str(r["id"]), r["seq"]) for r in self.cluster.log(self.tab_id)]
            return self.page.sealed() == log

        async with asyncio.timeout(timeout):
            while not done():
                with contextlib.suppress(TimeoutError):
                    await self.next(timeout=0.5)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


_ELAPSED_RE = re.compile(r'(<[^>]*class="[^"]*\belapsed\b[^"]*"[^>]*>)[^<]*')


def without_clock(frame: str) -> str:
    """The frame without the running turn's elapsed time, which each web process renders
    from its own clock at the moment it sends the frame."""
    return _ELAPSED_RE.sub(r"\1", frame)


def rendered_text(row: dict[str, Any]) -> str:
    """The sealed chunk's text as the page shows it, rendered here from the log row."""
    from chat import render
    from chat.stream import Block
    from tests.ui_helpers import parse

    block = Block(
        row["id"], row["turn_id"], row["step"], row["role"], row["type"], row["data"], row["seq"]
    )
    return parse(render.fragment_seal(block)).by_id(f"chunk-{row['id']}").text


def words(text: str) -> str:
    return " ".join(text.split())


def assert_page_is_log(page: Page, log: list[dict[str, Any]]) -> None:
    """The page holds exactly the log: the same chunks in seq order, each showing its text,
    and every streamed text is the log's (for a chunk a crash cut, one is a prefix of the other)."""
    assert page.problems == []
    assert page.open_chunk is None
    assert page.sealed() == [(str(r["id"]), r["seq"]) for r in log]
    for row in log:
        shown = page.chunks[str(row["id"])].text
        assert words(shown) == words(rendered_text(row)), row
        streamed = page.streamed.get(str(row["id"]))
        if streamed is None or row["type"] not in ("text", "thinking"):
            continue
        if str(row["id"]) in page.live:
            # Rendered as it streamed: tests/test_live_markdown.py checks what it showed.
            continue
        saved = row["data"]["text"]
        if row["data"].get("interrupted"):
            # The checkpoint may lag the stream (up to a second) or lead it (deltas
            # still being coalesced when the worker died): either is a prefix.
            assert streamed.startswith(saved) or saved.startswith(streamed), (streamed, row)
        else:
            assert streamed == saved, (streamed, row)


def seqs_are_gapless(log: list[dict[str, Any]]) -> bool:
    return [r["seq"] for r in log] == list(range(1, len(log) + 1))


def turns_do_not_interleave(log: list[dict[str, Any]]) -> bool:
    """Each turn's chunks are one run in seq order: no two turns ran at once."""
    runs = [
        r["turn_id"] for i, r in enumerate(log) if i == 0 or log[i - 1]["turn_id"] != r["turn_id"]
    ]
    return len(runs) == len(set(runs))


def new_id() -> str:
    return str(uuid.uuid4())


# --- The scaled deployment of test_scaled and test_scaled_events ----------------------

# Tokens per second of the offline model in the workers: a plain reply (~120
# tokens) takes about two and a half seconds.
PACE = 50.0
# The tests that kill or stop something mid-text ask the offline model to read
# this workspace file: its second step quotes the lines back in one text chunk of
# about 160 tokens (three seconds at PACE), so whatever is killed once that chunk
# has begun dies in the middle of it, even on a busy machine.
STORY = "story.txt"
STORY_LINES = 6
STORY_WORDS_PER_LINE = 25


@contextlib.contextmanager
def scaled_cluster(workdir: Path) -> Iterator[Cluster]:
    """Two web processes and two workers on a scratch database and Redis, signed in,
    with the story in the user's workspace; stopped at the end."""
    require_services()
    with scratch_database() as database_url, scratch_redis() as redis_url:
        cluster = Cluster(database_url, redis_url, workdir, PACE)
        try:
            cluster.manage("migrate", "--noinput", "-v", "0")
            story = "\n".join(
                " ".join(f"w{line}.{i}" for i in range(STORY_WORDS_PER_LINE))
                for line in range(STORY_LINES)
            )
            cluster.start_web("a")
            cluster.start_web("b")
            cluster.start_worker("w1")
            cluster.start_worker("w2")
            cluster.login()
            (cluster.user_workspace() / STORY).write_text(story + "\n")
            cluster.wait_ready()
            yield cluster
        finally:
            cluster.stop()
