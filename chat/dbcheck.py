"""Whether the database answers a connection of its own.

Not through the connection pool a PostgreSQL database is used with (dispatch/settings.py):
the pool retries an unreachable server in the background, logging each try, and a caller
learns only, at the pool's timeout, that no connection came.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections


def database_unreachable() -> BaseException | None:
    """Why the default database did not answer, or None when it did."""
    connection = connections[DEFAULT_DB_ALIAS]
    driver = connection.Database  # type: ignore[attr-defined]
    try:
        if connection.vendor == "postgresql":
            driver.connect(**connection.get_connection_params()).close()
        else:
            connection.ensure_connection()
    except (DatabaseError, driver.Error) as exc:
        return exc
    finally:
        # Whoever uses the database next opens its own connection, in its thread.
        connection.close()
    return None
