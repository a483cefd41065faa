"""Browser streaming vs a raw WebSocket: one turn of DELTAS small text deltas (a provider at
full speed) streamed into a real Chromium tab page, timed from send to the sealed text in the
DOM; against a minimal page (bench/raw.html) in the same run that gets the same deltas over a
plain WebSocket, one frame each, and appends them with no htmx.

Every side times itself in the page with performance.now(), so no polling is in the figures:
the app from the composer's submit to the moment a mutation observer sees the sealed chunk
with all its text, the raw page from sending "go" to appending the last delta. Each also notes
its frames' arrival, the time its handlers ran ("busy") and the next paint.

The raw page runs three ways:
- `raw`: in a Chromium with no automation attached, reporting its timings over its socket.
  This is the baseline of the ratio. Under Playwright every WebSocket frame also becomes a
  DevTools event, which about doubles the cost of 20,000 frames and would flatter the app.
- `raw_automated`: the same page under Playwright, measured exactly as the app is.
- `raw_coalesced`: under Playwright, the deltas joined into frames the size the app's server
  sends at full speed: the floor for the app's frame count, so app / raw_coalesced is what
  htmx, the fragments and the turn machinery cost on top of the wire.
"""

from __future__ import annotations

import asyncio
import html.parser
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import IDLE_RE, bench_server, bench_session, bench_tab, cpu_seconds, summary
from bench.server import DELTAS_MODEL, RAW_RESULTS, small_deltas
from harness import chromium
from harness.login import browser_cookie

# The turn: many small deltas, so per-delta cost shows.
DELTAS = 20_000
# Timed runs per side, the sides alternating, after one untimed warm-up of each.
RUNS = 5
VIEWPORT = {"width": 1000, "height": 800}
# One run (page load to painted text) on a loaded 2-core machine stays well under this; past
# it the bench fails loudly instead of hanging.
RUN_TIMEOUT = 60.0
# A Chromium with no automation gets this long to exit after SIGTERM before SIGKILL.
EXIT_TIMEOUT = 10.0

# The app page's probe, installed once the socket is synced: when each frame arrived and its
# handlers finished, when the POST was answered, when the sealed text was in the DOM and when
# the next frame was painted.
APP_PROBE = """expected => {
  const log = document.getElementById('log');
  const bench = window.__bench = {
    t0: null, posted: null, done: null, painted: null, frames: [],
  };
  document.addEventListener('htmx:wsBeforeMessage', () => {
    if (bench.t0 !== null) bench.frames.push([performance.now(), null]);
  });
  document.addEventListener('htmx:wsAfterMessage', () => {
    if (bench.t0 !== null) bench.frames[bench.frames.length - 1][1] = performance.now();
  });
  document.addEventListener('htmx:afterRequest', () => {
    if (bench.t0 !== null && bench.posted === null) bench.posted = performance.now();
  });
  const observer = new MutationObserver(() => {
    const chunks = log.querySelectorAll(':scope > .chunk.t-text.a');
    const el = chunks[chunks.length - 1];
    if (!el || el.classList.contains('open') || !el.getAttribute('data-seq')) return;
    const md = el.querySelector('.md');
    if (!md || md.textContent.length !== expected) return;
    bench.done = performance.now();
    observer.disconnect();
    requestAnimationFrame(() => setTimeout(() => { bench.painted = performance.now(); }, 0));
  });
  observer.observe(log, {childList: true, subtree: true});
}"""
APP_SEND = """() => {
  window.__bench.t0 = performance.now();
  document.getElementById('composer').requestSubmit();
}"""


class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def text_content(fragment: str) -> str:
    """What the DOM's textContent of this HTML would be."""
    parser = _Text()
    parser.feed(fragment)
    parser.close()
    return "".join(parser.parts)


async def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"browser bench: timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _ms(t0: float, t: float | None) -> float | None:
    return None if t is None else round(t - t0, 1)


async def _app_run(context, base: str, tab_id: str, expected: int) -> dict:
    frames: list[str | bytes] = []
    errors: list[str] = []
    page = await context.new_page()
    page.set_default_timeout(RUN_TIMEOUT * 1000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(f)))
    try:
        await page.goto(f"{base}/t/{tab_id}/")
        # The status frame answers the page's hello: the socket is synced.
        await _until(lambda: frames, "the app socket's first frame")
        await page.evaluate(APP_PROBE, expected)
        await page.fill("#composer-text", "stream")
        start = len(frames)
        await page.evaluate(APP_SEND)
        await page.wait_for_function("() => window.__bench.painted !== null")
        await _until(
            lambda: len(frames) > start and any(IDLE_RE.search(str(f)) for f in frames[start:]),
            "the idle status frame",
        )
        bench = await page.evaluate("() => window.__bench")
    finally:
        await page.close()
    if errors:
        raise RuntimeError(f"browser bench: page errors {errors}")
    sent = frames[start:]
    t0, done = bench["t0"], bench["done"]
    arrived = [f for f in bench["frames"] if f[0] <= done]
    return {
        "seconds": (done - t0) / 1000,
        "painted_seconds": (bench["painted"] - t0) / 1000,
        "frames": len(sent),
        "bytes": sum(len(f.encode() if isinstance(f, str) else f) for f in sent),
        "splits_ms": {
            "posted": _ms(t0, bench["posted"]),
            "first_frame": _ms(t0, arrived[0][0]),
            # The frame that completed the text: the seal.
            "last_frame": _ms(t0, arrived[-1][0]),
            "dom": _ms(t0, done),
            "painted": _ms(t0, bench["painted"]),
            "busy": round(sum(after - at for at, after in arrived if after is not None), 1),
        },
    }


def _raw_result(bench: dict, expected: int) -> dict:
    if bench["length"] != expected:
        raise RuntimeError(
            f"browser bench: raw page holds {bench['length']} characters, not {expected}"
        )
    t0 = bench["t0"]
    return {
        "seconds": (bench["done"] - t0) / 1000,
        "painted_seconds": (bench["painted"] - t0) / 1000,
        "frames": bench["frames"],
        "splits_ms": {
            "first_frame": _ms(t0, bench["first"]),
            "last_frame": _ms(t0, bench["last"]),
            "dom": _ms(t0, bench["done"]),
            "painted": _ms(t0, bench["painted"]),
            "busy": round(bench["busy"], 1),
        },
    }


async def _raw_run(context, base: str, mode: str, expected: int) -> dict:
    """The raw page under Playwright."""
    page = await context.new_page()
    page.set_default_timeout(RUN_TIMEOUT * 1000)
    try:
        await page.goto(f"{base}/bench/raw/?mode={mode}")
        await page.wait_for_function("() => window.__bench.ready")
        await page.evaluate("() => window.benchGo()")
        await page.wait_for_function("() => window.__bench.painted !== null")
        bench = await page.evaluate("() => window.__bench")
    finally:
        await page.close()
    return _raw_result(bench, expected)


async def _plain_run(base: str, results: Path, expected: int) -> dict:
    """The raw page in a Chromium with no automation: it sends its timings to the server."""
    seen = len(results.read_text().splitlines()) if results.exists() else 0
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-chromium-") as profile:
        browser = subprocess.Popen(
            chromium.command(
                f"--user-data-dir={profile}",
                f"--window-size={VIEWPORT['width']},{VIEWPORT['height']}",
                f"{base}/bench/raw/?mode=each&auto",
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own process group: the renderer and helpers go with it.
            start_new_session=True,
        )
        try:
            await _until(
                lambda: results.exists() and len(results.read_text().splitlines()) > seen,
                "the raw page's timings from a Chromium with no automation",
            )
        finally:
            os.killpg(browser.pid, signal.SIGTERM)
            try:
                browser.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(browser.pid, signal.SIGKILL)
                browser.wait(timeout=EXIT_TIMEOUT)
    bench = json.loads(results.read_text().splitlines()[seen])
    return _raw_result(bench, expected)


def _side(runs: list[dict], cpu: float) -> dict:
    splits = runs[0]["splits_ms"]
    return {
        **summary([r["seconds"] for r in runs]),
        "painted_median": statistics.median(r["painted_seconds"] for r in runs),
        "splits_ms": {k: statistics.median(r["splits_ms"][k] for r in runs) for k in splits},
        "frames": statistics.median(r["frames"] for r in runs),
        "server_cpu_seconds_per_run": round(cpu / len(runs), 3),
    }


async def _measure(base: str, server_pid: int, session: str, tab_ids: list[str]) -> dict:
    from chat.render import markdown

    text = "".join(small_deltas(DELTAS))
    app_expected = len(text_content(str(markdown(text))))
    results = Path(os.environ["DISPATCH_DATA_DIR"]) / RAW_RESULTS
    sides = {
        "app": lambda i: _app_run(context, base, tab_ids[i], app_expected),
        "raw": lambda i: _plain_run(base, results, len(text)),
        "raw_automated": lambda i: _raw_run(context, base, "each", len(text)),
        "raw_coalesced": lambda i: _raw_run(context, base, "coalesced", len(text)),
    }
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    cpu = dict.fromkeys(sides, 0.0)
    async with chromium.browser(timeout=RUN_TIMEOUT) as browser:
        # Playwright's wait_for_function uses eval, which the page's CSP refuses.
        context = await browser.new_context(viewport=VIEWPORT, bypass_csp=True)
        await context.add_cookies([browser_cookie(session, base)])
        # Warm-up: the first page load compiles scripts and fills caches on every side.
        for run in sides.values():
            await run(0)
        for i in range(1, RUNS + 1):
            for name, run in sides.items():
                before = cpu_seconds(server_pid)
                runs[name].append(await run(i))
                cpu[name] += cpu_seconds(server_pid) - before
            print(
                "  run {}: {}".format(
                    i, ", ".join(f"{n} {r[-1]['seconds']:.3f} s" for n, r in runs.items())
                ),
                flush=True,
            )
    out = {name: _side(runs[name], cpu[name]) for name in sides}
    app = out["app"]
    return {
        "deltas": DELTAS,
        "characters": len(text),
        **out,
        "ratio": round(app["median"] / out["raw"]["median"], 3),
        "painted_ratio": round(app["painted_median"] / out["raw"]["painted_median"], 3),
        "ratio_to_automated": round(app["median"] / out["raw_automated"]["median"], 3),
        "ratio_to_coalesced": round(app["median"] / out["raw_coalesced"]["median"], 3),
        "app_frames": app["frames"],
        "app_bytes": statistics.median(r["bytes"] for r in runs["app"]),
    }


def run() -> dict:
    chromium.executable()  # a missing Chromium stops the bench here, saying how to install it
    session = bench_session()
    # A fresh tab per app run (and the warm-up): every run streams into the same empty page.
    tab_ids = [str(bench_tab(DELTAS_MODEL).pk) for _ in range(RUNS + 1)]
    server_args = ("0", "1", os.environ["DISPATCH_DATA_DIR"], str(DELTAS))
    with bench_server(*server_args) as server:
        return asyncio.run(_measure(server.url, server.pid, session, tab_ids))
