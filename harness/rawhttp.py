"""A raw HTTP/1.1 server on 127.0.0.1 for hostile provider bodies: byte-level control
of the status line, headers and chunked body, which a well-behaved fake cannot give.

`RawServer({name: handler})` serves each request by the handler its path's first
segment names; a handler gets the StreamWriter and returns whether to keep the
connection open for another request. It runs in its own thread and loop, so the
adapter under test and the server never share a loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

SSE = b"text/event-stream"
Handler = Callable[[asyncio.StreamWriter], Awaitable[bool]]


class RawServer:
    def __init__(self, handlers: dict[str, Handler]) -> None:
        self.handlers = handlers
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        if not ready.wait(10):
            raise RuntimeError("the raw HTTP server did not start within 10 s")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1").split("\r\n")
                length = 0
                for line in head[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                await reader.readexactly(length)
                name = head[0].split(" ")[1].strip("/").split("/")[0]
                if not await self.handlers[name](writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def body(*parts: bytes, content_type: bytes = SSE, then: Handler | None = None) -> Handler:
    """A 200 with a chunked body of `parts`; then ended, or handed to `then`."""

    async def handle(writer: asyncio.StreamWriter) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: "
            + content_type
            + b"\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for part in parts:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        await writer.drain()
        if then is not None:
            return await then(writer)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return handle


async def stall(writer: asyncio.StreamWriter) -> bool:
    """Keep the body open and send nothing more."""
    await asyncio.sleep(3600)
    return False
