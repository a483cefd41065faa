"""A bench server: the real app on daphne, with a provider that stamps each token with the
time it was yielded, plus a bare Channels consumer streaming the same tokens as a baseline.

    python -m bench.server PORT TOKENS PACE
"""

from __future__ import annotations

import asyncio
import sys
import time


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


def main(port: int, tokens: int, pace: float) -> None:
    from bench.common import setup_django

    setup_django(sys.argv[4] if len(sys.argv) > 4 else None)
    from channels.generic.websocket import AsyncWebsocketConsumer
    from channels.routing import URLRouter
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from django.urls import path

    from chat import agent
    from chat.turns import start_embedded_worker
    from dispatch import asgi

    async def provider_for(model):
        return StampedProvider(tokens, pace)

    agent.provider_for = provider_for

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

    bare = URLRouter([path("bare/", BareStream.as_asgi())])

    async def application(scope, receive, send):
        if scope["type"] == "websocket" and scope["path"] == "/bare/":
            return await bare(scope, receive, send)
        return await asgi.application(scope, receive, send)

    Server(
        application=application,
        endpoints=build_endpoint_description_strings(host="127.0.0.1", port=port),
        ready_callable=start_embedded_worker,
        verbosity=0,
    ).run()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
