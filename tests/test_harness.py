"""The support package shared by tests and bench: the launcher, the fake provider (paced,
stamped, in its own process), the login cookie, the Chromium policy."""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request

import pytest
from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from openai import AsyncOpenAI

from harness import chromium
from harness.fakeprovider import (
    CONTROL_REPLIES,
    CONTROL_REQUESTS,
    CUT,
    STAMP,
    FakeProviderProcess,
    Pause,
    Raw,
    Reply,
    openai_text,
    pacing,
)
from harness.login import browser_cookie, cookie_header, session_for
from harness.servers import (
    LISTENING_LINE,
    SHUTDOWN_GRACE,
    Proc,
    ProcessFailed,
    clean_env,
    database_url,
    procfile_argv,
    server_env,
)

# --- Pacing, on a fake clock ----------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pacing_waits_for_each_frame_s_slot_on_a_fixed_schedule():
    """Frame n is due at start + n / rate: the wait is what is left of that, whatever
    time the previous frame took to write."""
    clock = FakeClock()
    waits = pacing(200.0, clock)
    assert next(waits) == 0.0
    clock.now += 0.001  # writing frame 0 took 1 ms
    assert next(waits) == pytest.approx(0.004)
    clock.now += 0.004 + 0.002  # waited, then writing frame 1 took 2 ms
    assert next(waits) == pytest.approx(0.003)


def test_pacing_does_not_drift_after_a_late_frame():
    """A frame that comes late is sent at once, and the ones after it catch up with the
    schedule instead of shifting it."""
    clock = FakeClock()
    waits = pacing(100.0, clock)
    next(waits)
    clock.now += 0.035  # the machine was busy for three and a half slots
    assert [next(waits), next(waits), next(waits)] == [0.0, 0.0, 0.0]
    assert next(waits) == pytest.approx(0.005)


# --- Replies as JSON, for a fake server in another process ----------------------------


def test_a_reply_survives_json_with_every_kind_of_event():
    reply = Reply(
        events=[{"type": "ping"}, "data line", Raw("{not json", "oops"), Pause(0.5), CUT],
        status=200,
        headers={"x-test": "1"},
        delay=0.01,
        done=False,
        rate=50.0,
        stamp=True,
    )
    assert Reply.from_json(json.loads(json.dumps(reply.to_json()))) == reply


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "a reply is a JSON object, not list"),
        ({"events": [], "colour": "red"}, "unknown reply field(s) colour"),
        ({"events": {"json": {}}}, "a reply's events are a list, not dict"),
        ({"events": [{"pause": 1, "cut": True}]}, "event 0: expected an object with one of"),
        ({"events": [{}, "line"]}, "event 0: expected an object with one of"),
        ({"events": [{"json": {}}, {"json": [1]}]}, "event 1: a json event is an object"),
    ],
)
def test_a_malformed_reply_is_refused_saying_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Reply.from_json(data)


def test_an_event_that_has_no_json_form_is_refused():
    with pytest.raises(TypeError, match="cannot send a int event"):
        Reply(events=[42]).to_json()


# --- The fake server on the wire ------------------------------------------------------


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _stream(url: str) -> list[str]:
    """The data lines of one streamed OpenAI-format reply."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("POST", "/v1/chat/completions", body=b"{}")
        body = conn.getresponse().read().decode()
    finally:
        conn.close()
    return [line.removeprefix("data: ") for line in body.splitlines() if line.startswith("data:")]


def test_a_paced_stamped_reply_carries_the_time_each_frame_was_written(fake_server):
    """Every STAMP is replaced by nanoseconds since the epoch, in the order written."""
    fake_server.add(Reply(events=openai_text([f"{STAMP} "] * 20), rate=1000.0, stamp=True))
    lines = _stream(fake_server.url)
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    stamps = [int(t) for t in "".join(t for t in texts if t).split()]
    assert len(stamps) == 20
    assert stamps == sorted(stamps)
    assert chunks[-1]["usage"]["completion_tokens"] == 20


def test_replies_are_scripted_over_http_and_requests_read_back(fake_server):
    status, answer = _post(
        fake_server.url + CONTROL_REPLIES,
        json.dumps([Reply(events=openai_text(["hi"])).to_json()]).encode(),
    )
    assert (status, answer) == (200, {"queued": 1})
    assert "hi" in "".join(_stream(fake_server.url))
    with urllib.request.urlopen(fake_server.url + CONTROL_REQUESTS, timeout=10) as response:
        seen = json.loads(response.read())
    assert [(r["method"], r["path"], r["completed"]) for r in seen] == [
        ("POST", "/v1/chat/completions", True)
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "fake server: Expecting property name"),
        (b'{"events": []}', "fake server: expected a JSON list of replies, got dict"),
        (b'[{"events": []}, {"status": 200, "nope": 1}]', "reply 1: unknown reply field(s) nope"),
    ],
)
def test_a_bad_script_is_refused_whole_with_a_400_saying_why(fake_server, body, message):
    status, answer = _post(fake_server.url + CONTROL_REPLIES, body)
    assert status == 400
    assert message in answer["error"]
    assert list(fake_server.replies) == []


async def test_the_fake_server_in_its_own_process_streams_to_the_openai_sdk(tmp_path):
    """What the bench runs: a separate process, scripted over HTTP, read by the real SDK."""
    fake = FakeProviderProcess(tmp_path / "fake.log").start()
    try:
        assert fake.proc.pid != 0 and fake.proc.alive
        fake.add(Reply(events=openai_text(["Hello", ", ", "world"]), rate=500.0))
        client = AsyncOpenAI(api_key="x", base_url=fake.openai_url, max_retries=0)
        stream = await client.chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        assert text == "Hello, world"
        assert [r["path"] for r in fake.requests()] == ["/v1/chat/completions"]
    finally:
        fake.stop()
    assert fake.proc.proc.returncode == 0


# --- The launcher ---------------------------------------------------------------------


def _python(tmp_path, code: str) -> Proc:
    return Proc("child", [sys.executable, "-c", code], clean_env(), tmp_path / "child.log")


def test_a_server_s_port_comes_from_its_listening_line(tmp_path):
    line = LISTENING_LINE.format(host="127.0.0.1", port=4242)
    code = f"import time; print({line!r}, flush=True); time.sleep(60)"
    with _python(tmp_path, code).start().listening() as server:
        assert (server.port, server.url) == (4242, "http://127.0.0.1:4242")
    assert not server.alive


def test_a_server_that_exits_before_listening_fails_with_its_code_and_log(tmp_path):
    server = _python(tmp_path, "import sys; print('no database here'); sys.exit(3)").start()
    with pytest.raises(ProcessFailed, match=r"(?s)exited with 3\..*no database here"):
        server.listening()


def test_a_server_that_never_listens_is_stopped_and_the_error_says_so(tmp_path):
    server = _python(tmp_path, "import time; print('stuck', flush=True); time.sleep(60)").start()
    with pytest.raises(ProcessFailed, match=r"(?s)still running after 0\.2 s.*stuck"):
        server.listening(timeout=0.2)
    assert not server.alive


def test_a_server_s_environment_drops_the_shell_s_services_and_takes_overrides(
    monkeypatch, tmp_path
):
    """A developer's REDIS_URL or API key never reaches a test server; what the caller
    passes wins over the defaults (the offline model's pace, the shutdown grace)."""
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6379/0")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real")
    env = server_env(tmp_path, DISPATCH_OFFLINE_PACE="0", OPENAI_API_KEY="fake")
    assert "REDIS_URL" not in env
    assert (env["DISPATCH_OFFLINE_PACE"], env["OPENAI_API_KEY"]) == ("0", "fake")
    assert env["DISPATCH_SHUTDOWN_GRACE"] == SHUTDOWN_GRACE
    assert env["DATABASE_URL"] == database_url()


def test_an_unknown_procfile_process_type_is_an_error():
    assert procfile_argv("worker")[1:] == ["manage.py", "runworker"]
    with pytest.raises(ValueError, match="the Procfile has no 'cron' process type"):
        procfile_argv("cron")


# --- Logging in -----------------------------------------------------------------------


class WhoAmI(AsyncJsonWebsocketConsumer):
    async def connect(self):
        await self.accept()
        await self.send_json({"user": self.scope["user"].get_username()})


@pytest.mark.django_db(transaction=True)
async def test_one_session_logs_in_the_django_client_a_socket_and_a_browser():
    user = await database_sync_to_async(get_user_model().objects.create_user)("ada")
    session = await database_sync_to_async(session_for)(user)

    client = Client()
    client.cookies[settings.SESSION_COOKIE_NAME] = session
    response = await database_sync_to_async(client.get)(reverse("home"))
    assert response.status_code == 200, response.get("Location")

    communicator = WebsocketCommunicator(
        AuthMiddlewareStack(WhoAmI.as_asgi()),
        "/who/",
        headers=[(b"cookie", cookie_header(session).encode())],
    )
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_json_from() == {"user": "ada"}
    await communicator.disconnect()

    assert browser_cookie(session, "http://127.0.0.1:8000") == {
        "name": settings.SESSION_COOKIE_NAME,
        "value": session,
        "url": "http://127.0.0.1:8000",
    }


# --- Chromium -------------------------------------------------------------------------


def test_a_missing_chromium_is_an_error_saying_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(chromium, "EXECUTABLE", str(tmp_path / "chromium"))
    with pytest.raises(chromium.ChromiumMissing, match="Run `make chromium`"):
        chromium.executable()
    with pytest.raises(chromium.ChromiumMissing):
        chromium.command("--version")


def test_chromium_is_installed_here():
    """The policy is to install it, never to skip: on this machine it is there."""
    assert chromium.command("about:blank")[: len(chromium.ARGS) + 1] == [
        chromium.EXECUTABLE,
        *chromium.ARGS,
    ]
