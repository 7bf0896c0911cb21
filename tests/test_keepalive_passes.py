"""daphne's check of its connections' timeouts and keepalive pings runs in passes
(speech/server/patches/daphne_timeout_passes.py): sessions opened together are pinged a share per loop
turn, not all in one, and each connection is still checked once per daphne's period. Figures:
bench/RESULTS.md, "Handshakes beside idle sessions"."""

from __future__ import annotations


class Connection:
    def __init__(self, checks):
        self.checks = checks

    def check_timeouts(self):
        self.checks.append(self)


def test_each_pass_checks_a_share_of_the_connections_and_every_period_checks_each_once(monkeypatch):
    from speech.server.launcher import SpeechServer
    from speech.server.patches import daphne_timeout_passes as module

    later = []
    monkeypatch.setattr(module.reactor, "callLater", lambda delay, fn, *args: later.append((delay, fn)))
    server = SpeechServer.__new__(SpeechServer)
    checks = []
    opened_together = [Connection(checks) for _ in range(2000)]
    server.connections = {connection: {} for connection in opened_together}

    server.timeout_checker()
    assert len(checks) == 2000 // module.TIMEOUT_PASSES  # daphne's own checks all 2,000 in this one turn
    assert [delay for delay, _ in later] == [module.TIMEOUT_CHECK_S / module.TIMEOUT_PASSES]
    for _ in range(module.TIMEOUT_PASSES - 1):
        later.pop()[1]()
    assert sorted(map(id, checks)) == sorted(map(id, opened_together))  # each once in the period
    later.pop()[1]()
    assert len(checks) == 2000 + 2000 // module.TIMEOUT_PASSES  # and the next period begins again


def test_a_connection_that_ends_during_a_pass_leaves_the_others_checked(monkeypatch):
    """check_timeouts may close a connection (daphne's timeouts), which removes it from `connections`."""
    from speech.server.launcher import SpeechServer
    from speech.server.patches import daphne_timeout_passes as module

    monkeypatch.setattr(module.reactor, "callLater", lambda *args: None)
    server = SpeechServer.__new__(SpeechServer)
    checks = []

    class Closing(Connection):
        def check_timeouts(self):
            super().check_timeouts()
            del server.connections[self]

    server.connections = {Closing(checks): {} for _ in range(2 * module.TIMEOUT_PASSES)}
    server.timeout_checker()
    assert len(checks) == 2 and len(server.connections) == 2 * module.TIMEOUT_PASSES - 2
