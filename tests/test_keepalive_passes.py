"""daphne's check of its connections' timeouts and keepalive pings runs in passes
(speech/server/patches/daphne_timeout_passes.py): sessions opened together are pinged a share per loop
turn, not all in one, and each connection is still checked once per daphne's period; a period has only
as many passes as its connections need (each pass is a wake-up of the loop). Figures:
bench/RESULTS.md, "Handshakes beside idle sessions"; docs/decisions.md."""

from __future__ import annotations

import pytest


class Connection:
    def __init__(self, checks):
        self.checks = checks

    def check_timeouts(self):
        self.checks.append(self)


@pytest.fixture
def later(monkeypatch):
    """The timers the checker sets: (delay, function)."""
    from speech.server.patches import daphne_timeout_passes as module

    timers = []
    monkeypatch.setattr(module.reactor, "callLater", lambda delay, fn, *args: timers.append((delay, fn)))
    return timers


def server_with(connections):
    from speech.server.launcher import SpeechServer

    server = SpeechServer.__new__(SpeechServer)
    server.connections = {connection: {} for connection in connections}
    return server


def test_each_pass_checks_a_share_of_the_connections_and_every_period_checks_each_once(later):
    from speech.server.patches import daphne_timeout_passes as module

    checks = []
    opened_together = [Connection(checks) for _ in range(2000)]
    server = server_with(opened_together)

    server.timeout_checker()
    assert module.passes_for(2000) == module.TIMEOUT_PASSES
    assert len(checks) == 2000 // module.TIMEOUT_PASSES  # daphne's own checks all 2,000 in this one turn
    assert [delay for delay, _ in later] == [module.TIMEOUT_CHECK_S / module.TIMEOUT_PASSES]
    for _ in range(module.TIMEOUT_PASSES - 1):
        later.pop()[1]()
    assert sorted(map(id, checks)) == sorted(map(id, opened_together))  # each once in the period
    later.pop()[1]()
    assert len(checks) == 2000 + 2000 // module.TIMEOUT_PASSES  # and the next period begins again


def test_few_connections_are_checked_in_one_pass_a_period(later):
    """A handful of sessions: daphne's one pass every TIMEOUT_CHECK_S, not TIMEOUT_PASSES wake-ups."""
    from speech.server.patches import daphne_timeout_passes as module

    checks = []
    few = [Connection(checks) for _ in range(8)]
    server = server_with(few)

    server.timeout_checker()
    assert sorted(map(id, checks)) == sorted(map(id, few))
    assert [delay for delay, _ in later] == [module.TIMEOUT_CHECK_S]
    server.connections = {}
    later.pop()[1]()  # none: still one pass a period
    assert [delay for delay, _ in later] == [module.TIMEOUT_CHECK_S]


def test_the_passes_change_only_when_a_period_begins(later):
    """Connections that open during a period do not change its stride: a connection at a fixed place is
    checked once in it; the next period has the passes its connections need."""
    from speech.server.patches import daphne_timeout_passes as module

    checks = []
    first = [Connection(checks) for _ in range(2 * module.PASS_CONNECTIONS)]
    server = server_with(first)
    server.timeout_checker()
    assert len(checks) == module.PASS_CONNECTIONS and later[-1][0] == module.TIMEOUT_CHECK_S / 2
    server.connections.update({Connection(checks): {} for _ in range(4 * module.PASS_CONNECTIONS)})
    later.pop()[1]()  # the period's second and last pass, still over every second connection
    assert sorted(map(id, checks[: len(first)])) == sorted(map(id, first))
    assert later[-1][0] == module.TIMEOUT_CHECK_S / 2
    later.pop()[1]()  # a new period: six times PASS_CONNECTIONS, six passes
    assert later[-1][0] == module.TIMEOUT_CHECK_S / 6


def test_a_connection_that_ends_during_a_pass_leaves_the_others_checked(later):
    """check_timeouts may close a connection (daphne's timeouts), which removes it from `connections`."""
    from speech.server.patches import daphne_timeout_passes as module

    checks = []

    class Closing(Connection):
        def check_timeouts(self):
            super().check_timeouts()
            del server.connections[self]

    count = 2 * module.TIMEOUT_PASSES * module.PASS_CONNECTIONS
    server = server_with(Closing(checks) for _ in range(count))
    server.timeout_checker()
    assert len(checks) == count // module.TIMEOUT_PASSES and len(server.connections) == count - len(checks)
