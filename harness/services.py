"""PostgreSQL and Redis for the scaled mode, as the tests and the bench use them: are they
reachable, a throwaway database, a Redis database number claimed for one run.

    if not unreachable_services():
        with scratch_database() as database_url, scratch_redis() as redis_url:
            ... processes with DATABASE_URL and REDIS_URL set ...
"""

from __future__ import annotations

import contextlib
import os
import secrets
import urllib.parse
from collections.abc import Iterator

# Where the tests and the bench find the services; the defaults are this machine's (and
# CI's).
POSTGRES_ADMIN_URL = os.environ.get(
    "DISPATCH_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
REDIS_BASE_URL = os.environ.get("DISPATCH_TEST_REDIS_URL", "redis://127.0.0.1:6379")

# A reachable service answers in milliseconds; this only bounds a dead address.
CONNECT_TIMEOUT = 3
# Redis database numbers tried for a run's channel layer (0 is left to people).
REDIS_DBS = range(1, 16)
# The claim on a Redis database outlives a crashed run by at most this.
REDIS_CLAIM_SECONDS = 3600
REDIS_CLAIM_KEY = "dispatch-scaled-test-claim"
# The channel layer's key prefix (channels_redis' default, which settings keep).
CHANNEL_LAYER_PREFIX = "asgi"


def _database_url(admin_url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(admin_url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def unreachable_services() -> list[str]:
    """What is missing, as sentences; empty when PostgreSQL and Redis both answer."""
    import psycopg
    import redis

    missing = []
    try:
        psycopg.connect(POSTGRES_ADMIN_URL, connect_timeout=CONNECT_TIMEOUT).close()
    except psycopg.Error as exc:
        missing.append(f"PostgreSQL at {POSTGRES_ADMIN_URL} is not reachable ({exc})")
    try:
        client = redis.Redis.from_url(REDIS_BASE_URL, socket_connect_timeout=CONNECT_TIMEOUT)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        missing.append(f"Redis at {REDIS_BASE_URL} is not reachable ({exc})")
    return missing


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """A new, empty PostgreSQL database for one run; dropped afterwards."""
    import psycopg

    name = f"dispatch_scaled_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _database_url(POSTGRES_ADMIN_URL, name)
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            # FORCE: a process killed mid-run may have left a session open.
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Claims the selected database only when it is empty, atomically.
_CLAIM_SCRIPT = """
if redis.call('DBSIZE') == 0 then
  return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
end
return false
"""


@contextlib.contextmanager
def scratch_redis() -> Iterator[str]:
    """A Redis URL on a database number nobody else uses now; its keys are removed after."""
    import redis

    token = secrets.token_hex(8)
    for db in REDIS_DBS:
        client = redis.Redis.from_url(f"{REDIS_BASE_URL}/{db}")
        try:
            if client.eval(_CLAIM_SCRIPT, 1, REDIS_CLAIM_KEY, token, REDIS_CLAIM_SECONDS):
                break
        finally:
            client.close()
    else:
        raise RuntimeError(
            f"every Redis database {REDIS_DBS.start}-{REDIS_DBS.stop - 1} on {REDIS_BASE_URL} "
            "holds keys; the scaled mode needs an empty one"
        )
    try:
        yield f"{REDIS_BASE_URL}/{db}"
    finally:
        client = redis.Redis.from_url(f"{REDIS_BASE_URL}/{db}")
        try:
            keys = list(client.scan_iter(match=f"{CHANNEL_LAYER_PREFIX}*", count=1000))
            if keys:
                client.delete(*keys)
            if client.get(REDIS_CLAIM_KEY) == token.encode():
                client.delete(REDIS_CLAIM_KEY)
        finally:
            client.close()
