"""A bench server: the real app on daphne, with a provider that stamps each token with the
time it was yielded, plus a bare Channels consumer streaming the same tokens as a baseline.

    python -m bench.server PORT TOKENS PACE [DATA_DIR [DELTAS]]

With PORT 0 the OS chooses the port; the server prints "Listening on TCP address
127.0.0.1:PORT" either way (harness.servers.Proc.listening waits for it). Tabs on
`bench/stamped` get the stamped tokens; tabs on any other model get the app's real
provider (the bench sets its key and base URL in the environment).

GET /bench/statements/ answers how many SQL statements the process has run so far (every
thread's); with BENCH_SQL_LOG set, /bench/statements/?sql answers their text, one a line.

For the browser benchmark, tabs on the model `bench/deltas` get DELTAS small text deltas at
full speed instead, and the page at /bench/raw/ (bench/raw.html) gets the same deltas raw on
/bench/raw/ws/: "go each" sends one frame per delta, "go coalesced" joins them into frames
the size the app's coalescing makes at full speed; then "END". "RESULT <json>" from a page
with no automation attached is appended to DATA_DIR/raw-results.jsonl.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

# The model a tab names to get the browser benchmark's deltas.
DELTAS_MODEL = "bench/deltas"
# The model a tab names to get TOKENS stamped tokens at PACE.
STAMPED_MODEL = "bench/stamped"
RAW_PAGE = Path(__file__).with_name("raw.html")
RAW_RESULTS = "raw-results.jsonl"
# Words of the small deltas; plain words, so markdown keeps the text as it is.
WORDS = ("the", "stream", "of", "small", "deltas", "goes", "into", "a", "tab", "page")
# A paragraph break every this many deltas: a long answer is paragraphs, not one line.
PARAGRAPH_DELTAS = 60


class StampedProvider:
    """Yields TOKENS text deltas at PACE tokens/s, each "<ns-since-epoch> "."""

    def __init__(self, tokens: int, pace: float) -> None:
        self.tokens, self.pace = tokens, pace

    async def stream(self, request):
        from chat.providers.base import Finish, TextDelta, Usage

        async for token in stamped_tokens(self.tokens, self.pace):
            yield TextDelta(token)
        yield Finish(Usage(output_tokens=self.tokens))


async def stamped_tokens(count: int, pace: float):
    start = time.monotonic()
    for i in range(count):
        due = start + i / pace
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        yield f"{time.time_ns()} "


def coalesced(deltas: list[str], size: int) -> list[str]:
    """The deltas joined into frames of at least `size` characters (the last one shorter)."""
    frames, run, length = [], [], 0
    for text in deltas:
        run.append(text)
        length += len(text)
        if length >= size:
            frames.append("".join(run))
            run, length = [], 0
    if run:
        frames.append("".join(run))
    return frames


def small_deltas(count: int) -> list[str]:
    """`count` deltas of a word each (about 5 characters, a model's token)."""
    deltas = []
    for i in range(count):
        sep = "" if i == 0 else "\n\n" if i % PARAGRAPH_DELTAS == 0 else " "
        deltas.append(sep + WORDS[i % len(WORDS)])
    return deltas


class DeltasProvider:
    """Yields the given text deltas as fast as the app takes them (no sleeping)."""

    def __init__(self, deltas: list[str]) -> None:
        self.deltas = deltas

    async def stream(self, request):
        from chat.providers.base import Finish, TextDelta, Usage

        for text in self.deltas:
            yield TextDelta(text)
        yield Finish(Usage(output_tokens=len(self.deltas)))


async def _respond(send, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def raw_page(receive, send) -> None:
    """Serve bench/raw.html: a page with no htmx and no app code."""
    await _respond(send, RAW_PAGE.read_bytes(), b"text/html; charset=utf-8")


# The SQL statements this process ran, in every thread (see _count_statements).
STATEMENTS: list[str] = []


def _count_statements() -> None:
    """Count every statement Django runs, whichever thread runs it (a connection's
    execute_wrapper is per thread): the bench reads the count over HTTP."""
    from django.db.backends import utils

    keep = bool(os.environ.get("BENCH_SQL_LOG"))
    real_execute, real_executemany = utils.CursorWrapper._execute, utils.CursorWrapper._executemany

    def _execute(self, sql, params, *ignored):
        STATEMENTS.append(sql if keep else "")
        return real_execute(self, sql, params, *ignored)

    def _executemany(self, sql, param_list, *ignored):
        STATEMENTS.append(sql if keep else "")
        return real_executemany(self, sql, param_list, *ignored)

    utils.CursorWrapper._execute = _execute
    utils.CursorWrapper._executemany = _executemany


async def statements_page(scope, send) -> None:
    body = "\n".join(STATEMENTS) if scope["query_string"] == b"sql" else str(len(STATEMENTS))
    await _respond(send, body.encode(), b"text/plain")


def main(port: int, tokens: int, pace: float) -> None:
    from bench.common import setup_django

    setup_django(sys.argv[4] if len(sys.argv) > 4 else None)
    _count_statements()
    results_path = Path(os.environ["DISPATCH_DATA_DIR"]) / RAW_RESULTS
    deltas = small_deltas(int(sys.argv[5]) if len(sys.argv) > 5 else 0)
    serve_bench_models(tokens, pace, deltas)
    _serve(_application(tokens, pace, deltas, results_path), port)


def serve_bench_models(tokens: int, pace: float, deltas: list[str]) -> None:
    """Tabs on DELTAS_MODEL and STAMPED_MODEL get the bench's providers, others the app's."""
    from chat.turn import step

    real_provider_for = step.provider_for

    async def provider_for(model):
        if model == DELTAS_MODEL:
            return DeltasProvider(deltas)
        if model == STAMPED_MODEL:
            return StampedProvider(tokens, pace)
        return await real_provider_for(model)

    step.provider_for = provider_for


def _application(tokens: int, pace: float, deltas: list[str], results_path: Path):
    """The app, with the baselines beside it: /bare/ (stamped tokens), /bench/raw/ (the
    raw page) and /bench/raw/ws/ (its deltas)."""
    from channels.generic.websocket import AsyncWebsocketConsumer
    from channels.routing import URLRouter
    from django.urls import path

    from chat import pacing
    from dispatch import asgi

    raw_frames = {"each": deltas, "coalesced": coalesced(deltas, pacing.COALESCE_MAX_CHARS)}

    class BareStream(AsyncWebsocketConsumer):
        """The baseline: the same tokens straight to the socket, no log, no rendering."""

        async def connect(self):
            await self.accept()
            self.task = asyncio.create_task(self.stream())

        async def stream(self):
            async for token in stamped_tokens(tokens, pace):
                await self.send(text_data=token)
            await self.send(text_data="END")

        async def disconnect(self, code):
            self.task.cancel()

    class RawDeltas(AsyncWebsocketConsumer):
        """The browser baseline: on "go MODE", the deltas as plain text frames, then "END"."""

        async def receive(self, text_data=None, bytes_data=None):
            text_data = text_data or ""
            if text_data.startswith("go "):
                for text in raw_frames[text_data.removeprefix("go ")]:
                    await self.send(text_data=text)
                await self.send(text_data="END")
            elif text_data.startswith("RESULT "):
                with results_path.open("a") as f:
                    f.write(text_data.removeprefix("RESULT ") + "\n")

    bare = URLRouter(
        [path("bare/", BareStream.as_asgi()), path("bench/raw/ws/", RawDeltas.as_asgi())]
    )

    async def application(scope, receive, send):
        if scope["type"] == "websocket" and scope["path"] in ("/bare/", "/bench/raw/ws/"):
            return await bare(scope, receive, send)
        if scope["type"] == "http" and scope["path"] == "/bench/raw/":
            return await raw_page(receive, send)
        if scope["type"] == "http" and scope["path"] == "/bench/statements/":
            return await statements_page(scope, send)
        return await asgi.application(scope, receive, send)

    return application


def _serve(application, port: int) -> None:
    """Serve `application` on daphne at 127.0.0.1:`port`, with the embedded worker."""
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    from chat.worker import start_embedded_worker
    from harness.servers import LISTENING_LINE

    def ready() -> None:
        # Listening already (daphne binds before this): say where, as `manage.py serve`
        # does at INFO, which the bench's log level keeps quiet.
        for host, bound in server.listening_addresses:
            print(LISTENING_LINE.format(host=host, port=bound), flush=True)
        start_embedded_worker()

    server = Server(
        application=application,
        endpoints=build_endpoint_description_strings(host="127.0.0.1", port=port),
        ready_callable=ready,
        verbosity=0,
    )
    server.run()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
