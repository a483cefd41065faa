"""Support shared by the tests and the benchmarks: one of each.

- `servers`: the one launcher of child processes (`manage.py serve`, `runworker`, the
  bench server, the fake provider in its own process), each stopped by its own PID.
- `fakeprovider`: a fake Anthropic / OpenAI server on the real wire, in this process or
  its own, scripted reply by reply, paced and time-stamped when asked.
- `login`: a session for a user, as a cookie the Django test client, a WebSocket client
  and Playwright all send.
- `chromium`: Debian's Chromium with the project's flags; a missing one is an error
  that says how to install it, never a skip.

Nothing here imports `tests` or `bench`; both import this.
"""
