"""Sub-agents in scaled mode: a parent's worker SIGKILLed while its child runs on another
worker (PostgreSQL, Redis, a web process and two `runworker` processes, the Anthropic
adapter against the fake provider). Skips without the services, as tests/test_scaled.py."""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from chat import worker
from chat.models import agent_child_id
from harness.fakeprovider import FakeProviderServer, Recorded, Reply
from tests.anthropic_wire import MODEL, reply, text, tool_use
from tests.procs import Cluster, require_services, scratch_database, scratch_redis

pytestmark = pytest.mark.scaled

PARENT_PROMPT = "delegate the survey"
CHILD_PROMPT = "survey the workspace"
CHILD_TEXT = "The workspace is empty."
# Bound on each wait here: a recovery scan (worker.SCAN_SECONDS) plus a busy machine.
WAIT = worker.SCAN_SECONDS + 40.0


class Provider:
    """Answers by the request's first user message; holds the parent's first answer and
    the child's answer until the test lets each go (threading events)."""

    def __init__(self) -> None:
        self.parent_go = threading.Event()
        self.parent_asked = threading.Event()
        self.child_go = threading.Event()
        self.child_asked = threading.Event()

    def __call__(self, request: Recorded) -> Reply:
        messages = request.json["messages"]
        first = messages[0]["content"]
        first = first if isinstance(first, str) else first[-1].get("text", "")
        last = messages[-1]["content"]
        answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if first == CHILD_PROMPT:
            self.child_asked.set()
            self.child_go.wait(WAIT)
            return reply(text(CHILD_TEXT))
        if not answered:
            self.parent_asked.set()
            self.parent_go.wait(WAIT)
            return reply(
                tool_use("call_1", "agent", description="Survey", prompt=CHILD_PROMPT),
                stop="tool_use",
            )
        return reply(text("The child reported back."))


def until(check, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cluster(tmp_path):
    require_services()
    provider = Provider()
    fake = FakeProviderServer(respond=provider).start()
    with scratch_database() as database_url, scratch_redis() as redis_url:
        cluster = Cluster(database_url, redis_url, tmp_path, 0.0)
        cluster.env.update(
            DISPATCH_MODEL=MODEL,
            ANTHROPIC_API_KEY="test-key",
            ANTHROPIC_BASE_URL=fake.url,
            # The SIGTERMed worker keeps its running turn until it is killed.
            DISPATCH_SHUTDOWN_GRACE="600",
        )
        try:
            cluster.manage("migrate", "--noinput", "-v", "0")
            cluster.start_web("a")
            cluster.start_worker("w1")
            cluster.login()
            cluster.wait_ready()
            cluster.provider = provider
            yield cluster
        finally:
            provider.parent_go.set()
            provider.child_go.set()
            cluster.stop()
            fake.stop()


def test_a_parent_whose_worker_is_killed_gets_its_one_childs_result(cluster):
    """w1 runs the parent and stops listening (SIGTERM, a long grace) before the parent
    calls `agent`, so the child runs on w2; w1 is SIGKILLed while the child runs. w2's
    recovery scan leaves the call open and resumes the parent, which re-attaches to the
    child (exactly one exists) and answers the call with the child's text."""
    provider = cluster.provider
    tab = cluster.new_tab("a")
    cluster.send("a", tab, PARENT_PROMPT)
    running = until(lambda: cluster.running(tab), "the parent's turn")
    assert cluster.worker_by_id(running["worker"]) == "w1"
    # The lease row is written before w1's runner exists: a SIGTERM in between finds no
    # running turn to wait for (w1 just exits). Its first request means the runner runs.
    assert provider.parent_asked.wait(WAIT)
    cluster.procs["w1"].proc.send_signal(signal.SIGTERM)
    cluster.procs["w1"].wait_for("stopping: waiting up to")
    cluster.start_worker("w2")
    cluster.wait_ready()
    provider.parent_go.set()

    assert provider.child_asked.wait(WAIT)
    # The child's id is derived from the parent, the call id and the seq of the call's chunk.
    ((seq,),) = cluster.sql(
        "SELECT seq FROM chat_chunk WHERE tab_id = %s AND type = 'tool_call'", tab
    )
    child = str(agent_child_id(tab, "call_1", seq))
    child_running = until(lambda: cluster.running(child), "the child's turn")
    assert cluster.worker_by_id(child_running["worker"]) == "w2"
    cluster.procs["w1"].kill()
    cluster.procs["w2"].wait_for(f"recovered interrupted turn .* on tab {tab}", timeout=WAIT)
    # Resumed on w2, the parent waits for the same child.
    resumed = until(lambda: cluster.running(tab), "the resumed parent turn")
    assert cluster.worker_by_id(resumed["worker"]) == "w2"
    provider.child_go.set()

    log = until(
        lambda: (rows := cluster.log(tab)) and rows[-1]["type"] == "text" and rows,
        "the parent's answer",
    )
    assert [f"{c['role']}/{c['type']}" for c in log] == [
        "user/text",
        "assistant/tool_call",
        "system/system",
        "tool/tool_result",
        "assistant/text",
    ]
    assert log[2]["data"]["kind"] == "interrupted"
    result = log[3]["data"]
    assert result["is_error"] is False
    assert result["result"].startswith(CHILD_TEXT + "\n\n")
    assert json.loads(result["result"].rsplit("\n", 1)[-1])["child_tab"] == child
    assert cluster.sql("SELECT id::text FROM chat_tab WHERE parent_tab_id = %s", tab) == [(child,)]
    child_log = cluster.log(child)
    assert [c["type"] for c in child_log] == ["text", "text"]
    assert child_log[-1]["data"]["text"] == CHILD_TEXT
