"""The handshake's database thread (speech/web/database.py) with a real daphne and a real PostgreSQL
(a fresh database on 127.0.0.1:5432): keyed handshakes share one kept connection instead of connecting
for every call, and a connection the database dropped is replaced before a handshake uses it."""

from __future__ import annotations

import types

import pytest

from tests.support.deploy import PostgresDatabase, needs_postgres
from tests.support.live import DaphneServer, configure, open_session

pytestmark = [pytest.mark.live, needs_postgres]

HANDSHAKES = 10


@pytest.fixture(scope="module")
def keyed():
    with PostgresDatabase() as database:
        env = {"DATABASE_URL": database.url, "SPEECH_REQUIRE_API_KEY": "true", "SPEECH_ENGINE": "fake"}
        with DaphneServer(env) as server:
            yield types.SimpleNamespace(server=server, database=database, secret=server.create_api_key("database-live"))
        server.cleanup()


async def keyed_handshake(keyed):
    ws = await open_session(keyed.server.ws_url, headers={"Authorization": f"Bearer {keyed.secret}"})
    try:
        return await configure(ws)
    finally:
        await ws.close()


def connections_made(database):
    """Connections ever made to the database (PostgreSQL counts a backend's connection when it reports
    its statistics: at the latest when it exits). This query's own connection counts in the next reading."""
    [(sessions,)] = database.query("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    return sessions


async def test_keyed_handshakes_share_one_kept_connection(keyed):
    await keyed_handshake(keyed)  # the database thread has connected
    before = connections_made(keyed.database)
    for _ in range(HANDSHAKES):
        await keyed_handshake(keyed)
    made = connections_made(keyed.database) - before
    # Connecting for every call made two connections a handshake (the key, then the registry row). Allowed:
    # the reading's own connection, and the registry writer's if its first batch came after `before`.
    assert made <= 2, f"{made} connections for {HANDSHAKES} keyed handshakes"
    keyed.server.assert_no_traceback()


async def test_a_connection_the_database_dropped_is_replaced_before_a_handshake_uses_it(keyed):
    await keyed_handshake(keyed)
    dropped = keyed.database.query(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert dropped and all(done for (done,) in dropped), dropped  # the server's kept connections, now gone
    configured = await keyed_handshake(keyed)
    assert configured["session_id"]
    keyed.server.assert_no_traceback()
