"""What watching live streams' credentials costs (chat.revocation): one process's check
of all its streams, for 1, 100 and 1,000 open streams (half page sockets in a session,
half API events by token, ten streams per user, each following a tab of its own).

The check runs every STREAM_RECHECK_SECONDS whatever the number of streams, so its
share of a core is its time over that interval; the queries stay four.
"""

from __future__ import annotations

from bench.common import measure

STREAMS = (1, 100, 1000)
PER_USER = 10


def _credentials(count: int) -> list:
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    from chat.models import ApiToken
    from chat.preferences import new_tab
    from chat.revocation import Credential

    users = [
        get_user_model().objects.create_user(f"bench-revocation-{count}-{n}")
        for n in range(max(1, count // PER_USER))
    ]
    out = []
    for i in range(count):
        user = users[i % len(users)]
        tab = new_tab(user, "offline/demo")
        if i % 2:
            out.append(Credential.of_token(ApiToken.issue(user)[0], tab.pk))
        else:
            session = SessionStore()
            session.create()
            out.append(Credential.of_session(session, user, tab.pk))
    return out


def run() -> dict:
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from chat.revocation import check

    by_streams = {}
    for count in STREAMS:
        credentials = _credentials(count)
        with CaptureQueriesContext(connection) as queries:
            verdicts = check(credentials)
        # Sessions made without a user in them are still rows: every stream is valid.
        assert verdicts == [None] * count
        timing = measure(lambda credentials=credentials: check(credentials), runs=20)
        by_streams[str(count)] = {
            "ms": round(timing["median"] * 1000, 2),
            "queries": len(queries),
            "core_share": round(timing["median"] / settings.STREAM_RECHECK_SECONDS, 5),
        }
    return {"interval_seconds": settings.STREAM_RECHECK_SECONDS, "by_streams": by_streams}
