"""A real MCP server (the SDK's MCPServer, once FastMCP) for the MCP client's tests.

`python tests/mcp_servers/tools.py stdio` serves stdin/stdout; `... http [PORT]` serves
streamable HTTP on 127.0.0.1:PORT (any port by default; `--hang`: answering nothing) and
counts the session DELETEs it gets (GET /deletes).
Its tools cover what the client must handle: text, structured, image, is_error,
progress, a hang, a crash mid-call, a huge result, a changing tool list.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from typing import TypedDict

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image

# A 1x1 red PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)

server = MCPServer("tools")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return f"echo: {text}"


class Sum(TypedDict):
    sum: int
    a: int
    b: int


@server.tool()
def add(a: int, b: int) -> Sum:
    """Add two numbers (a structured result)."""
    return {"sum": a + b, "a": a, "b": b}


@server.tool()
def pixel() -> Image:
    """A 1x1 PNG."""
    return Image(data=PIXEL, format="png")


@server.tool()
def fail(why: str) -> str:
    """Always fails."""
    raise ValueError(f"failed because {why}")


@server.tool()
async def slow(steps: int, ctx: Context) -> str:
    """Reports progress `steps` times, then answers."""
    for step in range(steps):
        await ctx.report_progress(step + 1, steps, f"step {step + 1}")
    return "slow done"


@server.tool()
async def hang() -> str:
    """Never answers."""
    await asyncio.sleep(3600)
    return "never"


@server.tool()
def crash() -> str:
    """The server exits in the middle of the call, saying why on stderr."""
    print("crash: out of patience", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def huge(megabytes: int) -> str:
    """A result of that many MB."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds a tool named `extra` and says the list changed."""

    def extra() -> str:
        """Added at run time."""
        return "extra"

    server.add_tool(extra)
    await ctx.session.send_tool_list_changed()
    return "grown"


class Deletes:
    """ASGI wrapper counting session DELETEs, read back at GET /deletes."""

    def __init__(self, app, *, hang: bool = False) -> None:
        self.app = app
        self.count = 0
        self.hang = hang

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/deletes":
            body = str(self.count).encode()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http" and scope["method"] == "DELETE":
            self.count += 1
        if self.hang and scope["type"] == "http" and scope["method"] == "POST":
            # `--hang`: a server that never answers, its handshake included.
            await asyncio.sleep(3600)
        await self.app(scope, receive, send)


def serve_http() -> None:
    import socket

    import uvicorn

    sock = socket.socket()
    # A server restarted on its port (a test of one coming back) binds at once.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = next((int(arg) for arg in sys.argv[2:] if arg.isdigit()), 0)
    sock.bind(("127.0.0.1", port))
    # Listening before the line: a client may connect at once (uvicorn accepts later).
    sock.listen(128)
    port = sock.getsockname()[1]
    app = Deletes(server.streamable_http_app(), hang="--hang" in sys.argv)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"Listening on TCP address 127.0.0.1:{port}", flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    if "--many" in sys.argv:
        # 500 tools, and one whose input schema is no object schema.
        for number in range(500):
            server.add_tool(echo, name=f"t{number:03}")
    for arg in sys.argv[2:]:
        if arg.startswith("--tool="):
            # `--tool=NAME=REPLY`: one more tool, answering REPLY.
            name, reply = arg.removeprefix("--tool=").split("=", 1)
            server.add_tool(lambda reply=reply: reply, name=name, description=f"Says {reply}.")
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        serve_http()
