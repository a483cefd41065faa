"""A bench turn worker for the scaled mode: `chat.worker.run_worker`, as `manage.py
runworker` runs it, with bench.server's providers (tabs on `bench/stamped` get the stamped
tokens), since in the scaled mode turns run on the workers, not on the web processes.

    python -m bench.worker TOKENS PACE DATA_DIR

On the database and Redis its environment names (DATABASE_URL, REDIS_URL: without
REDIS_URL a worker could receive no turn, and it says so). Prints READY_LINE once it
takes turns; SIGTERM or SIGINT drains it as they drain runworker.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

from bench.common import setup_django
from bench.server import serve_bench_models

READY_LINE = "Bench turn worker started"


async def _run() -> None:
    from chat.worker import run_worker

    task = asyncio.create_task(run_worker())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    print(READY_LINE, flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(tokens: int, pace: float, data_dir: str) -> int:
    setup_django(data_dir)
    from django.conf import settings

    if not settings.REDIS_URL:
        print("bench.worker: REDIS_URL is not set, so no turn could reach this worker")
        return 2
    serve_bench_models(tokens, pace, [])
    asyncio.run(_run())
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
